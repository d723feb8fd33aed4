"""What the verdict rests on: the required checks of this run, resolved once, before any engine work.

The profile's ``[report] required`` (else the built-in stages' declarations), a site stage's
declarations always, and, for a required check whose view this run cannot have (an external
deployment or a GPU server has no scheduler view), the stand-in its stage declares when the run has
the stand-in's own view: the /metrics estimate for the exact KV fragmentation, the ranks' memory
read beside the engine for the worker-RPC weight bytes. Where no stand-in can be measured either,
the check stays required and preflight says, in one line, that the run can only end INCOMPLETE.
The session writes the resolved list and the substitutions into the record, preflight reports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from day0.config.profile import Profile
from day0.core.globs import matches as glob_matches
from day0.core.stages import Stage, ViewNeed
from day0.engine.handle import beside_unavailable, scheduler_unavailable

ViewProbe = Callable[[Profile], "str | None"]

# Why a run cannot have each view (None: it can); "http" is every engine's.
VIEWS: dict[str, ViewProbe] = {
    "scheduler": scheduler_unavailable,
    "beside": beside_unavailable,
    "http": lambda _profile: None,
}


@dataclass(frozen=True)
class Substitution:
    """A required check this run cannot measure, and the one it requires in its place."""

    check: str
    stand_in: str
    why: str  # why the check's own view is missing

    def as_record(self) -> dict[str, str]:
        return {"check": self.check, "stand_in": self.stand_in, "why": self.why}


@dataclass(frozen=True)
class Unmeasurable:
    """A required check neither this run's views nor a stand-in can measure."""

    need: ViewNeed
    why: str


@dataclass
class Required:
    globs: list[str]
    substituted: list[Substitution] = field(default_factory=list)
    unmeasurable: list[Unmeasurable] = field(default_factory=list)


def declared(profile: Profile, stages: Sequence[Stage]) -> list[str]:
    """The profile's own list when it sets one, else the built-in stages'; a site stage's always (a
    profile written before the stage was installed cannot name them)."""
    builtin = [g for s in stages if s.origin == "day0" for g in s.required]
    site = [g for s in stages if s.origin != "day0" for g in s.required]
    return list(dict.fromkeys([*(profile.report.required or builtin), *site]))


def resolve(profile: Profile, stages: Sequence[Stage], views: dict[str, ViewProbe] | None = None) -> Required:
    """The run's required checks, with each view need settled (module docstring)."""
    probes = views or VIEWS
    missing = {name: probe(profile) for name, probe in probes.items()}
    globs = declared(profile, stages)
    out = Required(globs=list(globs))
    for stage in stages:
        for need in stage.view_needs:
            why = missing.get(need.view)
            if not why or not any(glob_matches(need.check, g) for g in globs):
                continue
            if need.stand_in and not missing.get(need.stand_in_view):
                out.globs = [need.stand_in if g == need.check else g for g in out.globs]
                if need.stand_in not in out.globs:  # a glob required it: keep the glob, add the stand-in
                    out.globs.append(need.stand_in)
                out.substituted.append(Substitution(need.check, need.stand_in, why))
            else:
                out.unmeasurable.append(Unmeasurable(need, why))
    out.globs = list(dict.fromkeys(out.globs))
    return out
