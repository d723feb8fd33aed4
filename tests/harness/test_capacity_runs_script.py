"""benchmarks/capacity_runs.py: issue 29's two targets counted over many side-by-side records, and
records that cannot be counted together refused in one line (no server)."""

import importlib.util
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO

spec = importlib.util.spec_from_file_location("capacity_runs", REPO / "benchmarks" / "capacity_runs.py")
runs_script = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = runs_script
spec.loader.exec_module(runs_script)

SLA = {"ttft_p99_ms": 300.0, "tpot_p99_ms": 40.0}
WORKLOAD = {"input_len": 128, "output_len": 32, "arrivals": "poisson", "ignore_eos": True}


def record(rounds: list[tuple[float | None, float, int, int]], **extra) -> dict:
    """A bench_capacity --json record: per round (day0 sustained, dense sustained, day0 requests,
    dense requests), and the ratios of the rounds' medians as the bench writes them."""
    def median(xs):
        xs = [x for x in xs if x]
        return statistics.median(xs) if xs else None
    d0 = median([r[0] for r in rounds]), median([r[2] for r in rounds])
    dense = median([r[1] for r in rounds]), median([r[3] for r in rounds])
    return {"seed": 1, "sla": SLA, "workload": WORKLOAD,
            "rounds": [{"day0": {"sustained": a, "requests": c}, "vllm": {"sustained": b, "requests": d}}
                       for a, b, c, d in rounds],
            "ratios_day0_over": {"vllm": {"sustained": d0[0] / dense[0] if d0[0] else None,
                                          "requests": d0[1] / dense[1]}}, **extra}


def write(tmp_path: Path, name: str, rec: dict) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(rec))
    return path


@pytest.mark.parametrize("sustained, agrees", [(1.0, True), (1.10, True), (1.11, False), (0.92, True),
                                                (0.905, False)])
def test_within_10_percent_is_the_larger_rate_over_the_smaller(sustained, agrees):
    assert runs_script.Pair(sustained, 0.4).agrees(1.10) is agrees


def test_each_run_and_each_round_is_counted_against_both_targets(tmp_path):
    paths = [write(tmp_path, "a", record([(40, 40, 2000, 6000), (44, 42, 3000, 6000)])),  # both
             write(tmp_path, "b", record([(50, 40, 2000, 6000), (50, 40, 2000, 6000)])),  # 1.25: cheap only
             write(tmp_path, "c", record([(40, 40, 3300, 6000), (40, 40, 3300, 6000)]))]  # 0.55: agrees only
    got = runs_script.summary(runs_script.read_runs(paths, "vllm"))
    assert got["over_runs"] == {"n": 3, "agree": 2, "spend": 2, "both": 1, "no_answer": 0,
                           "median_sustained": 1.0 * (42 / 41), "median_requests": 2500 / 6000}
    assert got["over_rounds"]["n"] == 6 and got["over_rounds"]["both"] == 2 and got["over_rounds"]["agree"] == 4


def test_a_round_without_an_answer_meets_neither_target_and_is_said(tmp_path):
    path = write(tmp_path, "a", record([(None, 40, 2000, 6000), (41, 40, 2000, 6000)]))
    (run,) = runs_script.read_runs([path], "vllm")
    assert run.rounds[0].sustained is None and not run.rounds[0].cheap(0.5) and not run.rounds[0].agrees(1.1)
    got = runs_script.summary([run])["over_rounds"]
    assert got["no_answer"] == 1 and got["both"] == 1 and got["median_sustained"] == 41 / 40
    assert "no answer on one side in 1" in runs_script.lines([run], "vllm")[-1]


def test_runs_of_another_setup_are_refused_but_a_record_without_one_and_other_rounds_are_not(tmp_path):
    setup = {"start_rate": 16.0, "dense_start": 16.0, "dense_step": 1.05, "dense_requests": 300, "rounds": 2,
             "scripted_slots": 0}
    old = write(tmp_path, "old", record([(40, 40, 2000, 6000)]))
    new = write(tmp_path, "new", record([(40, 40, 2000, 6000)], setup=setup))
    more = write(tmp_path, "more", record([(40, 40, 2000, 6000)], setup={**setup, "rounds": 4}))
    assert len(runs_script.read_runs([old, new, more], "vllm")) == 3
    other = write(tmp_path, "other", record([(40, 40, 2000, 6000)], setup={**setup, "dense_start": 4.0}))
    with pytest.raises(runs_script.BadRecord, match=r"other.json: setup: .*is not new.json's"):
        runs_script.read_runs([old, new, other], "vllm")


