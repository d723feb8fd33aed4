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
from day0.stages.latency.speculative import LENGTH_ID, RATE_ID, spec_checks, speculating
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
    assert set(found) == {RATE_ID, LENGTH_ID}
    assert found[RATE_ID].limit == spec.parity.min_acceptance_rate
    assert found[LENGTH_ID].limit == spec.parity.min_mean_acceptance_length
