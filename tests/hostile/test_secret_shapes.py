"""Hostile inputs, second round, cause 2: a secret's *shape* in a value, through every output channel.

Redaction by key name missed secrets that arrive inside values (issue #31): a password in a proxy
URL, an Authorization header an error body quotes, a signed query string, a shell-quoted flag, a
cookie in a check's evidence, a value on the next line of a continued command. Each shape below
goes in where a user or a server puts it, and every channel is read back:

* the files of a run limited to preflight (no engine): events.jsonl, run.json, report.html,
  junit.xml, the history copy, collect_env.txt;
* ``day0 profile show`` (TOML and ``--json``) and ``day0 plan`` (a lint finding quotes the arg);
* ``day0 latency --url`` against the scripted server answering 401 with a body that quotes the
  shape (stdout, stderr and the ``--json`` export);
* the other commands that print or write what they read: ``latency import``, ``collectives
  import``, ``compare``, ``weights manifest``, ``record rebuild``, ``slurm submit`` and one-line refusals.

A canary (the secret part of each shape) in any of them is a leak. Every case runs day0 as a
user would, under the corpus's time and memory bounds (tests/support/hostile.py).
"""

from __future__ import annotations

import json
import os
import stat
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from day0.core.redact import REDACTED, Redactor
from tests.support import REPO, hostile
from tests.support import run_factory as rf
from tests.support.sse_server import Script, SSEServer

SUITES = REPO / "day0" / "suites"


@dataclass(frozen=True)
class Shape:
    """How a secret appears in text (``text``), and the part of it that must never be seen."""

    id: str
    text: str
    secret: str


def _canary(tag: str) -> str:
    return f"Zq9{tag}Cnry7"  # distinctive: a hit can only be a leak


SHAPES = [Shape(i, t.format(c=_canary(i.replace("-", ""))), _canary(i.replace("-", ""))) for i, t in [
    ("url-userinfo", "http://admin:{c}@proxy.internal:3128"),
    ("url-token-as-user", "https://{c}@git.internal/org/model.git"),
    ("basic-auth", "Authorization: Basic {c}"),
    ("bearer-header", "Authorization: Bearer {c}"),
    ("query-key", "https://api.internal/v1/models?key={c}&alt=json"),
    ("query-amz-signature", "https://b.s3.amazonaws.com/w.bin?X-Amz-Expires=60&X-Amz-Signature={c}"),
    ("query-token", "https://hub.internal/m?token={c}"),
    ("query-access-token", "https://hub.internal/m?page=1&access_token={c}"),
    ("query-sig", "https://acct.blob.core.windows.net/m?sv=2022-11-02&sig={c}"),
    ("flag-single-quoted", "vllm serve m --api-key '{c}' --port 8000"),
    ("flag-double-quoted", 'vllm serve m --api-key="{c}"'),
    ("flag-hf-token", "huggingface-cli download --hf-token {c} m"),
    ("flag-passwd", "mysql-load --db-passwd {c} --host db"),
    ("cookie", "Cookie: theme=dark; session={c}"),
    ("set-cookie", "Set-Cookie: sid={c}; Path=/; HttpOnly"),
    ("flag-value-on-next-line", "vllm serve m \\\n  --api-key \\\n  {c}"),
    ("bearer-on-next-line", "Authorization: Bearer\n    {c}"),
    ("private-key-block", "-----BEGIN PRIVATE KEY-----\nMIIEv{c}\nQUFBQQ==\n-----END PRIVATE KEY-----"),
    # missed before: a name ending in key (not api_key), a command line printed as a list, a quoted
    # passphrase whose first word is short (a longer first word alone went)
    ("assign-secret-access-key", "aws_secret_access_key = {c}"),
    ("flag-secret-access-key", "aws configure --aws-secret-access-key {c} --profile ci"),
    ("flag-in-a-listed-command", "Command '['vllm', 'serve', '--api-key', '{c}']' returned non-zero exit status 1."),
    ("json-quoted-passphrase", '{{"password": "correct horse {c} staple", "user": "ci"}}'),
]]
IDS = [s.id for s in SHAPES]
KEY = "sk-shapes-KEYf00d-Zq9known"  # the value of the variable engine.api_key_env names
WRAPPED = ("Zq9wrapHEAD4u2", "Zq9wrapTAIL9k1")  # a known key a message wrapped over two lines
URL_PW = _canary("urlpw")  # engine.url's password: known by value, so it goes where quoted alone


