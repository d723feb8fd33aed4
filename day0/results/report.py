"""Render run.json into one self-contained, signable HTML acceptance report.

The report reads only the run record (never re-measures): the page is a view of run.json,
and run.json itself is embedded so ``day0 verify`` can re-hash it. Templates are Jinja2 with
autoescape on; a site overrides blocks by passing a template directory whose files shadow
the built-in ones (a site's ``base.html.j2`` can wrap ours as ``day0/base.html.j2``).
Everything the templates show is prepared as plain view objects (the stages and checks in
day0.results.stageview, the page's frame here), so a site template needs no logic of its own.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
from jinja2.loaders import split_template_path
from markupsafe import Markup

from day0.core.events import EVENTS_FILE
from day0.core.inputs import InputError, decode_utf8, read_regular, refusal, term_safe
from day0.core.outputs import write_file
from day0.core.record import RunRecord, load_with_bytes, record_file
from day0.core.verdict import waiver_for, waivers_of
from day0.results import summary, trends
from day0.results.junit import write_junit
from day0.results.sandbox import BoundedSandbox
from day0.results.signoff import (
    Signatory,
    SignoffError,
    embedded_blocks,
    keygen,
    parse_report,
    sign_report,
    signatures_region,
    signoff_block,
    verify_report,
)
from day0.results.stageview import REPORT_FILE, regression_view, stage_views
from day0.results.textview import _summary, duration, flatten, fmt_value, lookup

__all__ = ["render", "write_junit", "summary_lines", "publish", "add_cli", "ReportError", "Signatory"]

TEMPLATES = Path(__file__).with_name("templates")
DEFAULT_TEMPLATE = "report.html.j2"
JUNIT_FILE = "junit.xml"
MAX_TEMPLATE_BYTES = 4 << 20  # a site template is a few KB; a file past this is not one


class ReportError(InputError):
    """The report cannot be rendered as asked; the message names the file or template."""


def resolve_signatories(record: RunRecord, signatories: Iterable[Any] | None) -> list[Signatory]:
    """Explicit signatories win; otherwise the profile's ``[report] signatories``."""
    if signatories is None:
        rep = record.profile.get("report")
        signatories = (rep if isinstance(rep, dict) else {}).get("signatories") or []
        where = "profile report.signatories"
    else:
        where = "signatory"
    if not isinstance(signatories, (list, tuple)):
        raise ReportError(f"{where}: expected a list, got {type(signatories).__name__}")
    try:
        return [Signatory.coerce(s, f"{where}[{i}]") for i, s in enumerate(signatories)]
    except SignoffError as exc:
        raise ReportError(str(exc)) from None


FACTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Profile", ("profile.name",)),
    ("Model", ("profile.model.served_model_name", "profile.model.path", "profile.model.name", "profile.model.id",
               "profile.model", "environment.model")),
    ("Host", ("environment.host", "environment.hostname")),
    ("Devices", ("environment.devices",)),
    ("Topology", ("environment.topology", "profile.topology")),
    ("vLLM", ("environment.vllm", "environment.versions.vllm", "environment.vllm_version")),
    ("torch", ("environment.torch", "environment.versions.torch", "environment.torch_version")),
    ("Python", ("environment.python", "environment.versions.python", "environment.python_version")),
    ("Git commit", ("environment.git_commit", "environment.git.commit", "environment.commit")),
)


def first_screen(record: RunRecord, run_file: Path | None = None, history: Path | None = None) -> summary.Summary:
    """The first screen's data, worked out once per record (the page and the terminal lines share it).
    With ``run_file``, earlier runs in the history (``history``, else the default beside it) give the
    headline figures their trends. A glob no check id could be is one line naming the file and key."""
    past, unloaded = trends.history_runs(record, run_file, root=history) if run_file else ((), [])
    try:
        return summary.summarize(record, past, trends.baseline_run_id(record), unloaded)
    except ValueError as exc:  # a figure's or a required glob past day0.core.globs.MAX_GLOB
        raise ReportError(f"{run_file or 'run record'}: {exc}") from None


