"""scripts/repeat.py: reading a demo's verdict and a test run's outcome (the table we trust)."""

import importlib.util
import json
import os
import sys
import time

from tests.support import REPO

spec = importlib.util.spec_from_file_location("repeat_script", REPO / "scripts" / "repeat.py")
repeat = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = repeat  # dataclasses look their module up
spec.loader.exec_module(repeat)


def test_demo_outcome_names_the_checks_that_did_not_pass(tmp_path):
    started = time.time() - 1
    run = tmp_path / "r1"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"run_id": "r1", "verdict": "incomplete", "stages": [
        {"name": "kvcache", "checks": [{"id": "kvcache.blackbox_fragmentation", "status": "error"},
                                       {"id": "kvcache.fragmentation", "status": "pass"}]}]}))
    os.symlink("r1", tmp_path / "latest")
    o = repeat.demo_outcome(1, 0, 0, 12.0, started, tmp_path)
    assert o.verdict == "INCOMPLETE" and o.detail == "r1: kvcache.blackbox_fragmentation error" and not o.ok


def test_a_stale_record_is_not_taken_for_this_run(tmp_path):
    (tmp_path / "r0").mkdir()
    (tmp_path / "r0" / "run.json").write_text("{}")
    os.symlink("r0", tmp_path / "latest")
    o = repeat.demo_outcome(1, 0, 2, 5.0, time.time() + 60, tmp_path)
    assert o.verdict == "NO RECORD" and not o.ok


def test_test_outcome_reads_pytest_closing_line_and_failures(tmp_path):
    log = tmp_path / "t.log"
    log.write_text("FAILED tests/test_x.py::test_a - AssertionError\n"
                   "========== 1 failed, 590 passed, 2 skipped in 700.10s (0:11:40) ==========\n")
    o = repeat.test_outcome(1, 2, 2, 701.0, log)
    assert o.verdict == "RED" and o.detail == "1 failed, 590 passed, 2 skipped: tests/test_x.py::test_a"
    log.write_text("========== 593 passed, 2 skipped in 700.10s (0:11:40) ==========\n")
    assert repeat.test_outcome(2, 0, 0, 701.0, log).ok
