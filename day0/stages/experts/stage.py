"""The experts stage against the run's engine: does it apply, what the model and the placement are,
the workload, the views, and the checks.

Only an MoE has experts to balance: on a dense model the stage says so from config.json and
starts nothing. Everything it knows about the model (experts, top-k, which layers are MoE) comes
from config.json; the placement of experts on ranks from the engine args, as vLLM reads them.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from day0.client.workload import Request, WorkloadSpec, build_requests, read_vocab
from day0.config.experts import ExpertsSection
from day0.config.profile import Profile
from day0.core.record import Check
from day0.engine import local_model_dir
from day0.model import arch_tensors, archs
from day0.model.config import ConfigUnavailable, model_config
from day0.model.ranks import ep_size_of
from day0.stages.experts.checks import agreement_check, agreement_skipped, load_checks, unmeasured
from day0.stages.experts.load import LayerLoad, LoadSummary, Placement
from day0.stages.experts.routed import moe_layers
from day0.stages.experts.views import Driver, HttpDriver, InprocessDriver, Observed, Workers, observe


@dataclass(frozen=True)
class Target:
    """The MoE as served: its routed experts, top-k, MoE layers (None: read from the counts) and
    where the experts sit on ranks."""

    num_experts: int
    top_k: int
    moe_layers: tuple[int, ...] | None
    placement: Placement
    eplb: bool = False

    def describe(self) -> dict[str, Any]:
        return {"num_experts": self.num_experts, "top_k": self.top_k,
                "moe_layers": list(self.moe_layers) if self.moe_layers is not None else None,
                "ep_size": self.placement.ep_size, "eplb": self.eplb}


def not_applicable(profile: Profile) -> str | None:
    """Why the stage does not apply (a dense model, from its config.json), or None. Without a
    config.json on this host the model's kind is unknown: the stage then asks the engine."""
    try:
        config, where = model_config(profile)
    except ConfigUnavailable:
        return None
    if archs.routed_experts(config):
        return None
    return (f"not applicable: {archs.architecture(config)} ({where}) is a dense model: no routed experts, "
            "no router to balance")


def placement_of(args: dict[str, Any], num_experts: int) -> tuple[Placement, bool]:
    """Experts on ranks as vLLM places them: with ``enable_expert_parallel`` the EP group is
    TP x DP and each rank holds whole experts; without it every TP rank holds a slice of every
    expert (EP size 1). Returns (placement, EPLB on)."""
    ep = ep_size_of(args)
    strategy = str(args.get("expert_placement_strategy") or "linear")
    return Placement(num_experts, ep, strategy), bool(args.get("enable_eplb"))


def target_of(profile: Profile) -> Target | None:
    """The served MoE from config.json; None when there is no config.json on this host."""
    try:
        config, _ = model_config(profile)
    except ConfigUnavailable:
        return None
    e = archs.routed_experts(config)
    layers = tuple(moe_layers(arch_tensors.expected_tensors(config)))
    placement, eplb = placement_of(profile.engine.args, e)
    return Target(e, archs.experts_per_token(config), layers or None, placement, eplb)


def workload(profile: Profile, section: ExpertsSection) -> tuple[list[Request], dict[str, Any], int]:
    """``experts.num_requests`` requests of the ``[latency]`` workload's shape (lengths, shared
    prefixes, seed), the body keys they carry, and how many go at once.

    The seed's prompts exactly, without latency's per-run nonce: on a random-weight MoE the nonce
    (the same few tokens at the front of every prompt of a run) moved the tiny model's hottest
    expert from run to run, and the same system must give the same verdict. A fresh ``cache_salt``
    per run keeps an earlier run's prefix cache out instead (the router never sees a cached token),
    and decoding is greedy unless ``latency.extra_body`` sets a temperature.
    A dataset or the long-context mix is not replayed (their lengths need the latency stage's own
    reading of them); the profile's input_len and output_len are used."""
    lat = profile.latency
    model_dir = local_model_dir(profile)
    if model_dir is None or not (model_dir / "tokenizer.json").is_file():
        raise FileNotFoundError(f"token-id prompts need the model's tokenizer.json locally; model.path "
                                f"{profile.model.path!r} is not a local directory with one")
    spec = WorkloadSpec(lat.input_len, lat.output_len, lat.prefix_len, lat.num_prefixes, lat.seed)
    reqs = build_requests(spec, read_vocab(model_dir), section.num_requests)
    extra = dict(lat.extra_body)  # never stream or stream_options: the config refuses day0's own keys there
    extra.setdefault("temperature", 0.0)  # greedy unless the profile samples: the same tokens, run after run
    extra["cache_salt"] = secrets.token_hex(8)
    return reqs, extra, section.concurrency or lat.concurrency or section.num_requests


