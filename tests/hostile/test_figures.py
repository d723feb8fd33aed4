"""Hostile inputs, figures that cannot be true: ``day0 latency import`` of results no tool could write.

A vLLM bench result or a GuideLLM report is data from outside. A figure outside its domain (a
negative duration, a first token before the send, a zero-length window, more tokens than the
stream could carry, a count that is not a whole number: docs/metrics.md, "Domains") must never
become a PASS. One such request is left out of every figure and named in an ``error`` check (the
run is INCOMPLETE); a file with nothing usable left, or a window that cannot hold its requests, is
refused in one line (exit 2). A count is never spread into a per-token list, so a claim of 2e9
tokens costs nothing. Every case runs the real command under the corpus's bounds
(tests/support/hostile.py), on the fixtures the tools wrote (tests/data), edited one field at a time.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support import DATA, hostile

VLLM = DATA / "vllm-bench-detailed.json"
GUIDELLM = DATA / "guidellm-report.json"
# Limits the untouched fixtures meet, at percentiles their few requests can bound: a case that fails
# them fails because of its edit, and an edit that went unnoticed would show as a pass.
SLA = ["--max-error-rate", "0.2", "--limit", "ttft_p50_ms=1000", "--limit", "tpot_p50_ms=1000",
       "--limit", "e2e_p50_ms=1000", "--min-request-throughput", "1", "--min-output-throughput", "1"]
Edit = Callable[[dict[str, Any]], Any]


def _import(tmp_path: Path, raw: dict[str, Any] | str) -> tuple[Path, hostile.Outcome]:
    path = tmp_path / "result.json"
    path.write_text(raw if isinstance(raw, str) else json.dumps(raw), encoding="utf-8")
    return path, hostile.day0("latency", "import", path, *SLA, "--out", tmp_path / "run")


def _left_out(out: hostile.Outcome, named: str) -> str:
    """The request was left out and named: exit 1, an ``error`` import check naming the field, the run
    INCOMPLETE, no traceback."""
    assert out.code == 1 and "Traceback" not in out.stderr, out.explain()
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("ERROR  latency.import")), "")
    assert "could not measure" in line and "cannot be true" in line, out.explain()
    assert named in line, f"the error check does not name {named!r}\n{out.explain()}"
    assert "(verdict incomplete;" in out.stdout, out.explain()
    return line


def _vllm(edit: Edit) -> dict[str, Any]:
    raw = json.loads(VLLM.read_text(encoding="utf-8"))
    edit(raw)
    return raw


def _guidellm(edit: Edit) -> dict[str, Any]:
    raw = json.loads(GUIDELLM.read_text(encoding="utf-8"))
    edit(raw["benchmarks"][0])
    return raw


def _set(key: str, i: int, value: Any) -> Edit:
    return lambda r: r[key].__setitem__(i, value)


def _good(b: dict[str, Any], i: int = 0) -> dict[str, Any]:
    return b["requests"]["successful"][i]


def _timing(i: int, key: str, value: Callable[[dict[str, Any]], Any]) -> Edit:
    """Set successful request ``i``'s ``info.timings[key]`` from its own timings."""
    def edit(b: dict[str, Any]) -> None:
        t = _good(b, i)["info"]["timings"]
        t[key] = value(t)
    return edit


def _field(i: int, key: str, value: Callable[[dict[str, Any]], Any]) -> Edit:
    """Set successful request ``i``'s own ``key`` from the request."""
    def edit(b: dict[str, Any]) -> None:
        _good(b, i)[key] = value(_good(b, i))
    return edit


def _both(*edits: Edit) -> Edit:
    return lambda r: [e(r) for e in edits]


# --------------------------------------------------------------------------- the untouched fixtures


@pytest.mark.parametrize("fixture", [VLLM, GUIDELLM], ids=["vllm", "guidellm"])
def test_the_fixtures_as_the_tools_wrote_them_are_accepted(tmp_path: Path, fixture: Path) -> None:
    """The control: the same SLA on the unedited files passes, so every case below fails by its edit."""
    _, out = _import(tmp_path, fixture.read_text(encoding="utf-8"))
    assert out.code == 0 and "(verdict accepted;" in out.stdout and "ERROR" not in out.stdout, out.explain()


