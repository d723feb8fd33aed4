"""Speculative decoding's acceptance over the latency stage's measured workload, without an engine:
/metrics counter texts before and after the measured phase (the style of
tests/stages/parity/test_units.py) give vLLM's figures, a low acceptance fails naming speculative
decoding with its per-position rates, and a window without a draft is an error, never a pass. The
scrape the stage already takes is the one read (a scripted server, not vLLM), and only a profile
with ``speculative_config`` gets the checks, with the ``[parity]`` limits."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from day0.client.loadgen import LoadShape, PhaseResult, RequestResult
from day0.client.spec_decode import acceptance
from day0.config.latency import LatencySection, SlaSection
from day0.config.parity import ParitySection
from day0.config.profile import load_profile
from day0.stages.latency import LatencyRun, compute_metrics, run_latency
from day0.stages.latency import run as run_module
from day0.stages.latency import stage as stage_module
from day0.stages.latency.measurement import SpecWindow
from day0.stages.latency.run import _spec_window
from day0.stages.latency.speculative import (
    LENGTH_ID,
    NOT_MEASURED,
    RATE_ID,
    SPEEDUP_ID,
    spec_checks,
    speculating,
    speedup_check,
)
from tests.support.spec_counters import spec_counters
from tests.support.sse_server import SSEServer

LIMITS = ParitySection(min_acceptance_rate=0.2, min_mean_acceptance_length=1.3)  # cpu-tiny-spec's


counters = spec_counters


def run_with(spec: SpecWindow | None, **settings) -> LatencyRun:
    """A measured run of two requests whose /metrics window is ``spec``."""
    results = []
    for i in range(2):
        r = RequestResult(i, "measure", 100.0, 100.0, 8, 4)
        r.msg_t, r.msg_n, r.output_tokens, r.ok, r.finished = [0.01, 0.02], [1, 3], 4, True, 100.02
        results.append(r)
    m = compute_metrics(PhaseResult("measure", LoadShape(), results, 100.0, 101.0), [50, 99])
    return LatencyRun("http://x", "m", LatencySection(**settings), SlaSection(), m, None, None, None, spec=spec)


def checks_of(before: str, after: str, limits: ParitySection = LIMITS) -> dict:
    return {c.id: c for c in spec_checks(run_with(_spec_window(before, after)), limits)}


def test_the_figures_are_vllms_arithmetic_over_the_measured_window():
    # counts before the measured phase (the parity stage's and the warm-up's drafts) are not the workload's
    before, after = counters(10, 30, 12, 6, 4, 2), counters(44, 132, 66, 30, 22, 14)
    found = checks_of(before, after)
    rate, length = found[RATE_ID], found[LENGTH_ID]
    assert rate.status == length.status == "pass", rate.message
    assert rate.value == pytest.approx(54 / 102) and length.value == pytest.approx(1 + 54 / 34)
    assert (rate.limit, length.limit) == (0.2, 1.3)  # [parity] min_acceptance_rate, min_mean_acceptance_length
    ev = rate.evidence
    assert (ev["drafts"], ev["draft_tokens"], ev["accepted"]) == (34, 102, 54)
    assert ev["acceptance_per_position"] == {"0": 24 / 34, "1": 18 / 34, "2": 12 / 34}
    assert ev["table"]["rows"][0] == [0, 24, round(24 / 34, 6)]
    assert ev["limits"]["from"] == "[parity]" and "second engine" in ev["not_measured"]
    assert "2 completed requests" in ev["window"]
    # one definition: the same figures as day0.client.spec_decode, which the parity stage reads too
    acc = acceptance(before, after)
    assert (rate.value, length.value) == (acc.rate, acc.mean_length)
    assert "per position 0: 0.71, 1: 0.53, 2: 0.35" in rate.message


def test_low_acceptance_fails_naming_speculative_decoding_and_the_collapse():
    # acceptance collapsing after position 0 (vLLM #33497, #51009): most drafts rejected
    found = checks_of(counters(0, 0, 0, 0, 0, 0), counters(34, 102, 6, 6, 0, 0))
    rate, length = found[RATE_ID], found[LENGTH_ID]
    assert rate.status == "fail" and rate.message.startswith("speculative decoding: acceptance rate 0.059")
    assert length.status == "fail" and "mean acceptance length 1.176" in length.message
    assert "per position 0: 0.18, 1: 0.00, 2: 0.00" in rate.message
    assert "over the measured workload" in rate.message and "parity.min_acceptance_rate" in rate.message


def test_no_draft_in_the_window_is_an_error_not_a_pass():
    same = counters(5, 15, 3, 1, 1, 1)
    idle = checks_of(same, same)
    assert {c.status for c in idle.values()} == {"error"} and set(idle) == {RATE_ID, LENGTH_ID}
    assert idle[RATE_ID].message.startswith("speculative decoding: could not measure: no draft was proposed")
    absent = checks_of("# nothing\n", "# nothing\n")
    assert {c.status for c in absent.values()} == {"error"}
    assert "no vllm:spec_decode_* counters" in absent[RATE_ID].message
    restarted = checks_of(counters(50, 150, 30, 10, 10, 10), same)
    assert {c.status for c in restarted.values()} == {"error"} and "went down" in restarted[RATE_ID].message
    failed_scrape = spec_checks(run_with(SpecWindow(None, "http://x/metrics: HTTP 503")), LIMITS)
    assert {c.status for c in failed_scrape} == {"error"} and "HTTP 503" in failed_scrape[0].message


def test_a_view_without_metrics_is_one_skip_that_says_so():
    off = spec_checks(run_with(SpecWindow(None, "latency.server_metrics = false"), server_metrics=False), LIMITS)
    assert [(c.id, c.status) for c in off] == [(RATE_ID, "skip")] and "server_metrics = false" in off[0].message
    inproc = spec_checks(run_with(None), LIMITS)
    assert [(c.id, c.status, c.source) for c in inproc] == [(RATE_ID, "skip", "scheduler")]
    assert "in-process" in inproc[0].message


def test_the_stage_reads_the_scrapes_it_already_takes_around_the_measured_phase(monkeypatch):
    """Against a scripted server (no vLLM): its real /metrics with spec counters added, the first
    scrape after the warm-up and the second after the measured phase. No third scrape is taken."""
    texts = [counters(10, 30, 12, 6, 4, 2), counters(44, 132, 66, 30, 22, 14)]
    real_scrape = run_module.scrape
    calls = []

    async def scrape(session, base_url):
        calls.append(base_url)
        return await real_scrape(session, base_url) + texts[len(calls) - 1]

    monkeypatch.setattr(run_module, "scrape", scrape)
    settings = LatencySection(num_requests=3, warmup_requests=1, input_len=8, output_len=4, workers=1)
    with SSEServer() as srv:
        run = run_latency(srv.url, "scripted", 300, settings)
    assert len(calls) == 2 and run.server  # the agreement's histograms came from the same two scrapes
    found = {c.id: c for c in spec_checks(run, LIMITS)}
    assert found[RATE_ID].value == pytest.approx(54 / 102) and found[RATE_ID].evidence["drafts"] == 34
    assert "3 completed requests" in found[RATE_ID].evidence["window"]


def test_only_a_profile_that_speculates_gets_the_checks_with_the_parity_limits(monkeypatch):
    window = _spec_window(counters(0, 0, 0, 0, 0, 0), counters(34, 102, 54, 24, 18, 12))
    monkeypatch.setattr(stage_module, "tokenizer_dir", lambda profile: None)
    monkeypatch.setattr(stage_module, "read_vocab", lambda path: 300)
    monkeypatch.setattr(stage_module, "run_latency", lambda *a, **kw: run_with(window))
    engine = SimpleNamespace(view="http", endpoint=SimpleNamespace(base_url="http://x", model="m", headers={}))
    plain, spec = load_profile("cpu-tiny"), load_profile("cpu-tiny-spec")
    assert not speculating(plain.engine.args) and speculating(spec.engine.args)
    assert not [c for c in stage_module.run_stage(engine, plain) if "spec" in c.id]
    found = {c.id: c for c in stage_module.run_stage(engine, spec) if "spec" in c.id}
    assert set(found) == {RATE_ID, LENGTH_ID, SPEEDUP_ID}  # cpu-tiny-spec sets latency.spec_baseline
    assert found[RATE_ID].limit == spec.parity.min_acceptance_rate
    assert found[LENGTH_ID].limit == spec.parity.min_mean_acceptance_length
    # no session engines to start a baseline from: an error that says so, never a pass
    assert found[SPEEDUP_ID].status == "error" and "second server day0 starts" in found[SPEEDUP_ID].message
    external = load_profile("cpu-tiny-spec", overrides={"engine": {"mode": "external", "url": "http://x"}})
    found = {c.id: c for c in stage_module.run_stage(engine, external, engines=Variants()) if "spec" in c.id}
    assert found[SPEEDUP_ID].status == "error" and "engine.mode = 'external'" in found[SPEEDUP_ID].message


# -- the speedup: TPOT without speculation over TPOT with it, at the same load --------------------------------


def phase(chunk: int, gap_s: float, tokens: int = 13, requests: int = 4, stalled: int = 0):
    """Measured metrics of ``requests`` streams whose first token comes at 0.1 s and the rest in
    messages of ``chunk`` tokens every ``gap_s`` (a speculating engine streams several at once);
    the last ``stalled`` of them one token every 100 ms instead."""
    results = []
    for i in range(requests):
        if i >= requests - stalled:
            chunk, gap_s = 1, 0.100
        r = RequestResult(i, "measure", 100.0, 100.0, 8, tokens)
        t, n = [0.1], [1]
        while sum(n) < tokens:
            t.append(t[-1] + gap_s)
            n.append(min(chunk, tokens - sum(n)))
        r.msg_t, r.msg_n, r.output_tokens, r.ok, r.finished = t, n, tokens, True, 100.0 + t[-1]
        results.append(r)
    return compute_metrics(PhaseResult("measure", LoadShape(), results, 100.0, 101.0), [50, 99])


def test_the_speedup_is_tpot_without_over_with_and_itl_grows_with_the_chunks():
    # with: 3 tokens per message every 30 ms (TPOT 10 ms, ITL 30 ms); without: 1 token every 20 ms
    check = speedup_check(phase(3, 0.030), phase(1, 0.020), None)
    assert check.id == SPEEDUP_ID and check.status == "pass" and check.limit is None
    assert check.value == pytest.approx(2.0, rel=1e-3) and check.unit == "x"
    assert "reported, not judged" in check.message and "min_spec_speedup" in check.message
    rows = {r[0]: r[1:] for r in check.evidence["table"]["rows"]}
    assert rows["TPOT mean (ms)"] == rows["TPOT p50 (ms)"] == [pytest.approx(10.0), pytest.approx(20.0)]
    assert rows["ITL p50 (ms)"] == [pytest.approx(30.0), pytest.approx(20.0)]  # why TPOT is the one judged


def test_a_speculating_engine_slower_than_its_baseline_fails_the_limit():
    check = speedup_check(phase(1, 0.030), phase(1, 0.020), 1.0)
    assert check.status == "fail" and check.value == pytest.approx(2 / 3, rel=1e-3) and check.limit == 1.0
    assert "speculative decoding" in check.message.lower() and "limit >= 1x" in check.message


def test_the_mean_is_judged_so_requests_that_stall_are_counted():
    # three requests 2x faster (TPOT 10 ms), one stalled at 100 ms: p50 says 2x, the mean 20 / 32.5
    check = speedup_check(phase(3, 0.030, stalled=1), phase(1, 0.020), 1.0)
    rows = {r[0]: r[1:] for r in check.evidence["table"]["rows"]}
    assert rows["TPOT p50 (ms)"][0] < 20.0 and rows["TPOT mean (ms)"][0] == pytest.approx(32.5)
    assert check.status == "fail" and check.value == pytest.approx(20 / 32.5, rel=1e-3)


def test_no_baseline_or_no_tpot_is_an_error_never_a_pass():
    missing = speedup_check(phase(3, 0.030), None, 1.0, why="the engine without speculative_config did not start")
    assert missing.status == "error" and "did not start" in missing.message
    one_token = speedup_check(phase(1, 0.020, tokens=1), phase(1, 0.020), None)
    assert one_token.status == "error" and "mean TPOT missing" in one_token.message


class Variants:
    """A labelled fake of the session's engines: ``variant()`` records the args it was asked to
    change and yields a handle whose endpoint is another URL."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, dict]] = []

    def variant(self, name, args, env=None):
        import contextlib

        self.asked.append((name, args))
        return contextlib.nullcontext(SimpleNamespace(endpoint=SimpleNamespace(base_url="http://baseline", model="m",
                                                                               headers={})))


