"""Required checks that this deployment cannot measure as declared, said before any engine work.

Some checks need the engine's scheduler view (the exact block pool, the worker RPC): an external
deployment, an engine across nodes or a GPU server has none (:func:`day0.engine.handle.scheduler_unavailable`,
the same answer the run gets). Where the check's stage declares a stand-in this run can measure,
the run requires that instead (:func:`day0.stages.required.resolve`) and stage 0 says so as a note;
where none can be measured, the run can only end INCOMPLETE on it, and stage 0 warns, naming the
check and what to require instead.
"""

from __future__ import annotations

from typing import Sequence

from day0.config.profile import Profile
from day0.core.stages import Stage
from day0.stages.preflight.findings import Finding
from day0.stages.required import resolve


def unmeasurable_findings(profile: Profile, stages: Sequence[Stage]) -> list[Finding]:
    """One warning per required check this run cannot measure, one note per check stood in for."""
    required = resolve(profile, stages)
    out = [Finding("info", "stand_in", "report.required", s.check,
                   f"required check {s.check} cannot be measured by this run ({s.why}); {s.stand_in} is "
                   "required in its place", f"to require {s.check} itself, run day0 where its view exists")
           for s in required.substituted]
    for u in required.unmeasurable:
        out.append(Finding(
            "warning", "unmeasurable", "report.required", u.need.check,
            f"required check {u.need.check} needs the engine's {u.need.view} view, and this run has none "
            f"({u.why}): the run can only end INCOMPLETE on it", u.need.alternative))
    return out
