"""One schedule split across load workers: the same arrivals as one process, merged back exactly.

The split and the merge are pure (no network): any schedule, any number of shards, any cap. The
worker protocol and the pool run against the scripted loopback server (tests/support/sse_server.py), and
only structure is asserted there (which requests, when scheduled, how many tokens), never a
timing figure: accuracy under load is the loadgen tests' and the ladder benchmark's business.
"""

from __future__ import annotations

import asyncio
import io
import json
from dataclasses import asdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from day0.client.loadgen import ClientOptions, LoadShape, RequestResult, make_streams, run_phase
from day0.client.shards import ShardResult, ShardSpec, merge_shards, shard_count, split_phase
from day0.client.workers import WorkerError, WorkerPool, auto_workers, client_cores, server_on_this_host, worker_main
from day0.client.workload import WorkloadSpec, build_requests
from day0.config.latency import LatencySection, SlaSection
from day0.stages.latency import compute_metrics, latency_checks, run_latency
from day0.stages.latency.settings import load_workers
from tests.support.sse_server import Script, SSEServer

VOCAB = 300

shapes = st.one_of(
    st.builds(LoadShape, mode=st.just("rate"), concurrency=st.integers(0, 9), request_rate=st.floats(0.5, 500),
              burstiness=st.sampled_from([0.5, 1.0, 3.0]), seed=st.integers(0, 99),
              arrivals=st.sampled_from(["immediate", "vllm"])),
    st.builds(LoadShape, mode=st.just("concurrency"), concurrency=st.integers(1, 9)))


@settings(max_examples=120, deadline=None)
@given(st.integers(0, 60), st.integers(1, 8), shapes)
def test_the_shards_together_are_the_one_process_schedule(n, shards, shape):
    reqs = build_requests(WorkloadSpec(4, 2), VOCAB, n)
    specs, offsets = split_phase("http://x", "m", reqs, shape, ClientOptions(), shards, phase="measure", tag="abc")
    assert len(specs) == shard_count(shards, n, shape) and all(s.shards == len(specs) for s in specs)
    got = sorted((r.index, s.shard) for s in specs for r in s.requests)
    assert [i for i, _ in got] == list(range(n))  # every request exactly once
    assert all(shard == i % len(specs) for i, shard in got)  # dealt round robin in schedule order
    if shape.mode == "rate":
        assert offsets == shape.offsets(n)  # the single schedule, untouched
        for s in specs:
            assert s.offsets == [offsets[r.index] for r in s.requests] and s.offsets == sorted(s.offsets)
    else:
        assert offsets == [] and all(s.offsets is None for s in specs)
    if shape.concurrency:
        assert sum(s.concurrency for s in specs) == shape.concurrency and min(s.concurrency for s in specs) >= 1
    assert len({s.tag for s in specs}) == 1


def test_shard_count_needs_a_request_and_a_slot_per_shard():
    assert shard_count(4, 100, LoadShape(mode="rate", concurrency=0)) == 4
    assert shard_count(4, 3, LoadShape(mode="rate", concurrency=0)) == 3
    assert shard_count(4, 100, LoadShape(mode="rate", concurrency=2)) == 2
    assert shard_count(4, 100, LoadShape(concurrency=1)) == 1
    assert shard_count(4, 0, LoadShape(mode="rate", concurrency=0)) == 1


def _result(index: int, scheduled: float, ok: bool = True) -> RequestResult:
    r = RequestResult(index, "measure", scheduled, scheduled + 1e-4, 8, 3)
    r.finished = scheduled + 0.05 + index * 1e-3
    if ok:
        r.ok, r.msg_t, r.msg_n, r.output_tokens = True, [0.0213 + index * 1e-5, 0.0251, 0.0307], [1, 1, 1], 3
    else:
        r.error, r.reason = "http_error", "http_500: boom"
    return r


def test_merge_is_exact_and_equals_one_process():
    """Raw results from shards, through JSON (a real worker's wire), give the very figures the
    same results give unsplit: no histogram, no rounding."""
    t0 = 1000.0
    results = [_result(i, t0 + 0.013 * i + 1 / 3, ok=i % 5 != 3) for i in range(23)]
    shape = LoadShape(mode="rate", request_rate=70.0, concurrency=0)
    parts = [ShardResult(k, results[k::3], not_sent=k) for k in range(3)]
    wire = [ShardResult.from_json(json.loads(json.dumps(p.to_json()))) for p in parts]
    merged = merge_shards("measure", shape, wire, t0, [r.scheduled - t0 for r in results])
    assert [asdict(r) for r in merged.results] == [asdict(r) for r in results]  # bit-exact floats
    assert merged.not_sent == 3 and merged.workers == 3 and merged.started == t0
    assert merged.ended == max(r.finished for r in results)
    from day0.client.loadgen import PhaseResult

    one = PhaseResult("measure", shape, results, t0, max(r.finished for r in results), 3,
                      [r.scheduled - t0 for r in results])
    a, b = compute_metrics(merged, [50, 99], {"ttft": 25.0}), compute_metrics(one, [50, 99], {"ttft": 25.0})
    assert a.samples == b.samples and a.stats == b.stats and a.goodput == b.goodput and a.errors == b.errors
    assert a.workers == 3 and b.workers == 1


