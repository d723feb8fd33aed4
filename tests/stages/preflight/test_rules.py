"""The installed vLLM's rules are read once per install and kept (``day0.stages.preflight.rules``):
a later process gets the same rules without importing vLLM, a changed install is read again, and a
kept file that is damaged or cannot be written costs only the import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from day0.stages.preflight import rules as rules_mod
from day0.stages.preflight.rules import RULES_SOURCES, SNAPSHOT, install_key, read_vllm_rules, vllm_root, vllm_rules

REPO = Path(__file__).resolve().parents[3]
FRESH = """
import json, sys
from pathlib import Path
from day0.stages.preflight.rules import vllm_rules
r = vllm_rules(Path(sys.argv[1]))
print(json.dumps({"imported_vllm": "vllm" in sys.modules, "from_vllm": r.from_vllm, "version": r.version,
                  "args": len(r.engine_arg_names), "quant": list(r.quantization_methods)}))
"""


def fresh_process(cache: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", FRESH, str(cache)], capture_output=True, text=True, timeout=300,
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def live():
    rules = read_vllm_rules()
    if not rules.from_vllm:
        pytest.skip("vLLM does not import here: nothing to keep")
    return rules


def test_a_second_process_gets_the_installed_rules_without_importing_vllm(tmp_path, live):
    first = fresh_process(tmp_path)
    assert first["imported_vllm"] and first["from_vllm"]
    (kept,) = (tmp_path / "vllm-rules").glob("*.json")
    second = fresh_process(tmp_path)
    assert not second["imported_vllm"], "the kept rules were not used"
    assert second == {**first, "imported_vllm": False}
    assert (second["version"], second["args"]) == (live.version, len(live.engine_arg_names))
    assert vllm_rules(tmp_path) == live  # every field, kept and read back
    assert kept.stem == install_key(vllm_root())


def test_a_changed_install_is_another_key(tmp_path):
    root = tmp_path / "vllm"
    for rel in RULES_SOURCES:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x = 1\n")
    key = install_key(root)
    assert install_key(root) == key
    (root / "engine" / "arg_utils.py").write_text("x = 12\n")  # an upgrade or an edit rewrites it
    assert install_key(root) != key
    moved = tmp_path / "elsewhere" / "vllm"
    moved.parent.mkdir()
    root.rename(moved)
    assert install_key(moved) != install_key(root)


@pytest.mark.parametrize("damage", ["cut short", "not json", "another format", "a field missing"])
def test_a_damaged_kept_file_is_read_from_vllm_again_and_replaced(tmp_path, live, damage):
    vllm_rules(tmp_path)
    (kept,) = (tmp_path / "vllm-rules").glob("*.json")
    whole = json.loads(kept.read_text())
    kept.write_text({"cut short": kept.read_text()[:40], "not json": "\x00\x01",
                     "another format": json.dumps({**whole, "format": 0, "version": "9.9"}),
                     "a field missing": json.dumps({k: v for k, v in whole.items() if k != "dtypes"})}[damage])
    assert vllm_rules(tmp_path) == live
    assert json.loads(kept.read_text()) == whole


def test_a_cache_that_cannot_be_written_still_gives_the_rules(tmp_path, live):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder would be\n")
    assert vllm_rules(blocked) == live


def test_without_vllm_the_snapshot_is_used_and_nothing_is_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(rules_mod, "vllm_root", lambda: None)
    assert vllm_rules(tmp_path) == SNAPSHOT and not SNAPSHOT.from_vllm
    assert not (tmp_path / "vllm-rules").exists()
