"""The stage contract: what a Day0 stage declares about itself.

A stage is one folder (``day0/stages/<name>/``, or a package of a site's own registered through
the ``day0.stages`` entry-point group) whose ``STAGE`` is a :class:`Stage`. Everything that
names stages reads these declarations: the markers and gating (:mod:`day0.stages.registry`
orders them), the run record (``run_started`` carries each declaration's :meth:`Stage.describe`,
so a record explains itself without the code that made it), the terminal table, the report's
first screen, JUnit and the history. Nothing outside a stage's folder lists its check ids.

Kept in ``core`` because it is plain data every layer reads; the context a stage's ``run``
receives (:class:`day0.stages.context.StageContext`) lives with the stages, since it holds the
engine.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

STAGE_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")
# A stage's name is its pytest marker: day0's own markers and pytest's built-in ones are not free.
# A site stage named `day0` was the first stage marker of every built-in test (each carries `day0`
# first), so gating followed it; one named `skip` skipped its own tests.
RESERVED_NAMES = frozenset({"day0", "day0_once", "skip", "skipif", "xfail", "parametrize", "usefixtures",
                            "filterwarnings", "tryfirst", "trylast"})
PICKS = ("worst", "vs_expected")  # how a headline picks one check of several (day0.results.summary)


class StageDeclarationError(ValueError):
    """A stage that declares itself wrongly; the message names the stage and the field."""


@dataclass(frozen=True)
class Figure:
    """One headline figure: where it is read from and how it reads.

    ``check_ids`` are globs tried in order: the first whose checks measured a value is shown, so a
    figure measured by one of two methods (the scheduler's exact view, or /metrics) shows what was
    measured rather than "skip" for the method that was not available.
    """

    key: str
    label: str
    check_ids: tuple[str, ...]
    scale: float = 1.0
    unit: str | None = None
    pick: str = "worst"  # "worst" of a repeated check, or "vs_expected": furthest below its expectation
    need: bool = False  # the check's limit is what is needed (KV tokens): the note says "needs <limit>"
    # A measurement the profile opts into (the capacity search): shown when its check is in the
    # record, left out (never "absent") when the run did not ask for it.
    opt_in: bool = False
    # An evidence key of the shown check holding the figure's answer in words (the capacity per
    # replica, its margin and replicas; the load a cost is priced at): the first screen's note,
    # and a line under the terminal's table.
    answer_key: str = ""

    def describe(self) -> dict[str, Any]:
        return {"key": self.key, "label": self.label, "check_ids": list(self.check_ids), "scale": self.scale,
                "unit": self.unit, "pick": self.pick, "need": self.need, "opt_in": self.opt_in,
                "answer_key": self.answer_key}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Figure:
        """From a record's ``figures`` entry (already shape-checked by the record loader)."""
        ids = data.get("check_ids")
        unit = data.get("unit")
        return cls(str(data.get("key", "")), str(data.get("label", "")),
                   tuple(str(i) for i in ids) if isinstance(ids, list) else (),
                   float(data.get("scale") or 1.0), unit if isinstance(unit, str) else None,
                   str(data.get("pick") or "worst"), data.get("need") is True, data.get("opt_in") is True,
                   str(data.get("answer_key") or ""))


# What a stage's ``run`` returns: the checks it measured (a day0.core.record.Check each).
RunFn = Callable[[Any], Iterable[Any]]


@dataclass(frozen=True)
class ViewNeed:
    """A check only one of the engine's views can measure (``scheduler``: the exact block pool and the
    worker RPC), and what a profile can require instead. Where that view cannot exist (an external
    deployment, an engine across nodes, a GPU server), preflight says so before any engine work when
    the profile requires the check, rather than the run spending its minutes to end INCOMPLETE.

    ``stand_in`` is the check a run without that view requires in its place, when the run has the
    stand-in's own view (``stand_in_view``: ``http``, always; ``beside``, the engine's processes on
    this host); the record keeps the substitution, so the verdict still follows from it alone."""

    check: str
    view: str
    alternative: str
    stand_in: str = ""
    stand_in_view: str = "http"


@dataclass(frozen=True)
class Stage:
    """One stage's declaration.

    ``run(ctx)`` measures the stage and returns its checks; the plugin runs it as the stage's test
    (``-m <name>``), in registry order, gated and gating. A built-in stage may instead ship a suite
    module in ``day0.suites`` (``suite``): its tests are the stage's readable checklist, each thin
    over the stage package, and ``run`` is then left out. ``section`` names the profile section the
    stage reads (a built-in top-level table such as ``latency``; a site stage's own table lives
    under ``[stages.<name>]`` and ``settings`` validates it).
    """

    name: str
    title: str
    question: str
    run: RunFn | None = None
    suite: str | None = None  # a module of day0.suites holding the stage's tests
    section: str | None = None
    settings: type | None = None  # a pydantic model for a site stage's [stages.<name>] table
    figures: tuple[Figure, ...] = ()
    required: tuple[str, ...] = ()  # check globs the verdict rests on by default (with [report] required)
    view_needs: tuple[ViewNeed, ...] = ()  # checks only one engine view can measure
    # Its figures come from timing a live system: --day0-repeat N measures it N times on the same
    # engine to show their spread (static audits and one-off correctness probes are not repeated).
    repeatable: bool = False
    order: int = 1000  # built-ins are 0-60 in steps of 10; a site stage without one runs after them
    needs_nodes: bool = True  # False: does not touch the deployment (preflight): runs even when the nodes could
    # not be brought up, and an early-launched engine (engine.start_early) starts up while it runs
    origin: str = "day0"  # the distribution that declared it (for `day0 stages` and the report)

    @property
    def marker(self) -> str:
        return self.name

    def validate(self) -> Stage:
        if not isinstance(self.name, str) or not STAGE_NAME.fullmatch(self.name):
            raise StageDeclarationError(f"stage {self.name!r}: name: expected a lower-case identifier "
                                        f"({STAGE_NAME.pattern})")
        if self.name in RESERVED_NAMES:
            raise StageDeclarationError(f"stage {self.name!r}: name: a pytest marker day0 or pytest already "
                                        f"means something by ({', '.join(sorted(RESERVED_NAMES))})")
        if self.run is None and self.suite is None:
            raise StageDeclarationError(f"stage {self.name!r}: declares neither run(ctx) nor a suite module")
        if self.run is not None and not callable(self.run):
            raise StageDeclarationError(f"stage {self.name!r}: run: expected a callable run(ctx) -> checks")
        for f in self.figures:
            if f.pick not in PICKS:
                raise StageDeclarationError(f"stage {self.name!r}: figure {f.key!r}: pick: one of {', '.join(PICKS)}")
        return self

    @property
    def info(self) -> StageInfo:
        """What the run record keeps of the declaration (no code, nothing of the profile)."""
        return StageInfo(self.name, self.title, self.question, self.figures, self.required, self.origin)

    def describe(self) -> dict[str, Any]:
        return self.info.describe()


@dataclass(frozen=True)
class StageInfo:
    """A stage as a run record describes it: :meth:`Stage.describe` read back."""

    name: str
    title: str = ""
    question: str = ""
    figures: tuple[Figure, ...] = ()
    required: tuple[str, ...] = ()
    origin: str = ""

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "question": self.question,
                "figures": [f.describe() for f in self.figures], "required": list(self.required),
                "origin": self.origin}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StageInfo:
        figs = data.get("figures")
        req = data.get("required")
        return cls(str(data.get("name", "")), str(data.get("title") or ""), str(data.get("question") or ""),
                   tuple(Figure.from_dict(f) for f in figs if isinstance(f, dict)) if isinstance(figs, list) else (),
                   tuple(str(g) for g in req if isinstance(g, str)) if isinstance(req, list) else (),
                   str(data.get("origin") or ""))


# Added by the session after the Day0 stages ran, from the record alone: no marker, gate nothing;
# a failed check in them rejects the run like any other.
REGRESSION_STAGE = StageInfo("regression", "Regression against the history",
                             "is this run as good as the last runs of the same system, beyond their run-to-run spread?")
REPEAT_STAGE = StageInfo("repeat", "Verdict stability across repeats",
                         "does every check give the same verdict each time it is measured on the same engine?")
DERIVED_STAGES: tuple[StageInfo, ...] = (REGRESSION_STAGE, REPEAT_STAGE)
