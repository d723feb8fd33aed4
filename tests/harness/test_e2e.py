"""End to end: `pytest -m day0` for real, against a live vLLM engine serving the tiny model.

Each test starts its own pytest session (and so its own engine) in a subprocess; they are the
slow part of the suite (about a minute each on 2 cores), so they cover one thing each.
"""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from day0.core.record import load
from day0.engine import group_alive
from day0.engine.rpc_folder import FOLDER_LINE
from day0.engine.server import RENDEZVOUS_FILE
from tests.support import REPO

pytestmark = pytest.mark.engine  # starts vLLM: one such test at a time under xdist (tests/conftest.py)

SUITES = REPO / "day0" / "suites"
# cpu-tiny's SLA is a figure of a quiet 2-core box. These tests check the pipeline, so its latency
# limits are widened here: a CI box shared with other jobs missed them (TTFT p99 9.6 s, two busy
# processes and two engines beside it) and the run was, rightly, REJECTED. The SLA verdict itself
# is tested without an engine (tests/stages/latency).
WIDE_SLA = ("--day0-set", "sla.ttft_p90_ms=600000", "--day0-set", "sla.tpot_p90_ms=60000",
            "--day0-set", "sla.e2e_p90_ms=6000000", "--day0-set", "sla.min_output_throughput_tok_s=0")


# A bound on a run that ran away, not a figure: the default run with its two extra probes took 221 s
# alone on the CI box, 559-568 s beside a second worker, and past 600 s beside another worker's engines
# (it runs without them now, test_secrets.py's keyed run with them).
RUNAWAY_S = 1800.0


def day0_run(tmp_path: Path, *args: str, marker: str = "day0", timeout: float = RUNAWAY_S) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", str(SUITES), "-m", marker, "--day0-out", str(tmp_path / "reports"),
         "-p", "no:cacheprovider", "-rA", *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=timeout,
    )


def test_default_profile_runs_against_a_live_server(tmp_path):
    # the two probes the default run leaves out (a TP=2 engine against TP=1, lm-eval's task accuracy
    # against transformers) run in tests/core/test_secrets.py's keyed run, which needs them anyway
    proc = day0_run(tmp_path, *WIDE_SLA)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    rec = load(tmp_path / "reports" / "latest" / "run.json")
    by_id = {c.id: c for c in rec.checks()}
    assert by_id["collectives.engine_tp2_matches_tp1"].status == "skip" and by_id["risks.accuracy.task_delta"].status == "skip"
    # every stage timed, in the record and the terminal table
    assert all(s.duration_s is not None and s.duration_s > 0 for s in rec.stages[:6]), [s.duration_s for s in rec.stages]
    assert any(line.split()[:2] == ["latency", "pass"] and line.split()[2].replace(".", "").isdigit()
               for line in out.splitlines()), out[-3000:]
    assert rec.environment["vllm"] and rec.environment["torch"] and rec.environment["python"]
    assert rec.environment["devices"][0]["kind"] == "cpu"
    assert rec.profile["name"] == "cpu-tiny"
    assert rec.stage("preflight").verdict == "pass" and rec.stage("collectives").verdict == "pass"
    # the API agents use: the template as transformers renders it; cpu-tiny waives only the known
    # control-character failures (its [report] waivers), never shown as a pass
    assert by_id["agents.chat_template"].status == "pass" and by_id["agents.tool_parser"].status == "pass"
    assert rec.stage("agents").verdict in ("pass", "waived")
    assert by_id["agents.structured_outputs"].evidence["sent"] == 30 and by_id["agents.tool_calls"].evidence["sent"] == 24
    smoke = {c.id: c for c in rec.stage("weights").checks}
    assert smoke["weights.smoke.tokens"].status == "pass"
    assert smoke["weights.smoke.deterministic"].status == "pass"
    assert smoke["weights.smoke.tokens"].source == "http"
    engine = rec.notes["engine.http"]
    assert engine["mode"] == "server" and engine["startup_s"] > 0
    # one CPU run gives both views: the kvcache stage started the in-process scheduler view beside it
    assert rec.notes["engine.scheduler"]["mode"] == "inprocess"
    latency = {c.id: c for c in rec.stage("latency").checks}
    assert latency["latency.ttft_p99"].source == "http" and latency["latency.server_agreement"].status == "pass"
    assert {c.source for c in rec.stage("kvcache").checks} >= {"scheduler", "http"}
    # the server's whole process group is gone once the session is over
    assert not group_alive(engine["pgid"])
    # at one rank the worker runs inside the engine core: no worker process, no third vLLM import
    # at start-up (cpu-tiny's VLLM_ENABLE_V1_MULTIPROCESSING; docs/engine.md, "Start-up time")
    log = Path(engine["log_path"]).read_text()
    assert "(EngineCore" in log and "(Worker" not in log and "(VllmWorker" not in log, log[-2000:]
    # nothing of the server's is left in the temp folder: its sockets' folder, its rendezvous file
    # (docs/engine.md, "What a server leaves in the temp folder")
    left = [Path(m.group(1)) for m in (*FOLDER_LINE.finditer(log), *RENDEZVOUS_FILE.finditer(log))]
    assert len(left) == 2 and not [p for p in left if p.exists()], left
    assert "verdict:" in out and "run record:" in out
    # the report and the JUnit file are rendered from the record at the end of the session
    latest = tmp_path / "reports" / "latest"
    html = (latest / "report.html").read_text()
    assert rec.run_id in html and "weights.smoke.tokens" in html
    assert 'classname="weights"' in (latest / "junit.xml").read_text()
    assert f"report: {latest.resolve() / 'report.html'}" in out


