"""The in-process view: a vLLM worker extension that counts the router's top-k choices.

vLLM mixes this class into every worker when the engine is started with
``worker_extension_cls = "day0.stages.experts.router_hook.ExpertCounter"``; its methods are then
callable on every worker through ``collective_rpc`` (``LLM.collective_rpc``, or a server's
``POST /collective_rpc`` with ``VLLM_SERVER_DEV_MODE=1``). It uses the same per-layer capture
callback vLLM's own routed-experts capturer uses (``BaseRouter.capture_fn``: the *logical* expert
ids, before any EPLB remapping), so it sees every token each MoE layer routes on this rank, with
no change to what the engine computes. The callback is set as each router is built, before
``torch.compile`` traces the model, so a compiled engine counts too. Counts stay on the device
until they are read.

Why a worker extension and not vLLM's ``enable_return_routed_experts``: that capture needs Model
Runner V2, which vLLM 0.32 builds only with Triton (absent on the CPU backend), so on CPU this is
the only view there is (docs/stages/experts.md). Nothing here is imported by the harness's own
process except for its name: the module runs inside vLLM's workers, so it imports only torch and vLLM.
"""

from __future__ import annotations

from typing import Any

# The qualified name the engine arg takes.
EXTENSION = "day0.stages.experts.router_hook.ExpertCounter"


class ExpertCounter:
    """Worker mixin: ``day0_experts_reset()`` zeroes the counts, ``day0_experts_read()`` returns
    them. Names carry ``day0_`` since vLLM refuses an extension whose attribute a worker already has.

    The counters are set when the worker is created (:meth:`__new__`), before it builds the model:
    a graph that ``torch.compile`` traces or a CUDA graph captures at start-up then holds the
    count, so a compiled engine is counted like an eager one. vLLM checks an extension's names
    against the worker's, dunders excepted, and none of its worker classes defines ``__new__``,
    so this one runs as vLLM instantiates the worker.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        arm_new_routers()
        return super().__new__(cls)

    def day0_experts_reset(self) -> dict[str, Any]:
        """Hook every MoE layer's router (once) and zero its counts; returns what it armed."""
        state = getattr(self, "_day0_experts", None)
        if state is None:
            state = _arm(self)
            self._day0_experts = state  # type: ignore[attr-defined]
        for counts in state["counts"].values():
            counts.zero_()
        for tokens in state["tokens"].values():
            tokens.zero_()
        return {**_rank_info(self), "layers": sorted(state["counts"]), "num_experts": state["num_experts"],
                "skipped": state["skipped"]}

    def day0_experts_read(self) -> dict[str, Any]:
        """The counts since the last reset: per MoE layer, tokens routed to each logical expert and
        the tokens the layer routed (each token counts once per expert of its top-k)."""
        state = getattr(self, "_day0_experts", None)
        if state is None:
            return {**_rank_info(self), "error": "not armed: call day0_experts_reset first"}
        return {**_rank_info(self), "num_experts": state["num_experts"], "skipped": state["skipped"],
                "sequence_parallel": state["sequence_parallel"],
                "counts": {str(k): v[:state["num_experts"]].tolist() for k, v in state["counts"].items()},
                "tokens": {str(k): int(v.item()) for k, v in state["tokens"].items()}}


def arm_new_routers() -> None:
    """Give every router vLLM builds from now on, in this process, its own counts and a counting
    capture callback (chained before any callback vLLM sets later, such as its routed-experts
    capturer). Idempotent. The counts are made where the router is built (vLLM builds the model
    under its target device), so counting never leaves the device.

    Process-wide by nature: in a worker that is the engine; in-process (``engine.mode =
    "inprocess"``) it also arms the routers of any later engine in the same process, which then
    count too (one scatter-add per MoE layer and step) and are otherwise unchanged.
    """
    from vllm.model_executor.layers.fused_moe.router.base_router import BaseRouter

    if getattr(BaseRouter, "_day0_armed", False):
        return
    init, set_capture = BaseRouter.__init__, BaseRouter.set_capture_fn

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        import torch

        init(self, *args, **kwargs)
        n = int(self.global_num_experts)
        self._day0_counts = torch.zeros(n + 1, dtype=torch.int64)  # + 1: ids out of range
        self._day0_tokens = torch.zeros((), dtype=torch.int64)
        self.capture_fn = _counter(self._day0_counts, self._day0_tokens, n, None)

    def set_capture_fn(self: Any, capture_fn: Any) -> None:
        counts = getattr(self, "_day0_counts", None)
        if counts is None:
            return set_capture(self, capture_fn)
        return set_capture(self, _counter(counts, self._day0_tokens, int(self.global_num_experts), capture_fn))

    BaseRouter.__init__ = __init__  # type: ignore[method-assign]
    BaseRouter.set_capture_fn = set_capture_fn  # type: ignore[method-assign]
    BaseRouter._day0_armed = True  # type: ignore[attr-defined]


