"""``day0 latency import FILE``: a run a site already made, judged as if day0 had measured it.

Reads a ``vllm bench serve --save-result --save-detailed`` result or a GuideLLM benchmark report
(``from_vllm``, ``from_guidellm``) through the shared reader of untrusted files
(``day0.core.inputs``), rebuilds day0's own phase of requests, and runs the stage's metrics and
checks on it with the same SLA: the same definitions, percentiles and goodput as a live run. The
checks can be written as a list (``--json``, like ``day0 collectives import``) and as a run folder
(``--out``: ``events.jsonl`` and ``run.json``) that ``day0 report`` renders. An unusable file is
one line naming it and the key (exit 2).
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from day0.config.latency import SlaSection
from day0.core.events import EVENTS_FILE, EventLog, rebuild
from day0.core.inputs import InputError, decode_utf8, read_regular
from day0.core.record import Check, RunRecord
from day0.stages.latency.checks import (
    error_rate_check,
    goodput_check,
    percentile_checks,
    throughput_checks,
)
from day0.stages.latency.from_guidellm import benchmark_labels, looks_like_guidellm, read_guidellm
from day0.stages.latency.from_vllm import looks_like_vllm, read_vllm
from day0.stages.latency.imported import ImportedRun, result_json
from day0.stages.latency.metrics import LatencyMetrics, compute_metrics, rounded, summarize

MAX_RESULT_BYTES = 256 << 20  # as a run record: a detailed vLLM result of 100,000 x 64-token requests is ~150 MB


@dataclass(frozen=True)
class ImportFormat:
    """One tool's result file: how to tell it, what it lacks when it is not one, how to read a run."""

    name: str
    looks_like: Callable[[Any], bool]  # the file's first document
    lacks: str  # "a GuideLLM report (no ...)": said when no format matches
    read: Callable[[Path, list[Any], int | None], ImportedRun]  # (file, its documents, --benchmark)


def _guidellm(path: Path, runs: list[Any], benchmark: int | None) -> ImportedRun:
    first = runs[0]
    if len(runs) != 1 or not isinstance(first, dict) or not isinstance(first.get("benchmarks"), list):
        raise InputError(f"{path}: benchmarks: missing; not a GuideLLM report")
    return read_guidellm(path, first, _pick(path, benchmark, benchmark_labels(first), "benchmarks"))


def _vllm(path: Path, runs: list[Any], benchmark: int | None) -> ImportedRun:
    labels = [str(r.get("date", i)) if isinstance(r, dict) else str(i) for i, r in enumerate(runs)]
    i = _pick(path, benchmark, labels, "results (one per line, --append-result)")
    if not isinstance(runs[i], dict):
        raise InputError(f"{path}: result {i}: expected an object, not a vllm bench serve result")
    return read_vllm(path, runs[i], f"result {i} ({labels[i]})" if len(runs) > 1 else labels[i])


# detection asks each in turn: a GuideLLM report first (its own keys are the more specific)
IMPORT_FORMATS: tuple[ImportFormat, ...] = (
    ImportFormat("guidellm", looks_like_guidellm, "a GuideLLM report (no 'benchmarks' and 'metadata.guidellm_version')",
                 _guidellm),
    ImportFormat("vllm", looks_like_vllm, "a vllm bench serve result (no 'duration' and 'completed')", _vllm),
)
FORMATS = ("auto", *(f.name for f in IMPORT_FORMATS))


def read_result(path: Path, fmt: str = "auto", benchmark: int | None = None) -> ImportedRun:
    """The run in ``path`` (``benchmark``: which one, when the file holds several); InputError names
    the file and key of anything that cannot be used."""
    path = Path(path)
    runs, sha256 = _read(path)
    named = {f.name: f for f in IMPORT_FORMATS}
    found = named.get(fmt) if fmt != "auto" else next((f for f in IMPORT_FORMATS if f.looks_like(runs[0])), None)
    if found is None:
        raise InputError(f"{path}: neither " + " nor ".join(f.lacks for f in reversed(IMPORT_FORMATS)))
    run = found.read(path, runs, benchmark)
    run.sha256 = sha256
    return run


def _read(path: Path) -> tuple[list[Any], str]:
    """The file's documents and its sha256. The bytes are let go before the parse: held beside
    their decoded text and what the parser builds, they were a third of the import's peak."""
    raw = read_regular(path, "benchmark result", MAX_RESULT_BYTES)
    sha256 = hashlib.sha256(raw).hexdigest()
    try:
        text: str | bytes = decode_utf8(raw, str(path))
    except InputError:  # parsed as bytes, so a refusal names the bad byte (and its line, one result a line)
        text = raw
    del raw
    return _documents(path, text), sha256


