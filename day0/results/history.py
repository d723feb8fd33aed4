"""Run history: every run's ``run.json`` kept, append-only, per profile and machine.

Like pytest-benchmark's storage, each run becomes one numbered file whose name carries what a
person scans for (number, start time, git commit, verdict), so ``latest``, ``latest-accepted``
(the runs a nightly is judged against) and the trend chart need no index that could drift from
the files:

    <history_dir>/<profile>/<machine>/0007_20261130T090000Z_0123456789ab_accepted.json

The file is a byte-for-byte copy of ``run.json`` (so the signed report's digest still matches
it) and is read back with :func:`day0.core.record.load`, which keeps older schema versions loading.
Numbers are claimed with ``os.link`` (fails if taken), so two jobs sharing one history folder
never overwrite each other. The machine is part of the path because numbers from different
hardware are not comparable; it is derived from the recorded devices, not the host name, since
CI runners get a fresh host name every night.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from day0.config.compare import CompareSection
from day0.core.inputs import InputError, refusal, term_safe
from day0.core.names import file_name
from day0.core.numbers import whole_number
from day0.core.outputs import write_new
from day0.core.record import RUN_FILE, RecordError, RunRecord, load, load_with_bytes

_DEFAULTS = CompareSection()  # the [compare] defaults, for records made before a key existed
DEFAULT_HISTORY_DIR = _DEFAULTS.history_dir
LATEST_ACCEPTED = "latest-accepted"
LATEST = "latest"
BASELINE_KEYWORDS = (LATEST_ACCEPTED, LATEST)
NAME = re.compile(
    r"^(?P<number>\d{4,})_(?P<stamp>\d{8}T\d{6}Z)_(?P<commit>[0-9a-z]+(?:-dirty)?)_(?P<verdict>[a-z_]+)\.json$"
)
# ASCII punctuation groups (folder names as they always were); other text is left to file_name,
# which keeps two non-ASCII names apart with a hash.
_SLUG = re.compile(r"[^a-z0-9.\x80-\U0010ffff]+")


class HistoryError(InputError):
    """History that cannot be used as asked; the message names the folder or file."""


@dataclass(frozen=True)
class Entry:
    """One stored run, described by its file name alone (loading it is the caller's choice)."""

    path: Path
    number: int
    stamp: str
    commit: str
    verdict: str

    @property
    def label(self) -> str:
        return f"#{self.number}"

    def load(self) -> RunRecord:
        return load(self.path)


def slug(text: str, limit: int = 80) -> str:
    """A history folder's name for ``text``: grouped without case or ASCII punctuation ("My Site"
    and "my-site" share a folder, as they always have), made a file name by the one sanitiser
    (:func:`day0.core.names.file_name`: one component, never ``..``, bounded; a name cut for
    length or holding non-ASCII text keeps a hash of itself, so two such names stay apart). Lowered
    again after: a letter with no lower case ('𝙰', mathematical monospace) decomposes to 'A'."""
    return file_name(_SLUG.sub("-", str(text).lower()), limit).lower()


def machine_id(record: RunRecord, override: str = "") -> str:
    """The hardware a run measured, as a folder name: ``cuda-8x-nvidia-h200`` or ``cpu-2c-...``.

    Host names are left out on purpose (they change per CI runner); a profile's
    ``compare.machine`` wins when a site wants its own grouping.
    """
    if override:
        return slug(override)
    devices = record.environment.get("devices") if isinstance(record.environment, Mapping) else None
    parts: list[str] = []
    topo = record.profile.get("topology") if isinstance(record.profile, Mapping) else None
    nodes = topo.get("nodes") if isinstance(topo, Mapping) else None
    if isinstance(nodes, int) and nodes > 1:
        parts.append(f"{nodes}n")
    if isinstance(devices, list) and devices and all(isinstance(d, Mapping) for d in devices):
        groups: dict[tuple[str, str], int] = {}
        for d in devices:
            kind = str(d.get("kind") or "dev")
            name = str(d.get("name") or d.get("model") or "unknown")
            if kind == "cpu" and d.get("cores"):
                name = f"{d['cores']}c-{name}"
            groups[(kind, name)] = groups.get((kind, name), 0) + 1
        for (kind, name), n in sorted(groups.items()):
            parts.append(f"{kind}-{n}x-{name}" if n > 1 else f"{kind}-{name}")
    else:
        parts.append("unknown-devices")
    return slug("-".join(parts))


def profile_name(record: RunRecord) -> str:
    name = record.profile.get("name") if isinstance(record.profile, Mapping) else None
    return str(name) if name else "unnamed"


def compare_section(profile: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """A stored record's ``[compare]`` table as it was written (``{}`` before the table existed);
    ``day0.config.compare.CompareSection.from_mapping`` turns it into the typed section."""
    sec = profile.get("compare") if isinstance(profile, Mapping) else None
    return sec if isinstance(sec, Mapping) else {}


def history_root(profile: Mapping[str, Any] | None, out_dir: Path) -> Path:
    """``compare.history_dir`` of the *local* profile (the one this run or command was started
    with, resolved; ``{}`` or None for the default): absolute, or relative to the run folders'
    parent. Never a stored record's profile: a record is data, and the folder it names would be
    where a received run.json gets written (docs/record.md, "Names and paths")."""
    raw = compare_section(profile).get("history_dir") or DEFAULT_HISTORY_DIR
    p = Path(str(raw)).expanduser()
    return p if p.is_absolute() else Path(out_dir) / p


def default_root(run_path: Path) -> Path:
    """The history of a run named on a command line without ``--history``: ``history/`` in the
    folder holding its run folder (where a run with the default profile keeps it), whatever the
    record says."""
    run_file = Path(run_path) / RUN_FILE if Path(run_path).is_dir() else Path(run_path)
    return history_root(None, run_file.resolve().parent.parent)


def folder_for(root: Path, record: RunRecord, machine: str = "") -> Path:
    override = machine or str(compare_section(record.profile).get("machine") or "")
    return Path(root) / slug(profile_name(record)) / machine_id(record, override)


def entries(folder: Path) -> list[Entry]:
    """Stored runs, oldest first; files that do not follow the naming scheme are ignored."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    out = []
    for p in folder.iterdir():
        m = NAME.match(p.name)
        if m and p.is_file():
            out.append(Entry(p, int(m["number"]), m["stamp"], m["commit"], m["verdict"]))
    return sorted(out, key=lambda e: e.number)


def _stamp(iso: str | None) -> str:
    try:
        t = datetime.fromisoformat(str(iso))
    except (TypeError, ValueError):
        t = datetime.now(timezone.utc)
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    try:
        t = t.astimezone(timezone.utc)
    except OverflowError:  # year 1 east of UTC, year 9999 west of it: the time as written
        pass
    return f"{t.year:04d}{t.month:02d}{t.day:02d}T{t.hour:02d}{t.minute:02d}{t.second:02d}Z"  # strftime: "1", not "0001"


def _commit(record: RunRecord) -> str:
    raw = str(record.environment.get("git_commit") or "") if isinstance(record.environment, Mapping) else ""
    dirty = raw.endswith("-dirty")
    sha = re.sub(r"[^0-9a-f]", "", raw.removesuffix("-dirty").lower())[:12]
    return (sha or "nogit") + ("-dirty" if dirty and sha else "")


def entry_name(number: int, record: RunRecord) -> str:
    verdict = re.sub(r"[^a-z_]", "", str(record.verdict).lower()) or "unknown"
    return f"{number:04d}_{_stamp(record.started_at)}_{_commit(record)}_{verdict}.json"


def store(run_json: Path, folder: Path, attempts: int = 100) -> Entry:
    """Append ``run_json`` to ``folder`` under the next free number; never replaces a file."""
    src = Path(run_json)
    if src.is_dir():
        src = src / RUN_FILE
    record, data = load_with_bytes(src)  # one read: what is stored is the record that was checked
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    def names() -> Iterator[str]:  # listed afresh each try: another job may take a number in between
        for _ in range(attempts):
            existing = entries(folder)
            yield entry_name((existing[-1].number + 1) if existing else 1, record)

    target = write_new(folder, names(), data, error=HistoryError)  # claimed whole, never replacing a file
    if target is None:
        raise HistoryError(f"{folder}: could not claim a history number after {attempts} attempts")
    m = NAME.match(target.name)
    assert m is not None
    return Entry(target, int(m["number"]), m["stamp"], m["commit"], m["verdict"])


# Unreadable entries named one by one; past it, a count: 500 must not push a verdict off the screen.
NAMED_SKIPS = 3


def recent(folder: Path, n: int, exclude_run_id: str = "", verdict: str = "",
           skipped: list[str] | None = None, before: str = "") -> list[tuple[Entry, RunRecord]]:
    """The last ``n`` stored runs (oldest first), never the run ``exclude_run_id`` itself, only
    those with ``verdict`` when one is given (``latest-accepted``), and only those started before
    ``before`` (the judged run's start, or at it: an older run's report or comparison is against what came
    before it, never after). An entry that does not load is skipped (one bad file must not stop
    every later nightly) and named in ``skipped``, the first :data:`NAMED_SKIPS` of them and a
    count of the rest, unless its name says it was stored after ``before`` (it would never have been
    one of these). The nightly judges a run against these, and the trend charts draw them."""
    out: list[tuple[Entry, RunRecord]] = []
    bad: list[str] = []
    for e in reversed(entries(folder)):
        if len(out) >= n:
            break
        if verdict and e.verdict != verdict:
            continue
        try:
            rec = e.load()
        except RecordError as exc:
            if _named(e.stamp, before):
                bad.append(f"history entry skipped: {exc}")
            continue
        if rec.run_id != exclude_run_id and (not verdict or rec.verdict == verdict) and _earlier(rec.started_at, before):
            out.append((e, rec))
    if skipped is not None:
        more = len(bad) - NAMED_SKIPS
        skipped += bad[:NAMED_SKIPS] + ([f"and {more} more history entries that did not load"] if more > 0 else [])
    return list(reversed(out))


def _named(stamp: str, before: str) -> bool:
    """Whether an entry that did not load could have been a run before ``before``, by its name's stamp
    (:func:`_stamp`: the start to the second, in UTC, or a start without a zone read as UTC, so up to
    14 hours off the true time): one stored later is no gap in that run's history."""
    try:
        start = datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc)
        return not before or start - timedelta(hours=14) <= datetime.fromisoformat(before)
    except (TypeError, ValueError, OverflowError):  # a time that does not compare (or a year-1 stamp): named
        return True


def _earlier(started_at: str, before: str) -> bool:
    if not before:
        return True
    try:
        return datetime.fromisoformat(started_at) <= datetime.fromisoformat(before)  # the run itself goes by its id
    except (TypeError, ValueError):  # a time that does not compare (no zone on one side): kept, as before
        return True


def keep(record: RunRecord, run_dir: Path, out_dir: Path, log: Callable[[str], None],
         profile: Mapping[str, Any] | None = None) -> Entry | None:
    """End of a run: append its run.json to the history ``profile`` names (the run's own local
    profile, resolved; the defaults when None), unless it says ``compare.history = false``. The
    record's copy of the profile is not asked: where files go is never read from a record.
    Never raises: a run that cannot be stored is a log line, not a lost report."""
    local = compare_section(profile)
    if not local.get("history", _DEFAULTS.history):
        return None
    try:
        folder = folder_for(history_root(profile, Path(out_dir)), record, str(local.get("machine") or ""))
        entry = store(Path(run_dir) / RUN_FILE, folder)
    except (OSError, RecordError, HistoryError) as exc:
        log(f"history: run not stored: {exc}")
        return None
    log(f"history: stored as {entry.path}")
    return entry


# --------------------------------------------------------------------------- CLI


def _cmd_add(args: argparse.Namespace) -> int:
    """Stores a run made elsewhere under ``--history`` (default :func:`default_root`), never where
    the received record's ``compare.history_dir`` points (absolute, or ``../..``): it is said,
    not followed. Its profile and machine become folder names only through :func:`slug`."""
    run = Path(args.run)
    record = load(run)
    root = Path(args.history) if args.history else default_root(run)
    e = store(run, folder_for(root, record, args.machine or ""))
    print(term_safe(f"stored {run} as {e.path}"))
    named = compare_section(record.profile).get("history_dir")
    if named and not args.history and history_root(record.profile, root.parent) != root:
        print(term_safe(f"note: the record names compare.history_dir {str(named)!r}; not used (a record "
                        "names no paths): give --history to store elsewhere"))
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    root = Path(args.history) if args.history else Path("reports") / DEFAULT_HISTORY_DIR
    if not root.is_dir():
        raise HistoryError(f"{root}: no history folder (runs are stored under report.out_dir/compare.history_dir)")
    folders = sorted(p for p in root.glob("*/*") if p.is_dir())
    if args.profile:
        folders = [f for f in folders if f.parent.name == slug(args.profile)]
    if args.machine:
        folders = [f for f in folders if f.name == slug(args.machine)]
    if not folders:
        print(term_safe(f"{root}: no stored runs" + (f" for profile {args.profile}" if args.profile else "")))
        return 0
    for f in folders:  # folder names are whatever is on disk: escaped like record text
        es = entries(f)
        print(term_safe(f"{f.relative_to(root)}: {len(es)} runs"))
        for e in es[-args.last:] if args.last else es:
            print(term_safe(f"  {e.label:>6}  {e.stamp}  {e.commit:<18} {e.verdict:<11} {e.path.name}"))  # record text
    return 0


def _guard(name: str, fn: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except (InputError, OSError) as exc:  # RecordError, HistoryError
            print(refusal(exc), file=sys.stderr)
            return 2

    return run


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    """Register ``history list|add``; each sets ``func(args) -> exit code``."""
    p = subparsers.add_parser("history", help="stored runs per profile and machine (for baselines and trends)")
    sub = p.add_subparsers(dest="history_command", required=True, metavar="ACTION")
    q = sub.add_parser("list", help="list stored runs")
    q.add_argument("--history", help="history folder (default: reports/history)")
    q.add_argument("--profile", help="only this profile")
    q.add_argument("--machine", help="only this machine folder")
    q.add_argument("--last", type=whole_number(0), default=20, help="show the last N runs per folder (0: all; default 20)")
    q.set_defaults(func=_guard("list", _cmd_list))
    q = sub.add_parser("add", help="store a run in the history (the pytest plugin does this at the end of each run)")
    q.add_argument("run", help="run folder or run.json")
    q.add_argument("--history", help="history folder (default: history/ beside the run's folder; never the "
                                     "folder the record names)")
    q.add_argument("--machine", help="machine folder name (default: derived from the recorded devices)")
    q.set_defaults(func=_guard("add", _cmd_add))
