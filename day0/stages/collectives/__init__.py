"""Stage 2: collectives on torch.distributed (NCCL on GPUs, gloo on CPUs), measured like nccl-tests.

Every collective TP and PP rely on (all_reduce, all_gather, reduce_scatter, all_to_all,
broadcast, send/recv along the ring), and expert parallelism's all-to-all with the uneven splits of
a MoE routing (expert_dispatch, expert_combine), is swept over message sizes, timed, and checked
element by element against inputs whose sums are exact in the dtype; large-message busbw is held to what
the topology promises, and NCCL's own log to the transport it promises. Ranks are started by
real launchers (:func:`run_local` on this host, :func:`run_cluster` one torchrun per node; torchrun / srun run
``python -m day0.stages.collectives run`` on supernodes); a rank that dies or hangs is named.

The ops themselves (names, busbw factors, how each is called and what its output must equal) are
specs in one registry, :data:`OPS` (:mod:`day0.core.collective_ops`); adding an op is adding a spec.

Modules: ``settings`` (the ``[collectives]`` table), ``result`` (what rank 0 writes),
``exact`` (the exact data), ``routing`` (the expert routing behind the uneven all-to-all), ``sweep``, ``rank`` and ``rank_env`` (the rank side), ``launcher`` and ``faults``
(local ranks, watchdog, diagnosis), ``multinode`` (torchrun on every node of a cluster),
``links`` (node-to-node bandwidth), ``sockets`` (gloo's inter-node transport, the engine's TP traffic across nodes), ``checks``, ``busbw`` (formulas), ``nccl_debug``,
``nccl_comms`` (its communicator table), ``nccl_placement`` (where a connection's ends run) and
``transport`` (NCCL_DEBUG logs), ``nccl_tests`` with ``nccl_format``, ``nccl_text`` and
``nccl_json`` (importing nccl-tests output), ``inputs`` (reading a file handed in without trusting
it), ``tp_equivalence`` (vLLM's TP path), ``cli``.
"""

from day0.core.collective_ops import OPS
from day0.core.sockets import free_port
from day0.core.stages import Figure, Stage
from day0.stages.collectives.checks import result_checks
from day0.stages.collectives.cli import add_cli, main
from day0.stages.collectives.exact import ExactPattern
from day0.stages.collectives.faults import diagnose
from day0.stages.collectives.launcher import run_local
from day0.stages.collectives.links import links_check
from day0.stages.collectives.multinode import collectives_port, run_cluster
from day0.stages.collectives.nccl_tests import import_nccl_tests
from day0.stages.collectives.rank_env import RankEnv
from day0.stages.collectives.result import CollectivesResult, RankState, load_result, nccl_log_text
from day0.stages.collectives.settings import CollectivesSection, SettingsError, coerce_settings, parse_size
from day0.stages.collectives.sockets import engine_cross_node_check, socket_transport_check, stage_transport_checks
from day0.stages.collectives.tp_equivalence import tp_equivalence_check
from day0.stages.collectives.transport import transport_checks

__all__ = [
    "OPS",
    "CollectivesResult",
    "CollectivesSection",
    "ExactPattern",
    "RankEnv",
    "RankState",
    "SettingsError",
    "add_cli",
    "coerce_settings",
    "collectives_port",
    "diagnose",
    "engine_cross_node_check",
    "free_port",
    "import_nccl_tests",
    "links_check",
    "load_result",
    "main",
    "nccl_log_text",
    "parse_size",
    "result_checks",
    "run_cluster",
    "run_local",
    "socket_transport_check",
    "stage_transport_checks",
    "tp_equivalence_check",
    "transport_checks",
]

STAGE = Stage(
    name="collectives", order=20, suite="day0.suites.test_collectives", section="collectives", repeatable=True,
    title="Collective communication",
    question="are collectives correct and fast on this topology?",
    figures=(Figure("busbw", "Worst busbw vs expected", ("collectives.*.busbw",), pick="vs_expected"),),
    required=("collectives.*.correct", "collectives.*.busbw"),
)