def _documents(path: Path, text: str | bytes) -> list[Any]:
    """The file's JSON document, or (``vllm bench serve --append-result``) one per line. The lines
    are looked at only when the whole is not one document: they are a second copy of the file."""
    try:
        return [result_json(text, str(path))]
    except InputError as exc:  # kept without its traceback and chain, which held the first document's values
        whole = exc.with_traceback(None)
        whole.__context__ = whole.__cause__ = None
    raw = text.encode("utf-8") if isinstance(text, str) else text  # split as bytes: \n and \r only
    lines = [line for line in raw.splitlines() if line.strip()]
    if len(lines) > 1 and all(line.lstrip().startswith(b"{") for line in lines):
        return [result_json(line, f"{path}:{n}") for n, line in enumerate(lines, 1)]
    raise whole


def _pick(path: Path, benchmark: int | None, labels: list[str], what: str) -> int:
    if not labels:
        raise InputError(f"{path}: {what.split(' ')[0]}: empty; no run to import")
    if benchmark is None:
        if len(labels) > 1:
            listing = ", ".join(f"{i}: {label}" for i, label in enumerate(labels[:12]))
            raise InputError(f"{path}: {what}: {len(labels)} runs ({listing}); choose one with --benchmark N")
        return 0
    if not 0 <= benchmark < len(labels):
        raise InputError(f"{path}: --benchmark {benchmark}: the file holds runs 0-{len(labels) - 1}")
    return benchmark


def imported_metrics(run: ImportedRun, sla: SlaSection, percentiles: list[float]) -> LatencyMetrics:
    """The stage's metrics of the imported phase, with what the tool did not record left empty."""
    m = compute_metrics(run.phase, percentiles, sla.per_request_slo())
    for metric in run.missing:
        for key in [metric] + (["itl_token"] if metric == "itl" else []):
            m.samples[key] = []
            m.stats[key] = summarize([], percentiles)
    # the tool's own token accounting, named as such (not day0's "content" fallback: no note on every check)
    return replace(m, missing=dict(run.missing), token_source=f"{run.tool} (one token per message)")


def import_checks(run: ImportedRun, sla: SlaSection, percentiles: list[float]) -> tuple[LatencyMetrics, list[Check]]:
    """The stage's checks of an imported run (no engine cross-check: the file has no engine view)."""
    m = imported_metrics(run, sla, percentiles)
    checks = [source_check(run, m), *percentile_checks(m, sla), error_rate_check(m, sla),
              *throughput_checks(m, sla, run.settings), goodput_check(m, sla)]
    for c in checks:
        c.source = f"import:{run.tool}"
    return m, checks


def source_check(run: ImportedRun, m: LatencyMetrics) -> Check:
    """What was read, from where, and how the tool's figures differ from a live day0 run's. Requests
    whose figures cannot be true were left out of every figure: the check is then an ``error`` naming
    them, so the run is never accepted on what remains (docs/metrics.md, "Domains")."""
    rows = [[k, v if not isinstance(v, float) else rounded(v, 4)] for k, v in run.facts]
    left = run.left_out
    read = f"{m.sent} requests judged ({m.sent + left.count} read)" if left.count else f"{m.sent} requests read"
    message = (f"{run.tool} {run.label} from {run.path.name}: {read}, {m.completed} "
               f"completed, {m.failed} failed" + (f", {m.not_sent} left out (incomplete)" if m.not_sent else "")
               + (f"; not recorded by the tool: {', '.join(run.missing)}" if run.missing else ""))
    if left.count:
        message = (f"could not measure: {left.count} of {m.sent + left.count} requests hold figures that cannot be "
                   f"true and are left out of every figure; first: {left.shown[0]}; {message}")
    return Check("latency.import", "Imported benchmark result", "error" if left.count else "pass", value=run.tool,
                 unit="", direction="exact", message=message,
                 evidence={"file": str(run.path), "sha256": run.sha256, "tool": run.tool,
                           "tool_version": run.version, "run": run.label, "notes": run.notes,
                           "missing": run.missing, "left_out": left.count, "left_out_first": left.shown,
                           "table": {"columns": ["the tool's own figure", "as written"], "rows": rows}})


def write_run(out_dir: Path, run: ImportedRun, checks: list[Check], sla: SlaSection) -> RunRecord:
    """A run folder ``day0 report`` renders: the checks as events of a one-stage run, and run.json."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if (out_dir / EVENTS_FILE).exists():
        raise InputError(f"{out_dir}: already holds {EVENTS_FILE}; pass an empty folder to --out")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    events = EventLog(out_dir / EVENTS_FILE)
    environment = {"imported": True, "tool": run.tool, "tool_version": run.version, "file": str(run.path),
                   "run": run.label}
    profile = {"name": f"import of {run.path.name}", "latency": run.settings.model_dump(),
               "sla": sla.model_dump(exclude_none=True)}
    events.run_started(f"latency-import-{stamp}-{secrets.token_hex(3)}", environment, profile, ["latency"])
    for c in checks:
        events.check("latency", c)
    events.note("imported_from", {"file": str(run.path), "tool": run.tool, "notes": run.notes})
    events.run_finished(1 if any(c.failed for c in checks) else 0)
    return rebuild(out_dir)
