"""Slurm's node list, expanded as ``scontrol show hostnames`` would, with no Slurm installed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from day0.engine.cluster import slurm
from day0.engine.cluster.slurm import MAX_HOSTS, SlurmError, SlurmJob, expand_nodelist, hostnames


@pytest.mark.parametrize(("text", "expected"), [
    ("gpu[01-04]", ["gpu01", "gpu02", "gpu03", "gpu04"]),
    ("gpu[01-03,07,10-11]", ["gpu01", "gpu02", "gpu03", "gpu07", "gpu10", "gpu11"]),
    ("a1,b[2-3]", ["a1", "b2", "b3"]),
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ("node-1.cluster", ["node-1.cluster"]),
    ("node-[1-2].cluster.local", ["node-1.cluster.local", "node-2.cluster.local"]),
    (" a1 , b[2-3] ,c ", ["a1", "b2", "b3", "c"]),
    ("n[8-10]", ["n8", "n9", "n10"]),  # width from the lower bound: no padding for 8
    ("n[008-010]", ["n008", "n009", "n010"]),
    ("n[07]", ["n07"]),
    ("n[1 - 2, 5]", ["n1", "n2", "n5"]),
    ("[1-2]x", ["1x", "2x"]),
    ("a,a", ["a", "a"]),  # order and duplicates kept, as scontrol does
])
def test_expand(text, expected):
    assert expand_nodelist(text) == expected


def test_padding_four_names():
    hosts = expand_nodelist("gpu[01-04]")
    assert len(hosts) == 4
    assert all(len(h) == 5 for h in hosts)


@pytest.mark.parametrize(("text", "piece"), [
    ("gpu[01-04", "[01-04"),          # unbalanced '['
    ("gpu01-04]", "gpu01-04]"),       # unbalanced ']'
    ("gpu[[1-2]]", "gpu[["),          # nested
    ("gpu[5-2]", "[5-2]"),            # reversed
    ("gpu[a-b]", "'a'"),              # non-digit bound
    ("gpu[1-x]", "'x'"),
    ("gpu[1-]", "''"),
    ("gpu[-3]", "''"),
    ("gpu[]", "[]"),
    ("gpu[1,,2]", "[1,,2]"),
    ("", "''"),
    ("   ", "'   '"),
    ("a,,b", "a,,b"),
    ("a,", "'a,'"),
    ("gpu 01", "' '"),
    ("gpu;rm", "';'"),
    ("-oProxyCommand=x", "-oProxyCommand=x"),
    ("n[1-1234567890123456789]", "123456789012345678..."),
    ("n[١-٣]", "'١'"),                  # unicode digits are not node numbers
])
def test_bad_input_names_the_piece(text, piece):
    with pytest.raises(SlurmError) as info:
        expand_nodelist(text)
    message = str(info.value)
    assert "\n" not in message
    assert piece in message, message


def test_slurm_error_is_a_value_error():
    assert issubclass(SlurmError, ValueError)


@pytest.mark.parametrize("text", [
    "n[0-99999999]",
    "n[0-65536]",                     # 65,537 hosts
    "a[0-999]-b[0-999]",              # a product past the bound
    "a[0-40000],b[0-40000]",          # a sum past the bound
    "x" * 300,                        # one name past DNS length
    "n[0-999999999999999999]" * 50,   # a product past any memory
])
def test_size_bound_refuses(text):
    with pytest.raises(SlurmError):
        expand_nodelist(text)


def test_wide_padding_is_legal():
    assert expand_nodelist("n[0000000000-1]") == ["n0000000000", "n0000000001"]


def test_size_bound_edge_is_accepted():
    hosts = expand_nodelist(f"n[1-{MAX_HOSTS}]")
    assert len(hosts) == MAX_HOSTS
    assert hosts[-1] == f"n{MAX_HOSTS}"


def test_non_string_refused():
    with pytest.raises(SlurmError):
        expand_nodelist(None)  # type: ignore[arg-type]


# --- hostnames(): scontrol first, local expansion otherwise ------------------------------------


def _completed(args, rc=0, stdout=""):
    return subprocess.CompletedProcess(args, rc, stdout=stdout, stderr="")


def test_hostnames_uses_scontrol(monkeypatch):
    monkeypatch.setattr(slurm.shutil, "which", lambda name: "/opt/slurm/bin/scontrol")
    calls = []

    def run(args, **kw):
        calls.append((args, kw))
        return _completed(args, stdout="x1\nx2\n\n")

    assert hostnames("whatever[1-2]", run=run) == ["x1", "x2"]
    args, kw = calls[0]
    assert args == ["/opt/slurm/bin/scontrol", "show", "hostnames", "whatever[1-2]"]
    assert kw["timeout"] == 10
    assert kw.get("shell") is not True


@pytest.mark.parametrize("outcome", ["rc", "empty", "timeout", "oserror"])
def test_hostnames_falls_back_when_scontrol_fails(monkeypatch, outcome):
    monkeypatch.setattr(slurm.shutil, "which", lambda name: "/opt/slurm/bin/scontrol")

    def run(args, **kw):
        if outcome == "timeout":
            raise subprocess.TimeoutExpired(args, kw["timeout"])
        if outcome == "oserror":
            raise PermissionError("denied")
        return _completed(args, rc=1 if outcome == "rc" else 0, stdout="")

    assert hostnames("gpu[01-02]", run=run) == ["gpu01", "gpu02"]


def test_hostnames_without_scontrol_never_runs(monkeypatch):
    monkeypatch.setattr(slurm.shutil, "which", lambda name: None)

    def run(*a, **kw):
        raise AssertionError("scontrol is absent")

    assert hostnames("a1,b[2-3]", run=run) == ["a1", "b2", "b3"]


def test_hostnames_bad_list_without_scontrol(monkeypatch):
    monkeypatch.setattr(slurm.shutil, "which", lambda name: None)
    with pytest.raises(SlurmError, match=r"\[5-2\]"):
        hostnames("gpu[5-2]")
    with pytest.raises(SlurmError):
        hostnames("")


def test_hostnames_never_passes_an_option_to_scontrol(monkeypatch):
    monkeypatch.setattr(slurm.shutil, "which", lambda name: "/opt/slurm/bin/scontrol")

    def run(*a, **kw):
        raise AssertionError("an option-looking list must not reach scontrol")

    with pytest.raises(SlurmError, match="-v"):
        hostnames("-v", run=run)


FAKE_SCONTROL = textwrap.dedent("""\
    #!{python}
    import os, re, sys
    with open(os.environ["FAKE_SCONTROL_LOG"], "a") as log:
        log.write(" ".join(sys.argv[1:]) + "\\n")
    if sys.argv[1:3] != ["show", "hostnames"] or len(sys.argv) != 4:
        sys.exit(2)
    m = re.fullmatch(r"(\\w+)\\[(\\d+)-(\\d+)\\]", sys.argv[3])
    if not m:
        sys.exit(1)
    prefix, lo, hi = m.group(1), m.group(2), m.group(3)
    for n in range(int(lo), int(hi) + 1):
        print(f"{{prefix}}{{n:0{{len(lo)}}d}}.from-scontrol")
