"""Stage 0 glue: the profile's model config, lint findings and memory plan, before any engine.

The suite and ``day0 plan`` both call :func:`preflight`, so the table a person reads at the
shell and the checks in run.json come from one computation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from day0.config.profile import Profile
from day0.core.record import Check
from day0.core.stages import Stage
from day0.model.config import ConfigUnavailable, model_config
from day0.model.plan import Plan, plan
from day0.model.plan_report import plan_checks
from day0.model.sizing import plan_arguments
from day0.stages.preflight.counts import request_count_findings
from day0.stages.preflight.lint import Finding, lint, lint_checks
from day0.stages.preflight.views import unmeasurable_findings

__all__ = ["ConfigUnavailable", "Preflight", "engine_args_with", "model_config", "preflight"]


@dataclass
class Preflight:
    config_source: str
    findings: list[Finding]
    plan: Plan | None
    plan_error: str = ""  # why no plan could be priced (e.g. dtype="int4"), one line

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    def lint_checks(self) -> list[Check]:
        """One check per lint error or warning and a summary, each naming the config it read."""
        checks = lint_checks(self.findings)
        for check in checks:
            check.evidence.setdefault("config", self.config_source)
        return checks

    def plan_checks(self) -> list[Check]:
        """The memory plan's checks; a layout that cannot be priced at all fails (the lint says why)."""
        if self.plan is None:
            return [Check(id="preflight.plan", title="Memory plan", status="fail", source="static",
                          message=f"no plan could be priced: {self.plan_error}")]
        return plan_checks(self.plan)


def engine_args_with(profile: Profile, what_if: dict[str, Any] | None) -> dict[str, Any]:
    """The engine args a what-if would give (tp/pp spelt as vLLM spells them)."""
    args = dict(profile.engine.args)
    names = {"tp": "tensor_parallel_size", "pp": "pipeline_parallel_size"}
    for key, value in (what_if or {}).items():
        args[names.get(key, key)] = value
    return args


def preflight(profile: Profile, what_if: dict[str, Any] | None = None, rules: Any = None,
              stages: Sequence[Stage] = ()) -> Preflight:
    """The lint, the memory plan, and (given the run's ``stages``) the required checks this deployment
    cannot measure."""
    config, source = model_config(profile)
    t = profile.topology
    # An NVLink fabric across nodes (NVL72) is one fast domain: TP may span its trays.
    fast_domain = t.world_size if t.inter_node == "nvlink" else t.devices_per_node
    findings = lint(engine_args_with(profile, what_if), config, device=t.device,
                    devices_per_node=fast_domain, nodes=t.nodes if fast_domain == t.devices_per_node else 1,
                    env={**profile.engine.env}, rules=rules, mode=profile.engine.mode)
    findings += request_count_findings(profile.latency, profile.sla)
    findings += unmeasurable_findings(profile, stages)
    try:
        return Preflight(source, findings, plan(config, **plan_arguments(profile, what_if)))
    except ValueError as exc:  # the lint findings already say why; keep them
        return Preflight(source, findings, None, str(exc))

STAGE = Stage(
    name="preflight", order=0, suite="day0.suites.test_preflight", section="preflight", needs_nodes=False,
    title="Preflight: config lint and memory plan",
    question="can this profile work at all, before any GPU-hour?",
    required=("preflight.plan.verdict",),
)