def build_context(record: RunRecord, run_bytes: bytes, signatories: Sequence[Signatory], title: str | None,
                  run_file: Path | None = None, history: Path | None = None,
                  first: summary.Summary | None = None) -> dict:
    """Everything the templates may use; templates hold no logic beyond loops and blocks.
    ``first``: the first screen (:func:`first_screen`), worked out here when not given."""
    first = first or first_screen(record, run_file, history)
    both = {"environment": record.environment or {}, "profile": record.profile or {}}
    facts = [(label, _summary(v) if (v := lookup(both, *paths)) is not None else "—") for label, paths in FACTS]
    model = lookup(both, *dict(FACTS)["Model"])
    profile = record.profile if isinstance(record.profile, dict) else {}
    sections: list[tuple[str, list[tuple[str, str]]]] = []
    general: dict[str, Any] = {}
    for k, v in profile.items():
        if isinstance(v, dict):
            sections.append((k, flatten(v)))
        else:
            general[k] = v
    sections.sort(key=lambda s: (0 if "engine" in s[0] else 1))  # engine arguments first, open
    if general:
        n_engine = sum("engine" in name for name, _ in sections)
        sections.insert(n_engine, ("profile", flatten(general)))
    stages = stage_views(record)
    failed = [cv for s in stages for cv in s.checks if cv.check.failed and not cv.waiver]
    waived = [cv for s in stages for cv in s.checks if cv.waiver]
    signoff = signoff_block(record, run_bytes, signatories)
    rep = profile.get("report") if isinstance(profile.get("report"), dict) else {}
    return {
        "title": title or fmt_value(rep.get("title") or "Day0 acceptance report"),
        "model": _summary(model) if model is not None else "—",
        "record": record,
        "verdict": record.verdict,
        "verdict_label": str(record.verdict).upper(),
        "verdict_line": first.verdict_line,
        "summary": first,
        "sparks": {k: Markup(v) for k, v in trends.sparklines(first.headlines).items()},
        "reason": record.reason,
        "duration": duration(record.started_at, record.finished_at),
        "facts": facts,
        "environment_rows": flatten(record.environment or {}),
        "profile_sections": sections,
        "notes_rows": flatten(record.notes or {}),
        "stages": stages,
        "regression": regression_view(record),
        "failed": failed,
        "waived": waived,
        "totals": {k: sum(s.counts[k] for s in stages) for k in ("pass", "fail", "error", "skip", "blocked")},
        "signoff": signoff,
        "signatories": signatories,
        "signatures_region": Markup(signatures_region([])),
        "day0_embedded": Markup(embedded_blocks(run_bytes, signoff)),
    }


