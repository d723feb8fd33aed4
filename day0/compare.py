"""Compare a run with a baseline run: what improved, what regressed, and whether it is real.

A nightly job must fail on a real regression and stay green on noise. So a check regresses
only when (1) its value moved in the bad direction (the check's own ``direction``) by more
than the tolerance the profile gives it (``[compare.tolerances]``, by id or glob, percent or
absolute), and (2) where both runs kept per-sample evidence (``evidence["samples"]``), the
move is statistically meaningful: a one-sided Mann-Whitney U test when scipy is installed,
otherwise a bootstrap interval on the check's own percentile (``_p99`` in the id; the median
otherwise) computed with numpy. A check that passed in the baseline and fails now is a
regression whatever the numbers say: the run's own judgement already rejected it.

Check ids may repeat within one run (one failed ``weights.shard_size`` check per shard), so
checks are matched by id plus a discriminator taken from their evidence (``shard``,
``tensor``, ``rank``, ...); when none tells them apart they are matched by position and the
result says so.

Only run records are read (never re-measured). The pytest plugin calls :func:`finish_run`
at the end of a run (before the report is rendered), which adds the comparison as checks of
a ``regression`` stage (kept out of :data:`day0.stages.STAGES`: it is not a Day-0 stage, has
no marker and gates nothing, but a failed check there rejects the run like any other).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import re
import sys
import traceback
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import combinations
from pathlib import Path
from typing import TYPE_CHECKING, Any

from day0 import history
from day0.record import RUN_FILE, Check, RecordError, RunRecord, load, one_line, rebuild
from day0.stages import Stage

if TYPE_CHECKING:  # pragma: no cover
    from day0.session import Day0Session

REGRESSION_STAGE = Stage(
    "regression",
    "Regression against the baseline",
    "is this run as good as the baseline run, within tolerance and beyond noise?",
)
SUMMARY_ID = "regression.baseline"
KINDS: tuple[str, ...] = (
    "regression", "improvement", "noise", "changed", "new", "missing", "unmeasured", "incomparable", "unchanged",
)
# Evidence keys that tell repeated checks apart, most telling first.
DISCRIMINATORS: tuple[str, ...] = ("shard", "tensor", "rank", "node", "host", "op", "mode", "size_bytes", "file", "name")
MAX_BOOT_SAMPLES = 5000  # bootstrap resamples at most this many samples per side (seeded subsample)
MAX_TREND_CHARTS = 8
METHODS = ("auto", "mann-whitney", "bootstrap", "none")
_PCT = re.compile(r"_p(\d+(?:[._]\d+)?)$")
_ABS = re.compile(r"^[+]?(\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?$")


class CompareError(ValueError):
    """Input that cannot be compared (different profile, no baseline, bad tolerance): exit code 2."""


# --------------------------------------------------------------------------- tolerances


@dataclass(frozen=True)
class Tolerance:
    """How far a value may move in the bad direction before it counts: a fraction of the
    baseline value (``"5%"``) or an absolute amount in the check's unit (``2.5``)."""

    amount: float
    relative: bool
    pattern: str = ""  # the [compare.tolerances] key that chose it; "" for the default

    @classmethod
    def parse(cls, raw: Any, where: str, pattern: str = "") -> "Tolerance":
        if isinstance(raw, bool):
            raise CompareError(f"{where}: {raw!r} is not a tolerance (use \"5%\" or an absolute number)")
        if isinstance(raw, (int, float)):
            amount, relative = float(raw), False
        elif isinstance(raw, str) and raw.strip().endswith("%") and _ABS.match(raw.strip()[:-1].strip()):
            amount, relative = float(raw.strip()[:-1]) / 100.0, True
        elif isinstance(raw, str) and _ABS.match(raw.strip()):
            amount, relative = float(raw.strip()), False
        else:
            raise CompareError(
                f"{where}: {raw!r} is not a tolerance (use a percent like \"5%\" or an absolute number in the check's unit)")
        if not math.isfinite(amount) or amount < 0:
            raise CompareError(f"{where}: {raw!r}: a tolerance must be a finite number >= 0")
        return cls(amount, relative, pattern)

    def allowed(self, base: float) -> float:
        return self.amount * abs(base) if self.relative else self.amount

    def __str__(self) -> str:
        text = f"{self.amount * 100:g}%" if self.relative else f"±{self.amount:g}"
        return f"{text} ({self.pattern})" if self.pattern else text


def _match_rank(pattern: str, key: str, check_id: str) -> int | None:
    """How well a tolerance key names a check (lower is better); None when it does not."""
    names = (key, check_id)
    if pattern in names:
        return 0
    if any(n.endswith("." + pattern) for n in names):
        return 1  # `ttft_p99` names `latency.ttft_p99`
    if any(fnmatch.fnmatchcase(n, pattern) for n in names):
        return 2
    if any(fnmatch.fnmatchcase(n, "*." + pattern) for n in names):
        return 3
    return None