# --------------------------------------------------------------------------- vllm bench serve: one request


def _ends_before_its_last_token(r: dict[str, Any]) -> None:
    r["latencies"][0] = r["ttfts"][0] + sum(r["itls"][0]) / 2


def _sent_before_the_window(r: dict[str, Any]) -> None:
    r["start_times"][0] -= 100.0


A_YEAR = 3.2e7  # s: past imported.MAX_DURATION_S (1e7), which no request or run lasts


VLLM_LEFT_OUT: dict[str, tuple[Edit, str]] = {
    "negative-queue-time": (_set("queue_times", 0, -5.0), "queue_times[0]: expected a number >= 0"),
    "negative-ttft": (_set("ttfts", 0, -0.01), "ttfts[0]"),
    "negative-inter-token-gap": (lambda r: r["itls"][0].__setitem__(2, -0.002), "itls[0][2]"),
    "end-before-start": (_set("latencies", 0, -1.0), "latencies[0]"),
    "end-before-its-last-token": (_ends_before_its_last_token, "latencies[0]"),
    "1e9-tokens-over-5-gaps": (_set("output_lens", 0, 10**9), "output_lens[0]: 1000000000 output tokens over 6"),
    "1.7e308-tokens": (_set("output_lens", 0, 1.7e308), "output_lens[0]: expected a count"),
    "fewer-tokens-than-gaps": (_set("output_lens", 0, 2), "output_lens[0]: 2 output tokens, but"),
    "fractional-tokens": (_set("output_lens", 0, 5.5), "output_lens[0]: expected a count"),
    "negative-tokens": (_set("output_lens", 0, -3), "output_lens[0]: expected a count"),
    "1e300-prompt-tokens": (_set("input_lens", 0, 1e300), "input_lens[0]: expected a count"),
    "fractional-prompt-tokens": (_set("input_lens", 0, 0.5), "input_lens[0]: expected a count"),
    "negative-prompt-tokens": (_set("input_lens", 0, -1), "input_lens[0]"),
    "sent-before-the-window": (_sent_before_the_window, "start_times[0]: sent"),
    "failed-request-ends-before-it-starts": (_set("latencies", 4, -1.0), "latencies[4]"),
    # durations past any request's: were left out as ending after the window, or kept (a queue wait)
    "gaps-of-1e200-s": (lambda r: r["itls"].__setitem__(0, [1e200] * 5), "itls[0][0]: 1e+200 s: longer than 1e+07 s"),
    "first-token-a-year-after-the-send": (_set("ttfts", 0, A_YEAR), "ttfts[0]: 3.2e+07 s: longer than"),
    "queued-a-year": (_set("queue_times", 0, A_YEAR), "queue_times[0]: 3.2e+07 s: longer than"),
}


@pytest.mark.parametrize("case", list(VLLM_LEFT_OUT))
def test_a_vllm_request_outside_its_domain_is_left_out_and_named(tmp_path: Path, case: str) -> None:
    edit, named = VLLM_LEFT_OUT[case]
    _left_out(_import(tmp_path, _vllm(edit))[1], named)


# --------------------------------------------------------------------------- vllm bench serve: the file


def _every_gap_and_the_window_1e200_s(r: dict[str, Any]) -> None:
    """Consistent, but no run's: its gaps' squares in ms overflowed the variance (a traceback)."""
    for i, gaps in enumerate(r["itls"]):
        r["itls"][i] = [1e200] * len(gaps)
        r["latencies"][i] = r["ttfts"][i] + sum(r["itls"][i])
    r["duration"] = 1e201


def _every(key: str, value: Any) -> Edit:
    return lambda r: r.__setitem__(key, [value] * len(r[key]))


def _text(edit: Callable[[str], str]) -> str:
    text = VLLM.read_text(encoding="utf-8")
    edited = edit(text)
    assert edited != text
    return edited