class FolderLoader(jinja2.BaseLoader):
    """Templates from one folder, read only inside it. The sandbox stops a template running code,
    not reading files: ``{% include %}`` of a symlink to ``/etc/shadow`` or a private key would put
    that file in the page. A template whose real path leaves the folder (a link, of the file or of
    a folder on the way) is refused naming both, and only a regular file is read (a FIFO would
    hang the render)."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.root = self.folder.resolve()

    def get_source(self, environment: jinja2.Environment, template: str) -> tuple[str, str, Callable[[], bool]]:
        path = self.folder.joinpath(*split_template_path(template))
        if not os.path.lexists(path):
            raise jinja2.TemplateNotFound(template)
        real = path.resolve()
        if not real.is_relative_to(self.root):
            raise ReportError(f"{path}: template leaves its folder {self.folder} (it resolves to {real}); not read")
        data = read_regular(real, "template", MAX_TEMPLATE_BYTES, ReportError, label=str(path))
        return decode_utf8(data, str(path), ReportError), str(path), lambda: True


def _environment(template_dir: Path | None) -> jinja2.Environment:
    """Site templates come only from ``template_dir`` as the caller got it (a command line or the
    local profile), never from the record being rendered (docs/report.md, "Site templates")."""
    builtin = FolderLoader(TEMPLATES)
    loaders: list[jinja2.BaseLoader] = []
    if template_dir is not None:
        if not Path(template_dir).is_dir():
            raise ReportError(f"{template_dir}: template directory not found")
        loaders.append(FolderLoader(Path(template_dir)))
    loaders += [builtin, jinja2.PrefixLoader({"day0": builtin})]
    env = BoundedSandbox(
        loader=jinja2.ChoiceLoader(loaders),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["value"] = fmt_value
    return env


def _record_file(record_path: Path) -> Path:
    return record_file(Path(record_path))


def render(
    record_path: Path,
    out: Path,
    template_dir: Path | None = None,
    signatories: Iterable[Signatory | str | Mapping[str, str]] | None = None,
    *,
    title: str | None = None,
) -> Path:
    """Render run.json (file or run folder) to ``out`` (a file, or a folder that gets report.html).

    ``signatories`` default to the profile's ``[report] signatories``; ``template_dir`` to the
    built-in templates only (a record's ``[report] template_dir`` names no files). Returns the
    path written.
    """
    src = _record_file(record_path)
    _apart(src, {"report": Path(out) / REPORT_FILE if Path(out).is_dir() else Path(out)})
    record, run_bytes = load_with_bytes(src)  # one read: the digest is of the record rendered
    return _render(record, run_bytes, src, Path(out), template_dir, signatories, title=title)


def _render(
    record: RunRecord, run_bytes: bytes, src: Path, out: Path, template_dir: Path | None,
    signatories: Iterable[Signatory | str | Mapping[str, str]] | None, *, title: str | None = None,
    history: Path | None = None, first: summary.Summary | None = None,
) -> Path:
    env = _environment(Path(template_dir) if template_dir is not None else None)
    ctx = build_context(record, run_bytes, resolve_signatories(record, signatories), title, src, history, first)
    try:
        html = env.get_template(DEFAULT_TEMPLATE).render(ctx)
    except jinja2.TemplateError as exc:
        name = getattr(exc, "filename", None) or getattr(exc, "name", None) or DEFAULT_TEMPLATE
        line = getattr(exc, "lineno", None)
        raise ReportError(f"{name}{f':{line}' if line else ''}: template error: {exc}") from None
    except (ArithmeticError, LookupError, TypeError, ValueError, RecursionError) as exc:  # raised inside an expression
        where = template_dir or TEMPLATES
        raise ReportError(f"{where}: template error: {type(exc).__name__}: {str(exc)[:200]}") from None
    out = Path(out)
    if out.is_dir():
        out = out / REPORT_FILE
    try:
        parsed = parse_report(out, html)
    except SignoffError as exc:
        raise ReportError(
            f"template {template_dir or TEMPLATES}: the page lost a sign-off element "
            f"({exc}); keep {{{{ signatures_region }}}} and {{{{ day0_embedded }}}} in the page"
        ) from None
    if parsed.run_bytes != run_bytes:
        raise ReportError(f"{src}: embedded run record does not round-trip; report not written")
    out.parent.mkdir(parents=True, exist_ok=True)
    return write_file(out, html)


# --------------------------------------------------------------------------- summary / publish


def stage_lines(record: RunRecord) -> list[str]:
    """One line a stage for the terminal's day0 section: its verdict, how long it took, how many
    checks of each status (``weights     accepted   12.3 s  (2 pass, 1 skip)``)."""
    width = max((len(st.verdict) for st in record.stages), default=8)
    lines = []
    for st in record.stages:
        counts: dict[str, int] = {}
        for c in st.checks:
            counts[c.status] = counts.get(c.status, 0) + 1
        detail = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no checks"
        took = f"{st.duration_s:6.1f} s" if st.duration_s is not None else " " * 8
        lines.append(term_safe(f"  {st.name:<12} {st.verdict:<{width}} {took}  ({detail})"))
    return lines


def summary_lines(record: RunRecord, paths: Mapping[str, Path | str] | Sequence[Path | str],
                  first: summary.Summary | None = None) -> list[str]:
    """Lines for the terminal at the end of a run: verdict, what failed, where the files are.
    Record text is escaped (:func:`term_safe`): a message cannot forge or hide a line. ``first``:
    the page's first screen when already worked out (else it is worked out here)."""
    first = first or first_screen(record)
    rows = summary.headline_rows(first)
    if rows:  # like vLLM bench's result block: metric, value, limit, status
        w = max(len(r[0]) for r in rows)
        lines = [f"{'metric':<{w}}  {'value':>16}  {'limit':>16}  status"]
        lines += [f"{m:<{w}}  {v:>16}  {lim:>16}  {st}" for m, v, lim, st in rows]
    else:
        lines = []
    lines += summary.answer_lines(first)
    lines.append(f"day0 verdict: {summary.verdict_line(record)}: {record.reason}")
    failed = [(s.name, c) for s in record.stages for c in s.checks if c.failed]
    waivers = waivers_of(record.profile)
    for _, c in failed[:20]:  # an error is the harness's, never the deployment's: say so
        kind = "ERROR (could not measure)" if c.status == "error" else c.status.upper()
        if waiver_for(c, waivers, record.started_at):
            kind += " (waived by the profile)"
        lines.append(f"  {kind} {c.id}: {c.message}")
    if len(failed) > 20:
        lines.append(f"  … and {len(failed) - 20} more failed checks (see the report)")
    blocked = sum(c.status == "blocked" for c in record.checks())
    if blocked:
        lines.append(f"  {blocked} checks blocked by an earlier stage")
    items = paths.items() if isinstance(paths, Mapping) else ((Path(p).name, p) for p in paths)
    for label, p in items:
        lines.append(f"  {label}: {p}")
    return [term_safe(line) for line in lines]


def publish(
    record_path: Path,
    out_dir: Path | None = None,
    template_dir: Path | None = None,
    signatories: Iterable[Any] | None = None,
    history: Path | None = None,
) -> dict[str, Path]:
    """report.html and junit.xml next to run.json (or in ``out_dir``); returns the three paths.
    ``template_dir`` and ``history`` are the caller's (its local profile's), never the record's."""
    src = _record_file(record_path)
    out_dir = Path(out_dir) if out_dir is not None else src.parent
    _apart(src, {"report": out_dir / REPORT_FILE, "junit": out_dir / JUNIT_FILE})
    record, run_bytes = load_with_bytes(src)  # the page and junit.xml are views of the same bytes
    out_dir.mkdir(parents=True, exist_ok=True)
    html = _render(record, run_bytes, src, out_dir / REPORT_FILE, template_dir, signatories, history=history)
    junit = write_junit(record, out_dir / JUNIT_FILE)
    return {"run record": src, "report": html, "junit": junit}


def _apart(src: Path, outputs: Mapping[str, Path]) -> None:
    """Refuse outputs that would overwrite the run record rendered, its run's event log, or each
    other (``--junit run.json`` turned the record into XML and exited 0): a hard or symbolic link
    counts as the same file."""
    for label, out in outputs.items():
        for what, q in (("the run record rendered", src), ("its run's event log", src.parent / EVENTS_FILE)):
            if os.path.exists(out) and os.path.exists(q) and os.path.samefile(out, q):
                raise ReportError(f"{out}: the {label} output is {what} ({q}); not overwritten: name another file")
    paths = list(outputs.items())
    for i, (label, out) in enumerate(paths):
        for other, o in paths[i + 1:]:
            if Path(out).resolve() == Path(o).resolve():
                raise ReportError(f"{out}: the {label} and {other} outputs are one file; name two")


# --------------------------------------------------------------------------- CLI


def _cmd_report(args: argparse.Namespace) -> int:
    src = _record_file(Path(args.run))
    out = Path(args.out) if args.out else src.parent / REPORT_FILE
    out = out / REPORT_FILE if out.is_dir() else out
    _apart(src, {"report": out, "junit": Path(args.junit) if args.junit else out.parent / JUNIT_FILE})
    record, run_bytes = load_with_bytes(src)
    first = first_screen(record, src)
    html = _render(record, run_bytes, src, out, Path(args.template_dir) if args.template_dir else None,
                   args.signatory, first=first)
    junit = write_junit(record, Path(args.junit) if args.junit else html.parent / JUNIT_FILE)
    for line in summary_lines(record, {"run record": src, "report": html, "junit": junit}, first):
        print(line)
    rep = record.profile.get("report") if isinstance(record.profile, dict) else None
    named = rep.get("template_dir") if isinstance(rep, dict) else None
    if named and not args.template_dir:  # said, not followed: the record is data
        print(term_safe(f"note: the record names [report] template_dir {str(named)!r}; not used (a record "
                        "names no paths): give --template-dir to use site templates"))
    return 0


def _cmd_keygen(args: argparse.Namespace) -> int:
    priv, pub = keygen(Path(args.dir), args.name)
    print(term_safe(f"private key: {priv} (mode 0600; keep it out of reports and repositories)"))
    print(term_safe(f"public key:  {pub} (give this to whoever runs day0 verify)"))
    return 0


def _cmd_sign(args: argparse.Namespace) -> int:
    entry = sign_report(Path(args.report), Path(args.key), Signatory.parse(args.signer),
                        allow_rejected=args.allow_rejected)
    despite = entry.get("despite_verdict")
    tail = f", despite verdict {str(despite).upper()}" if despite else ""
    print(term_safe(f"signed {args.report} as {entry['signer']}, {entry['role']} with key {entry['key_id']}{tail}"))
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    result = verify_report(Path(args.report), [Path(p) for p in args.pubkey])
    for line in result.lines:  # sign-off text comes from the page: escaped, it cannot forge "verified"
        print(term_safe(line))
    if result.problems:  # one line, like every refusal: each problem names the part that changed
        print(term_safe(f"day0: {args.report}: verification failed: " + "; ".join(result.problems)),
              file=sys.stderr)
    print("verified" if result.ok else f"verification FAILED ({len(result.problems)} problems)")
    return 0 if result.ok else 1


def _guard(name: str, fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Known bad input prints one line naming the file and exits 2 (verify failures exit 1)."""

    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except (InputError, OSError) as exc:  # RecordError, SignoffError, ReportError
            print(refusal(exc), file=sys.stderr)
            return 2

    return run


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    """Register report/keygen/sign/verify; each sets ``func(args) -> exit code``."""
    p = subparsers.add_parser("report", help="render run.json to report.html and junit.xml")
    p.add_argument("run", help="run folder or run.json")
    p.add_argument("--out", help="report file (default: report.html next to run.json)")
    p.add_argument("--junit", help="JUnit XML file (default: junit.xml next to the report)")
    p.add_argument("--template-dir", help="folder of templates overriding the built-in blocks")
    p.add_argument(
        "--signatory", action="append", default=None, metavar='"NAME, ROLE"',
        help="who must sign (repeatable; default: the profile's [report] signatories)",
    )
    p.set_defaults(func=_guard("report", _cmd_report))

    p = subparsers.add_parser("keygen", help="create an Ed25519 signing key pair (PEM)")
    p.add_argument("dir", help="folder for NAME.pem (mode 0600) and NAME.pub.pem")
    p.add_argument("--name", default="day0_ed25519", help="file name stem (default: day0_ed25519)")
    p.set_defaults(func=_guard("keygen", _cmd_keygen))

    p = subparsers.add_parser("sign", help="append your Ed25519 signature to a report")
    p.add_argument("report", help="report.html to sign (the signature is appended in place)")
    p.add_argument("--key", required=True, help="private key PEM (mode 0600)")
    p.add_argument("--signer", required=True, metavar='"NAME, ROLE"',
                   help="who signs, as shown in the report's sign-off block")
    p.add_argument("--allow-rejected", action="store_true",
                   help="sign a run that was not accepted (REJECTED or INCOMPLETE); the signature and the page "
                        "then say 'signed despite verdict ...'")
    p.set_defaults(func=_guard("sign", _cmd_sign))

    p = subparsers.add_parser("verify", help="check a report's signatures and embedded run record")
    p.add_argument("report", help="report.html to check")
    p.add_argument("--pubkey", action="append", required=True, help="public key PEM (repeatable)")
    p.set_defaults(func=_guard("verify", _cmd_verify))
