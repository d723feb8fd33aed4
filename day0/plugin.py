"""The pytest plugin (entry point ``pytest11: day0``): thin hooks over :class:`Day0Session`.

It stays inert unless the selected tests carry the ``day0`` marker, so installing day0 never
changes an unrelated test run.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from day0.config.profile import DEFAULT_PROFILE, Profile, ProfileError, deep_merge, load_profile, parse_override
from day0.core.record import Check, measured, one_line
from day0.core.terminal import Terminal
from day0.core.verdict import NOT_APPLICABLE
from day0.engine import EngineError, ViewUnavailable
from day0.session import Day0Session
from day0.stages.context import SectionError, StageContext, check_sections
from day0.stages.registry import Registry, RegistryError, load

REGISTRY_KEY = pytest.StashKey[Registry]()

SESSION_KEY = pytest.StashKey[Day0Session]()
RUN_STAGE_FIXTURE = "day0_run_stage"  # the parameter of day0/suites/test_stages.py
RECORDER_KEY = pytest.StashKey["CheckRecorder"]()
BLOCKED_KEY = pytest.StashKey[bool]()
SIGTERM_KEY = pytest.StashKey[Any]()
PROFILE_KEY = pytest.StashKey[Profile]()
STARTED_KEY = pytest.StashKey[float]()
DESELECTED_KEY = pytest.StashKey[list[tuple[str, str]]]()  # (stage, node id) of each day0 test deselected
VERDICT_LINE = "day0 verdict: "  # how day0.results.report.summary_lines starts the run's verdict line


class NotApplicable(pytest.skip.Exception):
    """A stage's test skipping because the stage does not apply to this target (the expert-load
    stage on a dense model): recorded as a skip the verdict does not count as missing
    (day0.core.verdict.NOT_APPLICABLE). ``raise NotApplicable("why")`` in a suite."""


class CheckRecorder:
    """What a Day0 test uses to record checks; failed checks fail the test after it returns,
    so one test can report every problem it found rather than stopping at the first."""

    def __init__(self, session: Day0Session, stage: str, nodeid: str, repeat: int | None = None,
                 started: float | None = None) -> None:
        self._session = session
        self.stage = stage
        self.nodeid = nodeid
        self.repeat = repeat
        self.started = time.perf_counter() if started is None else started
        self.checks: list[Check] = []

    def add(self, check: Check) -> Check:
        check.nodeid = self.nodeid
        check.repeat = self.repeat
        if check.duration_s is None:  # stamped now, so the event log holds it even if the run dies later
            check.duration_s = elapsed(self.started)
        self.checks.append(self._session.add_check(self.stage, check))
        return check

    def extend(self, checks: list[Check]) -> list[Check]:
        return [self.add(c) for c in checks]

    def measured(self, id: str, title: str, value: Any, limit: Any = None, **kw: Any) -> Check:
        return self.add(measured(id, title, value, limit, **kw))

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.failed]


# --------------------------------------------------------------------------- options and set-up


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("day0", "day0 acceptance harness")
    group.addoption("--day0-profile", default=None,
                    help=f"target profile: a preset name or a TOML file (default: {DEFAULT_PROFILE})")
    group.addoption("--day0-out", default=None, help="folder for run records (default: profile report.out_dir)")
    group.addoption("--day0-no-gate", action="store_true", default=False,
                    help="run every stage even when an earlier stage failed")
    group.addoption("--day0-template-dir", default=None,
                    help="folder of Jinja2 templates overriding the report's blocks (default: report.template_dir)")
    group.addoption("--day0-set", action="append", default=[], metavar="KEY.PATH=VALUE",
                    help="override a profile value, e.g. engine.args.max_num_seqs=8 (repeatable)")
    group.addoption("--day0-baseline", default=None, metavar="PATH|latest-accepted|latest",
                    help="judge the run's performance figures against the last runs in the history (latest, "
                         "latest-accepted) or a baseline run file; a regression rejects the run (docs/ci.md)")
    group.addoption("--day0-repeat", type=_positive_int, default=1, metavar="N",
                    help="measure the repeatable stages (collectives, experts, latency, kvcache) N times on the same engine and "
                         "report each check's spread and any verdict that flipped (default 1)")
    group.addoption("--day0-prom-textfile", default=None, metavar="PATH",
                    help="also write the run's checks and verdict as Prometheus metrics to PATH (node_exporter "
                         "textfile collector format, replaced atomically; docs/ci.md)")
    group.addoption("--day0-pushgateway", default=None, metavar="URL",
                    help="also push the run's checks and verdict to a Prometheus Pushgateway at URL "
                         "(job=day0, grouped by profile; a failed push is logged, the run is kept)")


def elapsed(started: float) -> float:
    """Seconds since ``started`` (time.perf_counter), as recorded in a check's ``duration_s``."""
    return round(max(0.0, time.perf_counter() - started), 3)


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise pytest.UsageError(f"day0: --day0-repeat {text!r}: expected a whole number >= 1")
    return n