def _toml_str(text: str) -> str:
    return json.dumps(text)  # a JSON string is a TOML basic string


def _shapes_profile(path: Path, *, args: bool = True) -> Path:
    """A profile carrying every shape: in [engine.env] (shown, recorded) and, with ``args``, as
    unknown engine args (the lint quotes their values); engine.url holds a password too."""
    env = "\n".join(f"SHAPE_{i:02d} = {_toml_str(s.text)}" for i, s in enumerate(SHAPES))
    eng_args = "\n".join(f"shape_{i:02d} = {_toml_str(s.text)}" for i, s in enumerate(SHAPES)) if args else ""
    path.write_text(textwrap.dedent(f'''\
        extends = "cpu-tiny"
        name = "shapes"
        [engine]
        url = "http://admin:{URL_PW}@127.0.0.1:1"
        api_key_env = "DAY0_SHAPES_KEY"
        ''') + f"[engine.env]\n{env}\n" + (f"[engine.args]\n{eng_args}\n" if args else ""))
    return path


def _clean(text: str, shape: Shape, where: str) -> None:
    assert shape.secret not in text, f"{shape.id} leaked into {where}:\n{text[-3000:]}"


# --------------------------------------------------------------------------- the redactor itself


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_the_redactor_knows_each_shape_and_keeps_its_context(shape: Shape) -> None:
    out = Redactor().text(shape.text)
    assert shape.secret not in out and REDACTED in out, out
    assert Redactor().text(out) == out  # redacting twice changes nothing
    assert shape.text.replace(shape.secret, " ").split()[0] in out, out  # the flag, header or URL is still there


@pytest.mark.parametrize("text", ["a-" * 20_000, "-a" * 20_000, "x.token" * 6_000, "--api-key " * 4_000,
                                  "http://a:" * 5_000], ids=["hyphens", "dashes", "dotted-tokens", "flags", "urls"])
def test_redaction_is_linear_on_a_hostile_string(text: str) -> None:
    """An unbounded ``[\\w\\-]*`` before a secret word made 40 KB of ``a-a-a-`` take 70 s per string."""
    code = f"from day0.core.redact import Redactor; Redactor().text({text!r} * 10)"
    out = hostile.run([sys.executable, "-c", code], timeout_s=30)
    assert out.code == 0, out.explain()


def test_a_known_value_goes_in_every_form_a_text_gives_it() -> None:
    multi = "line-one-Zq9pem\nline-two-Zq9pem"
    r = Redactor.from_sources(environ={"X_TOKEN": KEY, "MY_PEM_KEY": multi}, data={})
    assert KEY[:10] + "\n   " + KEY[10:] not in r.text(f"key {KEY[:10]}\n   {KEY[10:]} wrapped")
    assert "Zq9pem" not in r.text("line-two-Zq9pem")  # a multi-line secret, met one line at a time
    assert "Zq9pem" not in r.text(json.dumps(multi))  # and JSON-escaped
    # a value JSON and repr escape as a whole (its lines alone would not catch it): quotes, a backslash,
    # a non-ASCII letter, met inside an error body or a log line
    odd = 'pa"ss\\w\u00f6rd-Zq9xy'
    r = Redactor.from_sources(environ={"DB_PASSWORD": odd}, data={})
    for form in (json.dumps({"error": f"login failed for {odd}"}), repr(f"login failed for {odd}")):
        assert "Zq9xy" not in r.text(form), (form, r.text(form))
    r = Redactor.from_sources(environ={"HTTPS_PROXY": f"http://u:{URL_PW}@p:1"}, data={"engine": {"url": ""}})
    assert URL_PW not in r.text(f"proxy refused password {URL_PW}")  # a URL's password, quoted alone


# --------------------------------------------------------------------------- the files of a run


