"""Secrets never reach a file the run writes, and a keyed deployment is measured, not refused.

Canary secrets go in through every door a user has (profile keys, ``--day0-set``, engine args and
env, a variable named by ``api_key_env``, notes, check messages and evidence, the engine's log),
then every file under the run's output folder is read back byte for byte.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from day0.core.events import EventLog, rebuild
from day0.core.record import load
from day0.core.redact import REDACTED, Redactor, is_secret_key
from day0.core.sockets import free_port
from day0.engine.process import die_with_parent, stop_process_group
from day0.engine.rpc_folder import own_rpc_folder
from day0.engine.server import remove_file_stores, scrub_log
from tests.support import REPO
from tests.support.hostile import leaks

SUITES = REPO / "day0" / "suites"

# Each canary is distinctive, so a hit can only be a leak.
KEY = "sk-day0canary-KEYf00d"  # the deployment's API key, in the variable api_key_env names
HF = "hf_day0canaryTOKENbeef"  # engine.env.HF_TOKEN
ARG = "sk-day0canary-ARGcafe"  # engine.args.api_key through --day0-set
DASHED = "day0canary-DASHED-7e7e"  # a dashed key name in a profile table of free keys ("hf-token")


# --------------------------------------------------------------------------- the redactor itself


@pytest.mark.parametrize("key", ["api_key", "api-key", "API_KEY", "hf-token", "HF_TOKEN", "hf_token", "password",
                                 "db.password", "secret", "aws_secret_access_key", "client-secret", "Authorization",
                                 "access_token", "credentials", "private_key", "key", "token"])
def test_secret_key_names(key):
    assert is_secret_key(key)


@pytest.mark.parametrize("key", ["num_key_value_heads", "max_num_batched_tokens", "eos_token", "bos_token",
                                 "profile_key", "cached_tokens", "tokenizer", "keys", "monkey", "tokens",
                                 "experts_per_token", "kv_bytes_per_token", "expertsPerToken", "answer_key", "by_key"])
def test_keys_that_only_look_like_secrets(key):
    assert not is_secret_key(key)


def test_redactor_covers_keys_values_and_text_shapes():
    r = Redactor.from_sources(environ={"HF_TOKEN": HF, "MY_VAR": KEY, "PATH": "/usr/bin"}, env_names=["MY_VAR"],
                              data={"engine": {"args": {"api-key": ARG}}})
    assert r.values == {HF, KEY, ARG}
    out = r({"api-key": "x" * 3, "token": 142, "eos_token": "</s>", "msg": f"curl -H 'Authorization: Bearer {KEY}'",
             "argv": ["--hf-token", "abcdefgh"], "nested": [{"note": f"saw {HF} in env"}],
             "flags": "token: 142 --max-num-batched-tokens 8192 --api-key=zzzzzzzz"})
    assert out["api-key"] == REDACTED and out["token"] == 142 and out["eos_token"] == "</s>"
    assert KEY not in json.dumps(out) and HF not in json.dumps(out) and "zzzzzzzz" not in json.dumps(out)
    assert "--max-num-batched-tokens 8192" in out["flags"] and "token: 142" in out["flags"]
    assert out["argv"] == ["--hf-token", REDACTED]
    assert r.argv(["--api-key", "s3cr3tvalue", "--port", "8000", "--hf-token=abc"]) == [
        "--api-key", REDACTED, "--port", "8000", f"--hf-token={REDACTED}"]


def test_a_credential_that_toml_reads_as_a_number_is_still_redacted_and_learnt():
    """An all-digit api_key is a TOML integer (or one entry of a mixed list): it was neither blanked
    by its key nor learnt as a value, while endpoint.api_key sent it. A bare token or key number is
    a token id or an index, not a credential."""
    data = {"engine": {"args": {"api_key": 73194028561}}, "site": {"password": ["sk-live-abcdef123456", 0]}}
    r = Redactor.from_sources(environ={}, data=data)
    assert r(data) == {"engine": {"args": {"api_key": REDACTED}}, "site": {"password": REDACTED}}
    assert r.text("got 401 for key 73194028561") == f"got 401 for key {REDACTED}"
    assert r({"token": 142, "key": 3}) == {"token": 142, "key": 3}


def test_camel_case_secret_names_and_credential_tables_are_redacted():
    """A site stage's free-form settings: accessToken and clientSecret were not secret names, and the
    leaves of credentials = {user, pass} went to run.json as written."""
    data = {"stages": {"gateway": {"accessToken": "gw-Zq81LmN0pQ77", "clientSecret": "cs-8812hhqq",
                                   "credentials": {"user": "ci-bot-account", "pass": "Hunter2Hunter2"},
                                   "eosToken": "</s>", "maxTokens": 64}}}
    r = Redactor.from_sources(environ={}, data=data)
    gw = r(data)["stages"]["gateway"]
    assert gw["accessToken"] == gw["clientSecret"] == REDACTED
    assert gw["credentials"] == {"user": REDACTED, "pass": REDACTED}
    assert gw["eosToken"] == "</s>" and gw["maxTokens"] == 64
    assert r.text("login ci-bot-account / Hunter2Hunter2 with gw-Zq81LmN0pQ77") == \
        f"login {REDACTED} / {REDACTED} with {REDACTED}"


def test_a_hyphenated_word_is_not_a_flag():
    """`a 4096-token prefix` in a check message is prose: the hyphen does not start a flag."""
    r = Redactor.from_sources(environ={}, data={})
    assert r.text("identical for a 4096-token prefix, cold") == "identical for a 4096-token prefix, cold"
    assert r.text("run with -token abcdefgh") == f"run with -token {REDACTED}"


def test_short_values_are_redacted_by_key_only():
    """A one-character 'secret' would blank every '1' in a report; it still goes by its key."""
    r = Redactor.from_sources(environ={"X_TOKEN": "1"}, data={"token": "ab"})
    assert r.values == frozenset()
    assert r({"token": "ab", "n": "1 of 1"}) == {"token": REDACTED, "n": "1 of 1"}


def test_event_log_redacts_every_event(tmp_path):
    log = EventLog(tmp_path / "events.jsonl", redactor=Redactor(frozenset({HF})))
    log.note("engine.http", {"env": {"HF_TOKEN": HF, "OTHER": f"prefix {HF} suffix"}, "args": {"api_key": ARG}})
    text = (tmp_path / "events.jsonl").read_text()
    assert HF not in text and ARG not in text
    event = json.loads(text)
    assert event["key"] == "engine.http"  # the note's own name is not a secret
    assert event["value"]["env"]["OTHER"] == f"prefix {REDACTED} suffix"


def test_a_secret_flag_in_a_recorded_command_line_loses_its_value(tmp_path):
    """environment.argv is sys.argv as given, one element per word: `--gateway-api-key` and its value
    were two strings, each redacted alone, so the value (no known secret) reached events.jsonl and
    run.json. A list under a command-line key is read as a command line, wherever it sits."""
    argv = ["pytest", "--pyargs", "day0.suites", "-p", "mysite_auth", "--gateway-api-key", "Zq81mXv0pLr3",
            "--hf-token", "hf_QwErTyUiOpAsDfGh", "--port", "8000"]
    log = EventLog(tmp_path / "events.jsonl", redactor=Redactor(frozenset()))
    log.run_started("r1", {"argv": argv}, {}, ["preflight"])
    log.note("tool", {"cmd": ["curl", "--api-key", "Zq81mXv0pLr3"], "command": ("x", "--password", "p4ssw0rdp4ss")})
    log.run_finished(0)
    record = rebuild(tmp_path)
    for name in ("events.jsonl", "run.json"):
        text = (tmp_path / name).read_text()
        assert "Zq81mXv0pLr3" not in text and "hf_QwErTyUiOpAsDfGh" not in text and "p4ssw0rdp4ss" not in text, name
    assert record.environment["argv"] == [*argv[:6], REDACTED, "--hf-token", REDACTED, "--port", "8000"]
    assert record.notes["tool"]["command"] == ["x", "--password", REDACTED]


def test_stage_declarations_keep_their_figure_keys_and_lose_secret_values(tmp_path):
    # a figure's `key` is its name: blanking it for its field name made every headline's key
    # "<redacted>" in real records, so trends matched every figure to every other
    from day0.results import summary
    from day0.stages.registry import builtin

    infos = [st.info.describe() for st in builtin()]
    infos[0]["question"] = f"leaks {HF}?"
    log = EventLog(tmp_path / "events.jsonl", redactor=Redactor(frozenset({HF})))
    log.run_started("r1", {}, {}, [i["name"] for i in infos], infos)
    log.run_finished(0)
    text = (tmp_path / "events.jsonl").read_text()
    assert HF not in text and REDACTED in text
    keys = [f.key for info in summary.stage_infos(rebuild(tmp_path)).values() for f in info.figures]
    assert "ttft_p99" in keys and "capacity" in keys and REDACTED not in keys


def test_engine_log_scrub_is_line_by_line(tmp_path):
    log = tmp_path / "engine.log"
    log.write_text(f"$ python -m vllm --port 1\nINFO env HF_TOKEN={HF}\n" + "x" * 100_000 + "\n")
    scrub_log(log, Redactor(frozenset({HF})))
    text = log.read_text()
    assert HF not in text and f"HF_TOKEN={REDACTED}" in text and text.endswith("x\n")


# --------------------------------------------------------------------------- a whole run, no engine


CANARY_SUITE = textwrap.dedent(f'''
    import pytest
    from day0.core.record import Check

    @pytest.mark.day0
    @pytest.mark.preflight
    def test_a_check_that_quotes_secrets(day0_checks, day0_session):
        day0_session.events.note("site", {{"deployment_token": "{DASHED}", "said": "key was {KEY}"}})
        day0_checks.add(Check("preflight.canary", "A check quoting secrets", "pass",
                              message="the engine said Authorization: Bearer {KEY} and HF_TOKEN={HF}",
                              evidence={{"argv": ["--api-key", "{ARG}"], "env": {{"HF_TOKEN": "{HF}"}}}}))

    @pytest.mark.day0
    @pytest.mark.preflight
    def test_a_traceback_that_quotes_secrets():
        token = "{HF}"  # pytest prints this source line in the traceback
        raise RuntimeError(f"the server said key={KEY} with " + token)
''')


def test_canaries_reach_no_file_of_a_run(tmp_path):
    """Preflight (lint quotes engine args) plus a check that quotes secrets in its message,
    evidence and a note: run.json, events.jsonl, report.html, junit.xml and the history copy all
    come back clean, and the secrets are still visible *as redacted* where they were."""
    profile = tmp_path / "canary.toml"
    profile.write_text(textwrap.dedent(f'''
        extends = "cpu-tiny"
        [engine]
        api_key_env = "DAY0_CANARY_KEY"
        [engine.env]
        HF_TOKEN = "{HF}"
        [latency.extra_body]
        "hf-token" = "{DASHED}"
    '''))
    suite = tmp_path / "test_canary_suite.py"
    suite.write_text(CANARY_SUITE)
    out = tmp_path / "reports"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(SUITES / "test_preflight.py"), str(suite), "-m", "day0 and preflight",
         "-p", "no:cacheprovider", "--day0-profile", str(profile), "--day0-out", str(out),
         "--day0-set", f'engine.args.api_key="{ARG}"', "--junitxml", str(out / "pytest-junit.xml")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "DAY0_CANARY_KEY": KEY})
    assert (out / "latest" / "run.json").is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
    assert leaks(out, [KEY, HF, ARG, DASHED]) == []
    for stream in (proc.stdout, proc.stderr):
        assert not [c for c in (KEY, HF, ARG, DASHED) if c in stream]
    rec = load(out / "latest" / "run.json")
    canary = next(c for c in rec.checks() if c.id == "preflight.canary")
    assert REDACTED in canary.message and canary.evidence["argv"] == ["--api-key", REDACTED]
    raised = next(c for c in rec.checks() if c.id == "preflight.a_traceback_that_quotes_secrets")
    assert raised.status == "error" and "RuntimeError: the server said key=" in raised.message
    assert "RuntimeError" in proc.stdout and REDACTED in raised.evidence["traceback"]  # shown, redacted
    assert rec.profile["engine"]["env"]["HF_TOKEN"] == REDACTED
    # the server's own flag is a known arg, not a lint error (vLLM's OpenAI server takes --api-key)
    assert not [c for c in rec.checks() if c.id.startswith("preflight.lint.") and "api_key" in c.title]


# --------------------------------------------------------------------------- a keyed deployment, end to end


def _start_keyed_server(model_dir: Path, port: int, log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """vLLM's server as a site runs it, by hand, with ``--api-key``: the deployment under test."""
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--served-model-name", "day0-tiny", "--host", "127.0.0.1", "--port", str(port), "--api-key", KEY,
           "--dtype", "float32", "--enforce-eager", "--block-size", "32", "--max-model-len", "32768",
           "--max-num-seqs", "16", "--enable-prefix-caching", "--seed", "0",
           # served for agents, as cpu-tiny's own server is (the agents stage's requests carry the key too)
           "--tool-call-parser", "hermes", "--enable-auto-tool-choice",
           "--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}']
    with log.open("wb") as fh:
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                preexec_fn=die_with_parent)


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return
        except OSError:
            time.sleep(1)
    raise AssertionError(f"keyed vLLM server not healthy in {timeout_s} s:\n{log.read_text()[-3000:]}")


