"""What a stage's ``run(ctx)`` is handed: everything it may read, built once per run by the session.

A stage reads its own config section, sends requests through one :class:`~day0.engine.Endpoint`
(the only holder of the engine's key), writes files under the run folder, reports progress, and
reads what earlier stages measured from the record so far, never from the event log and never by
measuring it again.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from day0.config.profile import Profile
from day0.core.record import Check
from day0.core.stages import Stage
from day0.engine import Endpoint, Engines


class SectionError(ValueError):
    """A site stage's ``[stages.<name>]`` table that its settings model refuses; names the key."""


@dataclass(frozen=True)
class RecordSoFar:
    """The checks recorded in this run before now, as deep copies: a stage can read them, not change
    them, down to their evidence (a shallow copy shared its evidence dict with the session's check).
    Every check here was already deep-copied once into the event log (``Check.to_dict``), so it copies."""

    _source: Callable[[], Sequence[Check]]

    def checks(self, stage: str | None = None) -> list[Check]:
        return [copy.deepcopy(c) for c in self._source() if stage is None or c.stage == stage]

    def latest(self, check_id: str) -> Check | None:
        """The last check recorded under ``check_id`` (the last repeat's, under --day0-repeat)."""
        found = [c for c in self._source() if c.id == check_id]
        return copy.deepcopy(found[-1]) if found else None


@dataclass
class StageContext:
    stage: Stage
    profile: Profile
    engines: Engines
    run_dir: Path
    progress: Callable[[str], None]
    record: RecordSoFar
    _section: Any = field(default=None, init=False, repr=False)

    @property
    def section(self) -> Any:
        """The stage's settings: a built-in's top-level section (``profile.latency``), or a site
        stage's ``[stages.<name>]`` table validated by its ``settings`` model (a plain dict without one)."""
        if self._section is None:
            self._section = section_of(self.stage, self.profile)
        return self._section

    @property
    def endpoint(self) -> Endpoint:
        """The engine's HTTP API: started on first use when day0 runs the engine."""
        return self.engines.http().endpoint

    @property
    def engine(self) -> Any:
        """The primary engine handle (its view: ``http`` or ``scheduler``), started on first use."""
        return self.engines.primary()

    def out_dir(self) -> Path:
        """The stage's own folder in the run folder (``<run>/<stage>/``), made on first use."""
        path = self.run_dir / self.stage.name
        path.mkdir(parents=True, exist_ok=True)
        return path


def section_of(stage: Stage, profile: Profile) -> Any:
    if stage.section and stage.section in type(profile).model_fields:
        return getattr(profile, stage.section)
    raw = dict(profile.stages.get(stage.name, {}))
    model = stage.settings
    if model is None:
        return raw
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise SectionError(f"stage {stage.name}: settings: expected a pydantic model class, got {model!r}")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ()))
        raise SectionError(f"stages.{stage.name}{'.' + where if where else ''}: {err.get('msg', exc)}") from None


def check_sections(stages: Sequence[Stage], profile: Profile) -> None:
    """Every ``[stages.<name>]`` table names an installed stage and passes its settings model, checked
    before the run starts: a typo would otherwise surface as an error an hour into it."""
    names = {s.name for s in stages}
    for name in profile.stages:
        if name not in names:
            raise SectionError(f"stages.{name}: no stage {name!r} is installed (`day0 stages` lists them)")
    for stage in stages:
        if stage.name in profile.stages or stage.settings is not None:
            section_of(stage, profile)

