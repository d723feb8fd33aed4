"""The ordered list of Day0 stages: the built-in packages under ``day0/stages/`` and the ones a
site installs through the ``day0.stages`` entry-point group (pytest's own plugin registration is
the model: ``[project.entry-points."day0.stages"] mystage = "mypkg.stage:STAGE"``).

Order decides gating: a stage that fails blocks every stage after it. Built-ins declare their
place (``order`` 0-60); a site stage without one runs after them, in name order.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from day0.core.stages import DERIVED_STAGES, Stage, StageDeclarationError

ENTRY_POINT_GROUP = "day0.stages"


class RegistryError(ValueError):
    """A stage that cannot be registered; the message names the entry point or package."""


@dataclass(frozen=True)
class Registry:
    stages: tuple[Stage, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.stages)

    def get(self, name: str) -> Stage | None:
        return next((s for s in self.stages if s.name == name), None)

    def index(self, name: str) -> int:
        return self.names.index(name)

    def before(self, name: str) -> tuple[str, ...]:
        """The stages that gate ``name`` (every one before it)."""
        return self.names[: self.index(name)] if name in self.names else ()

    @property
    def repeatable(self) -> frozenset[str]:
        return frozenset(s.name for s in self.stages if s.repeatable)

    def with_run(self) -> tuple[Stage, ...]:
        """Stages whose test is their ``run(ctx)`` (no suite module of their own)."""
        return tuple(s for s in self.stages if s.run is not None and s.suite is None)


def builtin() -> tuple[Stage, ...]:
    """Every package under ``day0/stages/`` with a ``STAGE``, in declared order."""
    found = []
    for mod in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if not mod.ispkg:
            continue
        stage = getattr(importlib.import_module(f"day0.stages.{mod.name}"), "STAGE", None)
        if isinstance(stage, Stage):
            found.append(stage.validate())
    return tuple(sorted(found, key=lambda s: (s.order, s.name)))


def from_entry_points(eps: Iterable[metadata.EntryPoint] | None = None) -> tuple[Stage, ...]:
    """The site stages installed in this environment; one bad entry point stops the run in one line
    (a stage that silently went missing would let a run be ACCEPTED without it)."""
    eps = metadata.entry_points(group=ENTRY_POINT_GROUP) if eps is None else eps
    found = []
    for ep in sorted(eps, key=lambda e: e.name):
        dist = getattr(ep.dist, "name", None) or "?"
        where = f"entry point {ep.name} = {ep.value!r} (distribution {dist}, group {ENTRY_POINT_GROUP})"
        try:
            stage = ep.load()
        except Exception as exc:  # an import error in a site's package: name it, never a traceback
            raise RegistryError(f"{where}: cannot load: {type(exc).__name__}: {exc}") from None
        if not isinstance(stage, Stage):
            raise RegistryError(f"{where}: expected a day0 Stage declaration, got {type(stage).__name__}")
        if stage.name != ep.name:
            raise RegistryError(f"{where}: the entry point's name must be the stage's name ({stage.name!r})")
        if stage.suite is not None:
            raise RegistryError(f"{where}: a site stage declares run(ctx), not a suite module")
        try:
            found.append(dataclasses.replace(stage, origin=dist).validate())
        except StageDeclarationError as exc:
            raise RegistryError(f"{where}: {exc}") from None
    return tuple(found)


def load(eps: Iterable[metadata.EntryPoint] | None = None) -> Registry:
    """Built-ins, then site stages; a name used twice (or a derived stage's name) is refused."""
    stages = [*builtin(), *from_entry_points(eps)]
    seen: dict[str, str] = {d.name: "day0 (derived)" for d in DERIVED_STAGES}
    for s in stages:
        if s.name in seen:
            raise RegistryError(f"stage {s.name!r} ({s.origin}): the name is taken by {seen[s.name]}")
        seen[s.name] = s.origin
    return Registry(tuple(sorted(stages, key=lambda s: (s.order, s.name))))  # ties in name order (stage-contract.md)
