"""Engine plumbing that needs no vLLM: root-cause extraction, CLI args, process-group shutdown."""

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from day0.engine.process import group_alive, stop_process_group
from day0.engine.rootcause import exception_root_cause, excerpt, root_cause
from day0.engine.server import cli_args
from tests.support import DATA


def test_root_cause_of_a_real_vllm_start_failure():
    # engine-block16.log: a real vLLM CPU server log, block_size=16 on the CPU attention backend
    text = (DATA / "engine-block16.log").read_text()
    assert root_cause(text) == "ValueError: No common block size for 16 (CPU_ATTN: [MultipleOf(32)])."


def test_root_cause_of_a_native_crash_is_the_crash_not_what_the_dying_core_logs_after():
    # engine-ep-segfault.log: a real vLLM CPU log (expert parallel, TP 2, 2026-12-01), trimmed: the
    # signal handler's native stack, then "RuntimeError: cancelled" and EngineDeadError wrappers
    text = (DATA / "engine-ep-segfault.log").read_text()
    assert "RuntimeError: cancelled" in text
    assert root_cause(text) == "segmentation fault in cpu_fused_moe.cpp:242 (fused_moe_impl)"


@pytest.mark.parametrize(
    "log, expected",
    [
        ("Fatal Python error: Illegal instruction\n\nThread 0x1 (most recent call first):\n"
         '  File "/x/site-packages/torch/nn/functional.py", line 9, in linear\n'
         '  File "/x/vllm/model_executor/layers/linear.py", line 88, in forward\n',
         "illegal instruction in linear.py:88 (forward)"),
        ("!!!!!!! Segfault encountered !!!!!!!\n  File \"<unknown>\", line 0, in raise\n",
         "segmentation fault in native code (the log shows no source frame)"),
        ("INFO a log that mentions SIGSEGV handlers and Segfault encountered counts in passing\n", None),
        ("usage: api_server.py [-h]\napi_server.py: error: unrecognized arguments: --bogus 1\n",
         "vLLM rejected its arguments: unrecognized arguments: --bogus 1"),
        ("(EngineCore pid=1) ERROR 11-30 09:41:42 [core.py:1] torch.OutOfMemoryError: CUDA out of memory.\n"
         "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n",
         "OutOfMemoryError: CUDA out of memory."),
        ("pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
         "  Value error, User-specified max_model_len (200000) is greater than the derived max_model_len\n"
         "    For further information visit https://errors.pydantic.dev/2.14/v/value_error\n",
         "ValidationError: 1 validation error for ModelConfig: Value error, User-specified max_model_len "
         "(200000) is greater than the derived max_model_len"),
        ("INFO all good\nINFO still good\n", None),
    ],
)
def test_root_cause_patterns(log, expected):
    assert root_cause(log) == expected


def test_cli_args_match_vllm_flag_spelling():
    assert cli_args({"max_num_seqs": 8, "enforce_eager": True, "enable_prefix_caching": False,
                     "speculative_config": {"method": "ngram"}, "seed": None}) == [
        "--max-num-seqs", "8", "--enforce-eager", "--no-enable-prefix-caching",
        "--speculative-config", '{"method":"ngram"}']