def pytest_configure(config: pytest.Config) -> None:
    _refuse_xdist(config)
    config.addinivalue_line("markers", "day0: a Day0 acceptance check against the live engine")
    config.addinivalue_line("markers", "day0_once: measured once even under --day0-repeat (a correctness probe "
                                       "that starts its own engine)")
    for st in registry_of(config).stages:
        config.addinivalue_line("markers", f"{st.marker}: Day0 stage '{st.title}': {st.question}")
    if config.getoption("--day0-profile"):
        _profile(config)  # an explicit profile is checked before collection: fail in a second


def _refuse_xdist(config: pytest.Config) -> None:
    """pytest-xdist would start one engine per worker and race for one run folder: refuse it for a
    Day0 run in one line (``-n 0`` is fine). Other test runs are none of day0's business."""
    workers = getattr(config.option, "numprocesses", None)
    if not workers:
        return
    asked = (any(config.getoption(o) for o in ("--day0-profile", "--day0-baseline", "--day0-set"))
             or config.getoption("--day0-repeat") > 1 or "day0" in (config.option.markexpr or "")
             or any("day0" in str(a) and "suites" in str(a) for a in config.args))
    if asked:
        raise pytest.UsageError(f"day0: -n {workers}: the Day0 suites share one engine and one run folder per "
                                "session; run them without pytest-xdist (or with -n 0)")


def registry_of(config: pytest.Config) -> Registry:
    """The stages in order: day0's own and every site stage installed (entry-point group
    ``day0.stages``); read once per pytest run, so markers, ordering and gating agree."""
    cached = config.stash.get(REGISTRY_KEY, None)
    if cached is None:
        try:
            cached = config.stash[REGISTRY_KEY] = load()
        except RegistryError as exc:
            raise pytest.UsageError(f"day0: {exc}") from None
    return cached


def _profile(config: pytest.Config) -> Profile:
    cached = config.stash.get(PROFILE_KEY, None)
    if cached is not None:
        return cached
    overrides: dict[str, Any] = {}
    try:
        for text in config.getoption("--day0-set"):
            overrides = deep_merge(overrides, parse_override(text))
        profile = load_profile(config.getoption("--day0-profile"), overrides=overrides or None)
        check_sections(registry_of(config).stages, profile)
    except (ProfileError, SectionError) as exc:
        raise pytest.UsageError(f"day0: {exc}") from None
    config.stash[PROFILE_KEY] = profile
    return profile


def stage_of(item: pytest.Item) -> str | None:
    names = registry_of(item.config).names
    found = [m.name for m in item.iter_markers() if m.name in names]
    return found[0] if found else None


def is_day0(item: pytest.Item) -> bool:
    return item.get_closest_marker("day0") is not None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Under --day0-repeat N, a repeatable stage's tests run N times as a module: pytest groups
    module-scoped parameters, so each repeat re-creates the measuring fixtures that ask for
    ``day0_repeat`` and reruns the stage in order, on the session's one engine."""
    n = metafunc.config.getoption("--day0-repeat", 1) or 1
    definition = metafunc.definition
    if n < 2 or "day0_repeat" not in metafunc.fixturenames or not is_day0(definition):
        return
    if stage_of(definition) not in registry_of(metafunc.config).repeatable or definition.get_closest_marker("day0_once"):
        return
    metafunc.parametrize("day0_repeat", range(1, n + 1), indirect=True, scope="module",
                         ids=[f"repeat{i}" for i in range(1, n + 1)])


def repeat_of(item: pytest.Item) -> int | None:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("day0_repeat") if callspec is not None else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    names = registry_of(config).names
    for item in items:
        if is_day0(item) and stage_of(item) is None:
            raise pytest.UsageError(
                f"day0: {item.nodeid} is marked day0 but has no stage marker (one of {', '.join(names)})")
    order = {name: n for n, name in enumerate(names)}
    # Stages run in order; non-day0 tests keep their place in front.
    items.sort(key=lambda it: order[stage_of(it)] + 1 if is_day0(it) else 0)  # type: ignore[index]


