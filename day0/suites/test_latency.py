"""Stage 3 - latency: a reproducible workload against the engine, judged against the SLA (TTFT,
TPOT, ITL, E2E percentiles, throughput, goodput, error rate), with the engine's own view as a
cross-check: /metrics over HTTP, vLLM's per-request metrics in-process."""

import pytest

from day0.stages import latency

pytestmark = [pytest.mark.day0, pytest.mark.latency]


@pytest.fixture(scope="module")
def latency_checks(day0_engine, day0_profile, day0_session, day0_repeat):
    """The measured load, run again for each --day0-repeat on the same engine."""
    try:
        return latency.run_stage(day0_engine, day0_profile, progress=day0_session.log, engines=day0_session.engines)
    except latency.NoTokenizer as exc:
        pytest.skip(str(exc))


def test_latency_meets_sla(latency_checks, day0_checks):
    """TTFT/TPOT/ITL/E2E percentiles, throughput, goodput and errors against [sla]; client vs engine."""
    day0_checks.extend(latency_checks)
