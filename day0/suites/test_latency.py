"""Stage 3 - latency: a reproducible workload against the engine, judged against the SLA (TTFT,
TPOT, ITL, E2E percentiles, throughput, goodput, error rate), with the engine's own view as a
cross-check: /metrics over HTTP, vLLM's per-request metrics in-process."""

from pathlib import Path

import pytest

from day0.client.workload import read_vocab
from day0.engine import local_model_dir, served_name
from day0.stages.latency import LatencySettings, SlaSettings, run_latency
from day0.stages.latency.inprocess import run_latency_inprocess

pytestmark = [pytest.mark.day0, pytest.mark.latency]


def _model_dir(profile) -> Path | None:
    path = local_model_dir(profile)
    return path if path is not None and (path / "tokenizer.json").is_file() else None


@pytest.fixture(scope="module")
def latency_checks(engine, day0_profile, day0_session, day0_repeat):
    """The measured load, run again for each --day0-repeat on the same engine."""
    model_dir = _model_dir(day0_profile)
    if model_dir is None:
        pytest.skip(f"synthetic prompts need the model's tokenizer.json locally; model.path "
                    f"{day0_profile.model.path!r} is not a local directory with one")
    settings = LatencySettings.from_table(day0_profile.latency)
    sla = SlaSettings.from_table(day0_profile.sla.model_dump(exclude_none=True))
    vocab = read_vocab(model_dir)
    if engine.view == "scheduler":  # engine.mode = "inprocess": drive vLLM's engine directly
        run, agreement = run_latency_inprocess(engine.llm, served_name(day0_profile), vocab, settings, sla,
                                               progress=day0_session.log)
        checks = [c for c in run.checks() if c.id != "latency.server_agreement"] + [agreement]
        for c in checks:
            c.source = "scheduler"
        return checks
    run = run_latency(engine.base_url, served_name(day0_profile), vocab, settings, sla, progress=day0_session.log)
    return run.checks()


def test_latency_meets_sla(latency_checks, day0_checks):
    """TTFT/TPOT/ITL/E2E percentiles, throughput, goodput and errors against [sla]; client vs engine."""
    day0_checks.extend(latency_checks)
