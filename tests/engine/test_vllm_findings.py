"""Day-0 findings about the installed vLLM, kept as runnable reproductions (scripts/repro/).

A finding is a fact about vLLM, not about day0: the day vLLM fixes it the reproduction says so and
this test still passes. What it holds is that the reproduction runs, answers one of its two
answers, and that the answer and the exit code agree; a crash, a missing kernel library or an
output that says neither fails.
"""

from __future__ import annotations

import subprocess
import sys

from tests.support import REPO


def test_the_mla_rope_reproduction_answers_present_or_fixed():
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "repro" / "vllm_cpu_mla_rope.py")],
                         capture_output=True, text=True, timeout=300)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith(("q_pe", "k_pe", "the same op"))]
    assert out.returncode in (0, 1), out.stdout + out.stderr
    assert len(lines) == 3, out.stdout
    assert "correct" in lines[2], "the contiguous 2-D call is the control: it must be right either way"
    mla_wrong = any("WRONG" in ln for ln in lines[:2])
    assert mla_wrong == (out.returncode == 1), out.stdout
