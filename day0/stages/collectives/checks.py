"""The checks of a sweep: every rank finished, and per op the results are exact and the
large-message busbw reaches ``pass_fraction`` x what the topology promises."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, NamedTuple

from day0.core.collective_ops import OPS
from day0.core.record import Check, measured
from day0.stages.collectives.busbw import algbw_gbps, bus_factor
from day0.stages.collectives.result import CollectivesResult, OpOutcome, SweepRow
from day0.stages.collectives.settings import CollectivesSection, check_expected, coerce_settings, human_bytes


@dataclass
class BusbwExpectations:
    expected: dict[str, dict[str, float]] = field(default_factory=dict)  # scope -> op -> GB/s
    pass_fraction: float = 0.8
    scope: str = "auto"
    large_message_bytes: int | None = None

    @classmethod
    def coerce(cls, x: Any) -> "BusbwExpectations":
        if isinstance(x, cls):
            return x
        if x is None:
            return cls()
        if isinstance(x, CollectivesSection) or (isinstance(x, Mapping) and ("expected_busbw" in x or "pass_fraction" in x)) or hasattr(x, "model_dump"):
            s = coerce_settings(x)
            return cls(s.expected_busbw, float(s.pass_fraction), s.scope, s.large_message_bytes)  # type: ignore[arg-type]
        if isinstance(x, Mapping):  # a bare {scope: {op: GB/s}} table
            return cls(check_expected(x))
        raise TypeError(f"cannot read busbw expectations from {type(x).__name__}")

    def limits(self, scope: str, op: str) -> tuple[float | None, float | None]:
        """(expected GB/s, pass line) for an op at a scope; both None when nothing is promised."""
        expected = self.expected.get(scope, {}).get(op)
        return expected, None if expected is None else round(expected * self.pass_fraction, 6)


def result_checks(result: CollectivesResult, expectations: Any = None) -> list[Check]:
    """Checks for a sweep (measured here or imported): ranks healthy, then per op correct + busbw.

    Every check names its source: ``nccl-tests`` for an imported result, else
    ``torch.distributed/<backend>``.
    """
    exp = BusbwExpectations.coerce(expectations)
    scope = exp.scope if exp.scope != "auto" else ("inter_node" if result.nnodes > 1 else "intra_node")
    src = "nccl-tests" if result.source == "nccl-tests" else f"torch.distributed/{result.backend or '?'}"
    intra = [r for r in result.rows if r.scope == "intra_node"] if result.nnodes > 1 else []
    main = replace(result, rows=[r for r in result.rows if r not in intra]) if intra else result
    checks: list[Check] = [_ranks_check(result, src)]
    for op, outcome in result.ops.items():
        checks.extend(_op_checks(main, op, outcome, exp, scope, src))
    for op in dict.fromkeys(r.op for r in intra):  # a multi-node run's node-local figures, under their own ids
        rows = [r for r in intra if r.op == op]
        checks.append(_correct_check(op, result.ops[op], rows, src, label=f"intra_node.{op}"))
        checks.append(_busbw_check(main, op, rows, exp, "intra_node", src, label=f"intra_node.{op}"))
    return checks


def _ranks_check(result: CollectivesResult, src: str) -> Check:
    ranks_ev: dict[str, Any] = {"world_size": result.world_size, "hosts": sorted(set(result.hosts)),
                                "backend": result.backend}
    if result.fault is None:
        return Check(
            id="collectives.ranks", title="Every rank completed the sweep", status="pass",
            value=0, limit=0, direction="exact",
            message=f"{result.world_size} ranks on {result.nnodes} node(s) completed ({result.backend or result.source})",
            evidence=ranks_ev, source=src,
        )
    f = result.fault
    ranks_ev["table"] = {
        "columns": ["rank", "pid", "host", "exit", "killed by harness", "heartbeat age (s)", "last step", "error"],
        "rows": [[st.rank, st.pid, st.host, st.returncode, st.killed_by_harness,
                  None if st.heartbeat_age_s is None else round(st.heartbeat_age_s, 1),
                  _step_str(st.step), st.error] for st in f.ranks_state],
    }
    ranks_ev["fault"] = {"kind": f.kind, "ranks": f.ranks, "elapsed_s": f.elapsed_s}
    return Check(
        id="collectives.ranks", title="Every rank completed the sweep", status="fail",
        value=len(f.ranks), limit=0, direction="exact", message=f.message, evidence=ranks_ev, source=src,
    )


def _step_str(step: Mapping[str, Any] | None) -> str:
    if not step:
        return ""
    if step.get("phase") == "sweep":
        return f"{step.get('op')} {step.get('mode')} {human_bytes(int(step.get('size', 0)))}"
    return str(step.get("phase", "")) + (f" {step['op']}" if step.get("op") else "")


class OpCheckIds(NamedTuple):
    """The ids and titles of an op's two checks."""

    correct_id: str
    correct_title: str
    busbw_id: str
    busbw_title: str


