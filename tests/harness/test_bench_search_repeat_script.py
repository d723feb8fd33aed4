"""benchmarks/bench_search_repeat.py: a ``--versus-tree`` arm runs another checkout's day0, so a
change and its parent are paired on one server; what that pairing rests on is which day0 the
arm's process imports."""

import importlib.util
import subprocess
import sys

from tests.support import REPO

spec = importlib.util.spec_from_file_location("bench_search_repeat", REPO / "benchmarks" / "bench_search_repeat.py")
bench = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = bench
spec.loader.exec_module(bench)


def imported_day0(env: dict[str, str] | None) -> str:
    """Where a child started in this checkout (the working folder the bench's arms run in) finds day0."""
    return subprocess.run([sys.executable, "-c", "import day0; print(day0.__file__)"], cwd=REPO, env=env,
                          capture_output=True, text=True, check=True).stdout.strip()


def test_the_other_arm_imports_day0_from_its_own_tree_not_from_the_working_folder(tmp_path):
    (tmp_path / "day0").mkdir()
    (tmp_path / "day0" / "__init__.py").write_text("")
    assert imported_day0(bench.tree_env(tmp_path)) == str(tmp_path / "day0" / "__init__.py")
    assert imported_day0(bench.tree_env(None)) == str(REPO / "day0" / "__init__.py")  # arm A: this checkout's
    # without PYTHONSAFEPATH the working folder, first on the path, would shadow the other tree
    leaky = {**bench.tree_env(tmp_path)}
    leaky.pop("PYTHONSAFEPATH")
    assert imported_day0(leaky) == str(REPO / "day0" / "__init__.py")
