"""A site's own stage, installed as a real distribution (a ``.dist-info`` with ``entry_points.txt``
on ``sys.path``), joins the run like a built-in: after them in order, gated and gating, in
run.json, junit.xml, the terminal table and the report; its failed check rejects the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from day0.core.stages import Stage
from day0.stages.registry import RegistryError, builtin, from_entry_points, load

BUILTIN = ["preflight", "weights", "parity", "collectives", "latency", "experts", "kvcache", "agents", "risks"]

SITE_STAGE = '''
"""A site's check on the record so far: stage weights must have passed its golden tokens."""
from pydantic import BaseModel

from day0.core.record import measured
from day0.core.stages import Figure, Stage


class Settings(BaseModel):
    limit: float = 1.0


def run(ctx):
    earlier = ctx.record.latest("weights.fake")
    value = 0.5 if earlier is not None and earlier.status == "pass" else 9.0
    return [measured("sitecheck.ratio", "Site ratio", value, ctx.section.limit, unit="x",
                     direction="lower_is_better")]


STAGE = Stage(name="sitecheck", title="Site check", question="does the site's own rule hold?", run=run,
              settings=Settings, figures=(Figure("site_ratio", "Site ratio", ("sitecheck.ratio",)),),
              required=("sitecheck.ratio",))
'''

BUILTIN_STANDIN = '''
import pytest
from day0.core.record import measured

@pytest.mark.day0
@pytest.mark.weights
def test_fake(day0_checks):
    day0_checks.add(measured("weights.fake", "A stand-in weights check", 1, 2, direction="lower_is_better"))
