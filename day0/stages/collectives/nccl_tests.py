"""nccl-tests output: its text table (the current ``#wrong`` and the older ``error`` layouts) and
its ``-J`` JSON file (version 2), turned into a result the same checks judge.

A site that already ran nccl-tests feeds its output in; several programs' outputs concatenated
give one result with each op. Formats follow nccl-tests' ``src/common.cu`` / ``src/util.cu``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from day0.stages.collectives.busbw import UnknownCollective, canonical_op
from day0.stages.collectives.result import CollectivesResult, Fault, OpOutcome, SweepRow


class NcclParseError(ValueError):
    """Input that is not the format it claims to be; the message names the file and line."""


@dataclass
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

    @property
    def validated(self) -> bool:
        """Whether nccl-tests checked results (-c 1): its out-of-bounds footer means nothing otherwise."""
        if str(self.config.get("validation", 1)) in ("0", "false"):
            return False
        if self.layout == "error":
            return any(r.max_error is not None for r in self.rows)
        return any(r.wrong is not None for r in self.rows) or not self.rows


_STARTING = re.compile(r"^#\s*Collective test starting:\s*(?P<prog>\S+)")
_NTHREAD = re.compile(r"^#\s*nThread\s+(?P<nt>\d+)\s+nGpus\s+(?P<ng>\d+)\s+minBytes\s+(?P<min>\d+)\s+maxBytes\s+(?P<max>\d+)")
_DEVLINE = re.compile(r"^#\s+Rank\s+(?P<rank>\d+)\s+(?:Group\s+\d+\s+)?Pid\s+(?P<pid>\d+)\s+on\s+(?P<host>\S+)\s+device\s+(?P<dev>\d+)")
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(?P<n>\d+)\s*(?P<ok>OK|FAILED)?")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(?P<bw>[-+0-9.eEnaNinf]+)")
_ROW = re.compile(r"^\s*\d+\s+\d+\s+\S+")


def _num(tok: str) -> float | None:
    if tok in ("N/A", "-", "nan", "-nan"):
        return None
    try:
        v = float(tok)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _header_columns(line: str) -> list[str]:
    return line.lstrip("#").split()


def _guess_op(program: str | None, path: Path | None, default: str | None) -> str:
    for cand in (program, path.stem if path else None, default):
        if not cand:
            continue
        try:
            return canonical_op(cand)
        except UnknownCollective:
            stem = re.sub(r"[._-]?(log|out|txt|json)$", "", cand)
            m = re.search(r"(all_reduce|all_gather|reduce_scatter|alltoall|broadcast|sendrecv|reduce|gather|scatter|hypercube)", stem)
            if m:
                return canonical_op(m.group(1))
    where = f"{path}" if path else "<text>"
    raise NcclParseError(f"{where}: cannot tell which collective this nccl-tests output is (no '# Collective test starting' line); pass op=")


def parse_nccl_tests_text(text: str, *, path: Path | None = None, op: str | None = None) -> list[NcclTestsRun]:
    """Parse nccl-tests stdout; several programs' outputs concatenated give several runs."""
    runs: list[NcclTestsRun] = []
    cur: NcclTestsRun | None = None
    program: str | None = None
    columns: list[str] | None = None
    pending_devices: list[tuple[int, str]] = []
    pending_config: dict[str, Any] = {}
    where = str(path) if path else "<text>"

    def start(prog: str | None) -> NcclTestsRun:
        run = NcclTestsRun(op=_guess_op(prog, path, op), program=prog)
        runs.append(run)
        return run

    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s:
            continue
        m = _STARTING.match(s)
        if m:
            program, cur, columns = m["prog"], None, None
            pending_devices, pending_config = [], {}
            continue
        m = _NTHREAD.match(s)
        if m:
            if cur is not None and cur.rows:  # a second program without a "starting" line
                cur, columns, program = None, None, None
            pending_devices = []
            pending_config = {
                "nthreads": int(m["nt"]), "ngpus": int(m["ng"]),
                "minimum_bytes": int(m["min"]), "maximum_bytes": int(m["max"]),
            }
            v = re.search(r"validation:\s*(\d+)", s)
            if v:
                pending_config["validation"] = int(v.group(1))
            continue
        m = _DEVLINE.match(s)
        if m:
            pending_devices.append((int(m["rank"]), m["host"]))
            continue
        if s.startswith("#") and "size" in s and ("busbw" in s or "algbw" in s):
            columns = _header_columns(s)
            if cur is None:
                cur = start(program)
                cur.config = pending_config
                if pending_devices:
                    cur.world_size = len(pending_devices)
                    cur.hosts = [h for _, h in sorted(pending_devices)]
            continue
        m = _OOB.match(s)
        if m and cur is not None:
            cur.out_of_bounds = int(m["n"])
            cur.out_of_bounds_ok = (m["ok"] or ("OK" if int(m["n"]) == 0 else "FAILED")) == "OK"
            continue
        m = _AVG.match(s)
        if m and cur is not None:
            cur.avg_busbw_gbps = _num(m["bw"])
            continue
        if s.startswith("#"):
            if cur is not None and s.lower().startswith("# error:"):
                cur.errors.append(s[1:].strip())
            continue
        if columns is not None and cur is not None and _ROW.match(s):
            cur.rows.extend(_parse_row(s, columns, where, n, cur))
            continue
        if cur is not None and re.search(r"Test (?:NCCL |CUDA )?failure|Test failure", s):
            cur.errors.append(s)
    if not runs:
        raise NcclParseError(f"{where}: no nccl-tests result table found (expected a '#  size  count  type ...' header)")
    return runs