def driver_of(engine: Any) -> Driver:
    if getattr(engine, "view", None) == "scheduler":
        return InprocessDriver(engine.llm)
    return HttpDriver(engine.endpoint)


def run_stage(engine: Any, profile: Profile, *, progress: Callable[[str], None] | None = None) -> list[Check]:
    """The workload on ``engine``, both views read, judged against ``[experts]``."""
    section = profile.experts
    target = target_of(profile)
    try:
        reqs, extra, concurrency = workload(profile, section)
    except FileNotFoundError as exc:
        return unmeasured(str(exc), section)
    driver = driver_of(engine)
    num_experts = target.num_experts if target else 0
    obs = observe(driver, reqs, extra, concurrency, num_experts, target.moe_layers if target else None, progress)
    return judge(obs, target, section, source_prefix=driver.source)


def judge(obs: Observed, target: Target | None, section: ExpertsSection, *, source_prefix: str = "http") -> list[Check]:
    """The checks from what the views saw: the router view first (it counts what the model
    computed), vLLM's routed_experts when it is the only one, "could not measure" when neither."""
    untrusted = router_untrusted(obs, target.top_k if target else 0, target.moe_layers if target else None) \
        if obs.router else None
    if untrusted:
        obs.router_missing, obs.router = untrusted, None
    router = obs.router.loads if obs.router else None
    use_router = router is not None and section.view in ("auto", "router")
    use_routed = obs.routed is not None and section.view in ("auto", "routed")
    if not (use_router or use_routed):
        return unmeasured(_why_neither(obs, section), section, source_prefix)
    loads = router if use_router else obs.routed
    assert loads is not None
    num_experts = len(next(iter(loads.values())).experts) if loads else (target.num_experts if target else 1)
    placement = target.placement if target and target.num_experts == num_experts else Placement(num_experts)
    summary = LoadSummary(tuple(loads.values()), placement)
    base = _base_evidence(obs, target, "router" if use_router else "routed_experts")
    source = f"{source_prefix}:router" if use_router else f"{source_prefix}:routed_experts"
    checks = load_checks(summary, section, source, base)
    if use_router and obs.router is not None and not obs.router.tp_agree:
        checks.append(Check(TP_AGREE, "The TP ranks of a replicated router count the same experts", "fail",
                            source=source, evidence=base,
                            message="the TP ranks of one data-parallel group routed the same tokens to different "
                                    "experts: a replicated router computes the same top-k on every rank, so the "
                                    "ranks disagree on which experts each token went to (the balance checks read "
                                    "rank 0's counts only)"))
    if use_router and use_routed:
        checks.append(agreement_check(list(router.values()), list(obs.routed.values()), section))  # type: ignore[union-attr]
    elif section.view == "auto":
        checks.append(agreement_skipped(obs.routed_missing if use_router else (obs.router_missing or "")))
    return checks


TP_AGREE = "experts.tp_ranks_agree"  # recorded when they do not: the balance checks keep one rank's counts


def router_untrusted(obs: Observed, top_k: int, moe_layers: Sequence[int] | None = None) -> str | None:
    """Why the router view cannot be trusted, or None. By the view's definition (docs/metrics.md,
    "Expert load") every MoE layer is counted (``moe_layers``, config.json's, when known: a layer
    the hook skipped or never hooked could be the collapsed one, so the rest are not judged alone),
    and each routed every token the workload forwarded, less at most the prompt tokens the prefix
    cache can serve (:func:`views.cacheable`), and counted ``top_k`` expert ids for each:
    a count outside that is not the workload's routing, however even its shares look. The counters
    are armed as the worker is created, before any graph is traced or captured
    (``router_hook.ExpertCounter.__new__``), so a compiled or graph-captured engine counts; what can
    still bypass them is a kernel that routes inside itself (a monolithic MoE kernel, listed in
    ``skipped``) or an extension that was not in place when the model was built. ``top_k`` 0: not
    known here (no config.json), and each layer's ids per token must then be one whole number."""
    assert obs.router is not None
    loads = list(obs.router.loads.values())
    if not loads:
        return "the workers found no MoE layer whose router takes a callback"
    uncounted = _layers_uncounted(obs.router, moe_layers)
    if uncounted:
        return uncounted
    if obs.forwarded_tokens is None:
        return (f"not verified: {obs.uncounted} of {len(obs.answers)} responses gave no usage.prompt_tokens and "
                "usage.completion_tokens, so the tokens forwarded, which each MoE layer's count must match, are unknown")
    return _ids_per_token(loads, top_k) or _tokens_seen(obs, loads)


