"""Latency formulas, metrics from request results, settings and the SLA judge (no network)."""

from __future__ import annotations

import math
from array import array

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from day0.client.loadgen import LoadShape, PhaseResult, RequestResult
from day0.client.prom import ServerFigure
from day0.config.latency import LatencySection, SlaSection
from day0.core.stats import BURSTY, percentile, percentile_bounds, tail_bursts
from day0.stages.latency import (
    LatencyRun,
    SettingsError,
    SweepPoint,
    compute_metrics,
    latency_checks,
    per_token_itl,
    summarize,
    tpot_of,
)

floats = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)


@settings(max_examples=150, deadline=None)
@given(st.lists(floats, min_size=1, max_size=200), st.floats(0, 100))
def test_percentile_matches_numpy_linear(values, p):
    assert percentile(values, p) == pytest.approx(float(np.percentile(values, p)), rel=1e-9, abs=1e-6)


@settings(max_examples=150, deadline=None)
@given(st.lists(floats, min_size=1, max_size=200), st.floats(0, 100))
def test_nearest_rank_percentile_matches_numpy_inverted_cdf(values, p):
    """The collective sweep's per-iteration rule (nccl-tests): a value that was measured."""
    got = percentile(values, p, method="nearest")
    assert got == float(np.percentile(values, p, method="inverted_cdf")) and got in values


def test_an_unknown_percentile_method_is_refused():
    with pytest.raises(ValueError, match="'midpoint' is not 'linear' or 'nearest'"):
        percentile([1.0, 2.0], 50, method="midpoint")


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0, 1e4), min_size=1, max_size=100))
def test_summary_matches_numpy(values):
    s = summarize(values, [50, 99, 99.9])
    assert s.count == len(values)
    assert s.mean == pytest.approx(float(np.mean(values)), rel=1e-9, abs=1e-9)
    assert s.std == pytest.approx(float(np.std(values)), rel=1e-6, abs=1e-6)
    assert s.percentiles["p99.9"] == pytest.approx(float(np.percentile(values, 99.9)), rel=1e-9, abs=1e-9)
    assert summarize([], [50]).count == 0 and math.isnan(summarize([], [50]).percentiles["p50"])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0, 1e4) | st.sampled_from([1.0, 2.5]), min_size=1, max_size=400), st.floats(1, 99.9))
def test_an_array_of_doubles_gives_the_figures_its_list_gives_bit_for_bit(values, p):
    """The pooled ITL is an array('d'), sorted by numpy (an import's millions of gaps as float
    objects were most of its memory): every figure judged must be the list's own, ties included."""
    compact = array("d", values)
    assert summarize(compact, [50, p]) == summarize(values, [50, p])
    assert percentile_bounds(compact, p) == percentile_bounds(values, p)
    assert tail_bursts(compact) == tail_bursts(values)
    assert all(type(x) is float for x in (percentile(compact, p), summarize(compact, [p]).min))  # JSON writes them


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=50))
def test_a_summary_of_any_finite_figures_is_figures_never_an_exception(values):
    """Gaps of 1e200 s (an import's, in ms) squared past a float in the variance: an OverflowError
    traceback. Now computed relative to the largest value, inf only where the std itself is."""
    s = summarize(values, [50])
    assert math.isfinite(s.mean) and s.std >= 0 and not math.isnan(s.std)


def test_huge_figures_are_summarized_as_their_scaled_selves():
    small, big = summarize([1.0, 1.0, 0.0], [50]), summarize([1e200, 1e200, 0.0], [50])
    assert (big.mean, big.std) == pytest.approx((small.mean * 1e200, small.std * 1e200), rel=1e-12)


@pytest.mark.parametrize("values", [[-1.7e308, 1.7e308], [1.7e308, math.inf, math.inf]])
def test_a_percentile_past_a_floats_range_prints_no_numpy_warning(values, recwarn):
    """numpy's float64 scalars warned 'overflow encountered' / 'invalid value' on stderr (an import
    of gaps of 1.8e305 s printed a RuntimeWarning); the interpolation is in Python floats."""
    for p in (25, 50, 75):
        percentile(array("d", values), p)
    assert not recwarn.list


@st.composite
def messages(draw):
    n = draw(st.integers(1, 30))
    gaps = draw(st.lists(st.floats(0, 0.5), min_size=n, max_size=n))
    t = np.cumsum(gaps).tolist()
    counts = draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
    return t, counts


