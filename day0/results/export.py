"""A run's results where operators already look: Prometheus (textfile collector, Pushgateway)
and the GitHub Actions job summary.

Dashboards and alerts already watch Prometheus, and a CI reviewer already reads the job's
summary page; a verdict that only lives in a run folder is one nobody sees at 3 a.m. Everything
here is built from the run record alone (like the report and junit.xml), so it can be tested
without pytest and rerun on an old run. An export that fails costs one log line, never the record.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from day0.core.outputs import open_output
from day0.core.record import RunRecord
from day0.core.record_shape import STATUSES, VERDICTS
from day0.core.verdict import waiver_for, waivers_of
from day0.results import summary

JOB = "day0"
PUSH_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Targets:
    """Where the run's results go besides the run folder; None leaves one out."""

    textfile: str | None = None  # --day0-prom-textfile: node_exporter's textfile collector (*.prom)
    pushgateway: str | None = None  # --day0-pushgateway: a Pushgateway URL
    step_summary: str | None = None  # $GITHUB_STEP_SUMMARY: the job summary's Markdown file

    @classmethod
    def from_options(cls, textfile: str | None, pushgateway: str | None,
                     environ: Mapping[str, str] | None = None) -> "Targets":
        env = os.environ if environ is None else environ
        return cls(textfile or None, pushgateway or None, env.get("GITHUB_STEP_SUMMARY") or None)


def _num(v: object) -> float | None:
    return summary.num(v)


def registry(record: RunRecord):  # -> prometheus_client.CollectorRegistry (imported lazily)
    """The run as Prometheus gauges, every series labelled by profile and run id.

    A check's status is a labelled gauge (one series per possible status, 1 for the one it has),
    the kube-state-metrics way, so ``day0_check_status{status="fail"} == 1`` is an alert rule;
    ``day0_check_waived`` marks the failures the profile waives (an ACCEPTED run keeps them
    ``fail``), for the rule to leave out.
    Only numeric values and limits become samples; a string value has no gauge."""
    from prometheus_client import CollectorRegistry, Gauge

    reg = CollectorRegistry()
    run = {"profile": str(record.profile.get("name") or ""), "run_id": record.run_id}
    keys = ["profile", "run_id", "stage", "check", "repeat"]
    value = Gauge("day0_check_value", "A Day0 check's measured value, in the check's unit", [*keys, "unit"],
                  registry=reg)
    limit = Gauge("day0_check_limit", "A Day0 check's limit, in the check's unit", [*keys, "unit", "direction"],
                  registry=reg)
    status = Gauge("day0_check_status", "1 for the status a Day0 check has, 0 for the others",
                   [*keys, "status"], registry=reg)
    duration = Gauge("day0_check_duration_seconds", "Seconds the pytest test that recorded a check took",
                     keys, registry=reg)
    waived = Gauge("day0_check_waived", "1 for a failed Day0 check the profile waives as a known failure",
                   keys, registry=reg)
    waivers = waivers_of(record.profile)
    verdict = Gauge("day0_verdict", "1 for the run's verdict, 0 for the others", ["profile", "run_id", "verdict"],
                    registry=reg)
    finished = Gauge("day0_run_finished_timestamp_seconds", "When the run finished (Unix time)",
                     ["profile", "run_id"], registry=reg)
    seen: dict[tuple[str, ...], set[str]] = {}  # the statuses of every check sharing one label set
    # label set -> (its labels, failing checks, waived ones): a waived failure beside an unwaived one
    # under the same labels must not mark the series waived, or `unless day0_check_waived` hides the latter
    fails: dict[tuple[str, ...], tuple[dict[str, str], int, int]] = {}
    for st in record.stages:
        for c in st.checks:
            labels = {**run, "stage": st.name, "check": c.id, "repeat": "" if c.repeat is None else str(c.repeat)}
            had = seen.setdefault(tuple(labels.values()), set())
            if (v := _num(c.value)) is not None and "fail" not in had:  # a failing copy's value is the one shown
                value.labels(**labels, unit=c.unit).set(v)
            if (lim := _num(c.limit)) is not None and "fail" not in had:
                limit.labels(**labels, unit=c.unit, direction=c.direction).set(lim)
            # one id per shard or rank shares the labels: each status any of them has is 1, so a
            # pass written after a fail never sets status="fail" back to 0 (the alert would not fire)
            had.add(c.status)
            for s in STATUSES:
                status.labels(**labels, status=s).set(1 if s in had else 0)
            if (d := _num(c.duration_s)) is not None:
                duration.labels(**labels).set(d)
            if c.status == "fail":
                _, n, w = fails.get(tuple(labels.values()), (labels, 0, 0))
                fails[tuple(labels.values())] = (labels, n + 1, w + (waiver_for(c, waivers, record.started_at) is not None))
    for labels, n, w in fails.values():
        if w == n:  # every failure under these labels is waived: an alert on fail leaves them out
            waived.labels(**labels).set(1)
    for v in VERDICTS:
        verdict.labels(**run, verdict=v).set(1 if record.verdict == v else 0)
    if record.finished_at:
        from datetime import datetime

        finished.labels(**run).set(datetime.fromisoformat(record.finished_at).timestamp())
    return reg


