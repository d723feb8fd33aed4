"""The layout is the architecture (DESIGN.md): data flows down the layers and never back up.

Read from the source with ``ast`` (no import is executed), so a crossed layer fails the build
with the file and line that crossed it, before anyone has to notice it in a review.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "day0"
# Lower layers first. A module may import its own layer and the layers below it.
LAYERS = ("core", "config", "model", "client", "engine", "stages", "results", "top")
MAX_LINES = 600
MAX_FUNCTION_LINES = 80


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in LAYERS[:-1]:
        return parts[1]
    return "top"  # day0.plugin, day0.session, day0.cli, day0.suites: they wire the layers together


def stage_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "stages" else None


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts}


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node except those under ``if TYPE_CHECKING:``: an import for annotations only is
    never executed, so it neither moves data nor closes a cycle."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in [child, *_runtime_nodes(child)])
            continue
        yield node
        yield from _runtime_nodes(node)


def imports(path: Path, known: set[str]) -> Iterator[tuple[str, int]]:
    """(imported day0 module, line) for every import in the file, lazy ones inside functions too."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            # `from day0.results import compare` imports the module day0.results.compare
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t.startswith("day0") and t != "day0" and t != me:
                yield t, node.lineno


def graph() -> dict[str, dict[str, int]]:
    mods = modules()
    known = set(mods)
    return {m: dict(imports(p, known)) for m, p in mods.items()}


def test_data_flows_down_the_layers():
    crossed = []
    for mod, deps in graph().items():
        for dep, line in deps.items():
            if LAYERS.index(layer(dep)) > LAYERS.index(layer(mod)):
                crossed.append(f"{mod}:{line} imports {dep} ({layer(mod)} -> {layer(dep)}, a higher layer)")
    assert not crossed, "\n".join(crossed)


def test_a_stage_never_imports_another_stage():
    crossed = [f"{mod}:{line} imports {dep}" for mod, deps in graph().items() for dep, line in deps.items()
               if stage_of(mod) and stage_of(dep) and stage_of(mod) != stage_of(dep)]
    assert not crossed, "\n".join(crossed)


def test_no_import_cycle():
    g = {m: set(d) for m, d in graph().items()}
    # A package's __init__ and its own submodules belong together; a cycle between them is Python's
    # ordinary package initialisation, not data flowing back up.
    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(g.get(m, ())):
            if state.get(d) == 1:
                cycle = stack[stack.index(d):] + [d]
                if not all(c.startswith(cycle[0] + ".") or c == cycle[0] for c in cycle):
                    cycles.append(" -> ".join(cycle))
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m)
    assert not cycles, "\n".join(cycles)


def _exception(path: Path) -> str | None:
    """A justified exception says so in its first lines: ``# size: <why>``."""
    for line in path.read_text(encoding="utf-8").splitlines()[:15]:
        if line.startswith("# size:"):
            return line
    return None


def test_modules_stay_small():
    big = [f"{module_name(p)}: {n} lines" for p in modules().values()
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES and not _exception(p)]
    assert not big, f"over {MAX_LINES} lines (split by what they hold, or say why in a '# size:' line):\n" + \
        "\n".join(big)


def test_functions_stay_short():
    long = []
    for p in modules().values():
        if _exception(p):
            continue
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{module_name(p)}.{node.name}: {n} lines")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


@pytest.mark.parametrize("mod, expected", [("day0.core.record", "core"), ("day0.stages.kvcache", "stages"),
                                           ("day0.plugin", "top"), ("day0.results.compare", "results")])
def test_layer_of_a_module(mod, expected):
    assert layer(mod) == expected