def _layers_uncounted(router: Workers, moe_layers: Sequence[int] | None) -> str | None:
    """Why the view does not cover every MoE layer, or None: a layer the hook skipped (a monolithic
    kernel routes inside itself) or whose router it never hooked is absent from the counts, and a
    collapse there would pass on the layers that are present. Layers counted that config.json holds
    no experts in are no MoE layer of this model either."""
    counted = sorted(router.loads)
    if moe_layers is not None and set(counted) != set(moe_layers):
        missing = sorted(set(moe_layers) - set(counted))
        extra = sorted(set(counted) - set(moe_layers))
        what = ([f"did not count MoE layer(s) {_listed(missing)}"] if missing else []) + (
            [f"counted layer(s) {_listed(extra)}, which hold no routed experts"] if extra else [])
        skipped = f"; skipped: {'; '.join(router.skipped)}" if router.skipped else ""
        return (f"the router hook {' and '.join(what)} (config.json's MoE layers: {_listed(sorted(moe_layers))}"
                f"{skipped}): judging only the layers it counted would leave a collapse in the others unseen")
    if router.skipped:
        return (f"the router hook skipped {'; '.join(router.skipped)}: that layer routes without the router's "
                f"callback, and judging the layers it counted ({_listed(counted)}) would leave it unseen")
    return None


def _listed(layers: Sequence[int]) -> str:
    return ", ".join(str(n) for n in layers)


def _ids_per_token(loads: list[LayerLoad], top_k: int) -> str | None:
    """A layer whose expert ids are not ``top_k`` for each token it counted: ids were dropped (an id
    outside the experts is not counted) or counted twice, so its shares are not the router's."""
    why = "the hook dropped or duplicated top-k ids"
    per_token: dict[int, int] = {}
    for load in loads:
        a, t = load.assignments, load.tokens
        if top_k and a != top_k * t:
            return f"layer {load.layer} counted {a} expert ids for {t} tokens, not top-{top_k} x {t} = {top_k * t}: {why}"
        if not top_k and (a % t if t else a):
            return f"layer {load.layer} counted {a} expert ids for {t} tokens, not a whole number per token: {why}"
        if t:
            per_token[load.layer] = a // t
    if len(set(per_token.values())) > 1:
        ordered = sorted(per_token.items(), key=lambda lk: (lk[1], lk[0]))
        low, high = ordered[0], ordered[-1]
        return f"layer {low[0]} counted {low[1]} expert ids a token and layer {high[0]} {high[1]}: {why}"
    return None


def _tokens_seen(obs: Observed, loads: list[LayerLoad]) -> str | None:
    """Every layer's tokens within [forwarded - shareable prompt tokens, forwarded]."""
    forwarded = obs.forwarded_tokens
    assert forwarded is not None
    need = forwarded - obs.cacheable_tokens
    low = min(loads, key=lambda x: (x.tokens, x.layer))
    high = max(loads, key=lambda x: (x.tokens, -x.layer))
    if low.tokens < need:
        return (f"the router hook saw {low.tokens} of the {forwarded} tokens the workload forwarded through "
                f"every MoE layer (at least {need} must pass it); something routed those tokens without the router's "
                "capture callback (a kernel that routes inside itself, or a worker extension loaded after the model "
                "was built): read vLLM's routed_experts")
    if high.tokens > forwarded:
        return (f"the router hook saw {high.tokens} tokens in layer {high.layer}, more than the {forwarded} the "
                "workload forwarded: it counted rows that are no token of it (CUDA-graph or sequence-parallel padding, "
                "a data-parallel dummy batch or another rank's tokens) or a step twice")
    return None


def _why_neither(obs: Observed, section: ExpertsSection) -> str:
    if section.view == "router":
        return f"router view: {obs.router_missing}"
    if section.view == "routed":
        return f"vLLM's routed_experts: {obs.routed_missing}"
    return f"router view: {obs.router_missing}; vLLM's routed_experts: {obs.routed_missing}"


def _base_evidence(obs: Observed, target: Target | None, view: str) -> dict[str, Any]:
    routed_tokens = max((load.tokens for load in (obs.router.loads if obs.router else {}).values()), default=None)
    ev: dict[str, Any] = {
        "view": view, "requests": len(obs.answers), "seconds": round(obs.seconds, 3),
        "prompt_tokens": obs.prompt_tokens, "completion_tokens": obs.completion_tokens,
        "forwarded_tokens": obs.forwarded_tokens, "model": target.describe() if target else None,
        "router_view": "measured" if obs.router else obs.router_missing,
        "routed_experts_view": "measured" if obs.routed is not None else obs.routed_missing,
    }
    if obs.router:
        ev.update(workers=obs.router.workers, tp_ranks_agree=obs.router.tp_agree, sequence_parallel=obs.router.sharded,
                  router_tokens_per_layer=routed_tokens, unhooked_layers=obs.router.skipped)
    if target and target.eplb:
        ev["eplb_note"] = ("EPLB is on: it moves and replicates experts at run time; the per-rank figure is the "
                           "static placement's, the per-expert counts are logical experts'")
    return ev
