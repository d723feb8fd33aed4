"""One audit run's state, and the check builder: what the run has learnt of the checkpoint, what
it found per category, and how those findings become :class:`~day0.core.record.Check` objects.

Every problem becomes one failed check; a category without problems gives one passing summary
check; a category that cannot be judged gives one skip saying why. The audit steps (index,
headers, config, manifest) only call :meth:`AuditRun.fail`, :meth:`~AuditRun.ok` and
:meth:`~AuditRun.skip`; :meth:`AuditRun.checks` renders them, in :data:`CATEGORIES` order.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from day0.core.record import Check
from day0.model.safetensors_header import ShardHeader
from day0.stages.weights import manifest as manifest_mod
from day0.stages.weights.manifest import Progress

INDEX_NAME = "model.safetensors.index.json"
CONFIG_NAME = "config.json"
SOURCE = "static"
DEFAULT_MAX_CHECKS_PER_CATEGORY = 200
# Findings kept per category; past it they are only counted. A hostile index naming a million
# missing shards must cost a counter, not a million objects and a million-row evidence table.
MAX_FINDINGS_KEPT = 10_000

TITLES: dict[str, str] = {
    "weights.index": "Shard index readable and well-formed",
    "weights.config": "config.json readable and describes a known model",
    "weights.shards_present": "Every shard named in the index exists",
    "weights.orphan_shards": "No shard file outside the index",
    "weights.shard_header": "Every shard header is readable",
    "weights.shard_layout": "Shard data offsets are contiguous and match dtype x shape",
    "weights.shard_size": "Shard file sizes match their headers (no truncation or padding)",
    "weights.tensor_placement": "Every tensor is in the shard the index names, and only there",
    "weights.total_size": "Index metadata.total_size matches the shards",
    "weights.dtypes": "Tensor dtypes agree with config.json",
    "weights.shapes": "Tensor names and shapes agree with config.json",
    "weights.param_count": "Parameter count agrees with config.json",
    "weights.manifest": "Files match the SHA-256 manifest",
}
CATEGORIES: tuple[str, ...] = tuple(TITLES)


@dataclass
class Finding:
    message: str
    shard: str | None = None
    tensor: str | None = None
    value: Any = None
    limit: Any = None
    unit: str = ""


@dataclass
class Summary:
    status: str  # pass | skip
    message: str
    value: Any = None
    limit: Any = None
    unit: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)


def human(n: float) -> str:
    """A byte count as people read it: ``812 B``, ``4.3 GB`` (powers of 1000)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"


class AuditRun:
    """One audit run: collects findings per category, then renders them as checks."""

    def __init__(self, model_dir: Path, verify_manifest: bool, workers: int | None,
                 progress: Progress, manifest_name: str, architectures: Sequence[str] = ()) -> None:
        self.dir = model_dir
        self.architectures = tuple(architectures)  # the engine's hf_overrides.architectures, over config.json's
        self.verify_manifest = verify_manifest
        self.workers = workers or manifest_mod.default_workers()
        self.progress = progress
        self.manifest_name = manifest_name
        self.findings: dict[str, list[Finding]] = {c: [] for c in CATEGORIES}
        self.dropped: dict[str, int] = {c: 0 for c in CATEGORIES}  # findings past MAX_FINDINGS_KEPT
        self.summaries: dict[str, Summary] = {}
        self.crashed: Check | None = None
        # what the run learns
        self.weight_map: dict[str, str] | None = None  # tensor -> shard, when the index is usable
        self.index_meta: dict[str, Any] = {}
        self.shards: list[str] = []  # the files that make up the checkpoint
        self.missing: set[str] = set()
        self.headers: dict[str, ShardHeader] = {}
        self.unreadable: set[str] = set()
        self.located: dict[str, list[str]] = {}  # tensor -> shards whose header holds it

    # ----------------------------------------------------------------- bookkeeping

    def fail(self, cat: str, message: str, **kw: Any) -> None:
        if len(self.findings[cat]) >= MAX_FINDINGS_KEPT:
            self.dropped[cat] += 1
            return
        self.findings[cat].append(Finding(message, **kw))

    def ok(self, cat: str, message: str, **kw: Any) -> None:
        self.summaries[cat] = Summary("pass", message, **kw)

    def skip(self, cat: str, message: str) -> None:
        self.summaries.setdefault(cat, Summary("skip", message))

    def crash(self, exc: BaseException) -> None:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        self.crashed = Check(
            id="weights.audit",
            title="Static weights audit ran to completion",
            status="error",
            message=f"{self.dir}: audit stopped by {type(exc).__name__}: {exc} (a day0 bug; checks above still hold)",
            evidence={"log_excerpt": tb[-4000:]},
            source=SOURCE,
        )

    # ----------------------------------------------------------------- the checks

    def checks(self, cap: int) -> list[Check]:
        """Every category in order: its failures (at most ``cap``, the rest folded into one), else its summary."""
        out: list[Check] = []
        for cat in CATEGORIES:
            found = self.findings[cat]
            if found:
                out += [_failed(cat, f) for f in found[:cap]]
                if found[cap:] or self.dropped[cat]:
                    out.append(_folded(cat, found, cap, self.dropped[cat]))
                continue
            s = self.summaries.get(cat) or Summary("skip", "not checked: an earlier problem stopped the audit")
            out.append(Check(id=cat, title=TITLES[cat], status=s.status, value=s.value,  # type: ignore[arg-type]
                             limit=s.limit, unit=s.unit, direction="exact", message=s.message,
                             evidence=s.evidence, source=SOURCE))
        if self.crashed is not None:
            out.append(self.crashed)
        return out


def _failed(cat: str, f: Finding) -> Check:
    ev = {k: v for k, v in (("shard", f.shard), ("tensor", f.tensor)) if v is not None}
    return Check(id=cat, title=TITLES[cat], status="fail", value=f.value, limit=f.limit,
                 unit=f.unit, direction="exact", message=f.message, evidence=ev,
                 source=SOURCE)


def _folded(cat: str, found: list[Finding], cap: int, dropped: int = 0) -> Check:
    """The failures beyond the cap as one check whose evidence table lists them (the first
    :data:`MAX_FINDINGS_KEPT`; ``dropped`` more were only counted)."""
    rest = found[cap:]
    total = len(found) + dropped
    first = f", first: {rest[0].message}" if rest else ""
    return Check(
        id=cat, title=TITLES[cat], status="fail", value=total, limit=0, unit="problems",
        direction="exact",
        message=f"{len(rest) + dropped} more {cat} problems (of {total}){first}",
        evidence={"table": {"columns": ["shard", "tensor", "message"],
                            "rows": [[f.shard, f.tensor, f.message] for f in rest]}},
        source=SOURCE,
    )