def _parse_row(s: str, columns: list[str], where: str, n: int, run: NcclTestsRun) -> list[NcclTestsRow]:
    toks = s.split()
    # The head columns come before the first time column; the rest splits into two sides.
    time_names = ("time", "cputime")
    try:
        first_time = next(i for i, c in enumerate(columns) if c in time_names)
    except StopIteration:
        raise NcclParseError(f"{where}:{n}: header has no time column") from None
    head = columns[:first_time]
    side_cols = columns[first_time:]
    try:
        second_time = next(i for i, c in enumerate(side_cols) if c in time_names and i > 0)
    except StopIteration:
        second_time = len(side_cols)
    left, right = side_cols[:second_time], side_cols[second_time:]
    if right and right[-1] == "timestamp":
        right = right[:-1]
    if len(toks) < len(head):
        raise NcclParseError(f"{where}:{n}: row has {len(toks)} fields, header needs at least {len(head)}")
    hv = dict(zip(head, toks[: len(head)]))
    try:
        size = int(hv.get("size", toks[0]))
        count = int(hv.get("count", toks[1]))
    except ValueError:
        raise NcclParseError(f"{where}:{n}: size/count are not integers: {s!r}") from None
    root_tok = hv.get("root")
    root = int(root_tok) if root_tok not in (None, "-1") and root_tok.lstrip("-").isdigit() else None
    rest = toks[len(head):]
    rows: list[NcclTestsRow] = []
    for mode, cols, vals in (
        ("out_of_place", left, rest[: len(left)]),
        ("in_place", right, rest[len(left): len(left) + len(right)]),
    ):
        if not cols or len(vals) < min(3, len(cols)):
            continue
        d = dict(zip(cols, vals))
        if all(_num(d.get(k, "N/A")) is None for k in ("time", "cputime", "algbw", "busbw")):
            continue  # nothing measured on this side (N/A columns)
        wrong: int | None = None
        max_error: float | None = None
        if "#wrong" in d:
            w = _num(d["#wrong"])
            wrong = int(w) if w is not None else None
        elif "error" in d:
            run.layout = "error"
            max_error = _num(d["error"])
        per_iter = {k: v for k in ("i_min", "i_max", "i_p99", "i_cv%") if (v := _num(d.get(k, "N/A"))) is not None}
        rows.append(
            NcclTestsRow(
                size_bytes=size, count=count, dtype=hv.get("type", ""), redop=hv.get("redop", ""), root=root,
                mode=mode, time_us=_num(d.get("time", d.get("cputime", "N/A"))),
                algbw_gbps=_num(d.get("algbw", "N/A")), busbw_gbps=_num(d.get("busbw", "N/A")),
                wrong=wrong, max_error=max_error, per_iter=per_iter or None,
            )
        )
    return rows