def write_textfile(record: RunRecord, path: Path) -> Path:
    """The node_exporter textfile collector's file, replaced atomically (a scrape never reads half)."""
    from prometheus_client import write_to_textfile

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_to_textfile(str(path), registry(record))
    return path


def push(record: RunRecord, url: str, timeout: float = PUSH_TIMEOUT_S) -> None:
    """PUT the run to a Pushgateway, grouped by profile: each run of a profile replaces the last
    one's series there (the run id stays a label), so the gateway holds one run per profile."""
    from prometheus_client import push_to_gateway

    profile = str(record.profile.get("name") or "unnamed")
    push_to_gateway(url, job=JOB, registry=registry(record), grouping_key={"profile": profile}, timeout=timeout)


# Record text reaches a page GitHub renders as Markdown with some raw HTML allowed (<h1>, <img> that
# fetches from outside): each line ending becomes a space (a \r or U+2028 began a line of its own,
# so a message could forge a heading), < > & are written as entities, inline Markdown is escaped,
# and text that starts a line cannot start a block (heading, quote, list, code).
_BREAKS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_INLINE = re.compile(r"([\\`*_\[\]!|~])")
_BLOCK_START = re.compile(r"^(\d+)([.)])|^([#>+\-=*_~`:])")


def _cell(text: object) -> str:
    """Record text as inline Markdown that shows as itself (a table cell, a heading's words)."""
    flat = _BREAKS.sub(" ", str(text))
    return _INLINE.sub(r"\\\1", flat).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _line(text: object) -> str:
    """Record text that begins a Markdown line: as :func:`_cell`, and its start cannot open a block."""
    return _BLOCK_START.sub(lambda m: f"{m[1]}\\{m[2]}" if m[1] else f"\\{m[3]}", _cell(text).lstrip())


def _code(text: object) -> str:
    """Record text as a code span: nothing inside is Markdown or HTML, so only its fence needs care."""
    flat = _BREAKS.sub(" ", str(text))
    fence = "`" * (max((len(r) for r in re.findall("`+", flat)), default=0) + 1)
    pad = " " if flat.startswith("`") or flat.endswith("`") or not flat.strip(" ") else ""
    return f"{fence}{pad}{flat}{pad}{fence}"


def markdown(record: RunRecord) -> str:
    """The verdict line and the headline table (the terminal's rows, from day0.results.summary)."""
    s = summary.summarize(record)
    lines = [f"### day0 {_cell(record.run_id)}: {_cell(s.verdict_line)}", ""]
    if s.reason:
        lines += [_line(s.reason), ""]
    rows = summary.headline_rows(s)
    if rows:
        lines += ["| Metric | Value | Limit | Status |", "| --- | --- | --- | --- |"]
        lines += [f"| {' | '.join(_cell(x) for x in row)} |" for row in rows]
        answers = summary.answer_lines(s)
        lines += [""] + [f"- {_line(a)}" for a in answers] if answers else []
    else:
        lines.append("No headline figure was measured in this run.")
    if s.failed:
        lines += ["", "**Failed:** " + ", ".join(_code(c.id) for c in s.failed)]
    return "\n".join(lines) + "\n\n"


def append_step_summary(record: RunRecord, path: Path) -> Path:
    """Append (the job summary file is shared by every step of the job, never replaced)."""
    path = Path(path)
    with open_output(path, append=True) as f:  # a regular file: never through a link, never a FIFO
        f.write(markdown(record).encode("utf-8"))
    return path


def export(record: RunRecord, targets: Targets, log: Callable[[str], None]) -> dict[str, Path | str]:
    """Every asked-for export; each failure is one log line, and the others still run.
    Returns label -> where it went, for the run's closing summary."""
    out: dict[str, Path | str] = {}
    jobs: list[tuple[str, str | None, Callable[[str], Path | str]]] = [
        ("prometheus textfile", targets.textfile, lambda t: write_textfile(record, Path(t))),
        ("pushgateway", targets.pushgateway, lambda t: (push(record, t), t)[1]),
        ("GitHub step summary", targets.step_summary, lambda t: append_step_summary(record, Path(t))),
    ]
    for label, target, run in jobs:
        if not target:
            continue
        try:
            out[label] = run(target)
        except Exception as exc:  # an unreachable gateway or a full disk must not cost the run
            log(f"{label} export to {target} failed: {type(exc).__name__}: {str(exc)[:300]}")
    return out
