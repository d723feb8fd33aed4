"""Progress on long work: the engine start-up tail (vLLM's own loading lines, live) and the
shared progress helper (a bar on a terminal, a rate-bounded line in a CI log)."""

from __future__ import annotations

import io
from pathlib import Path

from day0.core.progress import Progress
from day0.engine.server import LogTail

VLLM_LINES = [
    "(APIServer pid=4242) INFO 11-30 23:59:01 [api_server.py:1805] vLLM API server version 0.11.0",
    "(EngineCore_DP0 pid=4300) INFO 11-30 23:59:09 [gpu_model_runner.py:2602] Starting to load model /m/llama...",
    "(EngineCore_DP0 pid=4300) INFO 11-30 23:59:10 [default_loader.py:267] Loading weights took 41.20 seconds",
    "(EngineCore_DP0 pid=4300) DEBUG 11-30 23:59:10 [utils.py:1] some chatter",
    "(EngineCore_DP0 pid=4300) INFO 11-30 23:59:30 [kv_cache_utils.py:1087] GPU KV cache size: 1,204,224 tokens",
]


def _tail(tmp_path: Path, **kw: object) -> tuple[Path, LogTail, list[str]]:
    log = tmp_path / "vllm-server.log"
    log.write_text("$ vllm serve /m/llama --api-key ***\n")
    shown: list[str] = []
    return log, LogTail(log, shown.append, **kw), shown  # type: ignore[arg-type]


def _append(path: Path, text: str) -> None:
    with path.open("a") as fh:
        fh.write(text)


def test_startup_tail_shows_new_loading_lines_once_without_vllms_prefix(tmp_path: Path) -> None:
    log, tail, shown = _tail(tmp_path)
    assert tail.poll() == 0 and shown == []
    _append(log, "\n".join(VLLM_LINES[:3]) + "\n")
    assert tail.poll() == 2
    assert shown == ["Starting to load model /m/llama...", "Loading weights took 41.20 seconds"]
    assert tail.poll() == 0 and len(shown) == 2  # each line once
    _append(log, VLLM_LINES[3] + "\n" + VLLM_LINES[4][:60])  # the KV-cache line is still being written
    tail.poll()
    assert len(shown) == 2
    _append(log, VLLM_LINES[4][60:] + "\n")
    tail.poll()
    assert shown[-1] == "GPU KV cache size: 1,204,224 tokens"


def test_startup_tail_is_bounded_per_poll_and_in_width(tmp_path: Path) -> None:
    log, tail, shown = _tail(tmp_path, per_poll=3, width=80)
    _append(log, "".join(f"ERROR worker {i} failed: {'x' * 200}\n" for i in range(50)))
    tail.poll()
    assert len(shown) == 4 and shown[0] == "(47 earlier such lines in vllm-server.log)"
    assert shown[-1].startswith("ERROR worker 49 failed: xxx") and all(len(line) <= 80 for line in shown)


def test_startup_tail_far_behind_reads_only_the_newest_part(tmp_path: Path) -> None:
    log, tail, shown = _tail(tmp_path, max_read=4096)
    _append(log, "Loading old stuff\n" * 10_000 + "Loading weights took 1.0 seconds\n")
    tail.poll()
    assert shown[-1] == "Loading weights took 1.0 seconds"
    earlier = int(shown[0].split()[0].lstrip("("))
    assert earlier < 4096 // len("Loading old stuff\n")  # only the newest 4 KiB was read
    assert tail.pos == log.stat().st_size


def test_startup_tail_of_a_missing_log_shows_nothing(tmp_path: Path) -> None:
    shown: list[str] = []
    assert LogTail(tmp_path / "absent.log", shown.append).poll() == 0 and shown == []


def test_progress_in_a_ci_log_is_rate_bounded_lines() -> None:
    lines: list[str] = []
    bar = Progress(10, "sha256", "files", log=lines.append, every_s=3600)
    for _ in range(10):
        bar.update(1)
    bar.close()
    assert lines == []  # short work logs nothing
    bar = Progress(4, "kvcache workload", "requests", log=lines.append, every_s=0)
    bar.update(1, "step 7")
    bar.set(3)
    bar.close()
    assert lines[0].startswith("kvcache workload: 1/4 requests (25%), step 7, ")
    assert lines[1].startswith("kvcache workload: 3/4 requests (75%), step 7")
    assert lines[-1].endswith("(done)") and len(lines) == 3


def test_progress_on_a_terminal_is_a_tqdm_bar() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    with Progress(2048, "sha256", "B", stream=out, unit_scale=True) as bar:
        bar.update(1024)
        bar.update(1024)
    assert "sha256" in out.getvalue() and "\r" in out.getvalue()
    plain = io.StringIO()  # not a terminal: no bar, and nothing at all for quick work
    with Progress(2, "sha256", "B", stream=plain) as bar:
        bar.update(2)
    assert plain.getvalue() == ""


def test_wait_healthy_shows_the_engine_log_redacted_while_waiting(tmp_path: Path, monkeypatch) -> None:
    """Start-up tail, as ServerEngine uses it: lines written while /health fails reach the run's
    log, through the run's redactor; none of this starts vLLM (a sleeping process stands in)."""
    import subprocess
    import time

    from day0.config.profile import load_profile
    from day0.engine.server import ServerEngine

    monkeypatch.setenv("HF_TOKEN", "hf_secretsecretsecretsecret1234")
    shown: list[str] = []
    eng = ServerEngine(load_profile("cpu-tiny"), tmp_path, shown.append)
    eng.log_path.write_text("$ vllm serve\n")
    eng.procs.append(("node0", subprocess.Popen(["sleep", "30"]), eng.log_path))
    polls = iter(range(100))

    def healthy() -> bool:
        n = next(polls)
        if n == 1:
            _append(eng.log_path, "INFO 11-30 23:59:10 [loader.py:1] Loading weights took 2.0 s "
                                  "(token hf_secretsecretsecretsecret1234)\n")
        return n >= 3

    monkeypatch.setattr(eng, "_healthy", healthy)
    try:
        eng._wait_healthy(time.perf_counter(), 60)
    finally:
        eng.proc.kill()
        eng.proc.wait()
    assert len(shown) == 1 and shown[0].startswith("vllm: Loading weights took 2.0 s")
    assert "hf_secret" not in shown[0]
