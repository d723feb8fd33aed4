"""The side by side over many runs: how often day0 met issue 29's two targets, and the medians.

One run of ``bench_capacity.py`` answers with the median of its rounds, and the server's edge moves
from run to run on a shared box (docs/stages/capacity-evidence.md): a ratio from one run is a guess.
This reads ``bench_capacity.py --json`` records and prints, per run, day0 / the other tool's
sustained rate and requests spent, and whether the run met each target (a run or round where either
tool had no answer meets neither); then, over the runs and over their rounds, how many met each
target and both, and the median of each ratio. The targets: the sustained rates agree within
``--agree`` (the larger over the smaller, 1.10 by default: "within 10%" either way), and day0 spends
at most ``--spend`` (0.5) of the other tool's requests.

Records that asked a different question are not counted together: every file must hold the first
one's SLA and workload, and its setup (where each tool starts, the dense list's grid and requests a
rate; records from before bench_capacity wrote one are taken as they are). A file that is not such a
record, or asked another question, is one line naming the file and the key (exit 2). No server: the
runs' own records, plain or gzipped (``.json.gz``: the runs behind docs/stages/capacity-evidence.md's
counts since 2026-12-06's evening are kept so in benchmarks/records/capacity/).

    .venv/bin/python benchmarks/capacity_runs.py benchmarks/records/capacity/*.json.gz [--tool vllm] [--json summary.json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from capacity_report import fmt  # noqa: E402

AGREE, SPEND = 1.10, 0.5
MAX_RECORD_BYTES = 64 * 2**20  # a record is ~75 kB; past this it is not one (or a gzip bomb)


class BadRecord(Exception):
    """A file that cannot be counted: ``<file>: <key>: <problem>``."""

    def __init__(self, path: Path, key: str, problem: str) -> None:
        super().__init__(f"{path}: {key}: {problem}")


@dataclass(frozen=True)
class Pair:
    """day0 against the other tool, once: over a run's rounds (their medians) or in one round."""

    sustained: float | None  # day0 / other; None: a tool had no answer
    requests: float | None  # day0 / other; None: the other spent nothing

    def agrees(self, agree: float) -> bool:
        return self.sustained is not None and max(self.sustained, 1.0 / self.sustained) <= agree

    def cheap(self, spend: float) -> bool:
        return self.sustained is not None and self.requests is not None and self.requests <= spend


@dataclass(frozen=True)
class Run:
    name: str
    code: str | None  # the commit bench_capacity ran from ("-dirty": a changed checkout), where its record says
    median: Pair
    rounds: list[Pair]


def _number(path: Path, key: str, value: Any) -> float | None:
    """A figure above 0, or None where the record says there was none (null, or 0 requests)."""
    if value is None or (value == 0 and not isinstance(value, bool)):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise BadRecord(path, key, f"expected a number above 0 or null, got {value!r}")
    return float(value)


def _over(x: float | None, y: float | None) -> float | None:
    return x / y if x is not None and y is not None else None


