"""The profile's ``[compare]`` table: the run history and how a nightly is judged against it.

One definition, read by the profile (``Profile.compare``), by the nightly judgement of the
results layer (which calls it ``CompareSettings`` and reads it back from a run record's resolved
profile with :meth:`CompareSection.from_mapping`), by ``day0 compare`` (``--tolerance`` through
:meth:`CompareSection.with_overrides`) and by the run history (``history``, ``history_dir``,
``machine``). The tolerance syntax and :class:`CompareError` live here too, since the table is
validated with them; this module imports nothing above ``day0.config``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, WithJsonSchema, field_validator

from day0.config.errors import first_error
from day0.core.globs import checked
from day0.core.globs import matches as glob_matches
from day0.core.redact import REDACTED as _REDACTED  # what run.json holds for a secret

_ABS = re.compile(r"^[+]?(\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?$")


class CompareError(ValueError):
    """Input that cannot be compared (different profile, no baseline, bad tolerance): exit code 2."""


def _parse_tolerance(raw: Any) -> tuple[float, bool]:
    """(amount, relative) from ``"5%"`` or an absolute number; ValueError with the reason."""
    if isinstance(raw, bool):
        raise ValueError(f"{raw!r} is not a tolerance (use \"5%\" or an absolute number)")
    if isinstance(raw, (int, float)):
        amount, relative = float(raw), False
    elif isinstance(raw, str) and raw.strip().endswith("%") and _ABS.match(raw.strip()[:-1].strip()):
        amount, relative = float(raw.strip()[:-1]) / 100.0, True
    elif isinstance(raw, str) and _ABS.match(raw.strip()):
        amount, relative = float(raw.strip()), False
    else:
        raise ValueError(f"{raw!r} is not a tolerance "
                         "(use a percent like \"5%\" or an absolute number in the check's unit)")
    if not math.isfinite(amount) or amount < 0:
        raise ValueError(f"a tolerance must be a finite number >= 0, got {raw!r}")
    return amount, relative


@dataclass(frozen=True)
class Tolerance:
    """Slack on top of the run-to-run spread, for changes too small to matter: a fraction of
    the history's median (``"5%"``) or an absolute amount in the check's unit (``2.5``)."""

    amount: float
    relative: bool
    pattern: str = ""  # the [compare.tolerances] key that chose it; "" for the default

    @classmethod
    def parse(cls, raw: Any, where: str, pattern: str = "") -> "Tolerance":
        try:
            amount, relative = _parse_tolerance(raw)
        except ValueError as exc:
            raise CompareError(f"{where}: {exc}") from None
        return cls(amount, relative, pattern)

    def allowed(self, base: float) -> float:
        return self.amount * abs(base) if self.relative else self.amount

    def __str__(self) -> str:
        text = f"{self.amount * 100:g}%" if self.relative else f"±{self.amount:g}"
        return f"{text} ({self.pattern})" if self.pattern else text


def _check_tolerance(raw: Any) -> Any:
    _parse_tolerance(raw)
    return raw


#: A tolerance as the table takes it: ``"5%"`` (of the history's median) or a number in the check's unit.
ToleranceValue = Annotated[
    Union[str, float],
    BeforeValidator(_check_tolerance),
    WithJsonSchema({"anyOf": [{"type": "string", "pattern": r"^\s*\+?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?(\s*%)?\s*$"},
                              {"type": "number", "minimum": 0}]}),
]


def match_rank(pattern: str, key: str, check_id: str) -> int | None:
    """How well a tolerance key names a check (lower is better); None when it does not."""
    names = (key, check_id)
    if pattern in names:
        return 0
    if any(n.endswith("." + pattern) for n in names):
        return 1  # `ttft_p99` names `latency.ttft_p99`
    if any(glob_matches(n, pattern) for n in names):
        return 2
    if any(glob_matches(n, "*." + pattern) for n in names):
        return 3
    return None


class CompareSection(BaseModel):
    """``[compare]``: the run history and the nightly judgement against it (docs/ci.md)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    history: bool = Field(True, description="keep every run's run.json under history_dir/<profile>/<machine>/")
    history_dir: str = Field("history", description="absolute, or relative to report.out_dir")
    machine: str = Field("", description="history folder for this hardware; empty: derived from the recorded devices")
    history_runs: int = Field(5, ge=2, description="runs a nightly is judged against; fewer: gross changes only")
    spread_k: float = Field(2.5, ge=0, allow_inf_nan=False,
                            description="a regression is worse than the median by > k_n x spread + tolerance")
    gross_factor: float = Field(2.0, gt=1, allow_inf_nan=False,
                                description="doubled (lower is better) or halved counts whatever the spread")
    default_tolerance: ToleranceValue = Field(
        "5%", description="\"5%\" of the history's median, or absolute in the check's unit")
    tolerances: dict[str, ToleranceValue] = Field(
        {}, description="check id, id suffix or glob -> tolerance (as default_tolerance)")
    fail_on_missing: bool = Field(False, description="a performance figure missing from the run is a regression")
    trend_runs: int = Field(10, ge=2, description="runs in the report's trend charts (this one included)")
    trend_checks: list[str] = Field(
        [], description="ids/globs charted; empty: the compared figures, regressions first")

    @field_validator("tolerances", "trend_checks")
    @classmethod
    def _patterns(cls, value: Any) -> Any:
        for pattern in value:  # a dict's keys, a list's items
            checked(pattern)
        return value

    @classmethod
    def from_mapping(cls, sec: Mapping[str, Any] | None, where: str = "compare") -> "CompareSection":
        """The table as a run record stored it (``run.json``'s resolved profile). The profile
        validated it when the run was made, so keys of an older day0 (``alpha``, ``method``) are
        passed over, as are tolerances whose key looked like a secret (redacted); a bad value is
        a CompareError naming ``where.key`` in one line."""
        if sec is not None and not isinstance(sec, Mapping):
            raise CompareError(f"{where}: expected a table")
        data = {k: v for k, v in (sec or {}).items() if k in cls.model_fields}
        if isinstance(data.get("tolerances"), Mapping):
            # a key that looks like a secret (`..._token`) was redacted in run.json: skip it, never guess
            data["tolerances"] = {str(k): v for k, v in data["tolerances"].items() if v != _REDACTED}
        elif data.get("tolerances") is None:
            data.pop("tolerances", None)
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise CompareError(first_error(exc, cls, where)) from None

    def with_overrides(self, pairs: Iterable[str]) -> "CompareSection":
        """``PATTERN=TOL`` pairs from the command line; they win over the profile's."""
        extra: dict[str, str] = {}
        for text in pairs:
            if "=" not in text:
                raise CompareError(f"--tolerance {text!r}: expected PATTERN=TOLERANCE, e.g. ttft_p99=5%")
            pat, raw = (s.strip() for s in text.split("=", 1))
            try:
                checked(pat)
            except ValueError as exc:
                raise CompareError(f"--tolerance: {exc}") from None
            Tolerance.parse(raw, f"--tolerance {pat}", pat)
            extra.setdefault(pat, raw)
        kept = {k: v for k, v in self.tolerances.items() if k not in extra}
        return self.model_copy(update={"tolerances": {**extra, **kept}})

    @property
    def default(self) -> Tolerance:
        return Tolerance.parse(self.default_tolerance, "compare.default_tolerance")

    def tolerance_for(self, key: str, check_id: str) -> Tolerance:
        """The full id wins over a suffix, a suffix over a glob, then the first listed."""
        best: tuple[int, int, str] | None = None
        for order, pat in enumerate(self.tolerances):
            rank = match_rank(pat, key, check_id)
            if rank is not None and (best is None or (rank, order) < best[:2]):
                best = (rank, order, pat)
        if best is None:
            return self.default
        pat = best[2]
        return Tolerance.parse(self.tolerances[pat], f"compare.tolerances.{pat}", pat)
