"""Required checks that this deployment cannot measure, said before any engine work.

Some checks need the engine's scheduler view (the exact block pool, the worker RPC): an external
deployment, an engine across nodes or a GPU server has none (:func:`day0.engine.handle.scheduler_unavailable`,
the same answer the run gets). A profile that requires such a check can only end INCOMPLETE on it;
stage 0 says so in one line per check, naming the check and what to require instead.
"""

from __future__ import annotations

import fnmatch
from typing import Sequence

from day0.config.profile import Profile
from day0.core.stages import Stage
from day0.engine.handle import scheduler_unavailable
from day0.stages.preflight.findings import Finding


def required_globs(profile: Profile, stages: Sequence[Stage]) -> list[str]:
    """What the verdict will rest on: the profile's ``[report] required``, else the built-in stages'
    declarations, and a site stage's always (as the session resolves it for the record)."""
    builtin = [g for s in stages if s.origin == "day0" for g in s.required]
    site = [g for s in stages if s.origin != "day0" for g in s.required]
    return list(dict.fromkeys([*(profile.report.required or builtin), *site]))


def unmeasurable_findings(profile: Profile, stages: Sequence[Stage]) -> list[Finding]:
    """One warning per required check whose view this profile's run cannot have."""
    why = {"scheduler": scheduler_unavailable(profile)}
    required = required_globs(profile, stages)
    out = []
    for stage in stages:
        for need in stage.view_needs:
            reason = why.get(need.view)
            if reason and any(fnmatch.fnmatchcase(need.check, g) for g in required):
                out.append(Finding(
                    "warning", "unmeasurable", "report.required", need.check,
                    f"required check {need.check} needs the engine's {need.view} view, and this run has none "
                    f"({reason}): the run can only end INCOMPLETE on it", need.alternative))
    return out
