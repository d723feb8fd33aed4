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


def test_two_arms_run_abba_on_the_same_seeds_from_the_first_one():
    paired = bench.schedule(3, ["A", "B"], first_seed=10)
    assert paired == [("A", 10), ("B", 10), ("B", 11), ("A", 11), ("A", 12), ("B", 12)]
    assert bench.schedule(2, ["A"], first_seed=5) == [("A", 5), ("A", 6)]
    assert bench.schedule(2, ["A", "B"]) == [("A", 0), ("B", 0), ("B", 1), ("A", 1)]