@settings(max_examples=100, deadline=None)
@given(messages())
def test_per_token_itl_sums_to_decode_time(msgs):
    t, n = msgs
    itl = per_token_itl(t, n)
    assert len(itl) == sum(n) - 1
    assert math.fsum(itl) == pytest.approx(t[-1] - t[0], abs=1e-9)
    if sum(n) > 1:  # its mean is the request's TPOT when usage agrees with the messages
        r = result(0, t, n)
        assert tpot_of(r) == pytest.approx(math.fsum(itl) / len(itl), abs=1e-12)


def result(index: int, msg_t: list[float], msg_n: list[int], *, ok: bool = True, error: str | None = None,
           scheduled: float = 100.0, lag: float = 0.0) -> RequestResult:
    r = RequestResult(index, "measure", scheduled, scheduled + lag, 8, sum(msg_n) or 4)
    r.msg_t, r.msg_n = list(msg_t), list(msg_n)
    r.output_tokens = sum(msg_n)
    r.ok, r.error, r.reason = ok, error, (f"{error} reason" if error else "")
    r.finished = scheduled + (msg_t[-1] if msg_t else 0.5)
    r.token_source = "continuous_usage"
    return r


def phase_of(results: list[RequestResult], duration: float = 2.0) -> PhaseResult:
    return PhaseResult("measure", LoadShape(), results, 100.0, 100.0 + duration)


def test_metrics_keep_failures_out_of_every_statistic():
    good = [result(i, [0.010, 0.015, 0.020], [1, 1, 2]) for i in range(3)]
    bad = [result(3, [5.0, 6.0], [1, 1], ok=False, error="dropped_stream"),
           result(4, [], [], ok=False, error="http_error"),
           result(5, [9.0], [1], ok=False, error="timeout")]
    m = compute_metrics(phase_of(good + bad), [50, 99], {"ttft": 50.0})
    assert (m.sent, m.completed, m.failed) == (6, 3, 3)
    assert m.errors == {"dropped_stream": 1, "http_error": 1, "timeout": 1}
    assert m.error_rate == pytest.approx(0.5)
    assert m.stats["ttft"].count == 3 and m.stats["ttft"].max == pytest.approx(10.0)
    assert m.stats["itl"].count == 6 and m.stats["itl_token"].count == 9
    assert m.stats["tpot"].mean == pytest.approx((20.0 - 10.0) / 3)
    assert m.output_tokens == 12 and m.output_throughput == pytest.approx(6.0)
    assert m.good_requests == 3 and m.goodput == pytest.approx(1.5)


def test_goodput_uses_every_slo_and_single_token_requests_have_no_tpot():
    rs = [result(0, [0.010], [1]),  # one token: no TPOT, counts as meeting the TPOT SLO
          result(1, [0.010, 0.110], [1, 1]),  # TPOT 100 ms: misses
          result(2, [0.060, 0.070], [1, 1])]  # TTFT 60 ms: misses
    m = compute_metrics(phase_of(rs, 1.0), [50], {"ttft": 50.0, "tpot": 50.0})
    assert m.stats["tpot"].count == 2
    assert tpot_of(rs[0]) is None
    assert m.good_requests == 1


def test_ttft_is_from_scheduled_and_server_comparison_from_sent():
    rs = [result(0, [0.050, 0.060], [1, 1], lag=0.030)]
    m = compute_metrics(phase_of(rs), [50])
    assert m.stats["ttft"].mean == pytest.approx(50.0)
    assert m.stats["ttft_from_send"].mean == pytest.approx(20.0)
    assert m.stats["send_lag"].mean == pytest.approx(30.0)


def test_sla_table_parsing_and_limits():
    sla = SlaSection.from_table({"ttft_p99_ms": 500, "ttft_p90_ms": 200, "tpot_p99_9_ms": 80,
                                 "max_error_rate": 0.01, "e2e_p50_ms": 1000})
    assert sla.latency_limits() == [("ttft", 90.0, 200.0), ("ttft", 99.0, 500.0), ("tpot", 99.9, 80.0),
                                    ("e2e", 50.0, 1000.0)]
    assert sla.per_request_slo() == {"ttft": 500.0, "tpot": 80.0, "e2e": 1000.0}
    with pytest.raises(SettingsError, match="sla.ttft_ms"):
        SlaSection.from_table({"ttft_ms": 3})
    with pytest.raises(SettingsError, match="sla.max_error_rate"):
        SlaSection.from_table({"max_error_rate": 2})
    with pytest.raises(SettingsError, match="sla.tpot_p99_ms"):
        SlaSection.from_table({"tpot_p99_ms": -1})


