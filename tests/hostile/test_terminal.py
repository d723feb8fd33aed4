"""Hostile inputs, second round, cause 7: raw terminal control in what day0 prints.

Text day0 did not write (a profile's keys and values, a config path, an engine-arg name, a remote
server's model id or error body, a command's stderr) reached the terminal raw (issue #31): an
ESC sequence cleared the screen, a carriage return or a bidi override hid what came before, and
a key holding a newline forged a line of ``profile show``. Every printed string now goes through
one escaper (``day0.core.inputs.term_safe``, by way of ``day0.core.terminal.Terminal``).

Each family feeds one control per case, followed by a marker, and judges the printed output:
the marker is there (the text was printed), the raw control character is not (only the newlines
day0 prints itself), and no line starts with the marker (nothing forged a line of its own).
"""

from __future__ import annotations

import json
import os
import stat
import tomllib
from pathlib import Path

import pytest

from tests.support import hostile
from tests.support.sse_server import Script, SSEServer

# name -> the control sequence a hostile string carries (its first character is the one acted on)
CONTROLS = {
    "esc": "\x1b[2J",  # clears the screen
    "cr": "\r",  # back to column 0: what follows overwrites what came before
    "newline": "\n",  # a line of its own
    "bidi-override": "\u202e",  # the rest of the line reads right to left
    "c1-csi": "\x9b31m",  # the one-byte CSI of C1
    "bel": "\x07",
    "line-separator": "\u2028",  # a line break to str.splitlines and to some terminals
    "del": "\x7f",
}
NAMES = list(CONTROLS)
ONE_LINE = [n for n in NAMES if n not in ("cr", "newline", "line-separator")]  # those a line split keeps


def marker(name: str) -> str:
    return f"F0RGED_{name.replace('-', '_')}"


def hostile_text(names: list[str] = NAMES, prefix: str = "x") -> str:
    """Every control of ``names``, each followed by its marker."""
    return "".join(f"{prefix}{CONTROLS[n]}{marker(n)}" for n in names)


def assert_shown_safe(text: str, name: str, where: str) -> None:
    """``text`` (a command's output) printed the marker of ``name``, without the raw control and
    without a line that the marker starts."""
    char = CONTROLS[name][0]
    assert marker(name) in text, f"{where}: the hostile text was not printed at all\n{text[-3000:]!r}"
    if char != "\n":
        assert char not in text, f"{where}: a raw {name} reached the terminal\n{text[-3000:]!r}"
    forged = [ln for ln in text.split("\n") if ln.lstrip(" \t'\"").startswith(marker(name))]
    assert not forged, f"{where}: {name} forged a line: {forged}\n{text[-3000:]!r}"


def _toml_str(text: str) -> str:
    return json.dumps(text, ensure_ascii=True)  # \u escapes: a TOML basic string holds any character so


# --------------------------------------------------------------------------- profile show


@pytest.fixture(scope="module")
def profile_shown(tmp_path_factory: pytest.TempPathFactory) -> hostile.Outcome:
    """``profile show`` of keys and values holding every control, in a table of free keys
    ([latency.extra_body]; [engine.env] refuses names a shell cannot export), ``--json`` held:
    JSON escapes them itself."""
    tmp = tmp_path_factory.mktemp("terminal-profile")
    keys = "\n".join(f"{_toml_str('K_' + n + CONTROLS[n] + marker(n))} = {_toml_str('v_' + n + CONTROLS[n] + marker(n))}"
                     for n in NAMES)
    profile = tmp / "p.toml"
    profile.write_text(f'extends = "cpu-tiny"\n[latency.extra_body]\n{keys}\n')
    return hostile.day0("profile", "show", profile)


@pytest.mark.parametrize("name", NAMES)
def test_profile_show_escapes_keys_and_values(profile_shown: hostile.Outcome, name: str) -> None:
    assert profile_shown.code == 0, profile_shown.explain()
    assert_shown_safe(profile_shown.stdout, name, "profile show")


def test_a_key_with_a_newline_is_one_toml_key(tmp_path: Path) -> None:
    """``profile show`` prints TOML: a key holding a newline and a table header is quoted (a JSON
    string, which TOML reads), one key on one line instead of a forged second [engine] section."""
    key = 'a\n[engine]\nmode = "external"'
    profile = tmp_path / "p.toml"
    profile.write_text(f'extends = "cpu-tiny"\n[latency.extra_body]\n{_toml_str(key)} = "1"\n')
    out = hostile.day0("profile", "show", profile)
    assert out.code == 0, out.explain()
    lines = out.stdout.split("\n")
    assert lines.count("[engine]") == 1 and not [ln for ln in lines if ln.startswith('mode = "external"')], out.stdout
    line = next(ln for ln in lines if "mode" in ln and "external" in ln)
    assert tomllib.loads(line) == {key: "1"}  # the key, whole, as TOML reads it back


# --------------------------------------------------------------------------- day0 plan