def test_a_table_is_one_word_for_a_shell():
    """The Slurm recipe splits DAY0_VLLM_ARGS on whitespace: a table must stay one word."""
    out = cli_args({"structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True}})
    assert " ".join(out).split() == out and json.loads(out[1])["disable_any_whitespace"] is True


@given(st.dictionaries(st.from_regex(r"[a-z]{1,6}(_[a-z]{1,6}){0,2}", fullmatch=True), st.integers(), max_size=5))
def test_cli_args_keep_every_value(args):
    out = cli_args(args)
    assert len(out) == 2 * len(args)
    for key, value in args.items():
        i = out.index("--" + key.replace("_", "-"))
        assert out[i + 1] == str(value)


def test_exception_root_cause_walks_the_chain():
    try:
        try:
            raise ValueError("No common block size for 16")
        except ValueError as inner:
            raise RuntimeError("Engine core initialization failed. See root cause above.") from inner
    except RuntimeError as exc:
        assert exception_root_cause(exc) == "ValueError: No common block size for 16"


def test_stop_process_group_leaves_nothing_behind():
    # a parent that ignores SIGTERM and a grandchild: both must go
    code = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    time.sleep(0.5)
    assert group_alive(proc.pid)
    t0 = time.monotonic()
    stop_process_group(proc, grace_s=1.0)
    assert not group_alive(proc.pid)
    assert time.monotonic() - t0 < 10


def test_excerpt_shows_the_root_cause_and_the_end():
    text = (DATA / "engine-block16.log").read_text()
    ex = excerpt(text)
    assert "No common block size for 16" in ex
    assert ex.splitlines()[-1] == text.splitlines()[-1]
    assert len(ex.splitlines()) < 40


def _interrupted_after(seconds: float, stop: Callable[[], None]) -> float:
    """Run ``stop`` with a Ctrl-C (a KeyboardInterrupt from SIGALRM) ``seconds`` into it, which it
    must raise; the seconds it took."""
    def second_interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, second_interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds)
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            stop()
        return time.monotonic() - t0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_second_interrupt_cuts_the_grace_short_but_never_the_kill():
    """Ctrl-C twice (or a CI runner's second SIGTERM) while a server that ignores SIGTERM is being
    stopped: the group is still SIGKILLed before the interrupt propagates (seen here: a vLLM server
    still starting up outlived the harness)."""
    code = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    time.sleep(0.5)

    elapsed = _interrupted_after(0.5, lambda: stop_process_group(proc, grace_s=60.0))
    assert not group_alive(proc.pid)
    assert elapsed < 30  # the 60 s grace was cut short


def test_the_grace_is_one_period_for_the_leader_and_its_group_together(monkeypatch):
    """A server that ignores SIGTERM gets ``grace_s`` in all before the SIGKILL, not ``grace_s`` for
    its leader and as much again for the rest of its group. A labelled fake: a clock that the waits
    advance instead of sleeping, and a group that never leaves."""
    from types import SimpleNamespace

    from day0.engine import process

    clock = [0.0]
    killed_at: list[float] = []

    def advance(s: float) -> None:
        clock[0] += s

    class Hung:
        pid = 4242

        def wait(self, timeout: float | None = None) -> int:
            advance(timeout or 0.0)
            raise subprocess.TimeoutExpired("hung", timeout or 0.0)

    monkeypatch.setattr(process, "time", SimpleNamespace(monotonic=lambda: clock[0], sleep=advance))
    monkeypatch.setattr(process, "group_alive", lambda pgid: True)
    monkeypatch.setattr(process, "signal_group", lambda pgid, sig=signal.SIGKILL: None)
    monkeypatch.setattr(process, "_kill_group", lambda proc, pgid: killed_at.append(clock[0]))
    process.stop_process_group(Hung(), grace_s=30.0)  # type: ignore[arg-type]
    assert killed_at == [pytest.approx(30.0, abs=0.5)]


def test_a_second_interrupt_while_one_node_stops_still_kills_every_node(tmp_path):
    """Two nodes that ignore SIGTERM, a Ctrl-C during the first one's grace: the interrupt comes out
    of stop() only once both groups are gone (a rank left running holds its devices and the
    rendezvous port), and the second node gets no grace of its own."""
    from day0.config.profile import load_profile
    from day0.engine.server import ServerEngine

    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    profile = load_profile("cpu-tiny", overrides={"engine": {"shutdown_timeout_s": 60}})
    engine = ServerEngine(profile, tmp_path, print, name="two-nodes")
    for node in ("node0", "node1"):
        proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
        engine.procs.append((node, proc, tmp_path / f"{node}.log"))
    pids = {node: proc.pid for node, proc, _ in engine.procs}
    time.sleep(0.5)

    elapsed = _interrupted_after(0.5, engine.stop)
    assert [node for node, pid in pids.items() if group_alive(pid)] == []
    assert elapsed < 30  # neither node waited out its 60 s


def test_the_package_hands_out_each_name_from_its_module_and_a_submodule_pulls_in_no_http_client():
    """``day0 weights audit`` imports day0.engine.loaded; the package's names load on first use, so
    that import no longer brings aiohttp's client (~0.3 s of every such process)."""
    import importlib

    import day0.engine as engine

    for name in engine.__all__:
        assert getattr(engine, name) is getattr(importlib.import_module(engine._HOME[name]), name)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        engine.Nope  # noqa: B018
    probe = "import sys, day0.engine.loaded; print(sorted(m for m in ('aiohttp', 'day0.engine.server') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
