"""Hostile run records, statuses their own figures contradict: re-judged on every load, never believed.

A run record is data someone may have edited. A check whose value is past its limit but whose
status says ``pass`` (or inside it while it says ``fail``) is refused by every reader with one line
naming the check, its value, its limit and the claimed status (exit 2; ``verify`` fails, exit 1):
the report is not rendered, the page is not signed, the comparison does not run. Statuses the
figures cannot contradict are left as they are: a check without a limit, an ``exact`` check that
describes (not counts), ``error``/``skip``/``blocked``, a waived failure, a latency percentile
judged by its confidence bounds, and a ``fail`` whose figure was rounded onto its limit.
Cases run ``day0`` under the corpus's bounds (tests/support/hostile.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from day0.core import record_shape
from day0.core.events import EventLog
from day0.core.record import Check, load, run_verdict, stage_verdict, waivers_of
from day0.results.report import render
from day0.results.signoff import Signatory, keygen, parse_report, sign_report
from tests.support import hostile
from tests.support import run_factory as rf

# Where the checks sit in rf.accepted(): (stage, check)
SHARDS, LOAD_TIME = (0, 0), (0, 1)  # weights: exact 3 == 3, lower 31.5 <= 120
BUSBW = (1, 1)  # collectives: higher 4.6 >= 4.0
TTFT, THROUGHPUT = (2, 0), (2, 2)  # latency: lower 328.63 <= 2000, higher 812.5 >= 100
Change = dict[str, Any]


def _record(at: tuple[int, int], change: Change, stage_fail: bool = False) -> dict[str, Any]:
    """rf.accepted() as run.json with one check changed; a forged ``fail`` gets the stage and run
    verdicts it implies, so the status is the only contradiction in the file."""
    data = rf.accepted().to_dict()
    data["stages"][at[0]]["checks"][at[1]].update(change)
    if stage_fail:
        data["stages"][at[0]]["verdict"] = "fail"
        data["verdict"], data["reason"] = "rejected", "forged"
    return data


def _bounds(lower: float | None, upper: float | None) -> dict[str, Any]:
    """Confidence evidence as the latency stage writes it (day0/stages/latency/checks.py)."""
    return {"bounds": {"lower": lower, "upper": upper, "confidence": 0.95, "samples": 2000, "needed_for_upper": 299}}


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "run" / "run.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- forged statuses are refused

FORGED: dict[str, tuple[tuple[int, int], Change, bool, tuple[str, ...]]] = {
    # a pass past its limit, each direction
    "pass-past-a-lower-limit": (TTFT, {"value": 2500.0}, False, ("latency.ttft_p99", "'pass'", "2500.0", "2000.0")),
    "pass-under-a-higher-limit": (THROUGHPUT, {"value": 50.0}, False,
                                  ("latency.output_throughput", "'pass'", "50.0", ">= 100.0")),
    "pass-off-an-exact-count": (SHARDS, {"value": 2}, False, ("weights.shards_present", "'pass'", "value 2", "== 3")),
    "pass-busbw-under-its-line": (BUSBW, {"value": 1.2}, False, ("collectives.all_reduce_busbw", "1.2", "4.0")),
    # a pass that cannot be judged at all
    "pass-with-a-string-value": (LOAD_TIME, {"value": "fast"}, False, ("weights.load_time_s", "'fast'")),
    "pass-against-a-string-limit": (LOAD_TIME, {"limit": "120"}, False, ("weights.load_time_s", "'120'")),
    "pass-with-no-value": (TTFT, {"value": None}, False, ("latency.ttft_p99", "value None")),
    "pass-with-a-boolean-value": (LOAD_TIME, {"value": True}, False, ("weights.load_time_s", "True")),
    # with confidence evidence: a pass needs the upper bound within the limit, and its value too
    "pass-whose-upper-bound-is-past": (TTFT, {"value": 1900.0, **{"evidence": _bounds(1500.0, 2100.0)}}, False,
                                       ("latency.ttft_p99", "'pass'", "1500.0 .. 2100.0")),
    "pass-past-the-limit-with-bounds-inside": (TTFT, {"value": 2500.0, "evidence": _bounds(100.0, 1900.0)}, False,
                                               ("latency.ttft_p99", "2500.0")),
    "pass-without-an-upper-bound": (TTFT, {"evidence": _bounds(100.0, None)}, False, ("latency.ttft_p99", "None")),
    "higher-pass-whose-lower-bound-is-under": (THROUGHPUT, {"evidence": _bounds(90.0, 900.0)}, False,
                                               ("latency.output_throughput", "90.0 .. 900.0")),
    # a fail inside its limit, each direction
    "fail-inside-a-lower-limit": (TTFT, {"status": "fail"}, True, ("latency.ttft_p99", "'fail'", "328.63", "2000.0")),
    "fail-above-a-higher-limit": (THROUGHPUT, {"status": "fail"}, True, ("latency.output_throughput", "'fail'")),
    "fail-at-its-exact-count": (SHARDS, {"status": "fail"}, True, ("weights.shards_present", "'fail'", "value 3")),
    "fail-whose-lower-bound-is-inside": (TTFT, {"status": "fail", "value": 2500.0, "evidence": _bounds(1500.0, 3000.0)},
                                         True, ("latency.ttft_p99", "'fail'", "1500.0 .. 3000.0")),
    # a fail just past the rounding it is allowed (ROUNDING, 5e-4 of the unit): the slack stays that small
    "fail-a-hair-past-the-rounding-of-a-higher-limit": (BUSBW, {"status": "fail", "value": 4.001}, True,
                                                        ("collectives",)),
    "fail-whose-lower-bound-is-a-hair-inside": (TTFT, {"status": "fail", "value": 2100.0,
                                                       "evidence": _bounds(1999.99, 2300.0)},
                                                True, ("latency.ttft_p99", "'fail'")),
}


@pytest.mark.parametrize("case", list(FORGED))
def test_a_status_its_figures_contradict_is_refused_naming_the_check(tmp_path: Path, case: str) -> None:
    at, change, stage_fail, words = FORGED[case]
    path = _write(tmp_path, _record(at, change, stage_fail))
    line = hostile.refused(hostile.day0("report", path), path, problem=("contradicts itself", *words))
    assert f"stages[{at[0]}].checks[{at[1]}].status" in line
    assert not (path.parent / "report.html").exists()


# --------------------------------------------------------------------------- statuses the figures cannot contradict


def _waived() -> dict[str, Any]:
    """rf.rejected() with its failed TTFT waived by the profile: the check stays ``fail``."""
    rec = rf.rejected()
    rec.profile = {**rec.profile, "report": {"waivers": [{"check": "latency.ttft_p99", "reason": "known, ticket 7"}]}}
    waivers = waivers_of(rec.profile)
    for s in rec.stages:
        s.verdict = stage_verdict(s.checks, waivers, rec.started_at)
    rec.verdict, rec.reason = run_verdict(rec.stages, True, waivers=waivers, on=rec.started_at)
    assert rec.verdict == "accepted" and rec.stages[2].checks[0].status == "fail"
    return rec.to_dict()


def _errored() -> dict[str, Any]:
    """A TTFT the harness could not judge (``error``), its point estimate past the limit: not re-judged."""
    data = _record(TTFT, {"status": "error", "value": 5000.0})
    data["stages"][2]["verdict"] = "error"
    data["verdict"], data["reason"] = "incomplete", "could not measure: latency.ttft_p99"
    return data


def _added(check: Check) -> Callable[[], dict[str, Any]]:
    def make() -> dict[str, Any]:
        data = rf.accepted().to_dict()
        data["stages"][1]["checks"].append(check.to_dict())
        return data
    return make


LEGITIMATE: dict[str, tuple[Callable[[], dict[str, Any]], str]] = {
    "no-limit-any-value": (lambda: _record(TTFT, {"limit": None, "value": 99999.0}), "accepted"),
    "exact-description-not-a-count": (_added(Check("collectives.transport.intra_node", "transport", "pass",
                                                   value="NVLink x8", limit="nvlink", direction="exact")), "accepted"),
    "upper-bound-on-the-limit": (lambda: _record(TTFT, {"value": 1990.0, "evidence": _bounds(1500.0, 2000.0)}),
                                 "accepted"),
    "fail-whose-bound-was-rounded-onto-its-limit": (
        lambda: _record(TTFT, {"status": "fail", "value": 2000.0, "evidence": _bounds(2000.0, 2300.0)}, True),
        "rejected"),
    "fail-a-rounding-inside-a-higher-limit": (lambda: _record(BUSBW, {"status": "fail", "value": 4.0004}, True),
                                              "rejected"),
    "error-past-its-limit": (_errored, "incomplete"),
    "waived-failure": (_waived, "accepted"),
    "factory-rejected": (lambda: rf.rejected().to_dict(), "rejected"),
    "factory-blocked": (lambda: rf.blocked_stages().to_dict(), "rejected"),
}


@pytest.mark.parametrize("case", list(LEGITIMATE))
def test_a_status_its_figures_allow_stands(tmp_path: Path, case: str) -> None:
    make, verdict = LEGITIMATE[case]
    path = _write(tmp_path, make())
    out = hostile.day0("report", path)
    assert out.code == 0 and (path.parent / "report.html").is_file(), out.explain()
    assert load(path).verdict == verdict


# --------------------------------------------------------------------------- every reader, every source


def test_compare_and_history_refuse_a_forged_record_too(tmp_path: Path) -> None:
    bad = _write(tmp_path / "bad", _record(TTFT, {"value": 2500.0}))
    base = rf.accepted()
    base.run_id = "run-baseline"
    ok = rf.write(base, tmp_path / "base")
    hostile.refused(hostile.day0("compare", bad, "--baseline", ok), bad, problem="latency.ttft_p99")
    hostile.refused(hostile.day0("compare", ok, "--baseline", bad), bad, problem="latency.ttft_p99")
    hostile.refused(hostile.day0("history", "add", bad, "--history", tmp_path / "history"), bad,
                    problem="latency.ttft_p99")


def test_a_forged_check_in_the_event_log_is_skipped_and_the_run_never_accepted(tmp_path: Path) -> None:
    run = tmp_path / "run"
    log = EventLog(run / "events.jsonl")
    log.run_started("run-forged", {"host": "h"}, {"name": "p"}, ["latency"])
    log.check("latency", Check("latency.ttft_p99", "TTFT p99", "pass", value=2500.0, limit=2000.0, unit="ms",
                               direction="lower_is_better"))
    log.check("latency", Check("latency.tpot_p99", "TPOT p99", "pass", value=25.0, limit=200.0, unit="ms",
                               direction="lower_is_better"))
    log.run_finished(0)
    out = hostile.day0("record", "rebuild", run)
    hostile.refused(out, f"{run / 'events.jsonl'}:2", code=0, problem=["latency.ttft_p99", "2500.0"])
    record = load(run)
    assert record.verdict == "incomplete" and [c.id for c in record.checks()] == ["latency.tpot_p99"]


def _forged_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A page embedding a forged record, as a day0 without re-judging (or a hand) would make it."""
    monkeypatch.setattr(record_shape, "misjudged", lambda check: None)
    run = _write(tmp_path, _record(TTFT, {"value": 2500.0}))
    return render(run, tmp_path / "run" / "report.html")


def test_sign_refuses_a_page_whose_record_claims_a_false_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report = _forged_report(tmp_path, monkeypatch)
    keys = keygen(tmp_path / "keys", "ada")
    out = hostile.day0("sign", report, "--key", keys[0], "--signer", "Ada Lovelace, Infra lead")
    hostile.refused(out, report, problem=["latency.ttft_p99", "'pass'", "2500.0", "2000.0"])
    assert parse_report(report).entries == []


def test_verify_fails_a_signed_page_whose_record_claims_a_false_pass(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    report = _forged_report(tmp_path, monkeypatch)
    keys = keygen(tmp_path / "keys", "ada")
    sign_report(report, keys[0], Signatory("Ada Lovelace", "Infra lead"))  # still without re-judging
    monkeypatch.undo()
    out = hostile.day0("verify", report, "--pubkey", keys[1])
    assert out.code == 1 and "Traceback" not in out.stderr, out.explain()
    assert "latency.ttft_p99 claims 'pass'" in out.stdout + out.stderr, out.explain()