@dataclass(frozen=True)
class CompareSettings:
    """The profile's ``[compare]`` table as the comparison uses it."""

    tolerances: tuple[tuple[str, Tolerance], ...] = ()
    default: Tolerance = Tolerance(0.05, True)
    alpha: float = 0.05
    min_samples: int = 5
    bootstrap: int = 1000
    method: str = "auto"
    fail_on_missing: bool = False
    trend_runs: int = 10
    trend_checks: tuple[str, ...] = ()

    @classmethod
    def from_mapping(cls, sec: Mapping[str, Any] | None, where: str = "compare") -> "CompareSettings":
        sec = dict(sec or {})
        tol = sec.get("tolerances") or {}
        if not isinstance(tol, Mapping):
            raise CompareError(f"{where}.tolerances: expected a table of check id or glob = tolerance")
        method = str(sec.get("method", "auto"))
        if method not in METHODS:
            raise CompareError(f"{where}.method: {method!r} is not one of {', '.join(METHODS)}")
        alpha = sec.get("alpha", 0.05)
        if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not 0 < alpha < 0.5:
            raise CompareError(f"{where}.alpha: expected a probability in (0, 0.5), got {alpha!r}")
        return cls(
            # a key that looks like a secret (`..._token`) was redacted in run.json: skip it, never guess
            tolerances=tuple((str(k), Tolerance.parse(v, f"{where}.tolerances.{k}", str(k)))
                             for k, v in tol.items() if v != "<redacted>"),
            default=Tolerance.parse(sec.get("default_tolerance", "5%"), f"{where}.default_tolerance"),
            alpha=float(alpha),
            min_samples=int(sec.get("min_samples", 5)),
            bootstrap=int(sec.get("bootstrap", 1000)),
            method=method,
            fail_on_missing=bool(sec.get("fail_on_missing", False)),
            trend_runs=int(sec.get("trend_runs", 10)),
            trend_checks=tuple(str(p) for p in sec.get("trend_checks") or ()),
        )

    @classmethod
    def from_record(cls, record: RunRecord) -> "CompareSettings":
        return cls.from_mapping(history.compare_section(record.profile), f"{record.run_id}: profile compare")

    def with_overrides(self, pairs: Iterable[str]) -> "CompareSettings":
        """``PATTERN=TOL`` pairs from the command line; they win over the profile's."""
        extra = []
        for text in pairs:
            if "=" not in text:
                raise CompareError(f"--tolerance {text!r}: expected PATTERN=TOLERANCE, e.g. ttft_p99=5%")
            pat, raw = (s.strip() for s in text.split("=", 1))
            extra.append((pat, Tolerance.parse(raw, f"--tolerance {pat}", pat)))
        return replace(self, tolerances=tuple(extra) + self.tolerances)

    def tolerance_for(self, key: str, check_id: str, direction: str) -> Tolerance:
        best: tuple[int, int, Tolerance] | None = None
        for order, (pat, tol) in enumerate(self.tolerances):
            rank = _match_rank(pat, key, check_id)
            if rank is not None and (best is None or (rank, order) < best[:2]):
                best = (rank, order, tol)
        if best is not None:
            return best[2]
        # An exact check (a correctness count) gets no slack unless a key grants it.
        return Tolerance(0.0, False, "exact") if direction == "exact" else self.default


# --------------------------------------------------------------------------- significance


@dataclass(frozen=True)
class Significance:
    """Whether the samples say the run moved in the tested direction (not only the summary value)."""

    method: str
    significant: bool
    p_value: float
    n_base: int
    n_run: int
    interval: tuple[float, float] | None = None  # bootstrap: (1 - 2 alpha) interval of run - baseline

    def describe(self) -> str:
        ci = f", change interval [{self.interval[0]:.4g}, {self.interval[1]:.4g}]" if self.interval else ""
        return f"{self.method} p={self.p_value:.3g} (n={self.n_base}/{self.n_run}){ci}"

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "significant": self.significant, "p_value": self.p_value,
                "n_baseline": self.n_base, "n_run": self.n_run,
                "interval": list(self.interval) if self.interval else None}


def percentile_of(check_id: str) -> float:
    """The percentile a check reports, from its id (``latency.ttft_p99_9`` -> 99.9); else the median."""
    m = _PCT.search(check_id)
    if not m:
        return 50.0
    q = float(m.group(1).replace("_", "."))
    return q if 0 < q < 100 else 50.0


def scipy_available() -> bool:
    try:
        import scipy.stats  # noqa: F401
    except ImportError:
        return False
    return True


def mann_whitney(base: Sequence[float], run: Sequence[float], toward: int, alpha: float) -> Significance:
    """One-sided Mann-Whitney U (scipy): is the run stochastically larger (toward=+1) / smaller (-1)?"""
    from scipy.stats import mannwhitneyu

    res = mannwhitneyu(run, base, alternative="greater" if toward > 0 else "less")
    p = float(res.pvalue)
    return Significance("mann-whitney", p < alpha, p, len(base), len(run))