def pytest_deselected(items: list[pytest.Item]) -> None:
    """The day0 tests a selection dropped (-k, -m, --deselect, a plugin's own): the record notes
    them, so a run that left out a failing test is not taken for a full run (day0.core.verdict)."""
    if items:
        found = items[0].config.stash.setdefault(DESELECTED_KEY, [])
        found += [(stage, it.nodeid) for it in items if is_day0(it) and (stage := stage_of(it)) is not None]


def out_dir_problem(out: Path) -> str:
    """Why the run cannot write where it is told, said before it starts: it ends by pointing
    ``out/latest`` at its folder, and a folder or file there (or ``out`` a file) was an INTERNALERROR
    after the whole run, with a stray ``.latest-<pid>`` link left."""
    if out.exists() and not out.is_dir():
        return f"--day0-out {out}: a file, not a folder for the run records"
    latest = out / "latest"
    if latest.exists() and not latest.is_symlink():
        return f"{latest}: a {'folder' if latest.is_dir() else 'file'} where day0 keeps its link to the latest run; move it"
    return ""


def pytest_collection_finish(session: pytest.Session) -> None:
    config = session.config
    if not any(is_day0(it) for it in session.items) or SESSION_KEY in config.stash or config.option.collectonly:
        return  # --collect-only lists the checklist: no run, no record, no history entry
    profile = _profile(config)
    out = Path(config.getoption("--day0-out") or profile.report.out_dir)
    if not out.is_absolute():
        out = Path(config.invocation_params.dir) / out
    problem = out_dir_problem(out)
    if problem:
        raise pytest.UsageError(f"day0: {problem}")
    template_dir = config.getoption("--day0-template-dir")
    from day0.results.export import Targets

    exports = Targets.from_options(config.getoption("--day0-prom-textfile"), config.getoption("--day0-pushgateway"),
                                   os.environ)
    registry = registry_of(config)
    day0 = Day0Session(profile, out, registry=registry, gate=not config.getoption("--day0-no-gate"),
                       log=_progress(config),
                       template_dir=Path(template_dir) if template_dir else None,
                       baseline=config.getoption("--day0-baseline"), repeats=config.getoption("--day0-repeat"),
                       exports=exports)
    # Every stage but preflight asks for the deployment (needs_nodes); a preflight-only run starts no engine.
    wanted = any(getattr(registry.get(stage_of(it) or ""), "needs_nodes", False) for it in session.items if is_day0(it))
    day0.start(engine_wanted=wanted, deselected=config.stash.get(DESELECTED_KEY, []))
    config.stash[SESSION_KEY] = day0
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        # A CI runner's SIGTERM becomes an interrupt, so teardown stops the engine and the
        # record is written; a SIGKILL still leaves the event log (and PDEATHSIG stops the server).
        def _term(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt("SIGTERM")

        signal.signal(signal.SIGTERM, _term)
        config.stash[SIGTERM_KEY] = _term


def _progress(config: pytest.Config) -> Callable[[str], None]:
    """Progress lines that reach the terminal even while pytest captures output (engine start-up
    takes a minute; silence would look like a hang)."""
    capman = config.pluginmanager.getplugin("capturemanager")

    def log(msg: str) -> None:
        ctx = capman.global_and_fixture_disabled() if capman else contextlib.nullcontext()
        with ctx:
            print(f"[day0] {msg}", file=sys.stderr, flush=True)

    return log


def _session(config: pytest.Config) -> Day0Session | None:
    return config.stash.get(SESSION_KEY, None)


# --------------------------------------------------------------------------- running


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[Any]:
    """Each stage's wall time: its tests' set-up, call and teardown (an engine started inside a
    stage's first test is that stage's time; module fixtures end in its last test's teardown)."""
    day0 = _session(item.config)
    t0 = time.perf_counter()
    try:
        return (yield)
    finally:
        stage = stage_of(item) if day0 is not None and is_day0(item) else None
        if stage is not None and day0 is not None:
            day0.add_stage_time(stage, time.perf_counter() - t0)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    day0 = _session(item.config)
    if day0 is None or not is_day0(item):
        return
    stage = stage_of(item)
    assert stage is not None
    item.stash[STARTED_KEY] = started = time.perf_counter()  # before fixtures: their set-up is the test's time too
    item.stash[RECORDER_KEY] = CheckRecorder(day0, stage, item.nodeid, repeat_of(item), started)
    reason = day0.blocked_by(stage)
    if reason:
        item.stash[BLOCKED_KEY] = True
        day0.add_check(stage, Check(id=auto_id(item, stage), title=item.name, status="blocked",
                                    message=reason, nodeid=item.nodeid, repeat=repeat_of(item)))
        pytest.skip(Terminal(day0.events.redactor).line(f"day0 blocked: {reason}"))  # -rs and --junitxml print it
    day0.stage_starting(stage)


def auto_id(item: pytest.Item, stage: str) -> str:
    if RUN_STAGE_FIXTURE in getattr(item, "fixturenames", ()):  # a stage whose test is its run(ctx)
        return f"{stage}.run"
    name = getattr(item, "originalname", None) or item.name
    name = re.sub(r"^test_", "", name)
    param = re.search(r"\[(.*)\]$", item.name)
    # the repeat is the check's `repeat` field, not part of its id (ids stay stable across repeats)
    ids = [p for p in param.group(1).split("-") if not re.fullmatch(r"repeat\d+", p)] if param else []
    return f"{stage}.{name}" + (f"[{'-'.join(ids)}]" if ids else "")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    rep = yield
    day0 = _session(item.config)
    if day0 is None or not is_day0(item) or item.stash.get(BLOCKED_KEY, False):
        return rep
    stage = stage_of(item)
    assert stage is not None
    rec = item.stash.get(RECORDER_KEY, None)
    recorded = rec.checks if rec else []
    # pytest prints these and writes them to its own --junitxml: check text, redacted and escaped
    # like every line day0 prints (the checks in memory are not yet through the event log's redactor)
    term = Terminal(day0.events.redactor)
    if call.when == "call" and rep.passed and rec and rec.failed:
        if all(day0.waived(c) for c in rec.failed):  # known failures the profile waives: pytest's xfail
            rep.outcome = "skipped"
            rep.wasxfail = term.line("waived by the profile: " + "; ".join(f"{c.id}: {c.message}" for c in rec.failed))
            return rep
        rep.outcome = "failed"
        rep.longrepr = "\n".join(term.line(f"{c.id}: {c.message}") for c in rec.failed)
        return rep
    if call.when == "call" and rep.passed and rec and rec.checks and all(c.status == "skip" for c in rec.checks):
        # a test that only recorded skips (a feature not in force) is a skip, never shown as a pass
        rep.outcome = "skipped"
        rep.longrepr = (str(item.path), (item.location[1] or 0) + 1, term.line(f"Skipped: {rec.checks[0].message}"))
        return rep
    if call.excinfo is None:
        return rep
    exc = call.excinfo.value
    if rep.skipped:
        if isinstance(rep.longrepr, tuple) and len(rep.longrepr) == 3:  # a skip's reason, as -rs prints it
            rep.longrepr = (rep.longrepr[0], rep.longrepr[1], term.line(str(rep.longrepr[2])))
        if not recorded:
            reason = getattr(exc, "msg", None) or str(exc)
            evidence = {NOT_APPLICABLE: True} if isinstance(exc, NotApplicable) else {}
            day0.add_check(stage, Check(id=auto_id(item, stage), title=item.name, status="skip",
                                        message=reason, evidence=evidence, nodeid=item.nodeid,
                                        repeat=repeat_of(item), duration_s=_item_elapsed(item)))
        return rep
    if not isinstance(exc, (AssertionError, EngineError)):
        exc = day0.engines.dead() or exc  # a request that failed because the engine died
    if isinstance(exc, EngineError):
        message = f"engine failed: {exc}"
        rep.longrepr = term.line(f"day0: {message}") + (f"\n(engine log: {exc.log_path})" if exc.log_path else "")
        evidence = {"log_excerpt": exc.log_excerpt, "log_path": exc.log_path, "engine_pgid": exc.pgid}
    else:
        message = one_line(f"{type(exc).__name__}: {exc}")
        # pytest prints the traceback and writes it to its --junitxml: its source lines and the
        # exception's text may quote a key, so it leaves as day0's own lines do, redacted and escaped
        rep.longrepr = "\n".join(term.line(ln) for ln in str(rep.longrepr).split("\n"))
        evidence = {"traceback": rep.longrepr[-8000:]}
    # An engine that does not start or dies is the deployment measured not working (fail); any
    # other exception is the harness unable to measure (error: the run is INCOMPLETE, not REJECTED).
    status = "fail" if isinstance(exc, (AssertionError, EngineError)) else "error"
    day0.add_check(stage, Check(id=auto_id(item, stage), title=item.name, status=status,
                                message=message, evidence=evidence, nodeid=item.nodeid, repeat=repeat_of(item),
                                duration_s=_item_elapsed(item)))
    return rep


def _item_elapsed(item: pytest.Item) -> float | None:
    started = item.stash.get(STARTED_KEY, None)
    return None if started is None else elapsed(started)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    day0 = _session(session.config)
    if day0 is not None and day0.record is None:
        day0.finish(int(exitstatus))
        from day0.results.compare import regressed

        if regressed(day0.record) and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED  # a regression fails the nightly job
    handler = session.config.stash.get(SIGTERM_KEY, None)
    if handler is not None and signal.getsignal(signal.SIGTERM) is handler:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    day0 = _session(config)
    if day0 is None or day0.record is None:
        return
    from day0.results.report import stage_lines, summary_lines

    tr = terminalreporter
    record = day0.record
    tr.section("day0")
    for line in stage_lines(record):
        tr.write_line(line)

    colour = {"accepted": {"green": True}, "rejected": {"red": True}}.get(record.verdict, {"yellow": True})
    lines = summary_lines(record, day0.outputs)
    # The verdict line is coloured, wherever it sits (a headline table and answers come first); the
    # last one that starts so: every line after it is indented, so none of them can pose as it.
    verdict_at = max((i for i, line in enumerate(lines) if line.startswith(VERDICT_LINE)), default=-1)
    for i, line in enumerate(lines):
        tr.write_line(line, **({"bold": True, **colour} if i == verdict_at else {}))
    if day0.report_error:  # an exception's text: redacted and escaped like every printed line
        tr.write_line(Terminal(day0.events.redactor).line(day0.report_error), red=True)


# --------------------------------------------------------------------------- fixtures


def _need_session(request: pytest.FixtureRequest) -> Day0Session:
    day0 = _session(request.config)
    if day0 is None:
        raise pytest.UsageError("day0 fixtures are only available to tests marked day0")
    return day0


@pytest.fixture(scope="session")
def day0_session(request: pytest.FixtureRequest) -> Day0Session:
    return _need_session(request)


@pytest.fixture(scope="session")
def day0_profile(day0_session: Day0Session):
    return day0_session.profile


@pytest.fixture(scope="session")
def day0_engine(day0_session: Day0Session) -> Any:
    """The primary engine of the profile's mode, started once per session."""
    return day0_session.engines.primary()


@pytest.fixture(scope="session")
def day0_http_engine(day0_session: Day0Session) -> Any:
    """The engine's OpenAI-compatible HTTP API (server or external mode, or started beside)."""
    try:
        return day0_session.engines.http()
    except ViewUnavailable as exc:
        pytest.skip(f"day0: no HTTP view: {exc}")


@pytest.fixture(scope="session")
def day0_scheduler_engine(day0_session: Day0Session) -> Any:
    """An in-process engine whose scheduler can be sampled (started on demand on CPU targets)."""
    try:
        return day0_session.engines.scheduler()
    except ViewUnavailable as exc:
        pytest.skip(f"day0: no scheduler view: {exc}")


# The names before day0_*: kept so site suites written against them keep working.
@pytest.fixture(scope="session")
def engine(day0_engine: Any) -> Any:
    """Alias of ``day0_engine``."""
    return day0_engine


@pytest.fixture(scope="session")
def http_engine(day0_http_engine: Any) -> Any:
    """Alias of ``day0_http_engine``."""
    return day0_http_engine


@pytest.fixture(scope="session")
def scheduler_engine(day0_scheduler_engine: Any) -> Any:
    """Alias of ``day0_scheduler_engine``."""
    return day0_scheduler_engine


@pytest.fixture
def day0_context(request: pytest.FixtureRequest) -> StageContext:
    """The stage's context (its section, the endpoint, the run folder, progress, the record so far),
    built once per stage by the session."""
    day0 = _need_session(request)
    stage = stage_of(request.node)
    if stage is None:
        raise pytest.UsageError("day0_context is only available to tests marked day0 with a stage marker")
    return day0.context(stage)


@pytest.fixture
def day0_run_stage(request: pytest.FixtureRequest) -> Any:
    """The stage a generated test runs (day0/suites/test_stages.py parametrizes it)."""
    return request.param


@pytest.fixture(scope="module")
def day0_repeat(request: pytest.FixtureRequest) -> int | None:
    """Which repeat this is (1..N) under --day0-repeat N, else None. A measuring fixture that
    asks for it is re-created for each repeat; one that does not is shared by all of them."""
    return getattr(request, "param", None)


@pytest.fixture
def day0_checks(request: pytest.FixtureRequest, day0_repeat: int | None) -> CheckRecorder:
    rec = request.node.stash.get(RECORDER_KEY, None)
    if rec is None:
        raise pytest.UsageError("day0_checks is only available to tests marked day0 with a stage marker")
    return rec
