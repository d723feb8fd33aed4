"""State of one Day0 run: profile, run folder, event log, engines, stage gating.

Kept free of pytest so it can be driven and tested directly; ``day0.plugin`` only translates
pytest's hooks into calls on this object (stored under ``config.stash``).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from day0.config.profile import Profile
from day0.core import environment
from day0.core.events import EventLog, rebuild
from day0.core.names import MAX_COMPONENT, file_name
from day0.core.record import COLLECT_ENV_NOTE, MAX_SKIPPED_SHOWN, RUN_FILE, STAGE_SECONDS_NOTE, Check, RunRecord, utcnow
from day0.core.terminal import Terminal
from day0.core.verdict import DESELECTED_NOTE, Waiver, waiver_for
from day0.engine import EngineInfo, Engines
from day0.engine.cluster.nodes import ClusterError
from day0.stages.context import RecordSoFar, StageContext
from day0.stages.registry import Registry, load
from day0.stages.required import resolve

if TYPE_CHECKING:
    from day0.results.export import Targets


def new_run_id(profile_name: str, now: datetime | None = None) -> str:
    """``<UTC start>-<profile name as a file name>-<6 hex>``: the run folder's name, so the profile
    name passes the one sanitiser here, where the id is minted (``team/llama70b`` -> ``team-llama70b``;
    the name as given stays in the record's profile). Always an id the record accepts back."""
    now = now or datetime.now(timezone.utc)
    return f"{now:%Y%m%dT%H%M%SZ}-{file_name(profile_name)}-{secrets.token_hex(3)}"


def point_latest(out_dir: Path, run_dir: Path) -> Path:
    """``out_dir/latest`` -> the run folder, replaced atomically (a relative link, so the tree moves)."""
    link = out_dir / "latest"
    tmp = out_dir / f".latest-{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    tmp.symlink_to(run_dir.name)
    tmp.replace(link)
    return link


@dataclass
class Day0Session:
    profile: Profile
    out_dir: Path
    registry: Registry = field(default_factory=load)  # the stages, in order (built-ins and site stages)
    gate: bool = True
    log: Callable[[str], None] = field(default=lambda msg: print(f"[day0] {msg}", file=sys.stderr, flush=True))
    run_id: str = ""
    run_dir: Path = field(init=False)
    events: EventLog = field(init=False)
    engines: Engines = field(init=False)
    template_dir: Path | None = None
    record: RunRecord | None = None
    outputs: dict[str, Path] = field(default_factory=dict)  # label -> path, for the summary
    report_error: str = ""
    baseline: str | None = None  # --day0-baseline: a run.json path, or latest-accepted / latest (day0.compare)
    repeats: int = 1  # --day0-repeat: the measuring stages ran this many times on one engine (day0.repeats)
    exports: Targets | None = None  # Prometheus textfile, Pushgateway, GitHub step summary
    _failed_stage: dict[str, str] = field(default_factory=dict)  # stage -> first failure, one line
    _checks: list[Check] = field(default_factory=list)  # the record so far, for later stages to read
    _contexts: dict[str, StageContext] = field(default_factory=dict)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    cluster_blocked: str = ""  # why the nodes could not be brought up (no root for an emulated cluster)
    _collect_env: environment.CollectEnv | None = None  # vLLM's collect_env, until it is noted
    _collect_env_started: bool = False
    _launch_early: bool = False  # engine.start_early, until the launch (stage_starting)

    def __post_init__(self) -> None:
        self.out_dir = Path(self.out_dir)
        self.run_id = file_name(self.run_id, MAX_COMPONENT) if self.run_id else new_run_id(self.profile.name)
        self.run_dir = self.out_dir / self.run_id
        redactor = self.profile.redactor()
        self.events = EventLog(self.run_dir / "events.jsonl", redactor=redactor)
        say, term = self.log, Terminal(redactor)
        self.log = lambda msg: say(term.line(msg))  # progress lines (vLLM's own among them) end up in CI logs too
        self.engines = Engines(self.profile, self.run_dir, self.log)
        self.engines.on_start = self._engine_started

    def start(self, engine_wanted: bool = True, deselected: Sequence[tuple[str, str]] = ()) -> None:
        """Opens the record; ``engine_wanted`` says a selected stage will ask for the engine (with
        ``engine.start_early`` it is then launched while preflight runs: :meth:`stage_starting`).
        ``deselected``: (stage, node id) of each day0 test the session deselected (-k, -m, --deselect),
        noted so the verdict knows the run is not a full one."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        env = environment.collect()  # vLLM's collect_env comes later (_start_collect_env)
        nodes = self._bring_up_nodes()
        if nodes:
            env["nodes"] = nodes
        self.events.run_started(self.run_id, env, self.resolved_profile(), self.registry.names,
                                [s.describe() for s in self.registry.stages])
        tests = {nodeid: stage for stage, nodeid in deselected}  # each test once
        if tests:
            stages = dict(Counter(tests.values()))
            self.events.note(DESELECTED_NOTE, {"count": len(tests), "stages": stages,
                                               "nodeids": list(tests)[:MAX_SKIPPED_SHOWN]})
        point_latest(self.out_dir, self.run_dir)
        self.log(f"run {self.run_id}: recording to {self.run_dir}")
        self._launch_early = engine_wanted and self.profile.engine.start_early and not self.cluster_blocked

    def stage_starting(self, stage: str) -> None:
        """Called as each test of ``stage`` sets up. With ``engine.start_early`` the server is launched
        when the first stage that does not touch the deployment (preflight) begins, so vLLM's minute of
        start-up runs beside it; a run without such a stage (or a harness test's fake stages) launches
        nothing early, and the first stage that needs the engine starts it as before."""
        declared = self.registry.get(stage)
        if self._launch_early and declared is not None and not declared.needs_nodes:
            self._launch_early = False
            self.engines.launch_early()

    def resolved_profile(self) -> dict[str, object]:
        """The profile as the record keeps it, with ``[report] required`` resolved
        (:func:`day0.stages.required.resolve`: the declared checks, and a stand-in for each one this
        run has no view for) and the substitutions beside it, so the record's verdict follows from
        the record alone."""
        resolved = self.profile.resolved()
        required = resolve(self.profile, self.registry.stages)
        report = dict(resolved.get("report") or {})
        report["required"] = required.globs
        if required.substituted:
            report["substituted"] = [s.as_record() for s in required.substituted]
        return {**resolved, "report": report}

    def _bring_up_nodes(self) -> list[dict[str, object]]:
        """A multi-node topology's nodes, up before the first stage (an emulated cluster takes a
        fraction of a second); run.json lists each with its address, ranks and devices. Nodes that
        cannot be had block every stage after preflight, with the reason in one line."""
        topo = self.profile.topology
        if topo.launcher_kind(os.environ) == "local":
            return []
        try:
            cluster = self.engines.cluster()
        except ClusterError as exc:
            self.cluster_blocked = f"cluster: {exc}"
            self.log(self.cluster_blocked)
            return []
        per = topo.devices_per_node
        return [{**d, "ranks": list(range(i * per, (i + 1) * per)), "devices": f"{per} x {topo.device}"}
                for i, d in enumerate(cluster.describe())]

    def _engine_started(self, info: EngineInfo) -> None:
        self.events.note(f"engine.{info.view}", info.__dict__)
        if info.view == self.engines.primary_view:
            self._start_collect_env()

    def _start_collect_env(self) -> None:
        """vLLM's collect_env (collect_env.txt beside the record), in the background from when the
        primary engine serves: its ~10 s of imports would otherwise compete with the engine's own
        start-up, the run's longest wait on a small box. A run that starts none gets it at the end."""
        if not self._collect_env_started and environment.collect_env_wanted():
            self._collect_env = environment.CollectEnv(self.run_dir, self.events.redactor)
        self._collect_env_started = True

    # -- checks and gating ---------------------------------------------------------------

    def add_check(self, stage: str, check: Check) -> Check:
        check.stage = stage
        self.events.check(stage, check)
        self._checks.append(check)
        # Only a measured failure gates later stages; a check the harness could not measure (error)
        # says nothing about the deployment, and the stages after it still have something to tell.
        if check.status == "fail" and stage not in self._failed_stage and not self.waived(check):
            self._failed_stage[stage] = f"{check.id}: {check.message}"
            self._stop_early_engine(stage)
        return check

    @cached_property
    def _waivers(self) -> list[Waiver]:
        return [Waiver(w.check, w.reason, w.finding, w.until) for w in self.profile.report.waivers]

    def waived(self, check: Check) -> bool:
        """A failure the profile waives (``[report] waivers``) gates nothing; the record keeps it a fail."""
        return waiver_for(check, self._waivers, utcnow()) is not None

    def _stop_early_engine(self, failed_stage: str) -> None:
        """A failure in a stage that does not touch the deployment (preflight) blocks every stage
        that would use an engine launched early (``engine.start_early``): it is stopped at once,
        so a model the memory plan says does not fit is not left loading while the run ends."""
        declared = self.registry.get(failed_stage)
        if self.gate and declared is not None and not declared.needs_nodes and self.engines.cancel_early():
            self.log(f"stage {failed_stage} failed: the engine launched early is stopped (nothing after it will run)")

    def blocked_by(self, stage: str) -> str | None:
        """Why ``stage`` must not run: the first earlier stage that failed (None when gating is off)."""
        declared = self.registry.get(stage)
        if self.cluster_blocked and (declared is None or declared.needs_nodes):
            return self.cluster_blocked
        if not self.gate:
            return None
        for name in self.registry.before(stage):
            if name in self._failed_stage:
                return f"stage {name} failed ({self._failed_stage[name]})"
        return None

    def context(self, stage: str) -> StageContext:
        """The stage's context, built once per run (its record view stays live: later checks show)."""
        if stage not in self._contexts:
            declared = self.registry.get(stage)
            if declared is None:
                raise KeyError(f"no stage {stage!r} in the registry ({', '.join(self.registry.names)})")
            self._contexts[stage] = StageContext(declared, self.profile, self.engines, self.run_dir, self.log,
                                                 RecordSoFar(lambda: tuple(self._checks)))
        return self._contexts[stage]

    def add_stage_time(self, stage: str, seconds: float) -> None:
        """Noted after every test, so a run that dies keeps the times of what ran."""
        self.stage_seconds[stage] = round(self.stage_seconds.get(stage, 0.0) + max(0.0, seconds), 3)
        self.events.note(STAGE_SECONDS_NOTE, dict(self.stage_seconds))
        self._note_collect_env(wait=False)

    def _note_collect_env(self, wait: bool) -> None:
        """Noted as soon as the probe is done (a run that dies later keeps it), or at the end."""
        probe = self._collect_env
        if probe is not None and (wait or probe.done()):
            self._collect_env = None
            self.events.note(COLLECT_ENV_NOTE, probe.result())

    # -- end of run ----------------------------------------------------------------------

    def finish(self, exit_status: int | None) -> RunRecord:
        self.engines.stop()
        self._start_collect_env()
        self._note_collect_env(wait=True)
        self.events.run_finished(exit_status)
        self.record = rebuild(self.run_dir)
        self.outputs = {"run record": self.run_json}
        if self.repeats > 1:  # the spread of each repeated check, and any verdict that flipped
            from day0.results.repeats import REPEAT_STAGE, stability_check

            self.add_check(REPEAT_STAGE.name, stability_check(self.record, self.repeats))
            self.record = rebuild(self.run_dir)
        local = self.profile.resolved()  # where files go and come from: this run's profile, never a record's copy
        try:
            from day0.results import compare, history

            if self.baseline:  # judged against earlier runs before the report, as the regression stage's checks
                checks, note = compare.nightly_checks(self.record, self.out_dir, self.baseline, self.log, local)
                for c in checks:
                    self.add_check("regression", c)
                if note:
                    self.events.note("regression", note)
                self.record = rebuild(self.run_dir)
            history.keep(self.record, self.run_dir, self.out_dir, self.log, local)  # the next night's history
        except Exception as exc:  # the measured record is already on disk; say why the comparison is missing
            self.report_error = f"baseline comparison/history failed: {type(exc).__name__}: {exc}"
            self.log(self.report_error)
        try:
            from day0.results.history import history_root
            from day0.results.report import publish

            template_dir = self.template_dir or (
                Path(self.profile.report.template_dir) if self.profile.report.template_dir else None)
            self.outputs = publish(self.run_json, template_dir=template_dir, signatories=self.profile.report.signatories,
                                   history=history_root(local, self.out_dir))
        except Exception as exc:  # a broken site template must not cost the measurements
            self.report_error = "; ".join(filter(None, [self.report_error,
                                                        f"report not rendered: {type(exc).__name__}: {exc}"]))
            self.log(self.report_error)
        if self.exports is not None:  # Prometheus, Pushgateway, GitHub summary: each failure is one log line
            from day0.results.export import export

            self.outputs.update(export(self.record, self.exports, self.log))
        return self.record

    @property
    def run_json(self) -> Path:
        return self.run_dir / RUN_FILE