def bootstrap(
    base: Sequence[float], run: Sequence[float], q: float, toward: int, alpha: float,
    n_boot: int = 1000, seed: int = 0,
) -> Significance:
    """Bootstrap of (percentile q of the run) - (percentile q of the baseline), one-sided.

    Significant when fewer than ``alpha`` of the resampled differences fall on the other side
    of zero, i.e. the one-sided (1 - alpha) interval excludes no change. A tail percentile from
    few samples has a wide interval, so small runs err towards "noise" rather than flapping.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    b = np.asarray(base, dtype=float)
    r = np.asarray(run, dtype=float)
    if len(b) > MAX_BOOT_SAMPLES:
        b = rng.choice(b, MAX_BOOT_SAMPLES, replace=False)
    if len(r) > MAX_BOOT_SAMPLES:
        r = rng.choice(r, MAX_BOOT_SAMPLES, replace=False)
    diffs = np.empty(n_boot)
    chunk = max(1, 2_000_000 // max(len(b), len(r)))
    for start in range(0, n_boot, chunk):
        k = min(chunk, n_boot - start)
        sb = np.percentile(b[rng.integers(0, len(b), (k, len(b)))], q, axis=1)
        sr = np.percentile(r[rng.integers(0, len(r), (k, len(r)))], q, axis=1)
        diffs[start:start + k] = sr - sb
    p = float((np.count_nonzero(toward * diffs <= 0) + 1) / (n_boot + 1))
    lo, hi = (float(x) for x in np.quantile(diffs, [alpha, 1 - alpha]))
    return Significance(f"bootstrap p{q:g}", p < alpha, p, len(base), len(run), (lo, hi))


def _samples(check: Check) -> list[float] | None:
    ev = check.evidence if isinstance(check.evidence, dict) else {}
    raw = ev.get("samples")
    if not isinstance(raw, list):
        return None
    xs = [float(v) for v in raw if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    return xs or None


def significance(base: Check, run: Check, key: str, toward: int, settings: CompareSettings) -> Significance | None:
    """None when there is nothing to test (no samples, too few, or method "none")."""
    if settings.method == "none":
        return None
    xb, xr = _samples(base), _samples(run)
    if xb is None or xr is None or min(len(xb), len(xr)) < settings.min_samples:
        return None
    method = settings.method
    if method == "auto":
        method = "mann-whitney" if scipy_available() else "bootstrap"
    if method == "mann-whitney":
        if not scipy_available():
            raise CompareError("compare.method = \"mann-whitney\" needs scipy, which is not installed (use bootstrap)")
        return mann_whitney(xb, xr, toward, settings.alpha)
    return bootstrap(xb, xr, percentile_of(run.id), toward, settings.alpha, settings.bootstrap,
                     seed=zlib.crc32(key.encode()))


# --------------------------------------------------------------------------- matching


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


def _disc_value(check: Check, name: str) -> Any:
    if name == "nodeid":
        return check.nodeid or None
    ev = check.evidence if isinstance(check.evidence, dict) else {}
    v = ev.get(name)
    return v if _scalar(v) else None


def _discriminator(groups: Sequence[list[Check]]) -> tuple[str, ...] | None:
    """The fewest discriminator names whose values are unique within each run's group."""
    names = [n for n in (*DISCRIMINATORS, "nodeid") if any(_disc_value(c, n) is not None for g in groups for c in g)]
    for size in (1, 2, 3):
        for combo in combinations(names, size):
            if all(len({tuple(_disc_value(c, n) for n in combo) for c in g}) == len(g) for g in groups):
                return combo
    return None


def _key(check: Check, names: tuple[str, ...]) -> str:
    vals = [(n, _disc_value(check, n)) for n in names]
    shown = [f"{n}={v}" for n, v in vals if v is not None]
    return f"{check.id}[{','.join(shown)}]" if shown else check.id


def keyed(base: RunRecord, run: RunRecord) -> tuple[dict[str, Check], dict[str, Check], list[str]]:
    """Both runs' checks by comparison key, and notes on how repeated ids were matched."""
    b_checks, r_checks = list(base.checks()), list(run.checks())
    cb, cr = Counter(c.id for c in b_checks), Counter(c.id for c in r_checks)
    repeated = sorted(i for i in set(cb) | set(cr) if cb[i] > 1 or cr[i] > 1)
    notes: list[str] = []
    how: dict[str, tuple[str, ...] | None] = {}
    for cid in repeated:
        groups = [[c for c in b_checks if c.id == cid], [c for c in r_checks if c.id == cid]]
        how[cid] = _discriminator(groups)
        if how[cid] is None:
            notes.append(f"{cid} appears {cb[cid]}x in the baseline and {cr[cid]}x in this run with nothing in "
                         "its evidence to tell them apart; matched by position (#1, #2, ...)")
        else:
            notes.append(f"{cid} appears {cb[cid]}x / {cr[cid]}x; matched by {', '.join(how[cid])}")

    def build(checks: list[Check]) -> dict[str, Check]:
        out: dict[str, Check] = {}
        pos: Counter[str] = Counter()
        for c in checks:
            if c.id not in how:
                k = c.id
            elif how[c.id] is None:
                pos[c.id] += 1
                k = f"{c.id}#{pos[c.id]}"
            else:
                k = _key(c, how[c.id])  # type: ignore[arg-type]
            while k in out:  # cannot happen by construction; never drop a check silently
                k += "'"
            out[k] = c
        return out

    return build(b_checks), build(r_checks), notes


