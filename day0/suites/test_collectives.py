"""Stage 2 - collectives: every collective TP and PP rely on is exact, reaches the bandwidth the
topology promises, and uses the transport the topology promises; vLLM's own TP path agrees."""

from pathlib import Path

import pytest

from day0.config.profile import LOCAL_COLLECTIVES_KEYS
from day0.stages.collectives import CollectivesSettings, load_result, nccl_log_text, result_checks, run_local
from day0.stages.collectives.nccl_logs import transport_checks

pytestmark = [pytest.mark.day0, pytest.mark.collectives]

TP_PROMPTS = ["The supernode serves", "Paged attention keeps blocks", "A signed report says"]
TP_TOKENS = 12


@pytest.fixture(scope="module")
def settings(day0_profile):
    return CollectivesSettings.from_mapping(
        {k: v for k, v in day0_profile.collectives.items() if k not in LOCAL_COLLECTIVES_KEYS})


@pytest.fixture(scope="module")
def sweep(settings, day0_profile, day0_session, day0_repeat):
    """Ranks spawned here (one per local device), or the results torchrun/srun ranks wrote;
    swept again for each --day0-repeat."""
    results_file = day0_profile.collectives.get("results_file")
    if results_file:
        return load_result(Path(results_file))
    out = day0_session.run_dir / "collectives" / (f"repeat{day0_repeat}" if day0_repeat else "")
    return run_local(settings, settings.world_size, out)


def test_collectives_exact_and_fast(sweep, settings, day0_checks):
    """Exact results (#wrong = 0) and large-message busbw >= pass_fraction x expected."""
    for check in result_checks(sweep, settings):
        check.source = check.source or f"torch.distributed/{sweep.backend}"
        day0_checks.add(check)


def test_transport_matches_topology(sweep, day0_profile, day0_checks):
    """NCCL used NVLink/P2P inside a node and the promised network across nodes (skip on gloo)."""
    for check in transport_checks(nccl_log_text(sweep), day0_profile.topology, backend=sweep.backend):
        day0_checks.add(check)


@pytest.mark.day0_once
def test_engine_tp2_matches_tp1(engine, day0_profile, day0_session, day0_checks):
    """vLLM's own communicator path: greedy tokens of a TP=2 engine equal the TP=1 engine's."""
    if not day0_profile.collectives.get("tp_equivalence", False):
        pytest.skip("collectives.tp_equivalence is off (it starts a second engine)")
    if day0_profile.topology.device != "cpu":
        pytest.skip("on GPU targets a TP=1 reference rarely fits; compare against a golden file instead")
    base_tp = int(day0_profile.engine.args.get("tensor_parallel_size", 1))
    other_tp = 2 if base_tp == 1 else 1
    reference = engine.greedy(TP_PROMPTS, TP_TOKENS)
    # CPU workers bind OpenMP threads per rank: one core each (shared/notes/vllm-cpu.md)
    with day0_session.engines.variant(f"tp{other_tp}", {"tensor_parallel_size": other_tp},
                                      {"VLLM_CPU_OMP_THREADS_BIND": "0|1"} if other_tp == 2 else None) as other:
        candidate = other.greedy(TP_PROMPTS, TP_TOKENS)
    differ = [p for p, a, b in zip(TP_PROMPTS, reference, candidate) if a.token_ids != b.token_ids]
    day0_checks.measured(
        f"collectives.engine_tp{other_tp}_matches_tp{base_tp}",
        f"Greedy tokens with TP={other_tp} equal TP={base_tp}", len(differ), 0, unit="prompts",
        direction="exact", source=engine.view,
        message=(f"TP={other_tp} and TP={base_tp} give identical greedy tokens for {len(TP_PROMPTS)} prompts"
                 if not differ else f"TP={other_tp} differs from TP={base_tp} for {differ}"),
        evidence={"prompts": TP_PROMPTS, f"tp{base_tp}": [c.token_ids for c in reference],
                  f"tp{other_tp}": [c.token_ids for c in candidate]},
    )
