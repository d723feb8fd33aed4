"""A site's nccl-tests output — its text (any version, several programs concatenated) or its
``-J`` JSON file — read without trusting it and turned into a result the same checks judge.

Reading is bounded (:mod:`inputs`); parsing is strict (:mod:`nccl_text`, :mod:`nccl_json`) and
every run is held to its collective's bus factor (:mod:`nccl_format`). What is odd but still
judgeable is made conservative rather than refused: rows printed twice (``-N`` repeats the
sweep) count once with the lowest bandwidth and every wrong element; rows out of order are sorted.
"""

from __future__ import annotations

from pathlib import Path

from day0.core.inputs import InputError, open_regular, read_text, strict_json
from day0.stages.collectives.inputs import MAX_FILE_BYTES, MAX_JSON_BYTES, MAX_LINE_BYTES, iter_lines
from day0.stages.collectives.nccl_format import NcclParseError, NcclTestsRow, NcclTestsRun
from day0.stages.collectives.nccl_json import parse_nccl_tests_json
from day0.stages.collectives.nccl_text import parse_nccl_tests_lines, parse_nccl_tests_text
from day0.stages.collectives.result import CollectivesResult, Fault, OpOutcome, SweepRow

__all__ = ["NcclParseError", "NcclTestsRow", "NcclTestsRun", "import_nccl_tests", "parse_nccl_tests_json",
           "parse_nccl_tests_text", "read_nccl_tests"]


def _first_char(path: Path) -> str:
    """The first non-blank character: ``{`` is a -J file (one long line), anything else text.

    Decided by content, not by name, from the first MiB only.
    """
    fh, _ = open_regular(path, cap=MAX_FILE_BYTES)
    with fh:
        raw = fh.read(MAX_LINE_BYTES)
    head = raw.lstrip()
    if not head:
        raise InputError(path, "nothing but blank space in its first MiB" if raw else "empty file")
    return chr(head[0])


def _read_json(path: Path, op: str | None) -> NcclTestsRun:
    # strict: with two bus_bw keys, which one counts would be up to the reader
    data = strict_json(read_text(path, cap=MAX_JSON_BYTES), str(path), NcclParseError)
    run = parse_nccl_tests_json(data, path=path, op=op)
    if not run.complete and not run.errors:
        raise NcclParseError(path, "no 'average_bus_bandwidth': the run did not finish (nccl-tests writes it "
                                   "after the last row) and its 'errors' say nothing")
    return run


def read_nccl_tests(path: Path | str, *, op: str | None = None) -> list[NcclTestsRun]:
    """Read an nccl-tests output file, JSON (-J) or text; refusals name the file, line and column."""
    path = Path(path)
    if _first_char(path) == "{":
        return [_read_json(path, op)]
    return parse_nccl_tests_lines(iter_lines(path), path=path, op=op)


def _same_ranks(runs: list[NcclTestsRun], where: str) -> None:
    """Refuse a file whose programs ran on different ranks: one result has one topology (and scope)."""
    first = runs[0]
    for run in runs[1:]:
        if (run.world_size, run.hosts) != (first.world_size, first.hosts):
            raise NcclParseError(where, f"its programs ran on different ranks ({first.program or first.op}: "
                                        f"{first.world_size} ranks on {sorted(set(first.hosts))}, "
                                        f"{run.program or run.op}: {run.world_size} on {sorted(set(run.hosts))}); "
                                        "import each on its own", run.line)


def _merged(rows: list[NcclTestsRow]) -> list[NcclTestsRow]:
    """One row per sweep point, sorted by size: a point printed twice keeps the slower figures and
    every wrong element, so a repeat can only make the verdict stricter."""
    by_key: dict[tuple, NcclTestsRow] = {}
    for r in rows:
        key = (r.size_bytes, r.count, r.dtype, r.redop, r.root, r.mode)
        seen = by_key.get(key)
        if seen is None:
            by_key[key] = r
            continue
        seen.busbw_gbps = min(seen.busbw_gbps or 0.0, r.busbw_gbps or 0.0)
        seen.algbw_gbps = min(seen.algbw_gbps or 0.0, r.algbw_gbps or 0.0)
        seen.time_us = max(seen.time_us or 0.0, r.time_us or 0.0)
        if r.wrong is not None:
            seen.wrong = (seen.wrong or 0) + r.wrong
        if r.max_error is not None:
            seen.max_error = max(seen.max_error or 0.0, r.max_error)
    return sorted(by_key.values(), key=lambda r: r.size_bytes)


def _add_run(result: CollectivesResult, run: NcclTestsRun) -> None:
    outcome = result.ops.setdefault(run.op, OpOutcome(run.op))
    if outcome.status != "error":  # a failed program is not undone by another of the same op
        outcome.status, outcome.reason = ("ok", "") if run.rows else ("error", "no result rows")
    if run.validated and run.out_of_bounds is not None:
        outcome.out_of_bounds = (outcome.out_of_bounds or 0) + run.out_of_bounds
    outcome.avg_busbw_gbps = run.avg_busbw_gbps
    if run.errors:
        outcome.status, outcome.reason = "error", run.errors[0][:300]
    result.world_size = result.world_size or run.world_size or 0
    result.hosts = result.hosts or run.hosts
    result.dtype = result.dtype or (run.rows[0].dtype if run.rows else "")


def _sweep_row(op: str, n: int, row: NcclTestsRow) -> SweepRow:
    pi = row.per_iter or {}
    return SweepRow(
        op=op, mode=row.mode, size_bytes=row.size_bytes, count=row.count, dtype=row.dtype, nranks=n,
        time_us=row.time_us, algbw_gbps=row.algbw_gbps, busbw_gbps=row.busbw_gbps, wrong=row.wrong,
        p50_us=pi.get("p50_us"), p99_us=pi.get("p99_us", pi.get("i_p99")),
        min_us=pi.get("min_us", pi.get("i_min")), max_us=pi.get("max_us", pi.get("i_max")), max_error=row.max_error,
    )


def import_nccl_tests(path: Path | str, *, op: str | None = None) -> CollectivesResult:
    """Turn a site's nccl-tests output (text or -J JSON; several programs concatenated) into a result.

    ``op`` (``--op``) names the collective of every program in the file and wins over what the
    file says; without it the output's own program line, then the file name, tell.
    """
    path = Path(path)
    runs = read_nccl_tests(path, op=op)
    _same_ranks(runs, str(path))
    result = CollectivesResult(source="nccl-tests", backend="nccl", complete=True,
                               settings={"imported_from": str(path)})
    rows: dict[str, list[NcclTestsRow]] = {}
    for run in runs:
        _add_run(result, run)
        outcome = result.ops[run.op]
        for row in run.rows:
            if row.mode not in outcome.modes:
                outcome.modes.append(row.mode)
        rows.setdefault(run.op, []).extend(run.rows)
    result.rows = [_sweep_row(o, result.world_size, r) for o, rs in rows.items() for r in _merged(rs)]
    errors = [f"{run.program or run.op}: {e}" for run in runs for e in run.errors]
    if errors:
        result.fault = Fault("error", [], f"nccl-tests reported errors: {errors[0][:300]}")
        result.complete = False
    return result