def op_check_ids(op: str) -> OpCheckIds:
    """An op's two checks, named here once (op: ``intra_node.<op>`` for a multi-node run's node-local
    figures); the device check declares its ids with it."""
    name = op.replace("intra_node.", "") + (" within each node" if op.startswith("intra_node.") else "")
    return OpCheckIds(f"collectives.{op}.correct", f"{name}: exact results",
                      f"collectives.{op}.busbw", f"{name}: bus bandwidth at large messages")


def _op_checks(result: CollectivesResult, op: str, outcome: OpOutcome, exp: BusbwExpectations, scope: str,
               src: str) -> list[Check]:
    rows = result.rows_for(op)
    if outcome.status == "skip" or outcome.status in ("error", "not_run") or not rows:
        return _unmeasured_checks(result, op, outcome, rows, exp.limits(scope, op)[1], src)
    return [_correct_check(op, outcome, rows, src), _busbw_check(result, op, rows, exp, scope, src)]


def _unmeasured_checks(result: CollectivesResult, op: str, outcome: OpOutcome, rows: list[SweepRow],
                       limit: float | None, src: str) -> list[Check]:
    """Both checks of an op that was skipped (skip) or did not complete (error)."""
    cid_c, t_c, cid_b, t_b = op_check_ids(op)
    if outcome.status == "skip":
        msg = f"skipped: {outcome.reason}" if outcome.reason else "skipped"
        return [Check(id=cid_c, title=t_c, status="skip", message=msg, source=src),
                Check(id=cid_b, title=t_b, status="skip", limit=limit, unit="GB/s", direction="higher_is_better", message=msg, source=src)]
    # The fault names the culprit; a rank's own exception usually only names the symptom.
    why = result.fault.message if result.fault else (outcome.reason or "no rows measured")
    msg = f"{op} did not complete: {why}"
    ev = {"table": _rows_table(rows)} if rows else {}
    return [Check(id=cid_c, title=t_c, status="error", message=msg, evidence=ev, source=src),
            Check(id=cid_b, title=t_b, status="error", limit=limit, unit="GB/s", direction="higher_is_better",
                  message=msg, evidence=dict(ev), source=src)]


def _correct_check(op: str, outcome: OpOutcome, rows: list[SweepRow], src: str, label: str = "") -> Check:
    """#wrong == 0 over every size and mode; from nccl-tests' footer when only that is known."""
    cid_c, t_c, _, _ = op_check_ids(label or op)
    known = [r for r in rows if r.wrong is not None]
    if known:
        wrong = sum(int(r.wrong or 0) for r in known)
        bad = [r for r in known if r.wrong]
        if bad:
            detail = ", ".join(f"{human_bytes(r.size_bytes)} {r.mode}: {r.wrong}" for r in bad[:6])
            msg = f"{wrong} wrong elements in {op} ({detail}); results must be exact, suspect the fabric or NCCL/driver versions"
        elif outcome.out_of_bounds:  # the footer counts what the rows do not show: trust the worse
            wrong = outcome.out_of_bounds
            msg = (f"nccl-tests' footer reports {wrong} out-of-bounds values in {op} although every row shows "
                   "#wrong 0; results must be exact")
        else:
            msg = f"all {len(known)} sweep points exact (#wrong 0 at every size and mode)"
        return measured(cid_c, t_c, wrong, 0, unit="elements", direction="exact", message=msg,
                        evidence={"table": {"columns": ["size", "mode", "count", "#wrong"],
                                            "rows": [[r.size_bytes, r.mode, r.count, r.wrong] for r in rows]}},
                        source=src)
    if outcome.out_of_bounds is not None:
        msg = (f"nccl-tests reported {outcome.out_of_bounds} out-of-bounds values" if outcome.out_of_bounds
               else "nccl-tests reported 0 out-of-bounds values (older max-error layout)")
        return measured(cid_c, t_c, outcome.out_of_bounds, 0, unit="elements", direction="exact", message=msg,
                        evidence={"table": {"columns": ["size", "mode", "max error"],
                                            "rows": [[r.size_bytes, r.mode, r.max_error] for r in rows]}}, source=src)
    return Check(id=cid_c, title=t_c, status="skip", unit="elements",
                 message="correctness was not checked (nccl-tests -c 0 or check = false); rerun with validation",
                 source=src)