def test_a_request_result_is_slotted_and_still_crosses_a_process_boundary():
    """An import holds a RequestResult per request, so it has no per-instance ``__dict__``. Load
    workers send results as JSON (``asdict`` and back), and a pickle (multiprocessing, a cache)
    must round-trip too: both give the same fields, bit for bit."""
    import pickle
    from array import array

    r = _result(7, 1000.0 + 1 / 3, ok=True)
    r.stalled_to_first = 1e-3
    assert not hasattr(r, "__dict__")
    with pytest.raises(AttributeError):
        r.not_a_field = 1  # type: ignore[attr-defined]
    back = pickle.loads(pickle.dumps(r))
    assert type(back) is RequestResult and asdict(back) == asdict(r) and back.ttft == r.ttft
    assert RequestResult(**json.loads(json.dumps(asdict(r)))) == r
    r.msg_t, r.msg_n = array("d", r.msg_t), array("B", r.msg_n)  # as an import builds them
    assert asdict(pickle.loads(pickle.dumps(r))) == asdict(r)


def test_a_workers_stall_is_taken_out_of_its_own_requests_only():
    """Each worker watches its own loop and stamps its own requests with what they stalled through
    as they end; merged, a request's figures lose its own worker's stalls (``*_without_stalls``),
    never another's, and the phase's longest stall is the longest of any worker's."""
    from day0.client.loadgen import LoopWatch

    t0 = 1000.0
    results = [_result(i, t0 + 0.005 * i) for i in range(6)]  # ~21 ms to first token: they overlap
    stall = (results[3].scheduled + 0.005, results[3].scheduled + 0.015)  # 10 ms inside request 3's TTFT
    quiet, stalled = LoopWatch(), LoopWatch()
    stalled.spans = [stall]
    for r in results:
        r.shard = r.index % 2
        (stalled if r.shard else quiet).stamp(r)
    parts = [ShardResult(0, results[0::2], 0, 4.0), ShardResult(1, results[1::2], 0, 10.0)]
    wire = [ShardResult.from_json(json.loads(json.dumps(p.to_json()))) for p in parts]
    assert wire[1].results[1].stalled_to_first == pytest.approx(0.010) and wire[1].loop_stall_ms == 10.0
    merged = merge_shards("search", LoadShape(mode="rate", request_rate=20.0, concurrency=0), wire, t0, [])
    assert merged.loop_stall_ms == 10.0
    m = compute_metrics(merged, [50, 99])
    taken = [a - b for a, b in zip(m.samples["ttft"], m.samples["ttft_without_stalls"])]
    first = [(r.scheduled, r.scheduled + r.ttft) for r in results]
    assert all(a < stall[1] and b > stall[0] for a, b in first[1:])  # all but the first in flight through it
    assert taken[3] == pytest.approx(10.0) and taken[1] > 0 and taken[5] > 0  # the stalled worker's
    assert taken[0::2] == [0, 0, 0]  # the other worker's: its loop ran


def test_a_shard_spec_survives_its_wire_format():
    reqs = build_requests(WorkloadSpec([4, 9], 3), VOCAB, 7)
    opts = ClientOptions(endpoint="chat", extra_body={"temperature": 0}, headers={"X": "1"}, stall_timeout_s=2.5)
    specs, _ = split_phase("http://h:1", "m", reqs, LoadShape(mode="rate", request_rate=9.0, concurrency=4,
                                                               duration_s=3.0), opts, 2, phase="sweep", tag="f00")
    for s in specs:
        back = ShardSpec.from_json(json.loads(json.dumps(s.to_json())))
        assert back == s and back.options.stall_timeout_s == 2.5 and back.requests[0].prompt == s.requests[0].prompt