VLLM_REFUSED: dict[str, tuple[Callable[[], dict[str, Any] | str], tuple[str, ...]]] = {
    "zero-length-window": (lambda: _vllm(lambda r: r.__setitem__("duration", 0)), ("duration:", "0 s")),
    "negative-window": (lambda: _vllm(lambda r: r.__setitem__("duration", -1)), ("duration:", ">= 0")),
    "window-shorter-than-its-requests": (lambda: _vllm(lambda r: r.__setitem__("duration", 1e-6)),
                                         ("start_times[", "before the run's window", "nothing left")),
    "every-queue-time-negative": (lambda: _vllm(_every("queue_times", -5.0)), ("queue_times[0]", "nothing left")),
    "every-count-1.7e308": (lambda: _vllm(_every("output_lens", 1.7e308)), ("output_lens[0]", "nothing left")),
    "nan-ttft": (lambda: _text(lambda t: t.replace('"ttfts": [0.017450204000851954', '"ttfts": [NaN', 1)),
                 ("NaN",)),
    "infinite-duration": (lambda: _text(lambda t: t.replace('"duration": 0.2836420479998196',
                                                            '"duration": Infinity', 1)), ("Infinity",)),
    "duration-1e999": (lambda: _text(lambda t: t.replace('"duration": 0.2836420479998196', '"duration": 1e999', 1)),
                       ("1e999",)),
    "boolean-token-count": (lambda: _vllm(_set("output_lens", 0, True)), ("output_lens[0]", "true")),
    "every-gap-and-the-window-1e200-s": (lambda: _vllm(_every_gap_and_the_window_1e200_s),
                                         ("duration:", "1e+201 s: longer than")),
}


@pytest.mark.parametrize("case", list(VLLM_REFUSED))
def test_a_vllm_result_with_nothing_true_left_is_refused_in_one_line(tmp_path: Path, case: str) -> None:
    make, words = VLLM_REFUSED[case]
    path, out = _import(tmp_path, make())
    hostile.refused(out, path, problem=words)


# --------------------------------------------------------------------------- GuideLLM: one request


def _sent_before_measuring(b: dict[str, Any]) -> None:
    t = _good(b)["info"]["timings"]
    for key in ("targeted_start", "request_start"):
        t[key] = b["scheduler_metrics"]["measure_start_time"] - 10.0


def _last_token_after_measuring(b: dict[str, Any]) -> None:
    end = b["scheduler_metrics"]["measure_end_time"]
    _good(b)["info"]["timings"]["last_token_iteration"] = end + 5.0
    _good(b)["request_end_time"] = end + 6.0


def _errored_ends_before_it_starts(b: dict[str, Any]) -> None:
    r = b["requests"]["errored"][0]
    r["request_end_time"] = r["info"]["timings"]["request_start"] - 1.0


SUCCESSFUL = "benchmarks[0].requests.successful[0]"
GUIDELLM_LEFT_OUT: dict[str, tuple[Edit, str]] = {
    "first-token-before-its-start": (_timing(0, "first_token_iteration", lambda t: t["request_start"] - 1.0),
                                     f"{SUCCESSFUL}.info.timings.first_token_iteration"),
    "first-token-before-its-targeted-start": (_timing(0, "targeted_start", lambda t: t["first_token_iteration"] + 0.5),
                                              "first_token_iteration: -0.5 s after its targeted_start"),
    "last-token-before-the-first": (_timing(0, "last_token_iteration", lambda t: t["first_token_iteration"] - 0.01),
                                    f"{SUCCESSFUL}.info.timings.last_token_iteration"),
    "end-before-start": (_field(0, "request_end_time", lambda r: r["info"]["timings"]["request_start"] - 1.0),
                         f"{SUCCESSFUL}.request_end_time"),
    "end-before-its-last-token": (_field(0, "request_end_time",
                                         lambda r: r["info"]["timings"]["last_token_iteration"] - 0.001),
                                  f"{SUCCESSFUL}.request_end_time"),
    "2e9-tokens": (_field(0, "output_tokens", lambda r: 2 * 10**9), f"{SUCCESSFUL}.output_tokens: 2000000000"),
    "1.7e308-tokens": (_field(0, "output_tokens", lambda r: 1.7e308), f"{SUCCESSFUL}.output_tokens: expected a count"),
    "one-token-over-two-instants": (_field(0, "output_tokens", lambda r: 1), f"{SUCCESSFUL}.output_tokens: 1 output"),
    "fractional-tokens": (_field(0, "output_tokens", lambda r: 5.5), f"{SUCCESSFUL}.output_tokens"),
    "negative-tokens": (_field(0, "output_tokens", lambda r: -1), f"{SUCCESSFUL}.output_tokens"),
    "1e300-prompt-tokens": (_field(0, "prompt_tokens", lambda r: 1e300), f"{SUCCESSFUL}.prompt_tokens"),
    "no-token-iteration-but-a-first-token": (_timing(0, "token_iterations", lambda t: 0),
                                             f"{SUCCESSFUL}.info.timings.token_iterations"),
    "sent-before-the-window": (_sent_before_measuring, f"{SUCCESSFUL}.info.timings.request_start: sent"),
    "last-token-after-the-window": (_last_token_after_measuring, f"{SUCCESSFUL}.info.timings.last_token_iteration"),
    "errored-request-ends-before-it-starts": (_errored_ends_before_it_starts,
                                              "benchmarks[0].requests.errored[0].request_end_time"),
    "first-token-a-year-after-its-start": (_timing(0, "first_token_iteration", lambda t: t["request_start"] + A_YEAR),
                                           "first_token_iteration: 3.2e+07 s after its request_start: longer than"),
    "ends-a-year-after-its-start": (_field(0, "request_end_time", lambda r: r["info"]["timings"]["request_start"]
                                           + A_YEAR), "request_end_time: 3.2e+07 s after its request_start: longer"),
}