# --------------------------------------------------------------------------- comparison


@dataclass
class Row:
    """One check compared; ``why`` is the line a person reads."""

    key: str
    check_id: str
    title: str
    unit: str
    direction: str
    kind: str
    baseline: Any
    value: Any
    base_status: str | None
    status: str | None
    why: str
    delta: float | None = None
    relative: float | None = None
    tolerance: Tolerance | None = None
    bound: float | None = None  # the worst value the tolerance allows (non-exact numeric checks)
    significance: Significance | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key, "id": self.check_id, "title": self.title, "unit": self.unit, "direction": self.direction,
            "kind": self.kind, "baseline": self.baseline, "value": self.value, "baseline_status": self.base_status,
            "status": self.status, "delta": self.delta, "relative": self.relative,
            "tolerance": str(self.tolerance) if self.tolerance else None, "bound": self.bound,
            "significance": self.significance.to_dict() if self.significance else None, "why": self.why,
        }


@dataclass
class CompareResult:
    baseline_id: str
    run_id: str
    baseline_label: str
    profile: str
    rows: list[Row]
    notes: list[str] = field(default_factory=list)
    fail_on_missing: bool = False

    def of(self, *kinds: str) -> list[Row]:
        return [r for r in self.rows if r.kind in kinds]

    @property
    def regressions(self) -> list[Row]:
        return [r for r in self.rows if r.kind == "regression" or (self.fail_on_missing and r.kind == "missing")]

    @property
    def exit_code(self) -> int:
        return 1 if self.regressions else 0

    def counts(self) -> dict[str, int]:
        c = Counter(r.kind for r in self.rows)
        return {k: c[k] for k in KINDS if c[k]}

    def summary(self) -> str:
        counts = self.counts()
        text = ", ".join(f"{n} {k}" for k, n in counts.items()) or "no checks in common"
        n = len(self.regressions)
        head = f"{n} regression{'s' if n != 1 else ''}" if n else "no regression"
        return f"{head} vs baseline {self.baseline_label} ({text})"

    def to_dict(self) -> dict[str, Any]:
        return {"baseline_run_id": self.baseline_id, "run_id": self.run_id, "baseline": self.baseline_label,
                "profile": self.profile, "counts": self.counts(), "exit_code": self.exit_code,
                "notes": self.notes, "rows": [r.to_dict() for r in self.rows]}


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _f(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "—" if v is None else str(v)


def _u(v: Any, unit: str) -> str:
    return f"{_f(v)} {unit}".rstrip() if v is not None else "—"


def _change(row: "Row") -> str:
    if row.relative is not None:
        return f", {row.relative * 100:+.1f}%"
    return f", {row.delta:+.4g}" if row.delta is not None else ""


def _value_verdict(b: Check, r: Check, key: str, settings: CompareSettings) -> Row:
    """The numeric (or exact) comparison, before the pass/fail overlay."""
    row = Row(key, r.id, r.title or b.title, r.unit, r.direction, "unchanged", b.value, r.value, b.status, r.status, "")
    if (b.unit or "") != (r.unit or ""):
        row.kind, row.why = "incomparable", f"units differ (baseline {b.unit or 'none'}, this run {r.unit or 'none'})"
        return row
    if r.direction != b.direction:
        row.why = f"direction changed ({b.direction} -> {r.direction}); compared as {r.direction}"
    direction = r.direction
    tol = settings.tolerance_for(key, r.id, direction)
    row.tolerance = tol
    bv, rv = b.value, r.value
    if direction == "exact":
        lb, lr = b.limit, r.limit
        if is_number(bv) and is_number(rv):
            row.delta = float(rv - bv)
            if is_number(lb) and is_number(lr):
                worse = abs(rv - lr) - abs(bv - lb)
                allowed = tol.allowed(abs(bv - lb))
                if worse > allowed:
                    row.kind = "regression"
                    row.why = f"{_u(rv, r.unit)} is further from the exact limit {_f(lr)} than the baseline's {_f(bv)}"
                elif -worse > allowed:
                    row.kind = "improvement"
                    row.why = f"{_u(rv, r.unit)} is closer to the exact limit {_f(lr)} than the baseline's {_f(bv)}"
                else:
                    row.why = row.why or f"{_u(rv, r.unit)}, as far from the exact limit as the baseline"
                return row
            if abs(rv - bv) > tol.allowed(bv):
                row.kind = "changed"
                row.why = f"{_u(rv, r.unit)} differs from the baseline's {_f(bv)} (no limit: a recorded figure)"
            else:
                row.why = row.why or f"{_u(rv, r.unit)}, equal to the baseline within {tol}"
            return row
        ok_b = lb is not None and bv == lb
        ok_r = lr is not None and rv == lr
        if lb is not None and lr is not None and ok_b and not ok_r:
            row.kind, row.why = "regression", f"{_f(rv)} no longer equals the expected {_f(lr)} (baseline {_f(bv)})"
        elif lb is not None and lr is not None and ok_r and not ok_b:
            row.kind, row.why = "improvement", f"{_f(rv)} now equals the expected {_f(lr)} (baseline {_f(bv)})"
        elif rv != bv:
            row.kind, row.why = "changed", f"{_f(rv)} differs from the baseline's {_f(bv)}"
        else:
            row.why = row.why or f"{_f(rv)}, as in the baseline"
        return row
    if not (is_number(bv) and is_number(rv)):
        row.kind, row.why = "incomparable", f"non-numeric values ({_f(bv)} vs {_f(rv)}) for a {direction} check"
        return row
    sign = 1.0 if direction == "lower_is_better" else -1.0  # +1: larger is worse
    row.delta = float(rv - bv)
    row.relative = row.delta / abs(bv) if bv else None
    allowed = tol.allowed(bv)
    row.bound = float(bv + sign * allowed)
    worse = sign * row.delta
    change = f"{row.relative * 100:+.1f}%" if row.relative is not None else f"{row.delta:+.4g} {r.unit}".rstrip()
    if abs(worse) <= allowed:
        row.why = row.why or f"{_u(rv, r.unit)} vs {_u(bv, r.unit)} ({change}), within the {tol} tolerance"
        return row
    kind = "regression" if worse > 0 else "improvement"
    toward = int(sign) if kind == "regression" else -int(sign)
    row.significance = significance(b, r, key, toward, settings)
    better_worse = "worse" if kind == "regression" else "better"
    base = f"{_u(rv, r.unit)} vs {_u(bv, r.unit)} ({change}): {better_worse} beyond the {tol} tolerance"
    if row.significance is None:
        row.kind, row.why = kind, base
    elif row.significance.significant:
        row.kind, row.why = kind, f"{base}; significant: {row.significance.describe()}"
    else:
        row.kind = "noise"
        row.why = (f"{base} but not significant ({row.significance.describe()}, alpha {settings.alpha:g}): "
                   "treated as noise")
    return row


def compare_checks(key: str, b: Check | None, r: Check | None, settings: CompareSettings) -> Row:
    """One row: the value comparison, then the pass/fail overlay (a new failure is a regression)."""
    if b is None and r is None:
        raise ValueError(f"{key}: nothing to compare")
    if b is None:
        assert r is not None
        kind = "regression" if r.failed else "new"
        why = f"new check that {r.status}s: {r.message}" if r.failed else f"new check (not in the baseline): {r.message}"
        return Row(key, r.id, r.title, r.unit, r.direction, kind, None, r.value, None, r.status, one_line(why))
    if r is None:
        why = f"in the baseline ({b.status}, {_u(b.value, b.unit)}) but not in this run"
        return Row(key, b.id, b.title, b.unit, b.direction, "missing", b.value, None, b.status, None, why)
    unmeasured = ("skip", "blocked")
    if r.status in unmeasured:
        return Row(key, r.id, r.title, r.unit, r.direction, "unmeasured", b.value, r.value, b.status, r.status,
                   one_line(f"not measured in this run ({r.status}: {r.message})"))
    both = r.value is not None and b.value is not None
    if r.failed and not b.failed:
        row = _value_verdict(b, r, key, settings) if both else Row(
            key, r.id, r.title, r.unit, r.direction, "regression", b.value, r.value, b.status, r.status, "")
        row.kind = "regression"
        moved = f" ({_u(r.value, r.unit)} vs {_u(b.value, b.unit)}{_change(row)})" if row.delta is not None else ""
        row.why = one_line(f"status {b.status} -> {r.status}{moved}: {r.message}")
        return row
    if b.status in unmeasured:
        return Row(key, r.id, r.title, r.unit, r.direction, "new", b.value, r.value, b.status, r.status,
                   one_line(f"measured for the first time (baseline {b.status}): {r.message}"))
    if not both:  # a pass/fail check without a figure: only its status can move
        if b.failed and not r.failed:
            kind, why = "improvement", f"status {b.status} -> {r.status}: {r.message}"
        else:
            kind, why = "unchanged", f"{r.status}, as in the baseline (no value to compare)"
        return Row(key, r.id, r.title, r.unit, r.direction, kind, b.value, r.value, b.status, r.status, one_line(why))
    row = _value_verdict(b, r, key, settings)
    if b.failed and not r.failed and row.kind != "regression":
        row.kind = "improvement"
        row.why = one_line(f"status {b.status} -> {r.status}; {row.why}")
    return row


_ORDER = {k: i for i, k in enumerate(KINDS)}


def check_compatible(base: RunRecord, run: RunRecord, base_label: str = "baseline") -> None:
    if base.run_id == run.run_id:
        raise CompareError(f"{base_label}: is run {run.run_id} itself; compare with an earlier run "
                           "(a fixed path, or latest-accepted)")
    pb, pr = history.profile_name(base), history.profile_name(run)
    if pb != pr:
        raise CompareError(f"{base_label}: profile {pb!r} differs from this run's {pr!r}; "
                           "a baseline must be a run of the same profile")


def _flat(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, Mapping):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: obj}


