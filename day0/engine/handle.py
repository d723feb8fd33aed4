"""What every engine handle shares: the record of an engine (:class:`EngineInfo`), its greedy
output (:class:`Completion`), its two errors, and the name it serves the model under.

A handle (:class:`~day0.engine.server.ServerEngine`, :class:`~day0.engine.inprocess.InprocessEngine`,
:class:`~day0.engine.external.ExternalEngine`) has ``view``, ``info``, ``start()``, ``alive()``,
``stop()`` and ``greedy(prompts, max_tokens)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from day0.config.profile import Profile

Log = Callable[[str], None]


class EngineError(RuntimeError):
    """The engine could not be started or died; ``str()`` is the engine's own root-cause line."""

    def __init__(self, message: str, *, log_excerpt: str = "", log_path: Path | None = None,
                 pgid: int | None = None) -> None:
        super().__init__(message)
        self.log_excerpt = log_excerpt
        self.log_path = log_path
        self.pgid = pgid  # the process group that was stopped, so a test can prove it is gone


class ViewUnavailable(RuntimeError):
    """A view this mode/target cannot give (e.g. the scheduler of an external deployment)."""


@dataclass
class EngineInfo:
    """What the record keeps about an engine (run.json ``notes.engines``)."""

    mode: str
    view: str  # "http" or "scheduler"
    model: str
    served_model_name: str
    base_url: str | None = None
    pid: int | None = None
    pgid: int | None = None
    log_path: str | None = None
    startup_s: float | None = None
    args: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    nodes: list[dict[str, Any]] = field(default_factory=list)  # a multi-node engine: node, pid, log per node
    cross_node: list[dict[str, str]] = field(default_factory=list)  # its TCP connections between nodes
    experts: dict[str, Any] | None = None  # a MoE's placement: experts per rank (loaded.expert_placement)


@dataclass
class Completion:
    """One greedy answer. ``top_logprobs`` (per generated step: token id -> logprob, the top-k and
    the chosen token) and ``prompt_token_ids`` are there only when logprobs were asked for, so a
    caller that compares with an independent reference can tell a near-tie from a divergence."""

    text: str
    token_ids: list[int] | None
    completion_tokens: int
    top_logprobs: list[dict[int, float]] | None = None
    prompt_token_ids: list[int] | None = None


def served_name(profile: Profile) -> str:
    return profile.model.served_model_name or (
        "day0-tiny" if profile.model.source == "tiny" else str(profile.model.path)
    )


def scheduler_unavailable(profile: Profile, multi_node: bool | None = None) -> str | None:
    """Why this profile's run can have no scheduler view (None: it can). The one answer, asked by the
    run (:meth:`Engines.scheduler`) and by preflight before any engine work (``multi_node`` defaults
    to the topology's node count)."""
    mode = profile.engine.mode
    if mode == "external":
        return "an external engine's scheduler is not reachable; numbers come from /metrics"
    across_nodes = profile.topology.nodes > 1 if multi_node is None else multi_node
    if across_nodes:
        return ("the scheduler view is one process on this host; an engine across nodes is "
                "measured through its HTTP API and /metrics")
    if mode == "server" and profile.topology.device != "cpu":
        return ("the scheduler view beside a server engine is only started on CPU targets "
                "(a second engine would not fit on the GPUs); use engine.mode = \"inprocess\"")
    return None


def beside_unavailable(profile: Profile, multi_node: bool | None = None) -> str | None:
    """Why this run cannot read the engine's ranks as processes on this host (None: it can): day0
    starts a single-node server itself, and an external deployment is beside it when its URL names
    this host. The one answer, asked by preflight and by the weights stage."""
    across_nodes = profile.topology.nodes > 1 if multi_node is None else multi_node
    if across_nodes:
        return "an engine across nodes has ranks on other hosts, whose processes cannot be read from here"
    if profile.engine.mode == "external":
        from day0.engine.ranks import beside

        return beside(str(profile.engine.url))
    return None