@pytest.mark.parametrize("case", list(GUIDELLM_LEFT_OUT))
def test_a_guidellm_request_outside_its_domain_is_left_out_and_named(tmp_path: Path, case: str) -> None:
    edit, named = GUIDELLM_LEFT_OUT[case]
    _left_out(_import(tmp_path, _guidellm(edit))[1], named)


# --------------------------------------------------------------------------- GuideLLM: the report


def _only_impossible_requests(b: dict[str, Any]) -> None:
    for r in b["requests"]["successful"]:
        r["info"]["timings"]["first_token_iteration"] = r["info"]["timings"]["request_start"] - 1.0
    b["requests"]["errored"] = []
    b["metrics"]["request_totals"]["errored"] = 0


def _measure(key: str, value: Callable[[dict[str, Any]], float]) -> Edit:
    return lambda b: b["scheduler_metrics"].__setitem__(key, value(b["scheduler_metrics"]))


GUIDELLM_REFUSED: dict[str, tuple[Edit, tuple[str, ...]]] = {
    "zero-length-window": (_measure("measure_end_time", lambda m: m["measure_start_time"]),
                           ("scheduler_metrics.measure_end_time", "0 s")),
    "negative-window": (_measure("measure_end_time", lambda m: m["measure_start_time"] - 1.0),
                        ("scheduler_metrics.measure_end_time", ">=")),
    "every-first-token-before-its-start": (_only_impossible_requests,
                                           ("first_token_iteration", "nothing left to judge")),
    "boolean-token-count": (_field(0, "output_tokens", lambda r: True), ("output_tokens", "true")),
    "window-of-a-year": (_measure("measure_end_time", lambda m: m["measure_start_time"] + A_YEAR),
                         ("scheduler_metrics.measure_end_time", "after measure_start_time: longer than")),
}


@pytest.mark.parametrize("case", list(GUIDELLM_REFUSED))
def test_a_guidellm_report_with_nothing_true_left_is_refused_in_one_line(tmp_path: Path, case: str) -> None:
    edit, words = GUIDELLM_REFUSED[case]
    path, out = _import(tmp_path, _guidellm(edit))
    hostile.refused(out, path, problem=words)


# --------------------------------------------------------------------------- memory: claims are not lists


def test_a_claim_of_2e9_tokens_the_file_backs_costs_no_memory(tmp_path: Path) -> None:
    """2e9 tokens over 2e9 token iterations is consistent, so within its domain: the import must still
    not build a 2e9-entry per-token list (it did, MemoryError under the corpus's 1 GiB)."""
    raw = _guidellm(_both(_field(0, "output_tokens", lambda r: 2 * 10**9),
                          _timing(0, "token_iterations", lambda t: 2 * 10**9)))
    _, out = _import(tmp_path, raw)
    assert out.code in (0, 1) and "Traceback" not in out.stderr and "MemoryError" not in out.stderr, out.explain()
    assert "run folder:" in out.stdout, out.explain()

