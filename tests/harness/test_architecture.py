"""The layout is the architecture (docs/architecture.md): data flows down the layers and never back up.

Read from the source with ``ast`` (no import is executed), so a crossed layer fails the build
with the file and line that crossed it, before anyone has to notice it in a review. Every import
counts, lazy ones inside functions and type-only ones under ``if TYPE_CHECKING:`` too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import REPO

PACKAGE = REPO / "day0"
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
    """The stage a module belongs to: a package under day0/stages/. The contract's own modules
    beside them (``day0.stages.context``, ``day0.stages.registry``) are no stage."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "stages" and (PACKAGE / "stages" / parts[2]).is_dir():
        return parts[2]
    return None


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts}


def imports_in(source: str, me: str, package: str, known: set[str]) -> Iterator[tuple[str, int]]:
    """(imported day0 module, line) for every import in ``source``, the text of module ``me`` in
    ``package``: lazy ones inside functions, and type-only ones under ``if TYPE_CHECKING:``, which
    are a dependency all the same (the module cannot be read or type-checked without the other),
    so they count for the layers and close cycles like any other."""
    for node in ast.walk(ast.parse(source)):
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


def imports(path: Path, known: set[str]) -> Iterator[tuple[str, int]]:
    """(imported day0 module, line) for every import in the file (:func:`imports_in`)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    return imports_in(path.read_text(encoding="utf-8"), me, package, known)


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


def test_an_import_under_type_checking_counts():
    source = ("from typing import TYPE_CHECKING\n"
              "if TYPE_CHECKING:\n"
              "    from day0.stages.latency.run import LatencyRun\n"
              "def f():\n"
              "    from ..core import record\n")
    found = dict(imports_in(source, "day0.config.x", "day0.config", {"day0.stages.latency.run", "day0.core.record"}))
    assert found == {"day0.stages.latency.run": 3, "day0.core.record": 5}


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


# The modules that may touch the engine's key: where the setting is declared (config), the redactor
# that scrubs it from every file, and the one module that reads it and makes the header.
KEY_READERS = {"day0.engine.endpoint", "day0.core.redact"}


def _reads_the_key(tree: ast.AST) -> list[int]:
    """Lines that read ``.api_key_env`` or build a bearer/Authorization header by hand."""
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "api_key_env" and isinstance(node.ctx, ast.Load):
            hits.append(node.lineno)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                (node.value == "Authorization" or node.value.startswith("Bearer ")):
            hits.append(node.lineno)
    return hits


def test_only_the_endpoint_reads_the_engine_key():
    """Exactly one module derives auth headers (day0.engine.endpoint.Endpoint); a stage, a suite or
    a client that read the key itself would be a second place a secret can leak from."""
    found = [f"{mod}:{line}" for mod, path in modules().items()
             if mod not in KEY_READERS and layer(mod) != "config"
             for line in _reads_the_key(ast.parse(path.read_text(encoding="utf-8")))]
    assert not found, "reads the engine's key outside day0/engine/endpoint.py:\n" + "\n".join(found)


def test_the_key_rule_can_fail():
    assert sorted(set(_reads_the_key(ast.parse("h = {'Authorization': f'Bearer {k}'}\nn = p.engine.api_key_env\n")))) == [1, 2]
    assert _reads_the_key(ast.parse("engine['api_key_env'] = name\n")) == []  # setting it is not reading it


def test_every_stage_package_declares_itself():
    from day0.stages.registry import builtin

    packages = sorted(p.name for p in (PACKAGE / "stages").iterdir() if (p / "__init__.py").is_file())
    assert sorted(s.name for s in builtin()) == packages
    assert stage_of("day0.stages.registry") is None and stage_of("day0.stages.kvcache.views") == "kvcache"