CANARY_SUITE = '''
import json
import pytest
from day0.core.record import Check

SHAPES = json.loads({shapes!r})

@pytest.mark.day0
@pytest.mark.preflight
def test_a_check_that_quotes_every_shape(day0_checks, day0_session):
    day0_session.events.note("site", {{"said": SHAPES, "wrapped": "key {head}\\n    {tail} wrapped"}})
    day0_session.log("progress quoting " + " | ".join(SHAPES))
    day0_checks.add(Check("preflight.shapes", "A check quoting secrets", "pass",
                          message=" ; ".join(SHAPES) + " ; login failed for {url_pw}",
                          evidence={{"headers": {{"Cookie": "a=1; sid={cookie}", "X-Note": SHAPES}},
                                    "argv": SHAPES}}))
'''


@pytest.fixture(scope="module")
def preflight_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, hostile.Outcome]:
    """One run limited to preflight (no engine) with every shape in the profile, the environment, a
    check's message and evidence, a note and a progress line; the whole output folder is read back."""
    tmp = tmp_path_factory.mktemp("shapes-run")
    profile = _shapes_profile(tmp / "shapes.toml")
    suite = tmp / "test_shapes_suite.py"
    suite.write_text(CANARY_SUITE.format(shapes=json.dumps([s.text for s in SHAPES]), head=WRAPPED[0],
                                         tail=WRAPPED[1], url_pw=URL_PW, cookie=_canary("evidencecookie")))
    out = tmp / "reports"
    env = {"DAY0_SHAPES_KEY": KEY, "HTTPS_PROXY": SHAPES[0].text, "DAY0_WRAPPED_TOKEN": "".join(WRAPPED)}
    run = hostile.pytest_day0(SUITES / "test_preflight.py", suite, "-m", "day0 and preflight",
                              "--day0-profile", profile, "--day0-out", out, "--junitxml", out / "pytest-junit.xml",
                              cwd=tmp, env=env, timeout_s=600, mem_mb=8192)
    assert (out / "latest" / "run.json").is_file(), run.explain()
    return out, run


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_no_file_of_a_run_holds_a_shape(preflight_run: tuple[Path, hostile.Outcome], shape: Shape) -> None:
    out, run = preflight_run
    assert hostile.leaks(out, [shape.secret]) == []
    _clean(run.stdout + run.stderr, shape, "the pytest run's terminal")


def test_the_run_still_shows_where_each_secret_was(preflight_run: tuple[Path, hostile.Outcome]) -> None:
    out, _ = preflight_run
    rec = json.loads((out / "latest" / "run.json").read_text())
    check = next(c for s in rec["stages"] for c in s["checks"] if c["id"] == "preflight.shapes")
    assert "http://admin:<redacted>@proxy.internal:3128" in check["message"]  # the message is capped: its start
    shown = " ; ".join(check["evidence"]["argv"])
    assert "Authorization: Basic <redacted>" in shown and "--api-key '<redacted>'" in shown
    assert check["evidence"]["headers"]["Cookie"] == REDACTED  # a cookie header in evidence, by its name
    assert rec["profile"]["engine"]["url"] == "http://admin:<redacted>@127.0.0.1:1"
    assert (out / "history").is_dir() and hostile.leaks(out / "history", [s.secret for s in SHAPES]) == []


@pytest.mark.parametrize("secret", [KEY, *WRAPPED, URL_PW, _canary("evidencecookie")],
                         ids=["known-key", "wrapped-head", "wrapped-tail", "url-password-alone", "evidence-cookie"])
def test_known_values_reach_no_file(preflight_run: tuple[Path, hostile.Outcome], secret: str) -> None:
    out, run = preflight_run
    assert hostile.leaks(out, [secret]) == [] and secret not in run.stdout + run.stderr


# --------------------------------------------------------------------------- profile show, plan