def profile_differences(base: RunRecord, run: RunRecord, limit: int = 8) -> list[str]:
    """What changed in the resolved profile (a nightly's first question: was it the config?)."""
    fb, fr = _flat(base.profile), _flat(run.profile)
    keys = sorted(k for k in set(fb) | set(fr) if fb.get(k) != fr.get(k) and not k.startswith("compare."))
    lines = [f"{k}: {json.dumps(fb.get(k))} -> {json.dumps(fr.get(k))}" for k in keys[:limit]]
    if len(keys) > limit:
        lines.append(f"... and {len(keys) - limit} more profile keys")
    return lines


def compare_records(
    base: RunRecord, run: RunRecord, settings: CompareSettings | None = None, base_label: str | None = None,
) -> CompareResult:
    """Compare every check of ``run`` with ``base``; raises CompareError when they are not comparable."""
    label = base_label or base.run_id
    check_compatible(base, run, label)
    settings = settings or CompareSettings.from_record(run)
    kb, kr, notes = keyed(base, run)
    mb, mr = history.machine_id(base), history.machine_id(run)
    if mb != mr:
        notes.append(f"machines differ: baseline {mb}, this run {mr}")
    diffs = profile_differences(base, run)
    if diffs:
        notes.append("profile differs: " + "; ".join(diffs))
    rows = [compare_checks(k, kb.get(k), c, settings) for k, c in kr.items()]
    rows += [compare_checks(k, c, None, settings) for k, c in kb.items() if k not in kr]
    rows.sort(key=lambda r: _ORDER.get(r.kind, 99))  # stable: run order within a kind
    return CompareResult(base.run_id, run.run_id, label, history.profile_name(run), rows, notes,
                         settings.fail_on_missing)