@pytest.mark.engine
def test_external_mode_against_a_keyed_server_is_accepted(tmp_path):
    """The README's "Pointing it at a real deployment" example, against a vLLM server started with
    ``--api-key``: every request day0 makes carries the key, the run is ACCEPTED, and the key is
    in no file of the run (the TP=2 variant and the accuracy reference day0 starts beside it get
    the key through VLLM_API_KEY, never on their command lines)."""
    from day0.config.profile import TinySpec
    from day0.model.tiny import cached_model

    model_dir = cached_model(TinySpec())
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server_log = tmp_path / "keyed-server.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    # its IPC sockets in a folder of its own, as day0's servers have (docs/engine.md), not in /tmp
    # where vLLM's forced shutdown leaves them
    rpc = contextlib.ExitStack()
    rpc.enter_context(own_rpc_folder(env))
    proc = _start_keyed_server(model_dir, port, server_log, env)
    try:
        _wait_healthy(url, proc, server_log)
        req = urllib.request.Request(url + "/v1/models")
        with pytest.raises(urllib.error.HTTPError) as refused:  # the deployment really wants the key
            urllib.request.urlopen(req, timeout=10)
        assert refused.value.code == 401
        profile = tmp_path / "mysite.toml"
        profile.write_text(textwrap.dedent(f'''
            extends = "cpu-tiny"
            name = "keyed-external"
            [engine]
            mode = "external"
            url = "{url}"
            api_key_env = "VLLM_API_KEY"
            [engine.env]
            HF_TOKEN = "{HF}"
            [collectives]   # the probes the default run leaves out: both must carry the key too
            tp_equivalence = true
            [risks.accuracy]
            tasks = ["day0_tiny_qa"]
        '''))
        out = tmp_path / "reports"
        run = subprocess.run(
            [sys.executable, "-m", "pytest", str(SUITES), "-m", "day0", "-p", "no:cacheprovider",
             "--day0-profile", str(profile), "--day0-out", str(out)],
            cwd=tmp_path, capture_output=True, text=True, timeout=900, env={**os.environ, "VLLM_API_KEY": KEY})
    finally:
        stop_process_group(proc, 20)
        rpc.close()
        remove_file_stores(server_log)
    text = run.stdout + run.stderr
    assert run.returncode == 0, text[-6000:]
    rec = load(out / "latest" / "run.json")
    assert rec.verdict == "accepted", rec.reason + "\n" + text[-6000:]
    assert leaks(out, [KEY, HF]) == []
    assert KEY not in text and HF not in text
    checks = {c.id: c for c in rec.checks()}
    # cpu-tiny's own required list, unchanged: the exact KV view and the worker RPC are out of reach
    # of an external engine, so their stand-ins were required, and measured on this host
    stood_in = {s["check"]: s["stand_in"] for s in rec.profile["report"]["substituted"]}
    assert stood_in == {"weights.memory_per_rank": "weights.rank_memory",
                        "kvcache.fragmentation": "kvcache.blackbox_fragmentation"}
    assert checks["weights.rank_memory"].status == "pass" and checks["weights.rank_memory"].source == "beside"
    assert checks["kvcache.blackbox_fragmentation"].status == "pass"
    assert checks["latency.error_rate"].value == 0 and checks["latency.warmup"].status == "pass"
    assert checks["collectives.engine_tp2_matches_tp1"].status == "pass"
    # the two probes the default run leaves out, here and nowhere else among the whole runs:
    # TP=2 against TP=1 above, lm-eval's task accuracy against transformers
    assert checks["risks.accuracy.task_delta"].status == "pass"