@pytest.fixture(scope="module")
def shown(tmp_path_factory: pytest.TempPathFactory) -> dict[str, hostile.Outcome]:
    """``profile show``, ``profile show --json`` and ``plan`` of the shapes profile, once each."""
    tmp = tmp_path_factory.mktemp("shapes-shown")
    profile = _shapes_profile(tmp / "shapes.toml")
    env = {"DAY0_SHAPES_KEY": KEY}
    return {"profile show": hostile.day0("profile", "show", profile, env=env),
            "profile show --json": hostile.day0("profile", "show", profile, "--json", env=env),
            "plan": hostile.day0("plan", "--profile", profile, env=env, timeout_s=300, mem_mb=8192)}


@pytest.mark.parametrize("command", ["profile show", "profile show --json", "plan"])
@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_commands_that_print_a_profile_hold_no_shape(shown: dict[str, hostile.Outcome], command: str,
                                                     shape: Shape) -> None:
    out = shown[command]
    assert out.code in (0, 1) and "Traceback" not in out.stderr, out.explain()
    assert ("shape_" in out.stdout) if command == "plan" else ("SHAPE_" in out.stdout), out.explain()  # printed
    _clean(out.stdout + out.stderr, shape, command)


def test_profile_show_json_is_the_redacted_profile(shown: dict[str, hostile.Outcome]) -> None:
    data = json.loads(shown["profile show --json"].stdout)
    assert data["engine"]["url"] == "http://admin:<redacted>@127.0.0.1:1"
    assert data["engine"]["env"]["SHAPE_02"] == "Authorization: Basic <redacted>"


# --------------------------------------------------------------------------- day0 latency


LATENCY = ["latency", "--vocab-size", "300", "--num-requests", "4", "--warmup", "0", "--concurrency", "2",
           "--output-len", "4", "--input-len", "8", "--no-server-metrics"]


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_latency_prints_and_exports_no_shape_a_server_sends(server: SSEServer, tmp_path: Path,
                                                           shape: Shape) -> None:
    """Every request answered 401 with a body quoting the shape: the reason reaches the figures, the
    error-rate check and its --json export, redacted."""
    server.set_script(Script(reject_status=401, reject_body=f"denied: {shape.text}"))
    out = hostile.day0(*LATENCY, "--url", server.url, "--json", tmp_path / "c.json")
    assert out.code == 1 and "http_401" in out.stdout, out.explain()
    _clean(out.stdout + out.stderr, shape, "day0 latency's terminal")
    _clean((tmp_path / "c.json").read_text(), shape, "day0 latency --json")


@pytest.mark.parametrize("export", [False, True], ids=["terminal", "json"])
def test_latency_redacts_the_key_a_401_body_echoes(server: SSEServer, tmp_path: Path, export: bool) -> None:
    """The server quotes the Authorization header day0 sent: the key (--api-key-env) goes by value and
    by shape, on stdout and in --json (day0 latency redacted nothing before)."""
    server.set_script(Script(reject_status=401, reject_body='{"error": "bad key: {authorization} (%s)"}' % KEY))
    json_args = ["--json", str(tmp_path / "c.json")] if export else []
    out = hostile.day0(*LATENCY, "--url", server.url, "--api-key-env", "DAY0_SHAPES_KEY", *json_args,
                       env={"DAY0_SHAPES_KEY": KEY})
    assert out.code == 1 and "bad key: Bearer <redacted> (<redacted>)" in out.stdout, out.explain()
    assert server.log()[0]["authorization"] == f"Bearer {KEY}"  # the key really went, and really came back
    text = out.stdout + out.stderr + ((tmp_path / "c.json").read_text() if export else "")
    assert KEY not in text, text


def test_latency_search_prints_no_shape(server: SSEServer) -> None:
    shape = SHAPES[0]
    server.set_script(Script(reject_status=401, reject_body=f"denied: {shape.text}"))
    # over concurrency: a search over rate halves the rate past every failing point, waiting ever longer
    out = hostile.day0(*LATENCY, "--url", server.url, "--search", "--search-over", "concurrency",
                       "--search-requests", "4", "--ttft-p99-ms", "500")
    assert out.code == 1 and "search concurrency 1" in out.stdout, out.explain()
    _clean(out.stdout + out.stderr, shape, "day0 latency --search")


