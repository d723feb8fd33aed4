"""``day0 latency import``: results other tools wrote, judged by the same checks and SLA.

The fixtures in tests/data were written by the tools themselves against the scripted server
(benchmarks/make_import_fixtures.py): ``vllm bench serve --save-result --save-detailed`` (12
requests; request 4 an HTTP 500, request 9 a stream cut after two messages; every third message
with empty text), the same without ``--save-detailed``, and a GuideLLM 0.8.1 report (8 requests
at 20 req/s Poisson, one HTTP 500). Expected figures are recomputed here from the raw file by
each tool's documented fields, never copied from day0's output.
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from day0.config.latency import SlaSection
from day0.core.inputs import InputError
from day0.core.record import load
from day0.stages.latency import main
from day0.stages.latency.importing import import_checks, read_result
from tests.support import DATA, hostile
from tests.support.vllm_results import detailed_result, tiny_result_text

VLLM = DATA / "vllm-bench-detailed.json"
VLLM_SUMMARY = DATA / "vllm-bench-summary.json"
GUIDELLM = DATA / "guidellm-report.json"


def _checks(path: Path) -> dict[str, dict]:
    return {c["id"]: c for c in json.loads(path.read_text())}


def test_a_vllm_result_becomes_the_stages_figures():
    raw = json.loads(VLLM.read_text())
    run = read_result(VLLM)
    sla = SlaSection.from_table({"ttft_p99_ms": 1000, "ttft_p50_ms": 1000, "max_error_rate": 0.2})
    m, checks = import_checks(run, sla, [50, 99])
    ok = [i for i, e in enumerate(raw["errors"]) if not e]
    assert (m.sent, m.completed, m.failed) == (12, len(ok), 12 - len(ok)) == (12, 10, 2)
    assert m.errors == {"http_error": 1, "dropped_stream": 1}
    # day0's TTFT runs from the scheduled send: vLLM's TTFT plus its client queue time
    want = sorted((raw["ttfts"][i] + raw["queue_times"][i]) * 1e3 for i in ok)
    assert sorted(m.samples["ttft"]) == pytest.approx(want, rel=1e-12)
    assert sorted(m.samples["itl"]) == pytest.approx(sorted(g * 1e3 for i in ok for g in raw["itls"][i]), rel=1e-9)
    tpot = sorted((raw["latencies"][i] - raw["ttfts"][i]) / (raw["output_lens"][i] - 1) * 1e3 for i in ok)
    assert sorted(m.samples["tpot"]) == pytest.approx(tpot, rel=1e-9)  # vLLM's own TPOT formula, same numbers
    assert m.duration_s == pytest.approx(raw["duration"]) and m.output_tokens == raw["total_output_tokens"]
    assert m.request_throughput == pytest.approx(raw["request_throughput"], rel=1e-9)
    by_id = {c.id: c for c in checks}
    assert by_id["latency.import"].value == "vllm bench serve" and by_id["latency.ttft_p50"].status == "pass"
    assert by_id["latency.ttft_p50"].value == pytest.approx(float(np.percentile(want, 50)), abs=1e-3)
    # ten requests bound a median, never a p99: the limit is not judged on a point estimate
    p99 = by_id["latency.ttft_p99"]
    assert p99.status == "error" and "10 requests cannot bound p99 within 1000 ms at 95%; 299 needed" in p99.message
    assert p99.evidence["point_estimate"] == pytest.approx(float(np.percentile(want, 99)), abs=1e-3)
    assert by_id["latency.error_rate"].status == "pass" and "server_agreement" not in " ".join(by_id)
    assert {c.source for c in checks} == {"import:vllm bench serve"}


def test_a_guidellm_report_becomes_the_stages_figures_without_a_per_message_itl():
    raw = json.loads(GUIDELLM.read_text())["benchmarks"][0]
    good = raw["requests"]["successful"]
    run = read_result(GUIDELLM)
    m, checks = import_checks(run, SlaSection.from_table({"itl_p99_ms": 50, "max_error_rate": 0.2}), [50, 99])
    assert (m.sent, m.completed, m.failed, m.errors) == (8, 7, 1, {"http_error": 1})
    t = [r["info"]["timings"] for r in good]
    assert sorted(m.samples["ttft"]) == pytest.approx(
        sorted((x["first_token_iteration"] - x["targeted_start"]) * 1e3 for x in t), rel=1e-9)
    assert sorted(m.samples["e2e"]) == pytest.approx(
        sorted((x["last_token_iteration"] - x["targeted_start"]) * 1e3 for x in t), rel=1e-9)
    # GuideLLM's "ITL" is (last - first) / (tokens - 1): day0's TPOT
    assert sorted(m.samples["tpot"]) == pytest.approx(sorted(r["inter_token_latency_ms"] for r in good), rel=1e-6)
    assert m.samples["itl"] == [] and m.stats["itl"].count == 0
    itl = {c.id: c for c in checks}["latency.itl_p99"]
    assert itl.status == "error" and "GuideLLM records no per-message times" in itl.message  # a limit it cannot judge
    assert m.duration_s == pytest.approx(raw["scheduler_metrics"]["measure_end_time"]
                                         - raw["scheduler_metrics"]["measure_start_time"])


def test_the_command_judges_by_the_same_sla_and_writes_a_run_day0_report_renders(tmp_path, capsys):
    args = ["import", str(VLLM), "--json", str(tmp_path / "c.json"), "--max-error-rate", "0.2"]
    assert main(args + ["--limit", "ttft_p50_ms=1000", "--goodput", "ttft:1000", "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "PASS   latency.ttft_p50" in out and "note: TTFT and E2E here run from the scheduled send" in out
    checks = _checks(tmp_path / "c.json")
    assert checks["latency.goodput"]["value"] == pytest.approx(checks["latency.request_throughput"]["value"])
    record = load(tmp_path / "run")
    assert record.verdict == "accepted" and [s.name for s in record.stages] == ["latency"]
    assert record.environment["tool"] == "vllm bench serve"
    # a p99 limit the file's 10 requests cannot bound: the run is INCOMPLETE, naming the count needed
    assert main(args + ["--ttft-p99-ms", "1000", "--out", str(tmp_path / "few")]) == 1
    assert load(tmp_path / "few").verdict == "incomplete"
    assert "could not measure: 10 requests cannot bound p99 within 1000 ms at 95%; 299 needed" in capsys.readouterr().out
    assert main(args + ["--ttft-p99-ms", "1"]) == 1  # the same file, a tighter SLA: rejected (10 samples bound
    # a p99 from below: the 9th smallest is under it at 95%, and it is past 1 ms)
    assert _checks(tmp_path / "c.json")["latency.ttft_p99"]["status"] == "fail"
    from day0.cli import main as day0

    assert day0(["report", str(tmp_path / "run")]) == 0 and (tmp_path / "run" / "report.html").is_file()


def test_a_zero_error_sla_fails_on_the_failures_the_tool_recorded(capsys):
    assert main(["import", str(GUIDELLM)]) == 1
    assert "FAIL   latency.error_rate" in capsys.readouterr().out


def _write(tmp_path: Path, name: str, obj) -> Path:
    p = tmp_path / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return p


def _broken(tmp_path: Path, edit) -> Path:
    raw = json.loads(VLLM.read_text())
    edit(raw)
    return _write(tmp_path, "r.json", raw)


@pytest.mark.parametrize("edit, named", [
    (lambda r: r.pop("ttfts"), "ttfts: missing (vllm bench serve writes per-request figures only with "
                               "--save-result --save-detailed)"),
    (lambda r: r["ttfts"].__setitem__(2, "fast"), "ttfts[2]: expected a number, got"),
    (lambda r: r["itls"].pop(), "itls: 11 entries, expected 12 (one per request)"),
    (lambda r: r["itls"][0].__setitem__(1, None), "itls[0][1]: expected a number, got null"),
    (lambda r: r.__setitem__("duration", -1), "duration: expected a number >= 0"),
    (lambda r: r.__setitem__("errors", "none"), "errors: expected a list, got"),
    (lambda r: r.__setitem__("burstiness", -1), "burstiness: expected a number > 0, got -1"),
])
def test_an_unusable_vllm_file_is_one_line_naming_file_and_key(tmp_path, capsys, edit, named):
    path = _broken(tmp_path, edit)
    assert main(["import", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"day0: {path}: ") and named in err and "\n" not in err


def test_unusable_files_are_refused_by_the_real_command(tmp_path):
    hostile.refused(hostile.day0("latency", "import", str(VLLM_SUMMARY)), VLLM_SUMMARY, problem="--save-detailed")
    hostile.refused(hostile.day0("latency", "import", str(_write(tmp_path, "x.json", "{nope"))), "x.json",
                    problem="not JSON")
    hostile.refused(hostile.day0("latency", "import", str(_write(tmp_path, "l.json", [1, 2]))), "l.json",
                    problem="neither a vllm bench serve result")
    hostile.refused(hostile.day0("latency", "import", str(tmp_path / "absent.json")), "absent.json",
                    problem="not found")


def test_a_file_of_several_runs_asks_which(tmp_path, capsys):
    raw = json.loads(GUIDELLM.read_text())
    raw["benchmarks"] = raw["benchmarks"] * 2
    path = _write(tmp_path, "two.json", raw)
    assert main(["import", str(path)]) == 2
    assert "benchmarks: 2 runs (0: poisson@20, 1: poisson@20); choose one with --benchmark N" in capsys.readouterr().err
    assert main(["import", str(path), "--benchmark", "1", "--max-error-rate", "0.2"]) == 0
    assert main(["import", str(path), "--benchmark", "2"]) == 2
    line = VLLM.read_text().strip()
    appended = _write(tmp_path, "appended.json", line + "\n" + line + "\n")  # vllm bench serve --append-result
    assert main(["import", str(appended), "--benchmark", "1", "--max-error-rate", "0.2"]) == 0


def test_a_sampled_guidellm_report_is_refused(tmp_path, capsys):
    raw = json.loads(GUIDELLM.read_text())
    raw["benchmarks"][0]["requests"]["successful"] = raw["benchmarks"][0]["requests"]["successful"][:3]
    path = _write(tmp_path, "s.json", raw)
    assert main(["import", str(path)]) == 2
    assert "benchmarks[0].requests.successful: 3 of 7 requests kept (GuideLLM sampled" in capsys.readouterr().err


@pytest.mark.parametrize("edit, named", [
    # a strategy's keys were named as if they sat on the benchmark itself (the hunt)
    (lambda b: b["config"]["strategy"].update(type_="poisson", rate="x"),
     "benchmarks[0].config.strategy.rate: expected a number"),
    (lambda b: b["config"]["strategy"].update(type_=3), "benchmarks[0].config.strategy.type_: expected text"),
    # a request group of the wrong kind read as no requests at all
    (lambda b: b.update(requests=[1]), "benchmarks[0].requests: expected an object, got a list"),
], ids=["rate", "type", "requests-a-list"])
def test_a_guidellm_value_of_the_wrong_kind_is_named_by_its_whole_path(tmp_path, capsys, edit, named):
    raw = json.loads(GUIDELLM.read_text())
    edit(raw["benchmarks"][0])
    assert main(["import", str(_write(tmp_path, "g.json", raw))]) == 2
    err = capsys.readouterr().err
    assert named in err and err.count("\n") == 1, err


def test_a_window_shorter_than_its_requests_is_widened_to_hold_them(tmp_path):
    """Each request may lie up to 1 ms outside the window a file claims (the tools' clocks), so a
    window of 1e-9 s around requests of 0.5 ms read as 3e11 req/s; throughput is over at least the
    span its requests took."""
    n = 30
    tiny = {"date": "x", "duration": 1e-9, "completed": n, "failed": 0, "request_rate": "inf",
            "ttfts": [0.0005] * n, "itls": [[] for _ in range(n)], "latencies": [0.0005] * n,
            "start_times": [100.0] * n, "errors": [""] * n, "input_lens": [8] * n, "output_lens": [1] * n}
    m, _ = import_checks(read_result(_write(tmp_path, "v.json", tiny)), SlaSection.from_table({}), [50])
    assert m.duration_s == pytest.approx(0.0005) and m.request_throughput == pytest.approx(n / 0.0005)


@pytest.mark.parametrize("config", [[1, 2], "poisson"])
def test_a_guidellm_benchmark_whose_config_is_not_an_object_is_one_line(tmp_path, capsys, config):
    raw = json.loads(GUIDELLM.read_text())
    raw["benchmarks"] = [{**raw["benchmarks"][0], "config": config}] * 2  # two: the labels are read to ask which
    path = _write(tmp_path, "c.json", raw)
    assert main(["import", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"day0: {path}: benchmarks: 2 runs (0: ?, 1: ?)") and "\n" not in err


@pytest.mark.parametrize("argv, line", [
    (["--percentiles=-1"], "--percentiles (item 1): input should be greater than or equal to 0, got -1.0"),
    (["--confidence", "2"], "--confidence: input should be less than 1, got 2.0"),
    (["--limit", "ttft_p99_ms=-5"], "--limit ttft_p99_ms: input should be greater than 0, got -5.0"),
])
def test_a_bad_flag_of_an_import_is_named_as_typed(argv, line, capsys):
    """Not the [latency]/[sla] key it sets: the one refusal line, exit 2, before the file is read."""
    assert main(["import", str(VLLM), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert line in err and "\n" not in err


def test_an_import_holds_a_few_bytes_for_each_byte_of_its_file(tmp_path):
    """A long run's detailed result holds millions of inter-token gaps. Each was a float object
    (32 bytes) in the requests' message times, in the pooled ITL list, again per token, and in a
    sorted copy for every percentile: 10.7 bytes traced per byte of this file, 5.5 with vLLM's
    full-precision floats (8 MB of gaps written as "0.0" took 620 MB). The times and the pooled
    gaps are arrays of doubles now and sorted as one: about 4 (2.4), the parse's own share."""
    path = _write(tmp_path, "long.json", detailed_result(300, 200, digits=4))  # 0.74 MB, 59,700 gaps
    sla = SlaSection.from_table({"itl_p99_ms": 50})
    import_checks(read_result(VLLM), sla, [50, 99])  # what a first import loads is code, not the file's
    tracemalloc.start()
    try:
        m, checks = import_checks(read_result(path), sla, [50, 99])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert m.stats["itl"].count == 300 * 199 and {c.id: c for c in checks}["latency.itl_p99"].status == "pass"
    assert peak < 6.5 * path.stat().st_size, f"{peak / path.stat().st_size:.1f} bytes per byte of the file"


def test_an_import_of_many_small_requests_holds_a_few_times_what_its_parse_holds(tmp_path):
    """Memory follows the request count: each request of one gap held about 1.2 KB traced (a
    RequestResult with a ``__dict__``, ten per-request float lists in the metrics, a rounded copy
    of TTFT and E2E in each scatter), 3.4 times what the parsed file itself held for it. Slotted
    requests, per-request samples as arrays of doubles and a scatter's y sharing the samples' list
    hold about 2.6 times. The reference is the parse of the same file, measured in this run."""
    from day0.core.inputs import strict_json

    n = 20_000
    path = _write(tmp_path, "small.json", detailed_result(n, 2, digits=4))  # one gap a request
    sla = SlaSection.from_table({"itl_p99_ms": 50})
    import_checks(read_result(VLLM), sla, [50, 99])  # what a first import loads is code, not the file's
    text = path.read_text()
    tracemalloc.start()
    try:
        doc = strict_json(text, str(path))
        parsed = tracemalloc.get_traced_memory()[0]
        del doc, text
        tracemalloc.reset_peak()
        m, checks = import_checks(read_result(path), sla, [50, 99])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert m.completed == n and m.stats["itl"].count == n
    assert peak < 3.0 * parsed, f"{peak / n:.0f} bytes per request, {parsed / n:.0f} in the parsed file"


def test_limits_at_percentiles_alike_to_six_digits_get_their_own_checks(tmp_path, capsys):
    """99.99999 and 99.99998 were both named 'p100' ({p:g}): one id, latency.itl_p100, recorded
    twice, and a p100 column. Each limit is now its own check; two keys for one percentile are
    refused in one line naming both (one of the two limits would silently be dropped)."""
    out = tmp_path / "checks.json"
    main(["import", str(VLLM), "--limit", "itl_p99_99999_ms=3.99", "--limit", "itl_p99_99998_ms=1",
          "--json", str(out)])
    ids = [c["id"] for c in json.loads(out.read_text())]
    assert len(ids) == len(set(ids)) and {"latency.itl_p99_99999", "latency.itl_p99_99998"} <= set(ids)
    assert "p100" not in out.read_text()
    capsys.readouterr()
    assert main(["import", str(VLLM), "--limit", "ttft_p99_9_ms=3", "--limit", "ttft_p99.90_ms=5"]) == 2
    err = capsys.readouterr().err.strip()
    assert "ttft_p99_9_ms and ttft_p99.90_ms: the same percentile" in err and "\n" not in err


@pytest.mark.parametrize("path, named", [(VLLM, "input_lens: more than 5 entries"),
                                         (GUIDELLM, "benchmarks[0].requests: 8 requests")])
def test_a_run_of_more_requests_than_an_import_holds_is_one_line(path, named, capsys, monkeypatch):
    """Memory follows the request count (about 0.8 KB each), not the file's bytes: 300,000 requests
    of one gap, 5 MB, held 310 MB, and a file at the 256 MiB cap could claim 15 million. Past
    MAX_REQUESTS the count is refused, naming it and the cap (here a cap of 5, the fixtures hold more):
    in a vLLM result by the parse, at the first list of one entry a request (input_lens is vLLM's)."""
    from day0.stages.latency import imported

    monkeypatch.setattr(imported, "MAX_REQUESTS", 5, raising=False)
    assert main(["import", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert named in err and "an import holds at most 5 requests" in err and "\n" not in err


def test_a_file_over_the_request_cap_is_refused_before_its_parse_builds_it(tmp_path, monkeypatch):
    """The count was checked once the file was parsed: 1,000,001 requests of one gap (41 MB) peaked
    at 536 MB resident to be refused, 4,000,000 (167 MB) at 1,988 MB. The parse now counts each list
    at the top level as it builds it and stops at the cap: here a cap of 1,000 and 100,000 such
    requests (4 MB), whose whole parse traced 11 times the file's bytes. Refused, the peak is what
    reading the file takes (its bytes, then its text: 2 times), not what parsing it would."""
    from day0.stages.latency import imported

    monkeypatch.setattr(imported, "MAX_REQUESTS", 1_000)
    path = tmp_path / "many.json"
    path.write_text(tiny_result_text(100_000))
    read_result(VLLM)  # what a first import loads is code, not the file's
    tracemalloc.start()
    try:
        with pytest.raises(InputError) as refused:
            read_result(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * path.stat().st_size, f"{peak / path.stat().st_size:.1f} bytes per byte of the file"
    assert str(refused.value) == (f"{path}: input_lens: more than 1,000 entries; an import holds at most 1,000 "
                                  "requests (about 0.8 KB of memory each): import a shorter run")