@pytest.mark.parametrize("table, key", [
    ({"endpoint": "embeddings"}, "latency.endpoint"),
    ({"load": "rate", "request_rate": 0}, "latency.request_rate"),
    ({"concurrency": 0}, "latency.concurrency"),
    ({"input_len": [10, 2]}, "latency.input_len"),
    ({"sweep_rates": [4, 2]}, "latency.sweep_rates"),
    ({"percentiles": [101]}, "latency.percentiles"),
    ({"bogus": 1}, "latency.bogus"),
])
def test_latency_settings_errors_name_the_key(table, key):
    with pytest.raises(SettingsError, match=key):
        LatencySection.from_table(table)


def run_of(results: list[RequestResult], sla: SlaSection, server=None, sweep=None, **kw) -> LatencyRun:
    s = LatencySection(**kw)
    m = compute_metrics(phase_of(results), sorted(set(s.percentiles) | {99.0}), sla.per_request_slo())
    return LatencyRun("http://x", "m", s, sla, m, None, server, None if server else "no /metrics", sweep or [])


def by_id(checks):
    return {c.id: c for c in checks}


def test_checks_judge_limits_and_errors():
    rs = [result(i, [0.010 * (i + 1), 0.010 * (i + 1) + 0.004], [1, 1]) for i in range(10)]
    rs.append(result(10, [], [], ok=False, error="timeout"))
    sla = SlaSection(ttft_p99_ms=50.0, tpot_p99_ms=10.0, max_error_rate=0.2, limits={"ttft_p50_ms": 100.0})
    c = by_id(latency_checks(run_of(rs, sla)))
    assert c["latency.ttft_p99"].status == "fail" and c["latency.ttft_p99"].value == pytest.approx(99.1, abs=0.01)
    assert c["latency.ttft_p50"].status == "pass"
    # 10 samples bound a p99 from below (the 9th smallest, 90 ms, is past 50: a fail at 95%), never
    # from above: a p99 limit they all meet is not a pass but "could not measure"
    assert c["latency.ttft_p99"].evidence["bounds"]["lower"] == pytest.approx(90.0, abs=0.01)
    tpot = c["latency.tpot_p99"]
    assert tpot.status == "error" and "10 requests cannot bound p99 within 10 ms at 95%; 299 needed" in tpot.message
    assert tpot.value is None and tpot.evidence["point_estimate"] == pytest.approx(4.0)
    assert c["latency.itl_p99"].limit is None and c["latency.e2e_p99"].status == "pass"
    assert c["latency.error_rate"].status == "pass" and c["latency.error_rate"].value == pytest.approx(1 / 11, abs=1e-6)
    assert "timeout" in c["latency.error_rate"].message
    assert len(c["latency.ttft_p99"].evidence["samples"]) == 10
    assert c["latency.goodput"].status == "pass"
    assert c["latency.server_agreement"].status == "skip"
    tight = by_id(latency_checks(run_of(rs, SlaSection(max_error_rate=0.0))))
    assert tight["latency.error_rate"].status == "fail"
    assert tight["latency.goodput"].status == "skip"