def test_a_password_in_url_is_not_echoed(server: SSEServer) -> None:
    url = server.url.replace("http://", f"http://admin:{URL_PW}@")
    out = hostile.day0(*LATENCY, "--url", url)
    assert "Traceback" not in out.stderr and URL_PW not in out.stdout + out.stderr, out.explain()


# --------------------------------------------------------------------------- every other command


def test_latency_import_prints_and_exports_no_shape(tmp_path: Path) -> None:
    shape = SHAPES[0]
    data = json.loads((REPO / "tests" / "data" / "vllm-bench-detailed.json").read_text())
    data["date"] = f"nightly {shape.text}"  # the run's label, printed and recorded
    src = tmp_path / "bench.json"
    src.write_text(json.dumps(data))
    out = hostile.day0("latency", "import", src, "--max-error-rate", "0.5", "--json", tmp_path / "c.json",
                       "--out", tmp_path / "run")
    assert out.code == 0 and "http://admin:<redacted>@proxy.internal" in out.stdout, out.explain()
    _clean(out.stdout + out.stderr + (tmp_path / "c.json").read_text(), shape, "day0 latency import")
    assert hostile.leaks(tmp_path / "run", [shape.secret]) == []


def test_compare_prints_and_exports_no_shape(tmp_path: Path) -> None:
    shape = SHAPES[5]  # a signed URL in the profile's name, which compare prints and exports
    runs = []
    for name, record in (("base", rf.accepted()), ("run", rf.accepted())):
        record.run_id = f"run-{name}"
        record.profile = {**record.profile, "name": f"site {shape.text}"}
        runs.append(rf.write(record, tmp_path / name))
    out = hostile.day0("compare", runs[1], "--baseline", runs[0], "--json", tmp_path / "cmp.json")
    assert out.code == 0 and "X-Amz-Signature=<redacted>" in out.stdout, out.explain()
    _clean(out.stdout + out.stderr + (tmp_path / "cmp.json").read_text(), shape, "day0 compare")


@pytest.mark.parametrize("command", [["collectives", "import"], ["weights", "manifest"], ["record", "rebuild"],
                                     ["weights", "audit"], ["latency", "import"]], ids=" ".join)
def test_a_refusal_quoting_a_path_holds_no_shape(tmp_path: Path, command: list[str]) -> None:
    """A path a user pasted from a signed URL: the one-line refusal names it, redacted."""
    shape = SHAPES[6]
    bad = tmp_path / shape.text.replace("/", "_")  # not there
    out = hostile.day0(*command, bad)
    assert out.code == 2 and len(out.lines) == 1 and "token=<redacted>" in out.lines[0], out.explain()
    _clean(out.stdout + out.stderr, shape, " ".join(command))


def test_profile_refusal_quoting_a_value_holds_no_shape() -> None:
    shape = SHAPES[0]
    out = hostile.day0("profile", "show", "cpu-tiny", "--set", f"engine.mode={_toml_str(shape.text)}")
    assert out.code == 2 and len(out.lines) == 1, out.explain()
    _clean(out.stdout + out.stderr, shape, "a profile refusal")


def test_plan_refusal_quoting_a_model_path_holds_no_shape(tmp_path: Path) -> None:
    shape = SHAPES[0]
    profile = tmp_path / "p.toml"
    profile.write_text(f'extends = "cpu-tiny"\n[model]\nsource = "path"\npath = {_toml_str(shape.text + "/llama")}\n')
    out = hostile.day0("plan", "--profile", profile, timeout_s=300, mem_mb=8192)
    assert out.code == 2 and "Traceback" not in out.stderr, out.explain()
    _clean(out.stdout + out.stderr, shape, "day0 plan's refusal")


def test_slurm_submit_prints_no_shape_sbatch_says(tmp_path: Path) -> None:
    shape = SHAPES[3]
    fake = tmp_path / "bin" / "sbatch"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\necho {json.dumps('sbatch: error: proxy said ' + shape.text)} >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    out = hostile.day0("slurm", "submit", "job.sbatch", env={"PATH": f"{fake.parent}:{os.environ['PATH']}"})
    assert out.code == 2 and "Bearer <redacted>" in out.stderr, out.explain()
    _clean(out.stdout + out.stderr, shape, "day0 slurm submit")


