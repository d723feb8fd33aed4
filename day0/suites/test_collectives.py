"""Stage 2 - collectives: every collective TP and PP rely on is exact, reaches the bandwidth the
topology promises, and uses the transport the topology promises; vLLM's own TP path agrees."""

from pathlib import Path

import pytest

from day0.stages.collectives import (
    collectives_port,
    engine_cross_node_check,
    links_check,
    load_result,
    nccl_log_text,
    result_checks,
    run_cluster,
    run_local,
    stage_transport_checks,
    tp_equivalence_check,
)

pytestmark = [pytest.mark.day0, pytest.mark.collectives]


@pytest.fixture(scope="module")
def settings(day0_profile):
    """The profile's [collectives] table, validated with the profile (CollectivesSection)."""
    return day0_profile.collectives


@pytest.fixture(scope="module")
def sweep(settings, day0_profile, day0_session, day0_repeat):
    """Ranks spawned here (one per local device), one torchrun per node of a multi-node cluster
    (started through its launcher), or the results torchrun/srun ranks wrote elsewhere; swept again
    for each --day0-repeat."""
    if settings.results_file:
        return load_result(Path(settings.results_file))
    out = day0_session.run_dir / "collectives" / (f"repeat{day0_repeat}" if day0_repeat else "")
    topology = day0_profile.topology
    if topology.nodes > 1:
        cluster = day0_session.engines.cluster()
        if cluster.multi_node:
            return run_cluster(settings, cluster, out, devices_per_node=topology.devices_per_node,
                               master_port=collectives_port(topology.master_port))
    return run_local(settings, settings.world_size, out)


def test_collectives_exact_and_fast(sweep, settings, day0_checks):
    """Exact results (#wrong = 0) and large-message busbw >= pass_fraction x expected."""
    day0_checks.extend(result_checks(sweep, settings))


def test_links_between_nodes(sweep, settings, day0_profile, day0_checks):
    """Point-to-point bandwidth between every pair of nodes, both directions: a slow link is named
    (skip on a single node)."""
    day0_checks.add(links_check(sweep, settings, nodes=None if settings.results_file else day0_profile.topology.nodes))


def test_transport_matches_topology(sweep, day0_profile, day0_checks):
    """NCCL used NVLink/P2P inside a node and the promised network across nodes; on gloo across
    nodes, every inter-node rank pair talked over the node addresses (the ranks' own sockets)."""
    day0_checks.extend(stage_transport_checks(sweep, nccl_log_text(sweep), day0_profile.topology))


@pytest.mark.day0_once
def test_engine_tp2_matches_tp1(request, day0_profile, day0_session, day0_checks):
    """vLLM's own communicator path: greedy tokens of a TP=2 engine equal the TP=1 engine's."""
    if not day0_profile.collectives.tp_equivalence:  # decided before the engine fixture starts anything
        pytest.skip("collectives.tp_equivalence is off (it starts a second engine)")
    if day0_profile.topology.device != "cpu":
        pytest.skip("on GPU targets a TP=1 reference rarely fits; compare against a golden file instead")
    day0_engine = request.getfixturevalue("day0_engine")
    base_tp = int(day0_profile.engine.args.get("tensor_parallel_size", 1))
    day0_checks.add(tp_equivalence_check(day0_engine, day0_session.engines, base_tp))


@pytest.mark.day0_once
def test_engine_traffic_crosses_nodes(request, day0_profile, day0_session, day0_checks):
    """An engine across nodes: vLLM's TP ranks hold connections between every pair of node addresses."""
    cluster = day0_session.engines.cluster()
    if not cluster.multi_node:
        pytest.skip("the engine runs on one node")
    if day0_profile.engine.mode != "server":
        pytest.skip(f"engine.mode = {day0_profile.engine.mode!r}: day0 did not start the engine's ranks")
    args = day0_profile.engine.args
    ranks = int(args.get("tensor_parallel_size", 1)) * int(args.get("pipeline_parallel_size", 1))
    if ranks < len(cluster.nodes):  # checked before the engine fixture starts anything
        pytest.skip(f"the engine's {ranks} rank(s) (TP x PP) cannot span {len(cluster.nodes)} nodes: "
                    "a collectives-only profile")
    info = request.getfixturevalue("day0_engine").info
    day0_checks.add(engine_cross_node_check(info.cross_node, [n.name for n in cluster.nodes],
                                            readable=cluster.emulated is not None))