# --------------------------------------------------------------------------- output


def format_table(result: CompareResult, show_all: bool = False) -> str:
    """The table the CLI prints: changes first; unchanged rows only with ``show_all``."""
    lines = [f"day0 compare: run {result.run_id} vs baseline {result.baseline_label} (profile {result.profile})"]
    lines += [f"  note: {n}" for n in result.notes]
    shown = [r for r in result.rows if show_all or r.kind != "unchanged"]
    if shown:
        head = ("KIND", "CHECK", "BASELINE", "THIS RUN", "CHANGE", "TOLERANCE", "WHY")
        table = [head]
        for r in shown:
            change = (f"{r.relative * 100:+.1f}%" if r.relative is not None
                      else (f"{r.delta:+.4g}" if r.delta is not None else ""))
            kind = r.kind.upper() if r.kind in ("regression", "improvement") else r.kind
            tol = "" if r.tolerance is None else str(replace(r.tolerance, pattern=""))
            table.append((kind, r.key, _u(r.baseline, r.unit), _u(r.value, r.unit), change, tol, r.why))
        widths = [min(48, max(len(str(row[i])) for row in table)) for i in range(len(head) - 1)]
        for row in table:
            cells = [str(c)[: w].ljust(w) for c, w in zip(row, widths)]
            lines.append("  " + "  ".join(cells) + "  " + str(row[-1]))
    unchanged = len(result.of("unchanged"))
    if unchanged and not show_all:
        lines.append(f"  ({unchanged} checks unchanged within tolerance; --all lists them)")
    lines.append(f"result: {result.summary()}")
    return "\n".join(lines)


def _table(result: CompareResult) -> dict[str, Any]:
    rows = []
    for r in result.rows:
        change = f"{r.relative * 100:+.1f}%" if r.relative is not None else (_f(r.delta) if r.delta is not None else "")
        sig = r.significance.describe() if r.significance else ""
        rows.append([r.key, r.kind, _f(r.baseline), _f(r.value), r.unit, change,
                     str(r.tolerance) if r.tolerance else "", sig, r.why])
    return {"columns": ["check", "kind", "baseline", "this run", "unit", "change", "tolerance", "significance", "why"],
            "rows": rows}


def _matches_any(patterns: Sequence[str], key: str, check_id: str) -> bool:
    return any(_match_rank(p, key, check_id) is not None for p in patterns)


