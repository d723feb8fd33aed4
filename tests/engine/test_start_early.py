"""``engine.start_early``: the server is launched as the run starts and waited for by the first
stage that asks; a launch that fails is forgotten, a launch never waited for is still stopped.

The server process is a labelled fake: a real subprocess serving real HTTP on the port day0 chose,
answering /health after a scripted delay, in place of vLLM's minute of imports.
"""

from __future__ import annotations

import sys
import time

import pytest

from day0.config.profile import load_profile
from day0.engine import server as server_mod
from day0.engine.engines import Engines
from day0.engine.server import ServerEngine
from tests.support.fake_vllm import FAKE_SERVER


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch):
    """ServerEngine starts the fake server (healthy after ``delay`` s) instead of vLLM."""
    delay = {"s": 0.3}
    monkeypatch.setattr(ServerEngine, "command",
                        lambda self, model, port: [sys.executable, "-c", FAKE_SERVER, str(port), str(delay["s"])])
    return delay


def _engines(tmp_path) -> Engines:
    profile = load_profile("cpu-tiny", overrides={"engine": {"startup_timeout_s": 30}})
    return Engines(profile, tmp_path, lambda _: None)


def test_an_early_launch_is_waited_for_by_the_first_stage_and_timed_from_launch(fake_vllm, tmp_path):
    engines = _engines(tmp_path)
    engines.launch_early()
    time.sleep(1.0)  # preflight runs meanwhile
    t0 = time.perf_counter()
    engine = engines.http()
    waited = time.perf_counter() - t0
    try:
        assert engine.info is not None and engine.info.startup_s is not None
        assert engine.info.startup_s >= 1.0  # counted from the launch, not from the stage's request
        assert waited < engine.info.startup_s  # the stage waited for less than the start-up took
        assert engines.http() is engine  # one engine, as before
    finally:
        engines.stop()
    assert engine.proc is None


def test_a_failed_early_launch_is_forgotten_and_the_stage_starts_the_engine_itself(fake_vllm, tmp_path, monkeypatch):
    engines = _engines(tmp_path)
    real = server_mod.resolve_model
    monkeypatch.setattr(server_mod, "resolve_model", lambda *a, **k: (_ for _ in ()).throw(OSError("disk gone")))
    engines.launch_early()  # never raises: only a time saving
    monkeypatch.setattr(server_mod, "resolve_model", real)
    engine = engines.http()
    try:
        assert engine.info is not None and engine.info.startup_s is not None
    finally:
        engines.stop()


def test_an_early_launch_nobody_waited_for_is_stopped_with_the_run(fake_vllm, tmp_path):
    fake_vllm["s"] = 60.0  # still "loading" when the run ends (preflight failed, say)
    engines = _engines(tmp_path)
    engines.launch_early()
    launched = list(engines._launched.values())
    assert len(launched) == 1 and launched[0].proc is not None
    proc = launched[0].proc
    engines.stop()
    assert proc.poll() is not None


def test_a_fault_of_day0s_own_while_waiting_stops_the_engine_it_launched(fake_vllm, tmp_path, monkeypatch):
    """Not an EngineError (an `ip netns pids` that timed out, a bug): the early engine has left the
    launched list and never reached the started one, so only this stop keeps it from serving on,
    unreferenced, beside the next stage's fresh start."""
    engines = _engines(tmp_path)
    engines.launch_early()
    (early,) = engines._launched.values()
    proc = early.proc
    assert proc is not None
    monkeypatch.setattr(ServerEngine, "wait", lambda self: (_ for _ in ()).throw(RuntimeError("day0's own fault")))
    with pytest.raises(RuntimeError, match="day0's own fault"):
        engines.http()
    assert proc.poll() is not None and early.procs == []


def test_only_a_server_is_launched_early(tmp_path):
    profile = load_profile("cpu-tiny", overrides={"engine": {"mode": "inprocess"}})
    engines = Engines(profile, tmp_path, lambda _: None)
    engines.launch_early()
    assert engines._launched == {}


def test_the_session_launches_while_preflight_runs_and_only_when_a_later_stage_wants_the_engine(tmp_path):
    from day0.session import Day0Session

    launches: list[str] = []

    def session(wanted: bool, start_early: bool = True) -> Day0Session:
        profile = load_profile("cpu-tiny", overrides={"engine": {"start_early": start_early}})
        s = Day0Session(profile, tmp_path / f"out-{len(launches)}-{wanted}-{start_early}", log=lambda m: None)
        s.engines.launch_early = lambda: launches.append(s.run_id)  # type: ignore[method-assign]
        s.start(engine_wanted=wanted)
        return s

    s = session(wanted=True)
    s.stage_starting("weights")  # a stage that touches the deployment asks for the engine itself
    assert launches == []
    s.stage_starting("preflight")
    s.stage_starting("preflight")
    assert launches == [s.run_id]  # once, as preflight begins
    session(wanted=False).stage_starting("preflight")  # -m preflight: nothing later needs it
    session(wanted=True, start_early=False).stage_starting("preflight")
    assert launches == [s.run_id]


def test_a_preflight_failure_stops_the_early_engine_and_a_later_failure_does_not(fake_vllm, tmp_path):
    from day0.core.record import Check
    from day0.session import Day0Session

    fake_vllm["s"] = 60.0
    s = Day0Session(load_profile("cpu-tiny", overrides={"engine": {"startup_timeout_s": 30}}), tmp_path / "out",
                    log=lambda m: None)
    s.start(engine_wanted=True)
    s.stage_starting("preflight")
    proc = next(iter(s.engines._launched.values())).proc
    s.add_check("weights", Check(id="weights.x", title="x", status="fail"))  # a stage that uses the engine
    assert proc is not None and proc.poll() is None and s.engines._launched  # its own later tests may
    s.add_check("preflight", Check(id="preflight.lint", title="lint", status="fail"))
    assert s.engines._launched == {} and proc.wait(timeout=30) is not None
    s.finish(1)
