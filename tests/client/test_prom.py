"""Scraped histograms: parsing real prometheus_client output, deltas, Prometheus-style quantiles."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from day0.client.prom import PromError, delta, histogram_quantile, parse_histograms, server_view

BOUNDS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5]


def exposition(obs: dict[str, list[float]], name: str = "vllm:time_to_first_token_seconds",
               bounds: list[float] = BOUNDS) -> str:
    """Real exposition text from prometheus_client, one label set per key of ``obs``."""
    reg = CollectorRegistry()
    h = Histogram(name, "t", ["model_name"], buckets=bounds, registry=reg)
    for label, values in obs.items():
        child = h.labels(model_name=label)
        for v in values:
            child.observe(v)
    return generate_latest(reg).decode()


def cumulative(values: list[float], bounds: list[float]) -> list[tuple[float, float]]:
    return [(b, float(sum(1 for v in values if v <= b))) for b in bounds] + [(math.inf, float(len(values)))]


values_st = st.lists(st.floats(0.0, 3.0, allow_nan=False), min_size=1, max_size=200)
bounds_st = st.lists(st.floats(0.001, 3.0, allow_nan=False), min_size=1, max_size=15, unique=True).map(sorted)


@settings(max_examples=100, deadline=None)
@given(values_st, bounds_st, st.floats(0.0, 1.0))
def test_quantile_lands_in_the_bucket_that_holds_the_sample_quantile(values, bounds, q):
    buckets = cumulative(values, bounds)
    est = histogram_quantile(q, buckets)
    n = len(values)
    rank = q * n
    b = next(i for i, (_, c) in enumerate(buckets) if c >= rank)
    if b == len(buckets) - 1:
        assert est == bounds[-1]  # Prometheus answers the highest finite bound
        return
    lo = 0.0 if b == 0 else bounds[b - 1]
    hi = bounds[b]
    assert lo - 1e-12 <= est <= hi + 1e-12
    if rank > 0:
        kth = sorted(values)[math.ceil(rank) - 1]  # the sample at that rank lies in the same bucket
        assert lo <= kth <= hi or (b == 0 and kth <= hi)


@settings(max_examples=100, deadline=None)
@given(values_st, bounds_st, st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_quantile_is_monotonic(values, bounds, q1, q2):
    buckets = cumulative(values, bounds)
    a, b = sorted((q1, q2))
    assert histogram_quantile(a, buckets) <= histogram_quantile(b, buckets) + 1e-12


def test_quantile_worked_example():
    # 10 samples: 4 in (0, 0.1], 6 in (0.1, 0.5]; median rank 5 is 1/6 into the second bucket
    buckets = [(0.1, 4.0), (0.5, 10.0), (math.inf, 10.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.1 + 0.4 * (1 / 6))
    assert histogram_quantile(0.2, buckets) == pytest.approx(0.05)
    assert math.isnan(histogram_quantile(0.5, [(0.1, 0.0), (math.inf, 0.0)]))
    with pytest.raises(ValueError):
        histogram_quantile(1.5, buckets)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 3.0), max_size=50), st.lists(st.floats(0.0, 3.0), min_size=1, max_size=50))
def test_delta_of_real_scrapes_is_the_histogram_of_the_interval(first, second):
    reg = CollectorRegistry()
    h = Histogram("vllm:time_to_first_token_seconds", "t", ["model_name"], buckets=BOUNDS, registry=reg)
    for v in first:
        h.labels(model_name="m").observe(v)
    before = generate_latest(reg).decode()
    for v in second:
        h.labels(model_name="m").observe(v)
    after = generate_latest(reg).decode()
    name = "vllm:time_to_first_token_seconds"
    d = delta(parse_histograms(before).get(name), parse_histograms(after)[name])
    assert d.buckets == cumulative(second, BOUNDS)
    assert d.count == len(second)
    assert d.mean() == pytest.approx(sum(second) / len(second), rel=1e-9, abs=1e-9)


def test_label_sets_are_summed_and_filtered():
    text = exposition({"a": [0.003, 0.3], "b": [0.03]})
    h = parse_histograms(text)["vllm:time_to_first_token_seconds"]
    assert h.count == 3 and h.total == 3
    only_b = parse_histograms(text, {"model_name": "b"})["vllm:time_to_first_token_seconds"]
    assert only_b.count == 1 and only_b.sum == pytest.approx(0.03)


def test_counts_going_down_mean_a_restart():
    before = parse_histograms(exposition({"m": [0.1, 0.2, 0.3]}))["vllm:time_to_first_token_seconds"]
    after = parse_histograms(exposition({"m": [0.1]}))["vllm:time_to_first_token_seconds"]
    with pytest.raises(PromError, match="restarted"):
        delta(before, after)


def test_garbage_is_a_clear_error():
    with pytest.raises(PromError, match="not a Prometheus exposition"):
        parse_histograms("this is {not metrics\n")


@pytest.mark.parametrize("line", [
    'vllm:x{a="b",' + "c" * 5_000_000 + '} 1',
    'vllm:x 1 2 3 ' + "c" * 5_000_000,
    "\x1f\x8b" + "\xff" * 5_000_000,
], ids=["labels", "value", "binary"])
def test_a_malformed_line_is_quoted_in_part_with_its_length(line):
    """The parser quotes the offending line whole: a 4 MB line became run.server_error and was
    printed by `day0 latency` as one "line" of 4,000,047 characters."""
    with pytest.raises(PromError) as exc:
        server_view(None, "vllm:ok 1\n" + line + "\n")
    msg = str(exc.value)
    assert msg.startswith("not a Prometheus exposition: ") and "\n" not in msg
    assert len(msg) < 300 and msg.endswith(" characters)"), msg[:400]
    assert int(msg.rsplit("(", 1)[1].split()[0]) >= 5_000_000


def test_a_label_that_is_no_number_is_a_prom_error_naming_the_metric():
    """A bucket bound or a draft position the code reads as a number was a bare ValueError naming
    no metric, which no caller of these parsers expects."""
    from day0.client.spec_decode import acceptance

    with pytest.raises(PromError, match=r"^vllm:x_bucket: bucket bound le='fast' is not a number"):
        parse_histograms('vllm:x_bucket{le="fast"} 1\nvllm:x_bucket{le="+Inf"} 1\n')
    spec = ("vllm:spec_decode_num_drafts_total 5\nvllm:spec_decode_num_draft_tokens_total 10\n"
            "vllm:spec_decode_num_accepted_tokens_total 4\n"
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="first"} 4\n')
    with pytest.raises(PromError, match=r"^vllm:spec_decode_num_accepted_tokens_per_pos: position 'first' is not"):
        acceptance(None, spec)


def test_server_view_prefers_new_itl_name_and_falls_back_to_the_old():
    old = exposition({"m": [0.02, 0.04]}, name="vllm:time_per_output_token_seconds")
    view = server_view(None, old)
    assert view["itl"].source == "vllm:time_per_output_token_seconds"
    assert view["itl"].mean_ms == pytest.approx(30.0)
    both = old + exposition({"m": [0.01]}, name="vllm:inter_token_latency_seconds")
    assert server_view(None, both)["itl"].source == "vllm:inter_token_latency_seconds"
    assert "ttft" not in view
    # both exported, only the old one moved during the run: the one that saw the run is used
    reg = CollectorRegistry()
    new_h = Histogram("vllm:inter_token_latency_seconds", "i", buckets=BOUNDS, registry=reg)
    old_h = Histogram("vllm:time_per_output_token_seconds", "t", buckets=BOUNDS, registry=reg)
    new_h.observe(0.5)
    before = generate_latest(reg).decode()
    old_h.observe(0.02)
    moved = server_view(before, generate_latest(reg).decode())["itl"]
    assert moved.source == "vllm:time_per_output_token_seconds" and moved.count == 1


def _counters(hits: float, queries: float, engines: int = 1) -> str:
    from prometheus_client import Counter

    reg = CollectorRegistry()
    h = Counter("vllm:prefix_cache_hits", "hits", ["engine"], registry=reg)
    q = Counter("vllm:prefix_cache_queries", "queries", ["engine"], registry=reg)
    for e in range(engines):
        h.labels(engine=str(e)).inc(hits)
        q.labels(engine=str(e)).inc(queries)
    return generate_latest(reg).decode()


def test_prefix_cache_window_is_the_counter_delta_summed_over_engines():
    from day0.client.prom import prefix_cache_window

    before, after = _counters(100, 1000, engines=2), _counters(1300, 3000, engines=2)
    w = prefix_cache_window(before, after)
    assert (w.hits, w.queries) == (2400, 4000)  # _created samples are not counts
    assert w.share == pytest.approx(0.6)
    assert prefix_cache_window(None, after).hits == 2600
    assert prefix_cache_window(before, "# nothing\n") is None
    with pytest.raises(PromError, match="went down"):
        prefix_cache_window(after, before)
    assert math.isnan(prefix_cache_window(before, before).share)


@pytest.mark.parametrize("p, name, cid", [(50, "p50", "latency.ttft_p50"), (90, "p90", "latency.ttft_p90"),
                                          (95, "p95", "latency.ttft_p95"), (99, "p99", "latency.ttft_p99"),
                                          (99.0, "p99", "latency.ttft_p99"), (99.9, "p99.9", "latency.ttft_p99_9"),
                                          (99.99, "p99.99", "latency.ttft_p99_99"), (12.5, "p12.5", "latency.ttft_p12_5")])
def test_an_ordinary_percentile_keeps_its_name_and_check_id(p, name, cid):
    """Names are in check ids, stats columns and recorded runs: an ordinary percentile's must not move."""
    from day0.client.prom import pct_name
    from day0.stages.latency.checks import _check_id

    assert pct_name(p) == name and _check_id("ttft", p) == cid


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=0, max_value=100, exclude_min=True, exclude_max=True),
       st.floats(min_value=0, max_value=100, exclude_min=True, exclude_max=True))
def test_two_distinct_percentiles_never_share_a_name(a, b):
    """``{p:g}`` kept 6 significant digits: 99.99999 and 99.99998 were both 'p100' (one check id
    for two limits). The name is the float's shortest repr, so it parses back to the very float."""
    from day0.client.prom import pct_name

    assert pct_name(99.99999) == "p99.99999" != pct_name(99.99998) == "p99.99998"
    assert pct_name(1e-05) == "p0.00001"  # no exponent: the name stays one the limit grammar can write
    assert float(pct_name(a)[1:]) == a and (pct_name(a) == pct_name(b)) == (a == b)