def _arm(worker: Any) -> dict[str, Any]:
    """Find the MoE runners the way vLLM's ``bind_routed_experts_capturer`` does and take each
    router's counts: the ones :func:`arm_new_routers` gave it at start-up, else (a router built
    before the extension was in place) a counting callback chained on now, which an eager engine runs."""
    import torch
    from vllm.model_executor.layers.fused_moe.router.base_router import BaseRouter
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

    model = worker.model_runner.get_model()
    num_experts = int(worker.vllm_config.model_config.get_num_experts())
    counts: dict[int, torch.Tensor] = {}
    tokens: dict[int, torch.Tensor] = {}
    skipped: list[str] = []
    sequence_parallel = False
    for module in model.modules():
        if not isinstance(module, MoERunner):
            continue
        layer = int(module.layer_id)
        router = module.router
        if module.is_monolithic or not isinstance(router, BaseRouter):
            skipped.append(f"layer {layer}: {type(router).__name__} (monolithic kernel: no router callback)")
            continue
        param = next(module.parameters(), None)
        dev = param.device if param is not None else torch.device("cpu")
        # sequence-parallel MoE: each TP rank routes its own shard of the tokens
        sequence_parallel |= bool(getattr(getattr(module, "moe_config", None), "is_sequence_parallel", False))
        armed = getattr(router, "_day0_counts", None)
        if armed is not None:
            counts[layer], tokens[layer] = armed, router._day0_tokens
            continue
        counts[layer] = torch.zeros(num_experts + 1, dtype=torch.int64, device=dev)  # + 1: ids out of range
        tokens[layer] = torch.zeros((), dtype=torch.int64, device=dev)
        router.set_capture_fn(_counter(counts[layer], tokens[layer], num_experts, router.capture_fn))
    return {"counts": counts, "tokens": tokens, "num_experts": num_experts, "skipped": skipped,
            "sequence_parallel": sequence_parallel}


def _counter(counts: Any, tokens: Any, num_experts: int, previous: Any) -> Any:
    """A capture callback adding one step's top-k ids to ``counts``, then calling the callback that
    was there before (vLLM's own capturer, when it is on). A scatter-add into a fixed-size tensor:
    no host sync and no data-dependent shape on a GPU (an id outside the experts, such as a masked
    -1, lands in the extra last slot, which is never read)."""
    import torch

    def capture(topk_ids: torch.Tensor) -> None:
        ids = topk_ids.reshape(-1).to(torch.int64)
        ids = torch.where((ids >= 0) & (ids < num_experts), ids, num_experts)
        counts.scatter_add_(0, ids, torch.ones_like(ids))
        tokens.add_(topk_ids.shape[0])
        if previous is not None:
            previous(topk_ids)

    return capture


def _rank_info(worker: Any) -> dict[str, Any]:
    """Which worker answered: its DP, PP and TP ranks (a TP rank's router sees its DP group's tokens)."""
    from vllm.distributed import parallel_state as ps

    def rank(getter: str) -> int:
        try:
            return int(getattr(ps, getter)().rank_in_group)
        except Exception:  # a group that this engine never made (no DP, say)
            return 0

    return {"rank": int(getattr(worker, "rank", 0)), "dp_rank": rank("get_dp_group"),
            "pp_rank": rank("get_pp_group"), "tp_rank": rank("get_tp_group")}
