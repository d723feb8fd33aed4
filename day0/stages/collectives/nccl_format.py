"""An nccl-tests run once read (text or ``-J`` JSON), and what every run must satisfy before its
numbers are judged: which collective it is, on how many ranks, and busbw = algbw x that
collective's bus factor on that many ranks.

The last one is the guard against a run judged as the wrong thing: nccl-tests computes both
bandwidths from one time, so a file whose ``busbw / algbw`` is not the factor of the collective it
is taken for (an all_reduce read as reduce, rows of one program under the header of another, a
world size that is not the one that ran) is refused, naming the row, instead of being held to
another collective's expectation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from day0.core.collective_ops import OPS, UnknownCollective, canonical_op
from day0.stages.collectives.busbw import bus_factor
from day0.stages.collectives.inputs import InputError


class NcclParseError(InputError):
    """nccl-tests output that cannot be judged; ``str()`` names the file, line and column (or key)."""


@dataclass(slots=True)
class NcclTestsRow:
    size_bytes: int
    count: int
    dtype: str
    redop: str
    root: int | None
    mode: str  # out_of_place | in_place
    time_us: float | None
    algbw_gbps: float | None
    busbw_gbps: float | None
    wrong: int | None  # the #wrong column (None: not checked, or the older "error" layout)
    max_error: float | None = None  # the older layout's "error" column (max abs deviation)
    per_iter: dict[str, float] | None = None  # i_min/i_max/i_p99 (us) and i_cv% when printed
    line: int | None = None  # where the row is: text line ...
    col: int | None = None  # ... and the busbw column
    key: str | None = None  # or the JSON key of its side
    ulp: tuple[float, float] = (0.0, 0.0)  # last printed digit of algbw, busbw (rounding bound)


@dataclass
class NcclTestsRun:
    """One nccl-tests program's output: e.g. all_reduce_perf with its sweep and footers."""

    op: str
    program: str | None
    rows: list[NcclTestsRow] = field(default_factory=list)
    world_size: int | None = None
    hosts: list[str] = field(default_factory=list)  # per rank, from the "Using devices" list
    out_of_bounds: int | None = None
    out_of_bounds_ok: bool | None = None
    avg_busbw_gbps: float | None = None
    config: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    layout: str = "wrong"  # "wrong" (#wrong column) | "error" (older max-error column) | "json"
    op_source: str = ""  # how the collective was told: "--op", the program line, the file name
    line: int | None = None  # the run's column header line (text)
    complete: bool = False  # its footer was read: the sweep ran to the end
    groups: int = 1  # distinct "Group" numbers among the rank lines (NCCL_TESTS_SPLIT)

    @property
    def validated(self) -> bool:
        """Whether nccl-tests checked results (-c 1): its out-of-bounds footer means nothing otherwise."""
        if str(self.config.get("validation", 1)) in ("0", "false"):
            return False
        if self.layout == "error":
            return any(r.max_error is not None for r in self.rows)
        return any(r.wrong is not None for r in self.rows) or not self.rows


def op_from_name(name: str) -> str | None:
    """The collective a file name names as a whole word (the registry's spellings, longest first so
    "all_reduce" is never read as "reduce"), None when it names none; refuses two."""
    words = OPS.file_name_words()
    found = {canonical_op(m.group(1)) for m in words.finditer(name.lower().replace("-", "_"))}
    if len(found) > 1:
        raise ValueError(f"its name names several collectives ({', '.join(sorted(found))})")
    return next(iter(found), None)


def resolve_op(op_arg: str | None, program: str | None, path: Path | None, where: str,
               line: int | None = None) -> tuple[str, str]:
    """(collective, how it was told): ``--op`` first, then the output's own program name, then the
    file name; otherwise a refusal that says to pass ``--op``."""
    if op_arg:
        try:
            return canonical_op(op_arg), f"--op {op_arg}"
        except UnknownCollective as exc:
            raise NcclParseError(where, f"--op: {exc}") from None
    if program:
        try:
            return canonical_op(Path(program).name), f"the program name {program!r}"
        except UnknownCollective:
            raise NcclParseError(where, f"nccl-tests program {program!r} is not a collective day0 knows; "
                                        "pass --op", line) from None
    if path is not None:
        try:
            op = op_from_name(path.name)
        except ValueError as exc:
            raise NcclParseError(where, f"cannot tell which collective this is: {exc}; pass --op") from None
        if op:
            return op, f"the file name {path.name!r}"
    raise NcclParseError(where, "cannot tell which collective this is (no '# Collective test starting' line, "
                                "no collective in the file name); pass --op", line)