def test_the_baseline_is_the_same_workload_on_an_engine_without_speculative_config(monkeypatch):
    runs = {"http://x": phase(3, 0.030), "http://baseline": phase(1, 0.015)}
    window = _spec_window(counters(0, 0, 0, 0, 0, 0), counters(34, 102, 54, 24, 18, 12))
    seen = []

    def fake_run(base_url, model, vocab, settings, sla, **kw):
        seen.append((base_url, settings))
        return LatencyRun(base_url, model, settings, sla, runs[base_url], None, None, None, spec=window)

    monkeypatch.setattr(stage_module, "tokenizer_dir", lambda profile: None)
    monkeypatch.setattr(stage_module, "read_vocab", lambda path: 300)
    monkeypatch.setattr(stage_module, "run_latency", fake_run)
    monkeypatch.setattr(stage_module, "latency_checks", lambda run: [])
    engines = Variants()
    engine = SimpleNamespace(view="http", endpoint=SimpleNamespace(base_url="http://x", model="m", headers={}))
    profile = load_profile("cpu-tiny-spec", overrides={"latency": {"sweep_rates": [1.0, 2.0], "min_spec_speedup": 1.2,
                                                                   "search": {"start_rate": 2.0}}})
    found = {c.id: c for c in stage_module.run_stage(engine, profile, engines=engines)}
    assert engines.asked == [("no-spec", {"speculative_config": None})]
    (main_url, main), (base_url, base) = seen
    assert (main_url, base_url) == ("http://x", "http://baseline")
    assert main.sweep_rates == [1.0, 2.0] and base.sweep_rates == []  # the sweep is not run twice
    assert main.search is not None and base.search is None  # nor the capacity search
    assert base.model_dump(exclude={"sweep_rates", "search"}) == main.model_dump(exclude={"sweep_rates", "search"})
    speedup = found[SPEEDUP_ID]
    assert speedup.status == "pass" and speedup.value == pytest.approx(1.5, rel=1e-3) and speedup.limit == 1.2
    assert found[RATE_ID].status == "pass" and "not_measured" not in found[RATE_ID].evidence
    plain = load_profile("cpu-tiny-spec", overrides={"latency": {"spec_baseline": False}})
    found = {c.id: c for c in stage_module.run_stage(engine, plain, engines=Variants())}
    assert SPEEDUP_ID not in found and found[RATE_ID].evidence["not_measured"] == NOT_MEASURED