def test_engine_start_failure_is_one_root_cause_line(tmp_path):
    t0 = time.monotonic()
    proc = day0_run(tmp_path, "--day0-set", "engine.args.block_size=16", "--day0-set", "engine.startup_timeout_s=240",
                    "-k", "engine_is_live")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert time.monotonic() - t0 < 300
    assert "day0: engine failed: ValueError: No common block size for 16 (CPU_ATTN: [MultipleOf(32)])" in out
    error_section = out.split("= ERRORS =")[1].split("= day0 =")[0]
    assert "Traceback" not in error_section
    rec = load(tmp_path / "reports" / "latest" / "run.json")
    assert rec.verdict == "rejected"
    (check,) = [c for c in rec.stage("weights").checks if c.status == "fail"]  # the deployment does not start
    assert "No common block size for 16" in check.message
    assert "No common block size" in check.evidence["log_excerpt"]
    assert not group_alive(check.evidence["engine_pgid"])


def test_engine_start_timeout_is_bounded_and_cleans_up(tmp_path):
    t0 = time.monotonic()
    proc = day0_run(tmp_path, "--day0-set", "engine.startup_timeout_s=4", "-k", "engine_is_live")
    elapsed = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "vLLM server not healthy within engine.startup_timeout_s = 4 s" in out
    assert elapsed < 120, elapsed
    rec = load(tmp_path / "reports" / "latest" / "run.json")
    (check,) = [c for c in rec.stage("weights").checks if c.status == "fail"]  # not up within its limit
    assert rec.verdict == "rejected"
    assert check.evidence["engine_pgid"] and not group_alive(check.evidence["engine_pgid"])
    assert "engine.http" not in rec.notes  # it never became healthy



def test_inprocess_engine_gives_the_scheduler_view_and_meets_its_recorded_golden_tokens(tmp_path):
    """`day0 weights golden` records a trusted run on an engine driven in process (the scheduler's
    view, no server beside it), and the stage compares against it. A third in-process engine here
    (another seed, ~20 s of the suite's engine worker) showed that file rejecting other weights in a
    whole run; the parts stay tested apart: the check on a tokens-only file with other tokens
    (tests/stages/weights/test_stage.py, a fake engine), a live engine serving a corrupted copy
    rejected at its position (tests/model/test_reference.py, a transformers-written file), and a
    failed check ending a whole run in exit 1 (test_engine_start_failure_is_one_root_cause_line)."""
    prof = tmp_path / "inproc.toml"
    prof.write_text('extends = "cpu-tiny"\n[engine]\nmode = "inprocess"\n')
    golden = tmp_path / "golden.json"
    made = subprocess.run([sys.executable, "-m", "day0.cli", "weights", "golden", "--profile", str(prof),
                           "-o", str(golden)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    same = day0_run(tmp_path, *WIDE_SLA, "--day0-profile", str(prof), "--day0-set", f'weights.golden="{golden}"',
                    marker="day0 and (weights or latency)")
    assert same.returncode == 0, same.stdout + same.stderr
    rec = load(tmp_path / "reports" / "latest" / "run.json")
    checks = {c.id: c for c in rec.checks()}
    assert checks["weights.golden_tokens"].status == "pass", checks["weights.golden_tokens"].message
    live = [c for c in rec.stage("weights").checks if c.id.startswith("weights.smoke")]
    assert {c.source for c in live} == {"scheduler"} and all(c.status == "pass" for c in live)
    assert rec.notes["engine.scheduler"]["mode"] == "inprocess"
    # stage 3 drove vLLM's engine directly and cross-checked with vLLM's own per-request TTFT
    assert checks["latency.ttft_p99"].status == "pass" and checks["latency.ttft_p99"].source == "scheduler"
    assert checks["latency.engine_agreement"].status == "pass"
    assert "engine.http" not in rec.notes  # no server was started beside it
