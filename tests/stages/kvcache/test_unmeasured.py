""""Could not measure" is never a verdict on the deployment: each such path gives an ``error``
check with its reason, and the run is INCOMPLETE, not REJECTED.

Each test forces one path with real inputs (the scripted loopback server stands in for an engine
whose /metrics answers nothing useful) and folds the checks into a run record.
"""

from __future__ import annotations

from pathlib import Path

from day0.config.kvcache import KvCacheSection
from day0.core.events import EventLog, rebuild
from day0.core.record import Check
from day0.stages import kvcache as kv
from tests.support.sse_server import SSEServer


def settings() -> KvCacheSection:
    return KvCacheSection(context_lengths=[1024, 256], short_requests=2, short_lengths=[40, 80],
                          shared_prefix_tokens=100, shared_prefix_requests=2, output_tokens=8)


def verdict_of(tmp_path: Path, stage: str, checks: list[Check]) -> tuple[str, str]:
    log = EventLog(tmp_path / "events.jsonl")
    log.run_started("r", {}, {"name": "p"}, [stage])
    for c in checks:
        log.check(stage, c)
    log.run_finished(0)
    rec = rebuild(tmp_path)
    return rec.verdict, rec.reason


def test_a_metrics_endpoint_without_kv_figures_is_incomplete(tmp_path):
    workload = kv.build_workload(settings(), 300)
    with SSEServer() as srv:  # vLLM-shaped API and /metrics, but no KV-cache gauges
        run = kv.run_blackbox(srv.url, "scripted", workload, timeout_s=30, passes=2)
    checks = kv.blackbox_checks(run, workload, settings())
    frag = next(c for c in checks if c.id == "kvcache.blackbox_fragmentation")
    assert frag.status == "error" and "kv_cache_usage_perc" in frag.message
    verdict, reason = verdict_of(tmp_path, "kvcache", checks)
    assert verdict == "incomplete" and reason.startswith("could not measure: kvcache.blackbox_fragmentation")


def test_scrapes_that_never_resolve_are_incomplete_and_say_how_to_fix_it(tmp_path):
    # every scrape caught a request still prefilling: nothing to estimate from
    unresolved = [kv.BlackBoxSample(0.1 * i, 40, 32, 0.01, 2, None, 0, "a request is waiting or prefilling")
                  for i in range(6)]
    run = kv.BlackBoxRun(samples=unresolved, scrapes=6, block_size=32, passes=3)
    checks = kv.blackbox_checks(run, kv.build_workload(settings(), 300), settings())
    assert checks[0].status == "error"
    assert "none of 6 /metrics scrapes in 3 pass(es)" in checks[0].message and "output_tokens" in checks[0].message
    assert verdict_of(tmp_path, "kvcache", checks)[0] == "incomplete"


def test_views_without_steady_samples_are_incomplete(tmp_path):
    exact = kv.ExactRun(samples=[], block_size=32, num_blocks=64)
    check = kv.agreement_check(exact, kv.BlackBoxRun(samples=[]), settings())
    assert check.status == "error" and check.message.startswith("could not compare")
    assert verdict_of(tmp_path, "kvcache", [check])[0] == "incomplete"


def test_an_exact_view_that_held_no_block_is_incomplete(tmp_path):
    checks = kv.exact_checks(kv.ExactRun(samples=[], block_size=32, num_blocks=64),
                             kv.build_workload(settings(), 300), settings())
    assert checks[0].id == "kvcache.fragmentation" and checks[0].status == "error"
    assert verdict_of(tmp_path, "kvcache", checks)[0] == "incomplete"


def test_an_exception_in_a_stage_is_incomplete_and_a_measured_miss_rejects(pytester):
    pytester.makepyfile("""
import pytest

@pytest.mark.day0
@pytest.mark.risks
def test_reference(day0_checks):
    raise RuntimeError("the accuracy reference engine did not start")

@pytest.mark.day0
@pytest.mark.kvcache
def test_kv(day0_checks):
    day0_checks.measured("kvcache.fragmentation", "f", 1.0, 5.0, unit="%", direction="lower_is_better")
""")
    result = pytester.runpytest("--day0-out", "out")
    result.stdout.fnmatch_lines(["*verdict: INCOMPLETE*could not measure: risks.reference: RuntimeError: the "
                                 "accuracy reference engine did not start*"])


class _Content:
    """A labelled fake of aiohttp's body reader: the chunks it is given, as they would arrive."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def iter_any(self):
        for c in self.chunks:
            yield c


class _Session:
    """A labelled fake of an aiohttp session whose one POST answers 200 with ``chunks``."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.content = _Content(chunks)
        self.status = 200

    def post(self, url, json):
        session = self

        class _Ctx:
            async def __aenter__(self):
                return session

            async def __aexit__(self, *exc):
                return False

        return _Ctx()


def test_the_black_box_reads_its_streams_with_days_one_sse_reader():
    """An event split across chunks, a comment line and a missing [DONE] after the finish are read
    as the timed client reads them; a stream cut before its finish is the request's error."""
    import asyncio
    import json

    from day0.stages.kvcache.blackbox import Flight, _stream

    def event(obj) -> bytes:
        return b"data: " + json.dumps(obj).encode() + b"\n\n"

    tokens = event({"choices": [{"text": "a"}], "usage": {"completion_tokens": 1}})
    finish = event({"choices": [{"text": "b", "finish_reason": "length"}], "usage": {"completion_tokens": 2}})
    done = Flight(8, 2)
    asyncio.run(_stream(_Session([b": keep-alive\n\n", tokens[:9], tokens[9:], finish]), "u", {}, done))
    assert (done.received, done.done, done.error) == (2, True, None)
    cut = Flight(8, 2)
    asyncio.run(_stream(_Session([tokens, finish[:20]]), "u", {}, cut))
    assert cut.received == 1 and cut.error == "stream ended before the request finished"