# --------------------------------------------------------------------------- a record from elsewhere

FOREIGN = ("Cnry1EnvTok", "Cnry2ProfTok", "Cnry3ArgKey", "Cnry4UrlPw", "Cnry5NotePw", "Cnry6EvKey",
           "Cnry7Bearer", "Cnry8Flag")


def _foreign_record(folder: Path) -> Path:
    """A record day0's own event log never wrote (an older day0, another site, a hand edit), holding
    a secret in each place a record can: the environment, the profile, a note, a check's evidence
    and message."""
    record = rf.accepted()
    record.environment["HF_TOKEN"] = FOREIGN[0]
    record.profile["engine"] = {"env": {"HF_TOKEN": FOREIGN[1]}, "args": {"api_key": FOREIGN[2]},
                                "url": f"http://u:{FOREIGN[3]}@h:1"}
    record.notes["password"] = FOREIGN[4]
    check = record.stages[0].checks[0]
    check.evidence["api_key"] = FOREIGN[5]
    check.evidence["cmd"] = f"vllm serve m --api-key {FOREIGN[7]}"
    check.message += f" Authorization: Bearer {FOREIGN[6]}"
    return rf.write(record, folder)


def _held(folder: Path, *outs: hostile.Outcome) -> list[str]:
    texts = [p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file() and p.name != "run.json"]
    texts += [o.stdout + o.stderr for o in outs]
    return [c for c in FOREIGN if any(c in t for t in texts)]


def test_a_record_from_elsewhere_reaches_no_page_export_or_terminal_line(tmp_path: Path) -> None:
    """`report` and `compare` wrote a foreign record's secrets into report.html (page and embedded
    record), junit.xml, the terminal and --json, and `history add` copied them: a record is redacted
    again where it is read (day0.core.record.load_with_bytes), as its events were."""
    run = _foreign_record(tmp_path / "run")
    base = rf.accepted()
    base.run_id = "run-baseline"
    rf.write(base, tmp_path / "base")
    outs = [hostile.day0("report", run.parent),
            hostile.day0("compare", run.parent, "--baseline", tmp_path / "base", "--json", tmp_path / "cmp.json"),
            hostile.day0("history", "add", run.parent, "--history", tmp_path / "hist")]
    assert all(o.code in (0, 1) for o in outs), [o.explain() for o in outs]
    assert (run.parent / "report.html").exists() and (tmp_path / "cmp.json").exists()
    assert not _held(tmp_path, *outs)
    assert "redacted" in (run.parent / "report.html").read_text()  # where each was, still shown (escaped)


def test_a_record_rebuilt_from_an_event_log_from_elsewhere_holds_no_secret(tmp_path: Path) -> None:
    """`record rebuild` folds events.jsonl, which can come from anywhere as a record can, and wrote
    what it held (the review): the folded record is redacted as a read one is."""
    from day0.core.events import EventLog
    from day0.core.record import Check

    folder = tmp_path / "run"
    log = EventLog(folder / "events.jsonl")
    log.run_started("run-x", {"host": "h"}, {"name": "p"}, ["weights"])
    log.check("weights", Check(id="weights.x", title="x", status="pass"))
    log.run_finished(0)
    lines = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
    lines[0]["environment"]["HF_TOKEN"] = FOREIGN[0]  # what a log from elsewhere may hold
    lines[0]["profile"]["engine"] = {"args": {"api_key": FOREIGN[2]}}
    next(e for e in lines if e["type"] == "check")["check"]["evidence"] = {"api_key": FOREIGN[5]}
    (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    out = hostile.day0("record", "rebuild", folder)
    assert out.code in (0, 1), out.explain()
    held = (folder / "run.json").read_text()
    assert not [c for c in FOREIGN if c in held] and "weights.x" in held


def test_a_record_day0_wrote_comes_back_byte_for_byte(tmp_path: Path) -> None:
    from day0.core.record import load_with_bytes

    run = rf.write(rf.accepted(), tmp_path / "run")
    assert load_with_bytes(run)[1] == run.read_bytes()