def _object(path: Path, key: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRecord(path, key, f"expected an object, got {type(value).__name__}")
    return value


def read_run(path: Path, tool: str) -> tuple[Run, dict[str, Any]]:
    """One record's run against ``tool``, and the question it asked (its SLA and workload)."""
    try:
        with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as f:
            raw = f.read(MAX_RECORD_BYTES + 1)
        if len(raw) > MAX_RECORD_BYTES:
            packed = " unpacked" if path.suffix == ".gz" else ""
            raise BadRecord(path, "(file)", f"over {MAX_RECORD_BYTES:,} bytes{packed}: not a bench_capacity record")
        record = json.loads(raw)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadRecord(path, "(file)", f"not a JSON record: {e}") from None
    record = _object(path, "(top level)", record)
    ratios = _object(path, f"ratios_day0_over.{tool}",
                     _object(path, "ratios_day0_over", record.get("ratios_day0_over")).get(tool))
    median = Pair(_number(path, f"ratios_day0_over.{tool}.sustained", ratios.get("sustained")),
                  _number(path, f"ratios_day0_over.{tool}.requests", ratios.get("requests")))
    rounds = record.get("rounds")
    if not isinstance(rounds, list) or not rounds:
        raise BadRecord(path, "rounds", "expected a list of rounds")
    pairs = []
    for i, rd in enumerate(rounds):
        ours, theirs = (_object(path, f"rounds[{i}].{t}", _object(path, f"rounds[{i}]", rd).get(t))
                        for t in ("day0", tool))
        key = f"rounds[{i}].%s.%s"
        pairs.append(Pair(*(_over(_number(path, key % ("day0", k), ours.get(k)),
                                  _number(path, key % (tool, k), theirs.get(k))) for k in ("sustained", "requests"))))
    setup = record.get("setup")  # older records have none
    question = {"sla": record.get("sla"), "workload": record.get("workload"),
                "setup": {k: v for k, v in setup.items() if k != "rounds"} if isinstance(setup, dict) else None}
    return Run(path.name.removesuffix(".gz").removesuffix(".json"), record.get("code"), median, pairs), question


def read_runs(paths: list[Path], tool: str) -> list[Run]:
    """Every file's run; each must have asked the first file's question: its SLA and workload, and
    where both records say (older ones do not), the same setup but for the number of rounds."""
    runs: list[Run] = []
    seen: dict[str, tuple[Path, Any]] = {}
    for path in paths:
        run, question = read_run(path, tool)
        for key, value in question.items():
            if value is None and key == "setup":
                continue
            first = seen.setdefault(key, (path, value))
            if value != first[1]:
                raise BadRecord(path, key, f"{value} is not {first[0].name}'s {first[1]}: runs that asked "
                                "another question are not counted together")
        runs.append(run)
    return runs


def tally(pairs: list[Pair], agree: float, spend: float) -> dict[str, Any]:
    """How many of ``pairs`` met each target and both, and the median of each ratio where there was one."""
    sustained = [p.sustained for p in pairs if p.sustained is not None]
    spent = [p.requests for p in pairs if p.requests is not None]
    return {"n": len(pairs), "agree": sum(p.agrees(agree) for p in pairs),
            "spend": sum(p.cheap(spend) for p in pairs),
            "both": sum(p.agrees(agree) and p.cheap(spend) for p in pairs),
            "no_answer": sum(p.sustained is None for p in pairs),
            "median_sustained": statistics.median(sustained) if sustained else None,
            "median_requests": statistics.median(spent) if spent else None}


def summary(runs: list[Run], agree: float = AGREE, spend: float = SPEND) -> dict[str, Any]:
    return {"agree": agree, "spend": spend, "over_runs": tally([r.median for r in runs], agree, spend),
            "over_rounds": tally([p for r in runs for p in r.rounds], agree, spend)}


def lines(runs: list[Run], tool: str, agree: float = AGREE, spend: float = SPEND) -> list[str]:
    """The table, then the counts over runs and over rounds."""
    out = [f"{'run':<12} {'code':<9} {'sustained':>9} {'requests':>8}  targets  (day0 / {tool}; by round)"]
    for r in runs:
        met = ("agree " if r.median.agrees(agree) else "") + ("half" if r.median.cheap(spend) else "")
        each = ", ".join(f"{fmt(p.sustained, '.3f')}/{fmt(p.requests, '.3f')}" for p in r.rounds)
        code = "-" if r.code is None else r.code[:9] + ("-dirty" if r.code.endswith("-dirty") else "")
        out.append(f"{r.name:<12} {code:<9} {fmt(r.median.sustained, '.3f'):>9} "
                   f"{fmt(r.median.requests, '.3f'):>8}  {met or '-':<10} ({each})")
    s = summary(runs, agree, spend)
    for over in ("runs", "rounds"):
        t = s[f"over_{over}"]
        out.append(f"over {t['n']} {over}: sustained within {agree:g}x in {t['agree']}, requests at most "
                   f"{spend:g} of {tool}'s in {t['spend']}, both in {t['both']}"
                   + (f" (no answer on one side in {t['no_answer']})" if t["no_answer"] else "")
                   + f"; medians {fmt(t['median_sustained'], '.3f')} and {fmt(t['median_requests'], '.3f')}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path, help="bench_capacity.py --json records")
    ap.add_argument("--tool", default="vllm", help="the tool day0 is compared with (default: the dense list)")
    ap.add_argument("--agree", type=float, default=AGREE, help="the larger sustained rate over the smaller, at most")
    ap.add_argument("--spend", type=float, default=SPEND, help="day0's requests over the other tool's, at most")
    ap.add_argument("--json", type=Path, help="write the runs and the counts here")
    a = ap.parse_args()
    if not a.agree >= 1.0 or not a.spend > 0.0:
        ap.error(f"--agree at least 1 and --spend above 0, got {a.agree:g} and {a.spend:g}")
    try:
        runs = read_runs(a.files, a.tool)
    except BadRecord as e:
        print(f"capacity_runs: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines(runs, a.tool, a.agree, a.spend)))
    if a.json:
        a.json.write_text(json.dumps({"runs": [asdict(r) for r in runs], **summary(runs, a.agree, a.spend)},
                                     indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