@pytest.mark.parametrize("name, content, where", [
    ("text", "not json", "(file)"),
    ("list", "[1, 2]", "(top level)"),
    ("no-ratio", json.dumps({**record([(40, 40, 2000, 6000)]), "ratios_day0_over": {}}), "ratios_day0_over.vllm"),
    ("bad-number", json.dumps(record([(40, 40, 2000, 6000)])).replace('"requests": 2000', '"requests": "2000"'),
     "rounds[0].day0.requests"),
    ("no-rounds", json.dumps({**record([(40, 40, 2000, 6000)]), "rounds": []}), "rounds"),
    ("other-sla", json.dumps({**record([(40, 40, 2000, 6000)]), "sla": {"ttft_p99_ms": 500.0}}), "sla"),
])
def test_a_record_that_cannot_be_counted_is_one_line_naming_the_file_and_key_exit_2(tmp_path, name, content, where):
    good = write(tmp_path, "good", record([(40, 40, 2000, 6000)]))
    bad = tmp_path / f"{name}.json"
    bad.write_text(content)
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "capacity_runs.py"), str(good), str(bad)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and run.stdout == ""
    (line,) = run.stderr.splitlines()
    assert line.startswith(f"capacity_runs: {bad}: {where}: ")


def test_the_printed_table_names_each_run_and_what_it_met_and_the_json_keeps_both(tmp_path):
    paths = [write(tmp_path, "cap-a", record([(40, 40, 2000, 6000)], code="abc1234")),
             write(tmp_path, "cap-b", record([(50, 40, 4000, 6000)]))]
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "capacity_runs.py"), *map(str, paths),
                          "--json", str(tmp_path / "out.json")], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    rows = run.stdout.splitlines()
    assert rows[1].split()[:5] == ["cap-a", "abc1234", "1.000", "0.333", "agree"]
    assert rows[2].split()[:5] == ["cap-b", "-", "1.250", "0.667", "-"]
    assert rows[3].startswith("over 2 runs: sustained within 1.1x in 1, requests at most 0.5 of vllm's in 1, "
                              "both in 1; medians 1.125 and 0.500")
    saved = json.loads((tmp_path / "out.json").read_text())
    assert [r["name"] for r in saved["runs"]] == ["cap-a", "cap-b"] and saved["over_runs"]["both"] == 1


def test_targets_that_cannot_be_met_or_missed_are_refused(tmp_path):
    good = write(tmp_path, "good", record([(40, 40, 2000, 6000)]))
    for flag, value in (("--agree", "0.9"), ("--spend", "0")):
        run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "capacity_runs.py"), str(good), flag, value],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 2 and "--agree at least 1 and --spend above 0" in run.stderr


def test_a_commit_is_shown_short_and_a_changed_checkout_says_so(tmp_path):
    full = "0123456789abcdef0123456789abcdef01234567"
    paths = [write(tmp_path, "clean", record([(40, 40, 2000, 6000)], code=full)),
             write(tmp_path, "dirty", record([(40, 40, 2000, 6000)], code=full + "-dirty"))]
    rows = runs_script.lines(runs_script.read_runs(paths, "vllm"), "vllm")
    assert rows[1].split()[1] == "012345678" and rows[2].split()[1] == "012345678-dirty"


def test_a_gzipped_record_counts_as_its_plain_twin_and_one_that_unpacks_too_large_is_refused(tmp_path, monkeypatch):
    """The runs behind docs/stages/capacity-evidence.md's counts are kept gzipped in the repo
    (benchmarks/records/capacity/), so the count is rerun from a checkout, not from a /tmp that went
    with its box; a record read is bounded, packed or not."""
    import gzip

    rec = record([(40, 44, 2000, 6000), (41, 40, 3200, 6000)])
    plain = write(tmp_path, "plain", rec)
    packed = tmp_path / "packed.json.gz"
    packed.write_bytes(gzip.compress(json.dumps(rec).encode()))
    a, _ = runs_script.read_run(plain, "vllm")
    b, _ = runs_script.read_run(packed, "vllm")
    assert (a.name, b.name) == ("plain", "packed") and (a.median, a.rounds) == (b.median, b.rounds)
    monkeypatch.setattr(runs_script, "MAX_RECORD_BYTES", 1000)
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip.compress(b" " * 10_000 + json.dumps(rec).encode()))  # 10 kB unpacked, 100 B packed
    with pytest.raises(runs_script.BadRecord, match=r"bomb.json.gz: \(file\): over 1,000 bytes unpacked"):
        runs_script.read_run(bomb, "vllm")
    torn = tmp_path / "torn.json.gz"
    torn.write_bytes(packed.read_bytes()[:40])
    with pytest.raises(runs_script.BadRecord, match=r"torn.json.gz: \(file\): not a JSON record"):
        runs_script.read_run(torn, "vllm")