'''


def install_dist(root: Path, name: str = "day0_sitecheck", entry: str = "sitecheck = day0_sitecheck:STAGE",
                 module: str = SITE_STAGE) -> Path:
    """A distribution as pip leaves it: the module and its .dist-info, nothing registered by hand."""
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{name}.py").write_text(textwrap.dedent(module))
    info = root / f"{name}-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[day0.stages]\n{entry}\n")
    return root


def test_builtin_stages_declare_themselves_in_order():
    stages = builtin()
    assert [s.name for s in stages] == BUILTIN
    assert all(s.question.endswith("?") and s.suite for s in stages)
    assert stages[0].needs_nodes is False and all(s.needs_nodes for s in stages[1:])


def test_a_bad_entry_point_is_one_line_naming_it(tmp_path, monkeypatch):
    install_dist(tmp_path, "day0_sitebad", entry="sitecheck = day0_sitebad:NOPE")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RegistryError, match=r"entry point sitecheck = 'day0_sitebad:NOPE' \(distribution "
                                            r"day0_sitebad, group day0.stages\): cannot load"):
        from_entry_points()


def test_a_stage_name_taken_twice_is_refused(tmp_path, monkeypatch):
    install_dist(tmp_path, "day0_sitedup", module=SITE_STAGE.replace('name="sitecheck"', 'name="latency"'),
                 entry="latency = day0_sitedup:STAGE")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RegistryError, match="stage 'latency' .*the name is taken by day0"):
        load()


@pytest.mark.parametrize("name", ["day0", "skip", "xfail"])
def test_a_stage_named_as_a_marker_day0_or_pytest_already_means_is_refused(tmp_path, monkeypatch, name):
    """A stage's name is its marker: one named `day0` became the first stage marker of every built-in
    test and gating followed it (latency ran after a weights failure); one named `skip` skipped itself."""
    install_dist(tmp_path, f"day0_site{name}", module=SITE_STAGE.replace('name="sitecheck"', f'name="{name}"'),
                 entry=f"{name} = day0_site{name}:STAGE")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RegistryError, match=f"stage '{name}': name: a pytest marker day0 or pytest already means"):
        load()


def test_stages_of_one_order_run_in_name_order(tmp_path, monkeypatch):
    """docs/stage-contract.md: ties run in name order; the built-ins won every tie."""
    latency = next(s for s in builtin() if s.name == "latency")
    install_dist(tmp_path, "day0_siteaaa", module=SITE_STAGE.replace('name="sitecheck"', 'name="aaa"').replace(
        "STAGE = Stage(", f"STAGE = Stage(order={latency.order}, "), entry="aaa = day0_siteaaa:STAGE")
    monkeypatch.syspath_prepend(str(tmp_path))
    names = list(load().names)
    assert names.index("aaa") < names.index("latency")


def test_the_site_stage_registers_after_the_builtins(tmp_path, monkeypatch):
    install_dist(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = load()
    assert list(reg.names) == [*BUILTIN, "sitecheck"]
    site = reg.get("sitecheck")
    assert isinstance(site, Stage) and site.origin == "day0_sitecheck" and reg.with_run() == (site,)
    assert reg.before("sitecheck") == tuple(BUILTIN)


def test_day0_stages_lists_the_builtins_with_questions_and_required_checks():
    out = subprocess.run([sys.executable, "-m", "day0.cli", "stages", "--json"], capture_output=True, text=True,
                         check=True).stdout
    stages = json.loads(out)
    assert [s["name"] for s in stages] == BUILTIN
    assert all(s["question"] and s["title"] for s in stages)
    required = {s["name"]: s["required"] for s in stages}
    assert "latency.ttft_p99" in required["latency"] and "kvcache.fragmentation" in required["kvcache"]
    text = subprocess.run([sys.executable, "-m", "day0.cli", "stages"], capture_output=True, text=True,
                          check=True).stdout
    assert "asks: do TTFT, TPOT and throughput meet the SLA?" in text


def test_day0_stages_prints_a_site_stage_s_text_escaped(tmp_path):
    """A site stage's title and question are its package's text: an ESC or a newline in them is shown
    escaped, never acted on, and cannot forge a line of the listing."""
    hostile = SITE_STAGE.replace('title="Site check"', 'title="Site\\x1b[2J check"').replace(
        'question="does the site\'s own rule hold?"', 'question="holds?\\nFORGED line"')
    root = install_dist(tmp_path, module=hostile)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    text = subprocess.run([sys.executable, "-m", "day0.cli", "stages"], capture_output=True, text=True, env=env,
                          check=True).stdout
    assert "Site\\x1b[2J check" in text and "\x1b" not in text
    assert "asks: holds?\\x0aFORGED line" in text and not any(ln.startswith("FORGED") for ln in text.splitlines())


def _run(pytester, monkeypatch, site: Path, *args: str):
    """A whole Day0 session in a subprocess, the site's distribution on its PYTHONPATH only."""
    pytester.makepyfile(test_standin=BUILTIN_STANDIN)
    monkeypatch.setenv("PYTHONPATH", str(site))
    result = pytester.runpytest_subprocess("test_standin.py", "--pyargs", "day0.suites.test_stages", *args,
                                           "-m", "day0", "--day0-out", "out", "-p", "no:randomly")
    latest = pytester.path / "out" / "latest"
    return result, json.loads((latest / "run.json").read_text()), latest


def test_a_site_stage_runs_after_the_builtins_and_reaches_every_output(pytester, monkeypatch, tmp_path):
    result, run, latest = _run(pytester, monkeypatch, install_dist(tmp_path / "site"))
    names = [s["name"] for s in run["stages"]]
    assert names[: len(BUILTIN) + 1] == [*BUILTIN, "sitecheck"]
    site = run["stages"][len(BUILTIN)]
    assert site["verdict"] == "pass" and site["origin"] == "day0_sitecheck" and site["duration_s"] >= 0
    (check,) = site["checks"]
    assert (check["id"], check["status"], check["value"]) == ("sitecheck.ratio", "pass", 0.5)  # read weights.fake
    assert "sitecheck.ratio" in run["profile"]["report"]["required"]
    out = result.stdout.str()
    assert any(line.split()[:2] == ["sitecheck", "pass"] for line in out.splitlines()), out
    assert "Site ratio" in out  # its headline in the terminal table
    assert 'name="sitecheck.ratio"' in (latest / "junit.xml").read_text()
    html = (latest / "report.html").read_text()
    assert "sitecheck.ratio" in html and "Site check" in html and "from day0_sitecheck" in html


def test_a_failing_site_check_rejects_the_run(pytester, monkeypatch, tmp_path):
    result, run, _ = _run(pytester, monkeypatch, install_dist(tmp_path / "site"), "--day0-set", "stages.sitecheck.limit=0.1")
    assert run["verdict"] == "rejected" and run["reason"].startswith("stage sitecheck fail: sitecheck.ratio")
    assert result.ret == 1


def test_a_site_stage_is_blocked_by_an_earlier_failure(pytester, monkeypatch, tmp_path):
    pytester.makepyfile(test_failing='''
        import pytest
        from day0.core.record import measured
        @pytest.mark.day0
        @pytest.mark.latency
        def test_slow(day0_checks):
            day0_checks.add(measured("latency.fake", "too slow", 9, 1, direction="lower_is_better"))
    ''')
    result, run, _ = _run(pytester, monkeypatch, install_dist(tmp_path / "site"), "test_failing.py")
    site = next(s for s in run["stages"] if s["name"] == "sitecheck")
    assert site["verdict"] == "blocked" and site["checks"][0]["id"] == "sitecheck.run"
    assert "stage latency failed" in site["checks"][0]["message"]


@pytest.mark.parametrize("override, message", [
    ('stages.sitecheck.limit="high"', "day0: stages.sitecheck.limit: Input should be a valid number"),
    ("stages.nope.x=1", "day0: stages.nope: no stage 'nope' is installed (`day0 stages` lists them)"),
])
def test_a_bad_site_stage_table_stops_the_run_before_it_starts(pytester, monkeypatch, tmp_path, override, message):
    pytester.makepyfile(test_standin=BUILTIN_STANDIN)
    monkeypatch.setenv("PYTHONPATH", str(install_dist(tmp_path / "site")))
    result = pytester.runpytest_subprocess("test_standin.py", "-m", "day0", "--day0-out", "out",
                                           "--day0-set", override)
    assert message in result.stderr.str(), result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR and not (pytester.path / "out").exists()
