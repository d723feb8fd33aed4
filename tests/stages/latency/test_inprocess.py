"""The in-process latency path's pure parts (the live path runs in tests/harness/test_e2e.py)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from day0.config.latency import LatencySection, SlaSection
from day0.stages.latency import SettingsError
from day0.stages.latency.inprocess import engine_agreement, run_latency_inprocess

ms = st.lists(st.floats(min_value=1.0, max_value=5000.0), min_size=1, max_size=50)


@given(ms, st.floats(min_value=0.0, max_value=1000.0))
def test_agreement_fails_exactly_when_the_means_differ_beyond_tolerance(client, shift):
    s = LatencySection(agreement_rel=0.1)
    engine = [x + shift for x in client]
    check = engine_agreement(client, engine, s)
    mean = sum(client) / len(client)
    std = (sum((x - mean) ** 2 for x in client) / len(client)) ** 0.5
    allowed = 0.1 * mean + 3 * std / len(client) ** 0.5  # relative part + the run's own noise
    diff = abs(mean - sum(engine) / len(engine))
    assert check.status == ("pass" if round(diff, 3) <= round(allowed, 3) else "fail")


def test_agreement_without_engine_figures_is_a_skip_with_the_reason():
    check = engine_agreement([10.0], [], LatencySection())
    assert check.status == "skip" and "first_token_latency" in check.message


@pytest.mark.parametrize("table, key", [({"endpoint": "chat"}, "latency.endpoint"), ({"load": "rate"}, "latency.load")])
def test_settings_the_engine_cannot_honour_are_refused(table, key):
    with pytest.raises(SettingsError, match=key):
        run_latency_inprocess(object(), "m", 300, LatencySection.from_table(table))


def test_inprocess_checks_are_the_scheduler_views():
    from day0.client.loadgen import LoadShape, PhaseResult, RequestResult
    from day0.stages.latency import LatencyRun, compute_metrics, latency_checks
    from day0.stages.latency.inprocess import ENGINE_VIEW, inprocess_checks

    r = RequestResult(0, "main", 100.0, 100.0, 8, 2)
    r.msg_t, r.msg_n, r.output_tokens, r.ok, r.token_source = [0.01, 0.02], [1, 1], 2, True, "token_ids"
    m = compute_metrics(PhaseResult("main", LoadShape(), [r], 100.0, 101.0), [50, 99])
    run = LatencyRun("inprocess", "m", LatencySection(), SlaSection(), m, None, None, ENGINE_VIEW)
    agreement = engine_agreement([10.0], [10.0], LatencySection())
    checks = inprocess_checks(run, agreement)
    ids = [c.id for c in checks]
    assert "latency.server_agreement" not in ids and ids[-1] == "latency.engine_agreement"
    assert ids[:-1] == [c.id for c in latency_checks(run) if c.id != "latency.server_agreement"]
    assert {c.source for c in checks} == {"scheduler"}
