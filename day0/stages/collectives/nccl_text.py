"""nccl-tests' text output (its stdout), read line by line: the current ``#wrong`` layout, the
older ``error`` one, per-iteration and timestamp columns, several programs concatenated, and
NCCL's own lines interleaved. Formats follow nccl-tests' ``src/common.cu`` / ``src/util.cu``.

Strict where a lenient reading could pass a run that did not happen as read: a row must have
exactly the header's fields, every figure must be a finite number >= 0, and a table must end
with nccl-tests' footer; otherwise the refusal names the file, the line and the column. A table
that stops without its footer is kept only when nccl-tests said why (a ``Test failure`` or
``# error:`` line): that is a measured failure, recorded as one.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Iterable

from day0.stages.collectives.nccl_format import NcclParseError, NcclTestsRow, NcclTestsRun, finish_run, resolve_op

_STARTING = re.compile(r"^#\s*Collective test starting:\s*(?P<prog>\S+)")
_CONCLUDED = re.compile(r"^#\s*Collective test concluded:\s*(?P<prog>\S+)")
_NTHREAD = re.compile(r"^#\s*nThreads?\s+(?P<nt>\d+)\s+nGpus\s+(?P<ng>\d+)\s+minBytes\s+(?P<min>\d+)\s+maxBytes\s+(?P<max>\d+)")
_DEVLINE = re.compile(r"^#\s+Rank\s+(?P<rank>\d+)\s+(?:Group\s+(?P<group>\d+)\s+)?Pid\s+\d+\s+on\s+(?P<host>\S+)\s+device\s+\d+")
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(?P<n>\S+)\s*(?P<ok>OK|FAILED)?")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(?P<bw>\S+)")
_ROW = re.compile(r"^\s*[-+]?\d+(?:\s|$)")  # a first field that is a whole number: a result row
_FAILURE = re.compile(r"Test (?:NCCL |CUDA )?failure")
_TOKEN = re.compile(r"\S+")
_TIMES = ("time", "cputime")
_FIGURES = ("time", "cputime", "algbw", "busbw", "i_min", "i_max", "i_p99", "i_cv%")

#: Ten times a sweep of every type, op and size nccl-tests offers; beyond, not one sweep. The
#: other caps bound what a hostile file can make the parser hold (programs, ranks, failure lines).
MAX_ROWS = 100_000
MAX_RUNS = 10_000
MAX_RANKS = 100_000
MAX_ERRORS = 20


@dataclass(frozen=True)
class _Columns:
    """One column header: the leading columns, the out-of-place and in-place ones, a timestamp."""

    names: tuple[str, ...]
    head: tuple[str, ...]
    left: tuple[str, ...]
    right: tuple[str, ...]
    timestamp: bool
    line: int

    @property
    def width(self) -> int:
        return len(self.head) + len(self.left) + len(self.right) + (2 if self.timestamp else 0)  # date + time


def _columns(s: str, where: str, n: int) -> _Columns:
    names = tuple(s.lstrip("#").split())
    timestamp = bool(names) and names[-1] == "timestamp"
    body = names[:-1] if timestamp else names
    times = [i for i, c in enumerate(body) if c in _TIMES]
    if len(times) != 2:
        raise NcclParseError(where, f"column header has {len(times)} time column(s); nccl-tests prints one "
                                    "out-of-place and one in-place", n)
    head, left, right = body[: times[0]], body[times[0]: times[1]], body[times[1]:]
    missing = [f"{side} {c}" for side, cols in (("out-of-place", left), ("in-place", right))
               for c in ("algbw", "busbw") if c not in cols]
    missing += [c for c in ("size", "count") if c not in head]
    if missing:
        raise NcclParseError(where, f"column header lacks {', '.join(missing)}", n)
    return _Columns(names, head, left, right, timestamp, n)


def _ulp(tok: str) -> float:
    """The value of the last printed digit: half of it is the rounding the figure carries."""
    try:
        exp = Decimal(tok).as_tuple().exponent
    except InvalidOperation:
        return 0.0
    return 10.0 ** exp if isinstance(exp, int) else 0.0


class _TextParser:
    """One pass over the lines; each method reads one kind of line."""

    def __init__(self, path: Path | None, op: str | None):
        self.path, self.op_arg = path, op
        self.where = str(path) if path is not None else "<text>"
        self.runs: list[NcclTestsRun] = []
        self.cur: NcclTestsRun | None = None
        self.columns: _Columns | None = None
        self.inplace_only: bool | None = None
        self.program: str | None = None
        self.config: dict[str, Any] = {}
        self.devices: dict[int, tuple[str, str | None, int]] = {}  # rank -> (host, group, line)
        self.failures: list[str] = []  # said before any table
        self.rows = 0
        self.last_row = 0

    def fail(self, problem: str, line: int | None = None, col: int | None = None) -> NcclParseError:
        return NcclParseError(self.where, problem, line, col)

    def feed(self, n: int, line: str) -> None:
        s = line.strip()
        if not s:
            return
        if s.startswith("#"):
            self._comment(s, n)
        elif _ROW.match(s):
            self._data(line, n)
        elif _FAILURE.search(s):
            said = self.cur.errors if self.cur is not None else self.failures
            if len(said) < MAX_ERRORS:
                said.append(s[:300])

    def _comment(self, s: str, n: int) -> None:
        if m := _STARTING.match(s):
            self._end()
            self.program, self.config, self.devices = m["prog"], {}, {}
        elif m := _NTHREAD.match(s):
            self._end()
            self.config, self.devices = self._header(m, s, n), {}
        elif m := _DEVLINE.match(s):
            rank = int(m["rank"])
            if rank in self.devices:
                raise self.fail(f"rank {rank} is listed twice (first at line {self.devices[rank][2]})", n)
            if len(self.devices) >= MAX_RANKS:
                raise self.fail(f"more than {MAX_RANKS} rank lines: not one nccl-tests job", n)
            self.devices[rank] = (sys.intern(m["host"]), m["group"], n)
        elif "size" in s and ("busbw" in s or "algbw" in s):
            self._table(s, n)
        elif self.cur is not None:
            self._footer(s, n)

    def _header(self, m: re.Match[str], s: str, n: int) -> dict[str, Any]:
        nt, ng = int(m["nt"]), int(m["ng"])
        if nt < 1 or ng < 1:
            raise self.fail(f"nThread {nt} nGpus {ng}: no rank ran", n)
        config: dict[str, Any] = {"nthreads": nt, "ngpus": ng, "minimum_bytes": int(m["min"]),
                                  "maximum_bytes": int(m["max"])}
        v = re.search(r"validation:\s*(\d+)", s)
        if v:
            config["validation"] = int(v.group(1))
        return config

    def _table(self, s: str, n: int) -> None:
        cols = _columns(s, self.where, n)
        if self.cur is not None and not self.cur.complete:
            if self.columns is not None and cols.names != self.columns.names:
                raise self.fail(f"a second, different column header inside the table of line {self.columns.line}", n)
            return  # the same header printed again
        self._end()
        op, source = resolve_op(self.op_arg, self.program, self.path, self.where, n)
        run = NcclTestsRun(op=op, program=self.program, config=dict(self.config), op_source=source, line=n,
                           layout="error" if "error" in cols.left else "wrong", errors=self.failures)
        self.failures = []
        if len(self.runs) >= MAX_RUNS:
            raise self.fail(f"more than {MAX_RUNS} result tables: not one file of nccl-tests runs", n)
        if self.devices:
            ranks = sorted(self.devices)
            if ranks != list(range(len(ranks))):
                gap = next(i for i, r in enumerate(ranks) if r != i)
                raise self.fail(f"the rank lines skip rank {gap} (listed: {len(ranks)} ranks up to {ranks[-1]})",
                                self.devices[ranks[-1]][2])
            run.world_size = len(ranks)
            run.hosts = [self.devices[r][0] for r in ranks]
            run.groups = len({g for _, g, _ in self.devices.values()})
        self.runs.append(run)
        self.cur, self.columns, self.inplace_only = run, cols, None

    def _footer(self, s: str, n: int) -> None:
        cur = self.cur
        assert cur is not None
        if m := _OOB.match(s):
            cur.out_of_bounds = int(self._number("out-of-bounds count", m["n"], m.start("n") + 1, n, whole=True))
            cur.out_of_bounds_ok = (m["ok"] or ("FAILED" if cur.out_of_bounds else "OK")) == "OK"
        elif m := _AVG.match(s):
            cur.avg_busbw_gbps = self._number("average bus bandwidth", m["bw"], m.start("bw") + 1, n)
            cur.complete = True
        elif m := _CONCLUDED.match(s):
            if cur.program and m["prog"] != cur.program:
                raise self.fail(f"'concluded: {m['prog']}' ends the table of {cur.program} (line {cur.line})", n)
            if not cur.complete:
                raise self.fail(f"{cur.program} concluded without its '# Avg bus bandwidth' footer", n)
        elif s.lower().startswith("# error:") and len(cur.errors) < MAX_ERRORS:
            cur.errors.append(s[1:].strip()[:300])

    def _number(self, name: str, tok: str, col: int, n: int, *, whole: bool = False) -> float:
        """A figure nccl-tests prints: finite and >= 0 (and whole where it counts), or a refusal at its column."""
        try:
            v = float(tok)
        except ValueError:
            raise self.fail(f"{name} {tok!r} is not a number", n, col) from None
        if not math.isfinite(v):
            raise self.fail(f"{name} {tok} is not a finite number", n, col)
        if v < 0:
            raise self.fail(f"{name} {tok} is negative", n, col)
        if whole and v != int(v):
            raise self.fail(f"{name} {tok} is not a whole number", n, col)
        return v

    def _data(self, line: str, n: int) -> None:
        if self.cur is None or self.columns is None:
            raise self.fail("a result row before any column header ('#  size  count  type ...')", n)
        if self.cur.complete:
            raise self.fail("a result row after the table's '# Avg bus bandwidth' footer", n)
        self.rows += 1
        if self.rows > MAX_ROWS:
            raise self.fail(f"more than {MAX_ROWS} result rows: not one nccl-tests sweep", n)
        self.cur.rows.extend(self._row(line, n))
        self.last_row = n

    def _row(self, line: str, n: int) -> list[NcclTestsRow]:
        cols = self.columns
        assert cols is not None and self.cur is not None
        toks = [(m.group(), m.start() + 1) for m in _TOKEN.finditer(line)]
        short = cols.width - len(cols.left)  # nccl-tests leaves out-of-place blank when it only runs in-place
        if self.inplace_only is None:
            self.inplace_only = len(toks) == short
        want = short if self.inplace_only else cols.width
        if len(toks) != want:
            col = toks[min(len(toks), want) - 1][1]
            raise self.fail(f"row has {len(toks)} fields where the column header (line {cols.line}) has "
                            f"{want}: a row cut short or run together with another", n, col)
        head = dict(zip(cols.head, toks))
        size = int(self._number("size", *head["size"], n, whole=True))
        count = int(self._number("count", *head["count"], n, whole=True))
        root_tok = head.get("root", ("-1", 0))[0]
        if not re.fullmatch(r"-?\d+", root_tok):
            raise self.fail(f"root {root_tok!r} is not a rank", n, head["root"][1])
        common = dict(size_bytes=size, count=count, dtype=head.get("type", ("", 0))[0],
                      redop=head.get("redop", ("", 0))[0], root=int(root_tok) if int(root_tok) >= 0 else None)
        rest = toks[len(cols.head):]
        sides = [("in_place", cols.right, rest)] if self.inplace_only else [
            ("out_of_place", cols.left, rest[: len(cols.left)]), ("in_place", cols.right, rest[len(cols.left):])]
        return [self._side(mode, names, vals, n, common) for mode, names, vals in sides]

    def _side(self, mode: str, names: tuple[str, ...], vals: list[tuple[str, int]], n: int,
              common: dict[str, Any]) -> NcclTestsRow:
        d = dict(zip(names, vals))
        fig = {k: self._number(k, tok, col, n) for k, (tok, col) in d.items() if k in _FIGURES}
        wrong: int | None = None
        max_error: float | None = None
        if "#wrong" in d and d["#wrong"][0] != "N/A":
            wrong = int(self._number("#wrong", *d["#wrong"], n, whole=True))
        elif "error" in d and d["error"][0] != "N/A":
            max_error = self._number("error", *d["error"], n)
        per_iter = {k: fig[k] for k in ("i_min", "i_max", "i_p99", "i_cv%") if k in fig}
        return NcclTestsRow(
            **common, mode=mode, time_us=fig.get("time", fig.get("cputime")), algbw_gbps=fig["algbw"],
            busbw_gbps=fig["busbw"], wrong=wrong, max_error=max_error, per_iter=per_iter or None, line=n,
            col=d["busbw"][1], ulp=(_ulp(d["algbw"][0]), _ulp(d["busbw"][0])),
        )

    def _end(self) -> None:
        """Close the open table: complete, or cut off with nccl-tests' reason, or refused."""
        run = self.cur
        if run is not None and not run.complete and not run.errors:
            raise self.fail(f"the table of line {run.line} stops without nccl-tests' '# Avg bus bandwidth' footer: "
                            "the output was cut off here", max(self.last_row, run.line or 0))
        if run is not None:
            self.program = None
        self.cur, self.columns = None, None

    def close(self) -> list[NcclTestsRun]:
        self._end()
        if not self.runs:
            why = f"; nccl-tests failed first: {self.failures[0]}" if self.failures else ""
            raise self.fail(f"no nccl-tests result table (expected a '#  size  count  type ...' header){why}")
        self.runs[-1].errors.extend(self.failures)
        for run in self.runs:
            finish_run(run, self.where)
        return self.runs


def parse_nccl_tests_lines(lines: Iterable[tuple[int, str]], *, path: Path | None = None,
                           op: str | None = None) -> list[NcclTestsRun]:
    """Parse numbered lines of nccl-tests stdout; several programs' outputs give several runs."""
    parser = _TextParser(path, op)
    for n, line in lines:
        parser.feed(n, line)
    return parser.close()


def parse_nccl_tests_text(text: str, *, path: Path | None = None, op: str | None = None) -> list[NcclTestsRun]:
    """Parse nccl-tests stdout held in memory (see :func:`parse_nccl_tests_lines`)."""
    return parse_nccl_tests_lines(enumerate(text.splitlines(), 1), path=path, op=op)