""")


@pytest.fixture()
def fake_scontrol(tmp_path, monkeypatch) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "scontrol"
    exe.write_text(FAKE_SCONTROL.format(python=sys.executable))
    exe.chmod(0o755)
    log = tmp_path / "scontrol.log"
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_SCONTROL_LOG", str(log))
    return log


def test_hostnames_runs_the_scontrol_on_path(fake_scontrol):
    assert hostnames("gpu[01-03]") == ["gpu01.from-scontrol", "gpu02.from-scontrol", "gpu03.from-scontrol"]
    assert fake_scontrol.read_text().splitlines() == ["show hostnames gpu[01-03]"]


def test_hostnames_falls_back_when_scontrol_on_path_fails(fake_scontrol):
    # the fake only knows one bracket group; a failing scontrol falls back to the local expansion
    assert hostnames("a1,b[2-3]") == ["a1", "b2", "b3"]
    assert fake_scontrol.read_text().splitlines() == ["show hostnames a1,b[2-3]"]


# --- SlurmJob ------------------------------------------------------------------------------------


@pytest.fixture()
def no_scontrol(monkeypatch):
    monkeypatch.setattr(slurm.shutil, "which", lambda name: None)


def test_from_environ_absent(no_scontrol):
    assert SlurmJob.from_environ({}) is None
    assert SlurmJob.from_environ({"SLURM_NODEID": "0", "SLURM_JOB_ID": "7"}) is None


def test_from_environ_present(no_scontrol):
    job = SlurmJob.from_environ({
        "SLURM_JOB_NODELIST": "gpu[01-04]",
        "SLURM_NODEID": "2",
        "SLURM_JOB_NUM_NODES": "4",
        "SLURM_JOB_ID": "12345",
    })
    assert job == SlurmJob("gpu[01-04]", ["gpu01", "gpu02", "gpu03", "gpu04"], 2, 4, "12345")
    assert job.master_addr == "gpu01"


def test_from_environ_old_names_and_defaults(no_scontrol):
    job = SlurmJob.from_environ({"SLURM_NODELIST": "a1,b[2-3]", "SLURM_NNODES": "3", "SLURM_JOBID": "9"})
    assert job is not None
    assert (job.hosts, job.node_id, job.nnodes, job.job_id) == (["a1", "b2", "b3"], None, 3, "9")
    job = SlurmJob.from_environ({"SLURM_JOB_NODELIST": "solo"})
    assert job is not None
    assert (job.nnodes, job.node_id, job.job_id, job.master_addr) == (1, None, None, "solo")


def test_from_environ_prefers_job_nodelist(no_scontrol):
    job = SlurmJob.from_environ({"SLURM_JOB_NODELIST": "new[1-2]", "SLURM_NODELIST": "old1"})
    assert job is not None and job.hosts == ["new1", "new2"]


def test_from_environ_uses_scontrol(monkeypatch):
    monkeypatch.setattr(slurm.shutil, "which", lambda name: "/usr/bin/scontrol")
    job = SlurmJob.from_environ(
        {"SLURM_JOB_NODELIST": "gpu[1-2]", "SLURM_JOB_NUM_NODES": "2"},
        run=lambda args, **kw: _completed(args, stdout="h1\nh2\n"),
    )
    assert job is not None and job.hosts == ["h1", "h2"] and job.master_addr == "h1"


def test_from_environ_count_mismatch_names_both(no_scontrol):
    with pytest.raises(SlurmError) as info:
        SlurmJob.from_environ({"SLURM_JOB_NODELIST": "gpu[01-04]", "SLURM_JOB_NUM_NODES": "8"})
    message = str(info.value)
    assert "SLURM_JOB_NUM_NODES=8" in message and "4 hosts" in message and "gpu[01-04]" in message


@pytest.mark.parametrize(("env", "piece"), [
    ({"SLURM_JOB_NODELIST": "gpu[01-04]", "SLURM_NNODES": "two"}, "SLURM_NNODES"),
    ({"SLURM_JOB_NODELIST": "gpu[01-04]", "SLURM_NODEID": "x"}, "SLURM_NODEID"),
    ({"SLURM_JOB_NODELIST": "gpu[01-04]", "SLURM_NODEID": "-1"}, "SLURM_NODEID"),
    ({"SLURM_JOB_NODELIST": "gpu[01-04]", "SLURM_NODEID": "4"}, "SLURM_NODEID=4"),
    ({"SLURM_JOB_NODELIST": "gpu[04-01]"}, "[04-01]"),
    ({"SLURM_JOB_NODELIST": ""}, "empty"),
])
def test_from_environ_bad(no_scontrol, env, piece):
    with pytest.raises(SlurmError, match=None) as info:
        SlurmJob.from_environ(env)
    assert piece in str(info.value)


def test_job_is_frozen(no_scontrol):
    job = SlurmJob.from_environ({"SLURM_JOB_NODELIST": "a1"})
    with pytest.raises(AttributeError):
        job.nnodes = 2  # type: ignore[misc,union-attr]


@pytest.mark.parametrize("flag", ["--timeout", "--unavailable-timeout"])
@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1"])
def test_slurm_submit_refuses_a_wait_that_never_fires_or_fires_at_once_before_it_submits(flag, value, capsys):
    """nan polled the job for ever, 0 or -1 submitted it and cancelled it at once: exit 2, and no
    sbatch runs (none is on this PATH's way: argparse refuses first)."""
    from day0.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["slurm", "submit", flag, value, "job.sbatch"])
    assert exited.value.code == 2
    assert f"argument {flag}: '{value}'" in capsys.readouterr().err