def test_auto_workers_follow_the_offered_messages_and_stop_at_the_cores():
    rate = LoadShape(mode="rate", request_rate=100.0, concurrency=0)
    assert auto_workers(rate, 64, cores=8) == 1  # 6,400 messages/s: one loop times that
    assert auto_workers(LoadShape(mode="rate", request_rate=1000.0), 64, cores=8) == 8
    assert auto_workers(LoadShape(mode="rate", request_rate=1000.0), 64, cores=2) == 2
    assert auto_workers(LoadShape(mode="rate", request_rate=float("inf")), 64, cores=3) == 3
    assert auto_workers(LoadShape(concurrency=4), 64, cores=8) == 1
    assert auto_workers(LoadShape(concurrency=1000), 64, cores=8) == 4


@pytest.mark.parametrize(("url", "here"), [
    ("http://127.0.0.1:8000", True), ("http://127.8.0.2:8000/v1", True), ("http://localhost:1", True),
    ("http://[::1]:8000", True), ("http://0.0.0.0:1", True), ("http://LOCALHOST:1", True),
    ("http://198.51.100.7:8000", False),  # TEST-NET-2: no interface here holds it
    ("http://gpu-node-7.example.invalid:8000", False),  # a name: never resolved, counted as elsewhere
    ("", False), (None, False)])
def test_a_server_on_this_host_is_told_from_one_elsewhere(url, here):
    assert server_on_this_host(url) is here


def test_the_client_leaves_a_core_to_a_server_on_its_host(monkeypatch):
    """The ladder on 2 cores: with the server on loopback one in-process worker beat two worker
    processes in 8 of 14 runs, lost in 2 (docs/stages/latency.md); a remote server leaves every core to
    the client."""
    import day0.client.workers as workers

    monkeypatch.setattr(workers, "usable_cores", lambda: 2)
    assert client_cores("http://127.0.0.1:8000") == 1 and client_cores("http://198.51.100.7:8000") == 2
    heavy = LatencySection(load="rate", request_rate=400.0, concurrency=0, output_len=64)  # 25,600 msg/s
    assert load_workers(heavy, "http://127.0.0.1:8000") == 1 and load_workers(heavy, "http://198.51.100.7:1") == 2
    assert load_workers(heavy.model_copy(update={"workers": 2}), "http://127.0.0.1:8000") == 2  # as set, always
    monkeypatch.setattr(workers, "usable_cores", lambda: 1)
    assert client_cores("http://127.0.0.1:8000") == 1  # never none


def test_a_search_has_every_core_the_client_may_take_and_each_phase_what_its_load_needs(server, monkeypatch):
    """A search's loads are not known before it runs (up to what the server completes flat out):
    sized on the measured load alone, a GPU server's search would lag on one worker and end
    "could not measure". So its pool has every core the client may take and each phase uses one
    worker per AUTO_MESSAGES_PER_WORKER messages a second it offers (here 50: 20 req/s of 4 tokens
    needs 2, 40 needs 4 and gets the pool's 3)."""
    import day0.client.workers as workers
    import day0.stages.latency.settings as settings_mod
    from day0.config.latency import CapacitySearch

    monkeypatch.setattr(settings_mod, "client_cores", lambda url=None: 3)
    monkeypatch.setattr(workers, "AUTO_MESSAGES_PER_WORKER", 50.0)
    server.set_script(Script(ttft_ms=[5], gaps_ms=[2]))
    s = LatencySection(num_requests=4, warmup_requests=0, output_len=4, input_len=8, concurrency=1,
                       server_metrics=False, search=CapacitySearch(start_rate=5.0, max_rate=50.0, probe_requests=16,
                                                                   requests=30, saturation_requests=0))
    assert load_workers(s, server.url) == 3 and load_workers(s.model_copy(update={"search": None}), server.url) == 1
    run = run_latency(server.url, "scripted", VOCAB, s, SlaSection(ttft_p90_ms=2000))
    used = {pt.load: pt.metrics.workers for pt in run.search.points}
    assert run.metrics.workers == 1 and used[5.0] == 1 and used[20.0] == 2 and max(used.values()) == 3, used


# ----------------------------------------------------------------------------- live, against the scripted server


@pytest.fixture(scope="module")
def server():
    with SSEServer() as srv:
        yield srv