def trend_charts(
    past: Sequence[tuple[str, RunRecord]], base: RunRecord, base_label: str, run: RunRecord,
    result: CompareResult, settings: CompareSettings,
) -> list[dict[str, Any]]:
    """Line charts (evidence chart specs) of key metrics over the last runs in history plus this one.

    Key metrics: ``compare.trend_checks`` patterns, else every compared numeric check with a
    direction, regressions first, at most MAX_TREND_CHARTS. Only ids unique in a run are drawn.
    """
    runs = list(past)
    if base.run_id not in {rec.run_id for _, rec in runs}:
        runs.insert(0, ("baseline", base))
    runs = runs[-max(1, settings.trend_runs - 1):] + [("this run", run)]
    candidates = [r for r in result.rows if r.key == r.check_id and r.direction != "exact"
                  and is_number(r.value) and r.kind in ("regression", "improvement", "noise", "unchanged")]
    if settings.trend_checks:
        candidates = [r for r in candidates if _matches_any(settings.trend_checks, r.key, r.check_id)]
    candidates = candidates[:MAX_TREND_CHARTS]
    values: list[dict[str, Any]] = []
    for _, rec in runs:
        counts = Counter(c.id for c in rec.checks())
        values.append({c.id: c.value for c in rec.checks() if counts[c.id] == 1})
    charts = []
    labels = [lbl for lbl, _ in runs]
    for row in candidates:
        ys = [v.get(row.check_id) if is_number(v.get(row.check_id)) else None for v in values]
        ref = [{"y": float(row.baseline), "label": "baseline"}] if is_number(row.baseline) else []
        limit = next((c.limit for c in run.checks() if c.id == row.check_id), None)
        seen = [float(y) for y in ys if y is not None] + ([float(row.baseline)] if is_number(row.baseline) else [])
        if is_number(limit) and seen and min(seen) / 2 <= limit <= 2 * max(seen):
            ref.append({"y": float(limit), "label": "limit"})  # a far-off limit would flatten the trend
        charts.append({
            "kind": "line", "title": f"{row.check_id} over the last {len(runs)} runs ({row.kind})",
            "x_label": "run (history number)", "y_label": row.unit or "value", "x_log": False,
            "series": [{"name": row.check_id, "x": labels, "y": ys}], "reference": ref,
        })
    return charts


def regression_checks(
    result: CompareResult, base_path: str = "", charts: list[dict[str, Any]] | None = None,
) -> list[Check]:
    """The comparison as run-record checks: a summary first (its message becomes the run's
    reason when it rejects), then one check per compared metric."""
    regs = result.regressions
    first = f": first {regs[0].key}: {regs[0].why}" if regs else ""
    summary = Check(
        id=SUMMARY_ID, title=f"No regression against baseline {result.baseline_label}",
        status="fail" if regs else "pass", value=len(regs), limit=0, unit="regressions", direction="exact",
        message=one_line(result.summary() + first), source="compare",
        evidence={"baseline": {"run_id": result.baseline_id, "label": result.baseline_label, "path": base_path},
                  "counts": result.counts(), "notes": result.notes, "table": _table(result),
                  "trend_charts": charts or []},
    )
    out = [summary]
    for r in result.rows:
        failing = r in regs
        if r.kind not in ("regression", "improvement", "noise", "unchanged", "changed") and not failing:
            continue
        out.append(Check(
            id=f"regression.{r.key}", title=f"{r.title or r.check_id} vs baseline",
            status="fail" if failing else "pass", value=r.value if _plain(r.value) else str(r.value),
            limit=r.bound, unit=r.unit, direction=r.direction,  # type: ignore[arg-type]
            message=r.why, source="compare",
            evidence={"kind": r.kind, "baseline_value": r.baseline if _plain(r.baseline) else str(r.baseline),
                      "baseline_run_id": result.baseline_id, "delta": r.delta, "relative": r.relative,
                      "tolerance": str(r.tolerance) if r.tolerance else None,
                      "significance": r.significance.to_dict() if r.significance else None},
        ))
    return out


def _plain(v: Any) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


# --------------------------------------------------------------------------- baselines


def resolve_baseline(spec: str, run: RunRecord, folder: Path) -> tuple[str, str, RunRecord] | None:
    """(label, path, record) for a path or a history keyword; None when the history has none yet."""
    if spec in history.BASELINE_KEYWORDS:
        found = history.find_baseline(spec, run, folder)
        if found is None:
            return None
        entry, rec = found
        return f"{entry.label} ({rec.run_id})", str(entry.path), rec
    path = Path(spec)
    rec = load(path)
    return rec.run_id, str(path / RUN_FILE if path.is_dir() else path), rec