@pytest.fixture(scope="module")
def plan_shown(tmp_path_factory: pytest.TempPathFactory) -> hostile.Outcome:
    """``day0 plan`` of a profile whose engine-arg names and model folder hold every control."""
    from day0.config.profile import TinySpec
    from day0.model.tiny import cached_model

    tmp = tmp_path_factory.mktemp("terminal-plan")
    model = tmp / hostile_text(prefix="m_")
    model.mkdir()
    (model / "config.json").write_bytes((cached_model(TinySpec()) / "config.json").read_bytes())
    args = "\n".join(f"{_toml_str('arg_' + n + CONTROLS[n] + marker(n))} = 1" for n in NAMES)
    profile = tmp / "p.toml"
    profile.write_text(f'extends = "cpu-tiny"\n[model]\nsource = "path"\npath = {_toml_str(str(model))}\n'
                       f"[engine.args]\n{args}\n")
    return hostile.day0("plan", "--profile", profile, timeout_s=300, mem_mb=8192)


@pytest.mark.parametrize("name", NAMES)
def test_plan_escapes_engine_arg_names(plan_shown: hostile.Outcome, name: str) -> None:
    out = plan_shown
    assert out.code == 1 and "Traceback" not in out.stderr, out.explain()  # unknown args: lint errors
    findings = out.stdout.split("\nconfig: ")[0] + "\n" + "\n".join(ln for ln in out.stdout.split("\n") if "arg_" in ln)
    assert_shown_safe(findings, name, "plan's findings")


@pytest.mark.parametrize("name", NAMES)
def test_plan_escapes_the_config_path(plan_shown: hostile.Outcome, name: str) -> None:
    out = plan_shown
    head = out.stdout.split("\nfindings:")[0]  # "config: <path>": the model folder's name
    assert head.startswith("config: "), out.explain()
    assert_shown_safe(head, name, "plan's config path")


# --------------------------------------------------------------------------- day0 latency


LATENCY = ["latency", "--vocab-size", "300", "--num-requests", "4", "--warmup", "0", "--concurrency", "2",
           "--output-len", "4", "--input-len", "8", "--no-server-metrics"]


@pytest.fixture(scope="module")
def latency_shown() -> dict[str, hostile.Outcome]:
    """``day0 latency`` against a server whose model id holds every control, and one whose 401
    error body does (a body is cut at 200 characters: each control's text is short)."""
    with SSEServer(Script(model_id=hostile_text(prefix="m"))) as srv:
        model = hostile.day0(*LATENCY, "--url", srv.url)
        srv.set_script(Script(reject_status=401, reject_body=hostile_text(prefix="e")))
        body = hostile.day0(*LATENCY, "--url", srv.url)
    return {"model id": model, "error body": body}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("what", ["model id", "error body"])
def test_latency_escapes_what_the_server_says(latency_shown: dict[str, hostile.Outcome], what: str,
                                              name: str) -> None:
    out = latency_shown[what]
    assert out.code in (0, 1) and "Traceback" not in out.stderr, out.explain()
    assert_shown_safe(out.stdout + out.stderr, name, f"day0 latency ({what})")


# --------------------------------------------------------------------------- commands quoting what others said


@pytest.fixture(scope="module")
def sbatch_said(tmp_path_factory: pytest.TempPathFactory) -> hostile.Outcome:
    """``day0 slurm submit`` where sbatch fails with a line holding every control a line split keeps."""
    fake = tmp_path_factory.mktemp("terminal-slurm") / "sbatch"
    fake.write_text(f"#!/usr/bin/env python3\nimport sys\nsys.stderr.write({hostile_text(ONE_LINE, 's')!r} + '\\n')\n"
                    "sys.exit(1)\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return hostile.day0("slurm", "submit", "job.sbatch", env={"PATH": f"{fake.parent}:{os.environ['PATH']}"})


@pytest.mark.parametrize("name", ONE_LINE)
def test_slurm_submit_escapes_sbatch_stderr(sbatch_said: hostile.Outcome, name: str) -> None:
    out = sbatch_said
    assert out.code == 2 and len(out.lines) == 1, out.explain()
    assert_shown_safe(out.stderr, name, "day0 slurm submit")


@pytest.fixture(scope="module")
def manifest_refused() -> hostile.Outcome:
    return hostile.day0("weights", "manifest", "/nonexistent/" + hostile_text(prefix="d"))


@pytest.mark.parametrize("name", NAMES)
def test_a_refusal_quoting_a_path_is_one_escaped_line(manifest_refused: hostile.Outcome, name: str) -> None:
    out = manifest_refused
    assert out.code == 2 and len(out.lines) == 1, out.explain()
    assert_shown_safe(out.stderr, name, "day0 weights manifest's refusal")


@pytest.fixture(scope="module")
def wrote_into(tmp_path_factory: pytest.TempPathFactory) -> dict[str, hostile.Outcome]:
    """Commands that print the folder they were told to write into: ``keygen`` and ``tiny build``,
    each into a folder whose name holds every control (Linux allows all but ``/`` and NUL)."""
    tmp = tmp_path_factory.mktemp("terminal-writes")
    name = hostile_text(prefix="d").replace("\x00", "")
    return {"keygen": hostile.day0("keygen", tmp / ("k" + name), "--name", "ada"),
            "tiny build": hostile.day0("tiny", "build", tmp / ("t" + name))}


@pytest.mark.parametrize("command", ["keygen", "tiny build"])
@pytest.mark.parametrize("name", NAMES)
def test_a_folder_a_command_wrote_into_is_printed_escaped(wrote_into: dict[str, hostile.Outcome], command: str,
                                                          name: str) -> None:
    out = wrote_into[command]
    assert out.code == 0, out.explain()
    assert_shown_safe(out.stdout, name, f"day0 {command}")