def test_the_worker_protocol_runs_a_shard_from_a_given_start(server):
    """The seam a node launcher would use: a spec in, READY, go with t=0, raw results out."""
    server.set_script(Script(ttft_ms=[10], gaps_ms=[2], tokens_per_message=[1, 2]))
    reqs = build_requests(WorkloadSpec(6, 5), VOCAB, 6)
    specs, offsets = split_phase(server.url, "scripted", reqs, LoadShape(mode="rate", request_rate=100.0,
                                                                         concurrency=0), ClientOptions(), 2,
                                 phase="measure", tag="0a0b0c")
    import time

    t0 = time.perf_counter() + 0.2
    stdin = io.StringIO(json.dumps({"cmd": "prepare", "spec": specs[1].to_json()}) + "\n"
                        + json.dumps({"cmd": "go", "t0": t0}) + "\n")
    stdout = io.StringIO()
    assert worker_main(stdin, stdout) == 0
    lines = stdout.getvalue().splitlines()
    assert lines[0] == "READY"
    res = ShardResult.from_json(json.loads(lines[1]))
    assert [r.index for r in res.results] == [1, 3, 5] and res.not_sent == 0
    # (t0 + offset) - t0 in doubles rounds by ~1e-12 s once perf_counter is large (a long-up host)
    assert [r.scheduled - t0 for r in res.results] == pytest.approx([offsets[i] for i in (1, 3, 5)], abs=1e-9)
    assert all(r.ok and r.output_tokens == 5 for r in res.results)
    assert sorted(e["index"] for e in server.log()) == [1, 3, 5]


def test_a_pool_splits_every_phase_and_the_stage_reports_its_workers(server):
    server.set_script(Script(ttft_ms=[12], gaps_ms=[2]))
    reqs = build_requests(WorkloadSpec(8, 4), VOCAB, 24)
    shape = LoadShape(mode="rate", request_rate=150.0, concurrency=0, seed=4, arrivals="vllm")
    opts = ClientOptions()

    async def go():
        async with WorkerPool(2) as pool:
            split = await pool.run_phase(server.url, "scripted", reqs, shape, opts)
            closed = await pool.run_phase(server.url, "scripted", reqs[:6], LoadShape(concurrency=3), opts,
                                          phase="warmup")
        async with make_streams(opts) as s:
            one = await run_phase(s, server.url, "scripted", reqs, shape, opts)
        return split, closed, one

    split, closed, one = asyncio.run(go())
    assert split.workers == 2 and closed.workers == 2 and one.workers == 1
    # every loop watched, each request marked with its shard
    assert split.loop_stall_ms is not None and one.loop_stall_ms is not None
    assert [r.shard for r in split.results] == [r.index % 2 for r in split.results]
    assert [r.index for r in split.results] == [r.index for r in one.results] == list(range(24))
    assert [r.scheduled - split.started for r in split.results] == pytest.approx(
        [r.scheduled - one.started for r in one.results], abs=1e-9)  # the very same schedule
    assert split.target_offsets == one.target_offsets and split.target_offsets[0] > 0  # vLLM's first gap
    assert all(r.ok and sum(r.msg_n) == 4 for r in split.results + closed.results)

    s = LatencySection(num_requests=10, warmup_requests=2, output_len=3, input_len=8, load="rate",
                       request_rate=80.0, concurrency=0, workers=2, server_metrics=False)
    run = run_latency(server.url, "scripted", VOCAB, s, SlaSection(ttft_p99_ms=2000))
    assert run.metrics.workers == 2 and run.metrics.completed == 10 and run.warmup.completed == 2
    table = {c.id: c for c in latency_checks(run)}["latency.output_throughput"].evidence["table"]["rows"]
    assert ["load workers (processes)", 2] in table


@pytest.mark.parametrize("shape", [LoadShape(mode="rate", request_rate=100.0, concurrency=0, seed=3),  # 4 s
                                   LoadShape(mode="concurrency", concurrency=4)],  # 400 x 35 ms / 4: 3.5 s
                         ids=["open", "closed"])
def test_a_stop_rule_judges_the_whole_phase_across_workers_and_stops_them_all(server, shape):
    """A search point's stop rule (``Until``) sees every worker's requests as they end, in one
    process; once it fires, no worker sends more. Without it a point above the answer would run
    to its end on a pool, its whole 30 s for a hold."""
    server.set_script(Script(ttft_ms=[20], gaps_ms=[5]))
    reqs = build_requests(WorkloadSpec(8, 4), VOCAB, 400)
    phase = f"stop{shape.mode}"
    seen: list[RequestResult] = []

    def until(r: RequestResult) -> bool:
        seen.append(r)
        return len(seen) >= 30

    async def go():
        async with WorkerPool(2) as pool:
            stopped = await pool.run_phase(server.url, "scripted", reqs, shape, ClientOptions(), phase=phase,
                                           until=until)
            after = await pool.run_phase(server.url, "scripted", reqs[:20], shape, ClientOptions(), phase="next")
        return stopped, after

    stopped, after = asyncio.run(asyncio.wait_for(go(), 60))
    assert {r.shard for r in seen[:30]} == {0, 1}  # both workers' requests, judged together
    assert 30 <= len(stopped.results) < 100 and stopped.not_sent == 400 - len(stopped.results), len(stopped.results)
    assert {(r.index, r.shard) for r in seen} <= {(r.index, r.shard) for r in stopped.results}
    assert [r.scheduled for r in stopped.results] == sorted(r.scheduled for r in stopped.results)  # merged
    received = [e for e in server.log() if e["phase"] == phase]
    assert len(received) < 120  # the stop reached the workers: nothing was sent for the seconds left
    # the next phase runs whole: a stop belongs to its own phase's tag
    assert len(after.results) == 20 and after.not_sent == 0 and all(r.ok for r in after.results)