def _where(row: NcclTestsRow) -> tuple[int | None, int | None, str]:
    return row.line, row.col, f"{row.key}: " if row.key else ""


def _fits(row: NcclTestsRow, factor: float) -> bool:
    """busbw == algbw x factor, within the rounding of the printed digits (and a hair for doubles)."""
    a, b = row.algbw_gbps or 0.0, row.busbw_gbps or 0.0
    ua, ub = row.ulp
    tol = 0.5 * ub + 0.5 * ua * factor
    return abs(b - a * factor) <= tol * 1.001 + 1e-9 * max(abs(b), 1.0)


def _solve_ranks(op: str, rows: list[NcclTestsRow]) -> int | None:
    """The rank count the bandwidths imply, for collectives whose factor depends on it; None when
    they cannot say (factor 1 whatever the count, or no row printed with enough digits)."""
    bus = OPS.resolve(op).bus
    if not bus.ring:
        return None
    best = max(rows, key=lambda r: r.algbw_gbps or 0.0, default=None)
    if best is None or not best.algbw_gbps or best.algbw_gbps < 200 * max(best.ulp):
        return None
    r = (best.busbw_gbps or 0.0) / best.algbw_gbps
    scale = bus.scale  # r = scale x (n-1)/n: 2 for all_reduce, 1 for the split ops
    if r >= scale * 0.9999:
        return None
    n = round(scale / (scale - r))
    return n if n >= 1 and all(_fits(x, bus_factor(op, n)) for x in rows) else None


def _header_ranks(run: NcclTestsRun) -> int | None:
    nt, ng = run.config.get("nthreads"), run.config.get("ngpus")
    return int(nt) * int(ng) if isinstance(nt, int) and isinstance(ng, int) else None


def finish_run(run: NcclTestsRun, where: str) -> None:
    """Settle the run's rank count and hold every row to its collective's bus factor, or refuse.

    Rank lines (one per rank, every process's) are the count; without them ``nThread x nGpus``
    (one process); without either, what the bandwidths imply. A mismatch names the first row
    whose busbw is not algbw x the factor.
    """
    per_process = _header_ranks(run)
    n = run.world_size or per_process
    if run.world_size and per_process and run.world_size % per_process:
        raise NcclParseError(where, f"the header says nThread x nGpus = {per_process} ranks per process but lists "
                                    f"{run.world_size} rank lines", run.line)
    candidates = [n] if n else []
    if n and run.groups > 1 and n % run.groups == 0:
        candidates.append(n // run.groups)  # split communicators: busbw uses one group's ranks
    for cand in candidates:
        if all(_fits(r, bus_factor(run.op, cand)) for r in run.rows):
            run.world_size = run.world_size or cand
            return
    solved = None if run.hosts else _solve_ranks(run.op, run.rows)
    if solved and (not per_process or solved % per_process == 0):
        run.world_size = solved  # several processes, no rank lines: the bandwidths tell
        return
    if not n:
        if not run.rows:
            return
        raise NcclParseError(where, "cannot tell how many ranks ran (no '#  Rank N ... device' lines, no "
                                    "'nThread .. nGpus ..' header)", run.line)
    bad = next(r for r in run.rows if not _fits(r, bus_factor(run.op, n)))
    line, col, key = _where(bad)
    factor = bus_factor(run.op, n)
    hint = "is --op right?" if run.op_source.startswith("--op") else "pass --op"
    raise NcclParseError(
        where, f"{key}busbw {bad.busbw_gbps:g} / algbw {bad.algbw_gbps:g} is not {run.op}'s bus factor on {n} ranks "
               f"({factor:.4g}; collective from {run.op_source}): these rows are another collective's or ran on "
               f"another rank count; {hint}", line, col)