def test_a_percentile_over_bursty_requests_says_what_the_sample_is_worth():
    """Slow first tokens in runs (a queue's bursts) leave the verdict to the bounds but name what
    the interval assumes; independent ones add nothing to the message."""
    def run(ttfts_ms):
        rs = [result(i, [t / 1000.0, t / 1000.0 + 0.004], [1, 1], scheduled=100.0 + 0.02 * i)
              for i, t in enumerate(ttfts_ms)]
        return by_id(latency_checks(run_of(rs, SlaSection(ttft_p99_ms=500.0))))["latency.ttft_p99"]

    bursty = run([(300.0 if (i // 10) % 10 == 0 else 20.0) + i * 0.01 for i in range(300)])
    ev = bursty.evidence["tail_bursts"]
    assert bursty.status == "pass" and ev["runs"] == 3 and ev["mean_run"] == 10.0
    assert ev["equivalent_samples"] == 33
    assert "slowest tenth came in runs of 10.0 (1.11 if independent): worth about 33 independent samples" \
        in bursty.message
    spread = run([20.0 + (i * 37 % 300) for i in range(300)])
    assert spread.status == "pass" and spread.evidence["tail_bursts"]["factor"] < BURSTY
    assert "independent" not in spread.message


def test_agreement_check_flags_disagreement():
    rs = [result(i, [0.040, 0.050, 0.060], [1, 1, 1]) for i in range(5)]  # TTFT 40 ms, ITL 10 ms, no spread
    fig = lambda metric, mean: ServerFigure(metric, "vllm:x", 5, mean, {"p50": mean, "p99": mean}, [])  # noqa: E731
    close = {"ttft": fig("ttft", 38.0), "itl": fig("itl", 10.5)}
    checks = by_id(latency_checks(run_of(rs, SlaSection(), close, agreement_rel=0.1)))
    c = checks["latency.server_agreement"]
    assert c.status == "pass" and c.value == pytest.approx(0.5)  # ITL 0.5 ms apart; TTFT: engine below client
    assert checks["latency.frontend_overhead"].value == pytest.approx(2.0)
    # a client far slower than the engine is front-end overhead, not a disagreement (the busy-box case)
    slow_front = {"ttft": fig("ttft", 5.0), "itl": fig("itl", 10.0)}
    checks = by_id(latency_checks(run_of(rs, SlaSection(), slow_front, agreement_rel=0.1)))
    assert checks["latency.server_agreement"].status == "pass"
    assert checks["latency.frontend_overhead"].value == pytest.approx(35.0)
    # the engine reporting a longer TTFT than the client saw is a measurement error
    engine_late = {"ttft": fig("ttft", 60.0), "itl": fig("itl", 10.0)}
    c = by_id(latency_checks(run_of(rs, SlaSection(), engine_late, agreement_rel=0.1)))["latency.server_agreement"]
    assert c.status == "fail" and "DISAGREE" in c.message and c.limit == pytest.approx(4.0) and c.value == 20.0
    # ITL apart beyond the relative tolerance (no spread in these samples, so no noise allowance)
    # plus the 2 ms the front end delayed, spread over a request's 2 gaps
    itl_far = {"ttft": fig("ttft", 38.0), "itl": fig("itl", 14.0)}
    c = by_id(latency_checks(run_of(rs, SlaSection(), itl_far, agreement_rel=0.1)))["latency.server_agreement"]
    assert c.status == "fail" and c.value == pytest.approx(4.0) and c.limit == pytest.approx(1.0 + 2.0 / 2)


def test_a_starved_front_end_that_delivers_tokens_in_a_burst_is_no_disagreement():
    """Measured with two busy processes beside the server: the front end held the first token back
    ~195 ms, then delivered the rest at once (client TPOT 1.4 ms, engine 4.5 ms). The delay is
    front-end overhead, measured in the same run, and it explains the shorter client span."""
    fig = lambda metric, mean: ServerFigure(metric, "vllm:x", 5, mean, {"p50": mean, "p99": mean}, [])  # noqa: E731
    burst = [result(i, [0.240, 0.241, 0.242], [1, 1, 1]) for i in range(5)]  # TTFT 240 ms, then 1 ms gaps
    engine = {"ttft": fig("ttft", 46.0), "itl": fig("itl", 4.5), "tpot": fig("tpot", 4.5)}
    checks = by_id(latency_checks(run_of(burst, SlaSection(), engine, agreement_rel=0.25)))
    assert checks["latency.server_agreement"].status == "pass"
    assert checks["latency.frontend_overhead"].value == pytest.approx(194.0)
    # the same per-token gap with a front end that delayed nothing is a measurement error
    no_delay = {"ttft": fig("ttft", 239.0), "itl": fig("itl", 4.5), "tpot": fig("tpot", 4.5)}
    c = by_id(latency_checks(run_of(burst, SlaSection(), no_delay, agreement_rel=0.25)))["latency.server_agreement"]
    assert c.status == "fail" and "DISAGREE" in c.message


def test_one_token_requests_the_engine_counts_as_zero_tpot_are_no_disagreement():
    """vLLM's TPOT histogram observes a 1-token request as 0; the client's TPOT leaves it out. Half
    the requests one token long: the engine's raw mean is half the client's (5 against 10 ms), the
    same decode spans over the same requests."""
    fig = lambda metric, mean, n: ServerFigure(metric, "vllm:x", n, mean, {"p50": mean}, [])  # noqa: E731
    multi = [result(i, [0.040 + 0.010 * k for k in range(9)], [1] * 9) for i in range(100)]  # 9 tokens, 10 ms apart
    single = [result(100 + i, [0.040], [1]) for i in range(100)]
    engine = {"ttft": fig("ttft", 39.0, 200), "tpot": fig("tpot", 5.0, 200)}
    c = by_id(latency_checks(run_of(multi + single, SlaSection(), engine, agreement_rel=0.25)))["latency.server_agreement"]
    assert c.status == "pass", c.message
    tpot_row = next(r for r in c.evidence["table"]["rows"] if r[0] == "tpot")
    assert tpot_row[2] == pytest.approx(10.0) and tpot_row[-1] == "ok"
    # a real disagreement over the same requests still shows: the engine's decode spans twice the client's
    slow = {"ttft": fig("ttft", 39.0, 200), "tpot": fig("tpot", 10.0, 200)}
    c = by_id(latency_checks(run_of(multi + single, SlaSection(), slow, agreement_rel=0.25)))["latency.server_agreement"]
    assert c.status == "fail" and "DISAGREE" in c.message


def test_agreement_allowance_grows_with_the_runs_own_noise():
    from day0.stages.latency import agreement_allowance

    quiet = agreement_allowance(0.1, 10.0, 0.0, 100)
    noisy = agreement_allowance(0.1, 10.0, 5.0, 100)
    assert quiet == pytest.approx(1.0) and noisy == pytest.approx(1.0 + 3 * 5.0 / 10)
    assert agreement_allowance(0.1, 10.0, 5.0, 10_000) < noisy  # more samples, tighter mean


def test_sweep_check_reports_the_highest_passing_rate():
    rs = [result(i, [0.01, 0.02], [1, 1]) for i in range(4)]
    sla = SlaSection(ttft_p99_ms=30.0)
    m = compute_metrics(phase_of(rs), [50, 99], sla.per_request_slo())
    sweep = [SweepPoint(1.0, m, True, []), SweepPoint(2.0, m, True, []), SweepPoint(4.0, m, False, ["ttft_p99"])]
    c = by_id(latency_checks(run_of(rs, sla, sweep=sweep)))["latency.sla_sweep"]
    assert c.value == 2.0 and "4 req/s does not meet it (ttft_p99)" in c.message
    assert c.evidence["charts"][0]["series"][0]["x"] == [1.0, 2.0, 4.0]


def test_a_sweep_step_too_short_to_bound_its_limit_is_an_error_not_a_pass_below_it():
    """Four requests cannot bound a p99 from above: the step decides nothing, so the sweep cannot
    name a rate (it once passed at "0 req/s", the step's values all far inside the limit)."""
    import asyncio

    from day0.config.latency import LatencySection
    from day0.stages.latency.sweep import run_sweep

    rs = [result(i, [0.01, 0.02], [1, 1]) for i in range(4)]
    sla = SlaSection(ttft_p99_ms=500.0)
    m = compute_metrics(phase_of(rs), [50, 99], sla.per_request_slo())

    async def measure_at(rate: float, n: int):
        return m

    settings = LatencySection(sweep_rates=[20.0, 40.0], sweep_requests=4)
    sweep = asyncio.run(run_sweep(measure_at, settings, sla, lambda _: None))
    assert [p.rate for p in sweep] == [20.0]
    c = by_id(latency_checks(run_of(rs, sla, sweep=sweep)))["latency.sla_sweep"]
    assert c.status == "error", c.message
    assert c.message == ("could not measure: at 20 req/s 4 requests cannot bound ttft_p99 from above at 95% "
                         "(299 needed): raise latency.sweep_requests")


def test_the_stage_needs_the_models_tokenizer_locally(tmp_path):
    from types import SimpleNamespace

    from day0.stages.latency import NoTokenizer, run_stage, workload_vocab

    profile = SimpleNamespace(model=SimpleNamespace(source="path", path=str(tmp_path)))  # a folder, no tokenizer.json
    with pytest.raises(NoTokenizer, match="tokenizer.json locally; model.path"):
        run_stage(object(), profile)
    with pytest.raises(NoTokenizer):
        workload_vocab(profile)