def test_a_workers_stop_lands_only_on_the_shard_it_names():
    """The worker reads its stdin on a thread (``_Inbox``): a stop sets the running shard's event
    at once, and one for a shard already done or another phase's tag (the pool sends a stop to
    every worker, some of which have finished) is dropped, never queued for the next phase."""
    import os

    from day0.client.workers import _Inbox

    loop = asyncio.new_event_loop()
    read, write = os.pipe()
    inbox = _Inbox(os.fdopen(read), loop)
    out = os.fdopen(write, "w", buffering=1)

    def say(*msgs: dict) -> None:
        for m in msgs:
            out.write(json.dumps(m) + "\n")

    stop = asyncio.Event()
    say({"cmd": "stop", "tag": "z"}, {"cmd": "prepare", "n": 0})  # a phase already done: stale
    assert inbox.next() == {"cmd": "prepare", "n": 0}
    with inbox.running("a", stop):
        say({"cmd": "stop", "tag": "b"}, {"cmd": "prepare", "n": 1})
        assert inbox.next() == {"cmd": "prepare", "n": 1}
        loop.run_until_complete(asyncio.sleep(0))
        assert not stop.is_set()  # another phase's
        say({"cmd": "stop", "tag": "a"}, {"cmd": "prepare", "n": 2})
        assert inbox.next() == {"cmd": "prepare", "n": 2}
        loop.run_until_complete(asyncio.sleep(0))
        assert stop.is_set()
    out.close()
    assert inbox.next() is None  # stdin closed: the worker's loop ends
    loop.close()


def test_a_stop_read_before_its_shard_starts_stops_it_at_the_start():
    """The pool sends every worker a stop as soon as one worker's request fires the rule; a worker
    whose main thread had taken its ``go`` but not yet entered ``running`` dropped that stop and ran
    its whole shard. The stop is kept by its tag and the shard starts stopped; a later phase (its own
    tag) is not."""
    import os

    from day0.client.workers import _Inbox

    loop = asyncio.new_event_loop()
    read, write = os.pipe()
    inbox = _Inbox(os.fdopen(read), loop)
    out = os.fdopen(write, "w", buffering=1)
    for m in ({"cmd": "go", "t0": 0}, {"cmd": "stop", "tag": "a"}, {"cmd": "prepare", "n": 1}):
        out.write(json.dumps(m) + "\n")
    assert inbox.next() == {"cmd": "go", "t0": 0}
    assert inbox.next() == {"cmd": "prepare", "n": 1}  # the stop between them has been read
    stop, later = asyncio.Event(), asyncio.Event()
    with inbox.running("a", stop):
        assert stop.is_set()
    with inbox.running("b", later):
        assert not later.is_set()
    out.close()
    assert inbox.next() is None
    loop.close()


def test_a_worker_that_died_is_named_not_waited_for(server):
    reqs = build_requests(WorkloadSpec(4, 2), VOCAB, 4)

    async def go():
        async with WorkerPool(2) as pool:
            pool._workers[1].proc.kill()
            await pool._workers[1].proc.wait()
            await pool.run_phase(server.url, "scripted", reqs, LoadShape(concurrency=2), ClientOptions())

    with pytest.raises(WorkerError, match=r"load worker 1 exited \(rc -9\)"):
        asyncio.run(asyncio.wait_for(go(), 60))


def test_unreadable_worker_results_are_an_error_not_a_guess(server, monkeypatch):
    import day0.client.workers as workers

    monkeypatch.setattr(workers.ShardResult, "from_json", classmethod(lambda cls, data: data["missing"]))
    reqs = build_requests(WorkloadSpec(4, 2), VOCAB, 4)

    async def go():
        async with WorkerPool(2) as pool:
            await pool.run_phase(server.url, "scripted", reqs, LoadShape(concurrency=2), ClientOptions())

    with pytest.raises(WorkerError, match="a load worker's results cannot be read"):
        asyncio.run(go())