def _busbw_check(result: CollectivesResult, op: str, rows: list[SweepRow], exp: BusbwExpectations, scope: str,
                 src: str, label: str = "") -> Check:
    """The best busbw at the largest size (or at sizes >= large_message_bytes) against the pass line; for
    node-local rows (``label``) the worst node's, so one slow node is not hidden by the others."""
    _, _, cid_b, t_b = op_check_ids(label or op)
    expected, limit = exp.limits(scope, op)
    big = exp.large_message_bytes
    cand = [r for r in rows if r.busbw_gbps is not None and (big is None or r.size_bytes >= big)]
    if big is None and cand:
        top = max(r.size_bytes for r in cand)
        cand = [r for r in cand if r.size_bytes == top]
    if not cand:
        return Check(id=cid_b, title=t_b, status="error", limit=limit, unit="GB/s", direction="higher_is_better",
                     message=f"no busbw measured for {op} at sizes >= {big}", evidence={"table": _rows_table(rows)},
                     source=src)
    ranks = result.world_size if not label else None
    if ranks is not None and ranks < 2:  # one rank: whatever the op's bus factor, nothing crossed a link
        why = ("its bus bandwidth is 0 by definition (nccl-tests' (n-1)/n)" if bus_factor(op, max(1, ranks)) == 0
               else "its figure is a local copy or a no-op (NCCL's in-place broadcast), not a bus's")
        return Check(id=cid_b, title=t_b, status="skip", limit=limit, unit="GB/s", direction="higher_is_better",
                     message=f"{op} at {ranks} rank moves nothing between ranks: nothing crosses a link and {why}, "
                             "so there is none to judge", source=src)
    best = (min if label else max)(cand, key=lambda r: r.busbw_gbps or 0.0)
    value = round(float(best.busbw_gbps or 0.0), 4)
    where = f" on {best.node}" if best.node else ""
    if expected is None:
        msg = (f"{value:g} GB/s at {human_bytes(best.size_bytes)} ({best.mode}){where}; no expected busbw for {op} at "
               f"{scope} scope, recorded only")
    else:
        verdict = "meets" if value >= (limit or 0) else "misses"
        msg = (f"{value:g} GB/s at {human_bytes(best.size_bytes)} ({best.mode}){where} {verdict} {exp.pass_fraction:g} x "
               f"expected {expected:g} GB/s = {limit:g} GB/s ({scope})")
    return measured(cid_b, t_b, value, limit, unit="GB/s", direction="higher_is_better", message=msg,
                    evidence=_busbw_evidence(result, op, rows, best, exp, scope, src), source=src, performance=True)


def _busbw_evidence(result: CollectivesResult, op: str, rows: list[SweepRow], best: SweepRow,
                    exp: BusbwExpectations, scope: str, src: str) -> dict[str, Any]:
    """The sweep table, a busbw-vs-size chart per mode with the expected and pass lines, and samples."""
    expected, limit = exp.limits(scope, op)
    series: dict[str, tuple[list, list]] = {}
    for r in rows:
        if r.busbw_gbps is not None:
            xs, ys = series.setdefault(r.mode, ([], []))
            xs.append(r.size_bytes)
            ys.append(r.busbw_gbps)
    reference = []
    if expected is not None:
        reference = [{"y": expected, "label": f"expected {expected:g} GB/s ({scope})"},
                     {"y": limit, "label": f"pass line {exp.pass_fraction:g} x expected"}]
    evidence: dict[str, Any] = {
        "table": _rows_table(rows),
        "charts": [{"kind": "line", "title": f"{op} busbw vs message size ({result.world_size} ranks, {src})",
                    "x_label": "message size S (bytes)", "y_label": "busbw (GB/s)", "x_log": True,
                    "series": [{"name": m, "x": xs, "y": ys} for m, (xs, ys) in series.items()],
                    "reference": reference}],
        "scope": scope, "expected_gbps": expected, "pass_fraction": exp.pass_fraction,
        "size_bytes": best.size_bytes, "mode": best.mode, "nranks": best.nranks,
        "bus_factor": row_factor(op, best),
    }
    if best.times_us and evidence["bus_factor"] is not None:
        evidence["samples"] = [algbw_gbps(best.size_bytes, t / 1e6) * evidence["bus_factor"]
                               for t in best.times_us if t > 0]
    return evidence


def row_factor(op: str, row: SweepRow) -> float | None:
    """busbw / algbw of a row: the op's factor of n, or for uneven splits the one the row was measured
    with (the routing's busiest rank, docs/metrics.md), read back from the row's own two figures."""
    spec = OPS.get(op)
    if spec is not None and spec.uneven_splits:
        alg, bus = row.algbw_gbps, row.busbw_gbps
        return bus / alg if alg and bus is not None and math.isfinite(alg) else None
    return bus_factor(op, row.nranks) if row.nranks else None


def _rows_table(rows: list[SweepRow]) -> dict[str, Any]:
    def r3(x: float | None) -> float | None:
        return None if x is None else round(float(x), 3)

    return {
        "columns": ["size (B)", "count", "type", "mode", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "#wrong",
                    "p50 (us)", "p99 (us)"],
        "rows": [[r.size_bytes, r.count, r.dtype, r.mode, r3(r.time_us), r3(r.algbw_gbps), r3(r.busbw_gbps), r.wrong,
                  r3(r.p50_us), r3(r.p99_us)] for r in rows],
    }