def parse_nccl_tests_json(data: Mapping[str, Any], *, path: Path | None = None, op: str | None = None) -> NcclTestsRun:
    """Parse the ``-J`` JSON of nccl-tests (file version 2: config, results, out_of_bounds, ...)."""
    where = str(path) if path else "<json>"
    if not isinstance(data, Mapping) or "results" not in data:
        raise NcclParseError(f"{where}: not an nccl-tests JSON file (no 'results' key)")
    results = data.get("results") or []
    if not isinstance(results, list):
        raise NcclParseError(f"{where}: 'results' is not a list")
    prog = None
    for r in results:
        if isinstance(r, Mapping) and r.get("experiment_name"):
            prog = str(r["experiment_name"])
            break
    args = data.get("args") or []
    if prog is None and args:
        prog = Path(str(args[0])).name
    run = NcclTestsRun(op=_guess_op(prog, path, op), program=prog, layout="json")
    config = data.get("config") or {}
    devices = config.get("devices") or data.get("devices") or []
    run.config = {k: v for k, v in config.items() if k != "devices"}
    if devices:
        run.world_size = len(devices)
        ranked = sorted((int(d.get("rank", i)), str(d.get("hostname", ""))) for i, d in enumerate(devices) if isinstance(d, Mapping))
        run.hosts = [h for _, h in ranked]
    for i, r in enumerate(results):
        if not isinstance(r, Mapping):
            raise NcclParseError(f"{where}: results[{i}] is not an object")
        try:
            size, count = int(r["size"]), int(r["count"])
        except (KeyError, TypeError, ValueError):
            raise NcclParseError(f"{where}: results[{i}] lacks an integer size/count") from None
        root_s = str(r.get("root", "")).strip()
        root = int(root_s) if root_s.lstrip("-").isdigit() and int(root_s) >= 0 else None
        for mode in ("out_of_place", "in_place"):
            side = r.get(mode)
            if not isinstance(side, Mapping):
                continue
            nw = side.get("nwrong")
            per = r.get(f"{mode}_per_iter")
            rows_time = side.get("time", side.get("cpu_time"))
            run.rows.append(
                NcclTestsRow(
                    size_bytes=size, count=count, dtype=str(r.get("type", "")), redop=str(r.get("redop", "")),
                    root=root, mode=mode, time_us=_json_num(rows_time), algbw_gbps=_json_num(side.get("alg_bw")),
                    busbw_gbps=_json_num(side.get("bus_bw")), wrong=int(nw) if _json_num(nw) is not None else None,
                    per_iter={k: float(v) for k, v in per.items() if k.endswith("_us") and _json_num(v) is not None}
                    if isinstance(per, Mapping) else None,
                )
            )
    oob = data.get("out_of_bounds")
    if isinstance(oob, Mapping):
        run.out_of_bounds = int(oob.get("count", 0))
        run.out_of_bounds_ok = str(oob.get("okay", "")).lower() == "true"
    avg = data.get("average_bus_bandwidth")
    if isinstance(avg, Mapping):
        run.avg_busbw_gbps = _json_num(avg.get("bandwidth"))
    run.errors = [str(e) for e in (data.get("errors") or []) if str(e).strip()]
    return run


def _json_num(v: Any) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)  # "nan" strings too
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def read_nccl_tests(path: Path, *, op: str | None = None) -> list[NcclTestsRun]:
    """Read an nccl-tests output file, JSON (-J) or text, deciding by content, not by name."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise NcclParseError(f"{path}: cannot read ({exc.strerror})") from None
    head = text.lstrip()[:1]
    if head == "{":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise NcclParseError(f"{path}: JSON error at line {exc.lineno}: {exc.msg}") from None
        return [parse_nccl_tests_json(data, path=path, op=op)]
    return parse_nccl_tests_text(text, path=path, op=op)


def import_nccl_tests(path: Path | str, *, op: str | None = None) -> CollectivesResult:
    """Turn a site's nccl-tests output (text or -J JSON; several programs concatenated) into a result."""
    path = Path(path)
    runs = read_nccl_tests(path, op=op)
    result = CollectivesResult(source="nccl-tests", backend="nccl", complete=True,
                               settings={"imported_from": str(path)})
    errors: list[str] = []
    for run in runs:
        n = run.world_size or 0
        outcome = result.ops.setdefault(run.op, OpOutcome(run.op))
        outcome.status = "ok" if run.rows else "error"
        outcome.reason = "" if run.rows else "no result rows"
        outcome.out_of_bounds = run.out_of_bounds if run.validated else None
        outcome.avg_busbw_gbps = run.avg_busbw_gbps
        for row in run.rows:
            if row.mode not in outcome.modes:
                outcome.modes.append(row.mode)
            pi = row.per_iter or {}
            result.rows.append(SweepRow(
                op=run.op, mode=row.mode, size_bytes=row.size_bytes, count=row.count, dtype=row.dtype, nranks=n,
                time_us=row.time_us, algbw_gbps=row.algbw_gbps, busbw_gbps=row.busbw_gbps, wrong=row.wrong,
                p50_us=pi.get("p50_us"), p99_us=pi.get("p99_us", pi.get("i_p99")),
                min_us=pi.get("min_us", pi.get("i_min")), max_us=pi.get("max_us", pi.get("i_max")),
                max_error=row.max_error,
            ))
        if run.world_size and not result.world_size:
            result.world_size = run.world_size
        if run.hosts and not result.hosts:
            result.hosts = run.hosts
        if run.rows and not result.dtype:
            result.dtype = run.rows[0].dtype
        errors.extend(f"{run.program or run.op}: {e}" for e in run.errors)
        if run.errors:
            outcome.status, outcome.reason = "error", run.errors[0][:300]
    if errors:
        result.fault = Fault("error", [], f"nccl-tests reported errors: {errors[0][:300]}")
        result.complete = False
    return result
