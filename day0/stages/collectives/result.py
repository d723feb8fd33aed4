"""The result of a sweep (measured here or imported from nccl-tests) and the folder it lives in.

Rank 0 writes ``<out-dir>/collectives.json`` (schema ``day0.collectives/1``) after every op; the
launcher adds the fault it diagnosed. The checks read only this structure.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from day0.core.inputs import InputError, loose_json, read_text
from day0.core.outputs import write_file
from day0.core.record import jsonable
from day0.stages.collectives.inputs import MAX_JSON_BYTES, UNREADABLE_LOG, iter_lines

RESULT_FILE = "collectives.json"
SETTINGS_FILE = "settings.json"
RANKS_DIR = "ranks"
RESULT_SCHEMA = "day0.collectives/1"


@dataclass
class SweepRow:
    op: str
    mode: str  # out_of_place | in_place
    size_bytes: int
    count: int
    dtype: str
    nranks: int
    time_us: float | None  # mean per iteration (nccl-tests' figure: total / iters, max over ranks)
    algbw_gbps: float | None
    busbw_gbps: float | None
    wrong: int | None  # mismatched elements summed over ranks; None: not checked
    iters: int | None = None
    times_us: list[float] | None = None  # per-iteration, max over ranks
    p50_us: float | None = None
    p90_us: float | None = None
    p99_us: float | None = None
    min_us: float | None = None
    max_us: float | None = None
    max_error: float | None = None  # only from older nccl-tests output
    scope: str = ""  # intra_node | inter_node (the ranks' group spans one node or several); "" imported
    node: str = ""  # the node of an intra-node row of a multi-node run


@dataclass
class OpOutcome:
    op: str
    status: str = "not_run"  # ok | skip | error | not_run
    reason: str = ""
    modes: list[str] = field(default_factory=list)
    out_of_bounds: int | None = None  # nccl-tests footer, when imported
    avg_busbw_gbps: float | None = None  # nccl-tests footer, when imported


@dataclass
class RankState:
    """What the launcher knows of one rank after the run: exit, last step, error, heartbeat."""

    rank: int
    pid: int | None = None
    host: str | None = None
    returncode: int | None = None  # None: still running when the harness killed it
    killed_by_harness: bool = False
    heartbeat_age_s: float | None = None
    step: dict[str, Any] | None = None  # last sweep point the rank entered
    error: str | None = None  # first line of the rank's exception, if it wrote one


@dataclass
class Fault:
    kind: str  # died | hung | error | timeout | startup
    ranks: list[int]
    message: str
    ranks_state: list[RankState] = field(default_factory=list)
    elapsed_s: float | None = None


@dataclass
class CollectivesResult:
    source: str = "day0"  # day0 | nccl-tests
    backend: str = ""
    world_size: int = 0
    hosts: list[str] = field(default_factory=list)  # per rank
    dtype: str = ""
    ops: dict[str, OpOutcome] = field(default_factory=dict)
    rows: list[SweepRow] = field(default_factory=list)
    fault: Fault | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    started_at: str = ""
    duration_s: float | None = None
    versions: dict[str, str] = field(default_factory=dict)
    nccl_logs: list[str] = field(default_factory=list)
    # Multi-node runs: the node-to-node link matrix (collectives.links) and every rank's TCP
    # connections (collectives.transport.inter_node on gloo); None when not measured.
    links: dict[str, Any] | None = None
    sockets: list[dict[str, Any]] | None = None
    complete: bool = False
    schema: str = RESULT_SCHEMA

    @property
    def nnodes(self) -> int:
        return max(1, len(set(self.hosts))) if self.hosts else 1

    def rows_for(self, op: str) -> list[SweepRow]:
        return [r for r in self.rows if r.op == op]

    def to_dict(self) -> dict[str, Any]:
        return jsonable(asdict(self))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CollectivesResult":
        d = dict(data)
        d["ops"] = {k: OpOutcome(**v) for k, v in (d.get("ops") or {}).items()}
        d["rows"] = [SweepRow(**r) for r in d.get("rows") or []]
        f = d.get("fault")
        if f:
            f = dict(f)
            f["ranks_state"] = [RankState(**s) for s in f.get("ranks_state") or []]
            d["fault"] = Fault(**f)
        known = {x.name for x in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    def write(self, path: Path) -> Path:
        return write_file(path, json.dumps(self.to_dict(), indent=1) + "\n")  # never half-written


def nccl_log_text(result: CollectivesResult) -> str:
    """The NCCL_DEBUG output the ranks wrote (for :func:`day0.stages.collectives.transport.transport_checks`).

    Each file is read under the caps of :mod:`inputs` (bytes that are not text replaced: the ranks
    wrote these, a killed one may leave padding); one that cannot be read (gone, a FIFO, too big)
    becomes an ``UNREADABLE_LOG`` line naming it, which the parser turns into an error: judging
    the other ranks' logs alone could pass a node nobody looked at.
    """
    parts = []
    for p in result.nccl_logs:
        try:
            parts.extend(line for _, line in iter_lines(p, lenient=True))
        except InputError as exc:
            parts.append(f"{UNREADABLE_LOG}\t{exc.path}\t{exc.problem}")
    return "\n".join(parts)


def load_result(path: Path) -> CollectivesResult:
    """A ``collectives.json`` (or the folder holding one), refused in one line if it is not one."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULT_FILE
    try:
        text = read_text(path, cap=MAX_JSON_BYTES)
    except InputError as exc:
        if exc.problem == "does not exist":
            raise FileNotFoundError(f"{path}: no collectives result (rank 0 writes it)") from None
        raise
    data = loose_json(text, str(path))  # day0's own file: a NaN figure in it is the checks' to judge
    if not isinstance(data, dict) or data.get("schema") != RESULT_SCHEMA:
        schema = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise InputError(path, f"schema {schema!r} is not {RESULT_SCHEMA}")
    try:
        return CollectivesResult.from_dict(data)
    except (TypeError, ValueError, AttributeError) as exc:
        raise InputError(path, f"not a {RESULT_SCHEMA} result ({exc})") from None
