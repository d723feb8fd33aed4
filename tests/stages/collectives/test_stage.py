"""The collectives stage judges a result written outside pytest (torchrun/srun's rank 0), given
by `[collectives] results_file`, with the same checks as a local sweep."""

import json
import subprocess
import sys

from tests.support import REPO


def test_stage_reads_a_result_written_by_the_per_rank_entry_point(tmp_path):
    out = tmp_path / "coll"
    made = subprocess.run([sys.executable, "-m", "day0.cli", "collectives", "run", "--local-ranks", "2",
                           "--out-dir", str(out), "--set", 'ops=["all_reduce", "broadcast"]',
                           "--set", 'min_bytes="1M"'],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert made.returncode == 0, made.stdout + made.stderr
    result = out / "collectives.json"
    assert result.is_file()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(REPO / "day0" / "suites"), "-m", "day0 and collectives", "-k", "exact_and_fast",
         "--day0-out", str(tmp_path / "reports"), "-p", "no:cacheprovider",
         "--day0-set", f'collectives.results_file="{result}"'],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = json.loads((tmp_path / "reports" / "latest" / "run.json").read_text())
    checks = {c["id"]: c for s in run["stages"] for c in s["checks"]}
    assert checks["collectives.all_reduce.correct"]["status"] == "pass"
    assert checks["collectives.broadcast.busbw"]["status"] == "pass"
    assert "collectives.all_gather.correct" not in checks  # only what the external run measured
    assert not (tmp_path / "reports" / "latest" / "collectives").exists()  # no local sweep was spawned