def finish_run(session: "Day0Session") -> RunRecord:
    """End-of-run step (Day0Session.finish, before the report): compare with the session's
    baseline when one was asked for, then append run.json to the history. Returns the record
    as it now stands. Never raises: a comparison that cannot be made becomes an error check
    (the user asked for it), a history that cannot be written a log line."""
    record = session.record if session.record is not None else rebuild(session.run_dir)
    folder = history.folder_for(history.history_root(record.profile, session.out_dir), record)
    spec = getattr(session, "baseline", None)
    if spec:
        checks: list[Check] = []
        try:
            settings = CompareSettings.from_record(record)
            found = resolve_baseline(str(spec), record, folder)
            if found is None:
                msg = f"no {spec} run in {folder} yet; nothing compared (this run can become the baseline)"
                session.events.note("regression", msg)
                session.log(f"regression: {msg}")
            else:
                label, path, base = found
                result = compare_records(base, record, settings, label)
                past = history.recent(folder, max(0, settings.trend_runs - 1), record.run_id)
                charts = trend_charts([(e.label, r) for e, r in past], base, label, record, result, settings)
                checks = regression_checks(result, path, charts)
                session.log(f"regression: {result.summary()}")
        except (CompareError, RecordError, history.HistoryError, OSError) as exc:
            checks = [Check(id=SUMMARY_ID, title="No regression against the baseline", status="error",
                            message=f"baseline {spec}: {exc}", source="compare")]
        except Exception as exc:  # a comparison bug must not cost the run record
            checks = [Check(id=SUMMARY_ID, title="No regression against the baseline", status="error",
                            message=f"comparison failed: {type(exc).__name__}: {exc} (a day0 bug; the measurements stand)",
                            evidence={"traceback": traceback.format_exc()[-8000:]}, source="compare")]
        for c in checks:
            session.add_check(REGRESSION_STAGE.name, c)
        record = rebuild(session.run_dir)
    if history.compare_section(record.profile).get("history", True):
        try:
            entry = history.store(session.run_dir / RUN_FILE, folder)
            session.log(f"history: stored as {entry.path}")
        except (OSError, RecordError, history.HistoryError) as exc:
            session.log(f"history: run not stored: {exc}")
    return record


def regressed(record: RunRecord | None) -> bool:
    """Whether the regression stage rejected the run (the plugin turns this into a failing exit)."""
    if record is None:
        return False
    return any(c.failed for s in record.stages if s.name == REGRESSION_STAGE.name for c in s.checks)


# --------------------------------------------------------------------------- CLI


def _cmd_compare(args: argparse.Namespace) -> int:
    run_path = Path(args.run)
    run = load(run_path)
    settings = CompareSettings.from_record(run).with_overrides(args.tolerance or [])
    if args.method:
        settings = replace(settings, method=args.method)
    if args.fail_on_missing:
        settings = replace(settings, fail_on_missing=True)
    if args.baseline in history.BASELINE_KEYWORDS:
        run_file = run_path / RUN_FILE if run_path.is_dir() else run_path
        root = Path(args.history) if args.history else history.history_root(run.profile, run_file.parent.parent)
        folder = history.folder_for(root, run, args.machine or "")
    else:
        folder = Path(".")
    found = resolve_baseline(args.baseline, run, folder)
    if found is None:
        raise CompareError(f"no {args.baseline} run in {folder}; give --baseline PATH, or store an accepted run first")
    label, path, base = found
    result = compare_records(base, run, settings, label)
    print(format_table(result, show_all=args.all))
    if args.json:
        Path(args.json).write_text(json.dumps(result.to_dict(), indent=1) + "\n", encoding="utf-8")
    return result.exit_code


def _guard(fn: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except (CompareError, RecordError, history.HistoryError, OSError) as exc:
            print(f"day0 compare: error: {exc}", file=sys.stderr)
            return 2

    return run


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    """Register ``compare`` and ``history``; each sets ``func(args) -> exit code``."""
    p = subparsers.add_parser(
        "compare", help="compare a run with a baseline run: exit 1 on a regression, 2 on unusable input")
    p.add_argument("run", help="run folder or run.json")
    p.add_argument("--baseline", required=True, metavar="PATH|latest-accepted|latest",
                   help="baseline run folder or run.json, or the newest (accepted) run in the history")
    p.add_argument("--history", help="history folder (default: the profile's compare.history_dir beside the run)")
    p.add_argument("--machine", help="history machine folder (default: derived from the recorded devices)")
    p.add_argument("--tolerance", action="append", metavar="PATTERN=TOL",
                   help="tolerance for checks matching PATTERN, e.g. ttft_p99=5%% or 'collectives.*.busbw=20%%' "
                        "(repeatable; wins over the profile)")
    p.add_argument("--method", choices=METHODS, help="significance test (default: the profile's, auto)")
    p.add_argument("--fail-on-missing", action="store_true", help="a check missing from the run is a regression")
    p.add_argument("--all", action="store_true", help="also list unchanged checks")
    p.add_argument("--json", metavar="FILE", help="write the comparison as JSON")
    p.set_defaults(func=_guard(_cmd_compare))
    history.add_cli(subparsers)
