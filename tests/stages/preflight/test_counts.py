"""Stage 0 names a request count that cannot decide the SLA (``day0.stages.preflight.counts``)."""

from __future__ import annotations

from day0.config.latency import CapacitySearch, LatencySection, SlaSection
from day0.stages.preflight.counts import request_count_findings

P99 = SlaSection(ttft_p99_ms=2000.0, limits={"tpot_p90_ms": 100.0})


def test_an_explicit_count_below_the_bound_is_a_warning_naming_key_and_need():
    found = request_count_findings(LatencySection(num_requests=32), P99)
    assert [(f.severity, f.key, f.value) for f in found] == [("warning", "latency.num_requests", 32)]
    assert "cannot bound ttft p99 (limit 2000 ms) at 95%: 299 needed" in found[0].why
    assert "0 chooses 299" in found[0].fix


def test_counts_chosen_by_day0_or_large_enough_are_silent():
    assert request_count_findings(LatencySection(), P99) == []  # 0: day0 chooses 299
    assert request_count_findings(LatencySection(num_requests=299), P99) == []
    assert request_count_findings(LatencySection(num_requests=5), SlaSection()) == []  # nothing to bound


def test_sweep_and_search_counts_are_checked_too_and_confidence_moves_the_need():
    lat = LatencySection(num_requests=500, sweep_rates=[1.0, 2.0], sweep_requests=100,
                         search=CapacitySearch(requests=300))
    assert [f.key for f in request_count_findings(lat, P99)] == ["latency.sweep_requests"]
    strict = SlaSection(ttft_p99_ms=2000.0, confidence=0.99)  # 459 needed at 99%
    assert [f.key for f in request_count_findings(lat, strict)] == ["latency.sweep_requests",
                                                                     "latency.search.requests"]
