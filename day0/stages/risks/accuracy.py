"""Quantization accuracy: the deployed model scored against a reference on one fixed text.

Both engines score the same token ids with vLLM's ``prompt_logprobs`` (teacher forcing: at
position i the model has seen tokens 0..i-1), so the figures compare the models, not sampling:

- Perplexity: ``exp(-mean_i log p(t_i | t_<i))`` over positions 1..n-1; the check is the relative
  difference ``PPL_deployed / PPL_reference - 1`` (absolute value against the limit).
- Top-1 agreement: the share of positions where both models' most likely next token is the same
  (vLLM's "greedy tokens match", without letting one early divergence change every later prompt).
- Mean KL(reference || deployed) per position over the cells the two top-k lists share, plus
  the actual token, plus one cell for all the rest. Merging tokens into cells never increases KL
  (data-processing inequality), so this is a lower bound of the full-vocabulary KL, tight when the
  shared top-k hold most of the mass (``mean_captured_mass`` in the evidence says how tight).

The reference is transformers scoring the same token ids on the host CPU in float32 (an
independent implementation that needs no second server: the deployment's checkpoint, or other
weights such as the unquantized model, ``reference_model``), a second server started beside the
deployment with some engine args changed (e.g. bfloat16 against float32 on CPU, bf16 weights
against a quantized checkpoint), or a reference deployment at a URL; :func:`check_accuracy`
starts it, scores both and stops it.
"""

from __future__ import annotations

import contextlib
import math
import time
import urllib.error
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from day0.config.risks import AccuracySettings
from day0.core.record import Check, measured
from day0.engine import Endpoint, EngineError, EngineInfo, ServerEngine, http_json, served_name
from day0.model.locate import local_model_dir
from day0.model.reference import host_reference_unavailable, score_tokens

# Probabilities below this are float rounding of sums, not mass (a top-k that sums to 1 - 1e-12).
MASS_EPS = 1e-9


class AccuracyError(RuntimeError):
    """Logprobs that cannot be compared; the message names the engine and the position."""


# --------------------------------------------------------------------------- parsing


@dataclass
class PromptLogprobs:
    """What one engine said about every position of the evaluation tokens."""

    token_ids: list[int]
    actual: list[float]  # log p(t_i | t_<i) for i = 1..n-1
    top: list[dict[int, float]]  # top-k (and the actual token) per position 1..n-1
    top1: list[int]  # the most likely next token per position 1..n-1


def parse_prompt_logprobs(choice: dict[str, Any], where: str = "engine") -> PromptLogprobs:
    """vLLM's completion choice with ``prompt_logprobs`` and ``prompt_token_ids`` -> PromptLogprobs.

    Each position holds ``{token_id: {"logprob", "rank", "decoded_token"}}`` with the top-k and the
    actual prompt token (rank 1 is the argmax); position 0 is ``None`` (nothing to predict from).
    """
    ids = choice.get("prompt_token_ids")
    plp = choice.get("prompt_logprobs")
    if not isinstance(ids, list) or not isinstance(plp, list):
        raise AccuracyError(f"{where}: the answer has no prompt_token_ids/prompt_logprobs "
                            "(a vLLM server with return_token_ids and prompt_logprobs support is needed)")
    if len(plp) != len(ids) or len(ids) < 2:
        raise AccuracyError(f"{where}: {len(plp)} prompt_logprobs for {len(ids)} prompt tokens")
    actual: list[float] = []
    top: list[dict[int, float]] = []
    top1: list[int] = []
    for i in range(1, len(ids)):
        pos = plp[i]
        if not isinstance(pos, dict) or not pos:
            raise AccuracyError(f"{where}: position {i} has no logprobs")
        lp = {int(k): float(v["logprob"]) for k, v in pos.items()}
        tok = int(ids[i])
        if tok not in lp:
            raise AccuracyError(f"{where}: position {i} lacks the prompt token {tok}")
        ranked = [(int(v.get("rank") or 10**9), int(k)) for k, v in pos.items()]
        actual.append(lp[tok])
        top.append(lp)
        top1.append(min(ranked)[1])
    return PromptLogprobs([int(t) for t in ids], actual, top, top1)


# --------------------------------------------------------------------------- formulas


def perplexity(logprobs: Sequence[float]) -> float:
    """exp of the mean negative log-likelihood (natural log): 1 for a certain model, V for uniform."""
    if not logprobs:
        raise ValueError("perplexity of no tokens")
    return math.exp(-math.fsum(logprobs) / len(logprobs))


def relative_delta(value: float, reference: float) -> float:
    """``value / reference - 1``: +0.02 means 2 % higher than the reference."""
    if reference <= 0:
        raise ValueError(f"reference must be positive, got {reference}")
    return value / reference - 1.0


def top1_agreement(a: Sequence[int], b: Sequence[int]) -> float:
    if len(a) != len(b) or not a:
        raise ValueError(f"top-1 lists of different or zero length ({len(a)} vs {len(b)})")
    return sum(x == y for x, y in zip(a, b)) / len(a)


def cell_kl(ref: dict[int, float], dep: dict[int, float], actual: int | None = None) -> tuple[float, float]:
    """(KL(ref || dep) over shared cells + "rest", the reference mass those cells capture).

    ``ref`` and ``dep`` map token ids to log-probabilities (each a subset of the vocabulary,
    e.g. a top-k). Cells: every token both know, plus one for everything else. The result is
    <= the full-vocabulary KL and equals it when both maps cover the whole vocabulary.
    """
    shared = set(ref) & set(dep)
    if actual is not None and (actual not in ref or actual not in dep):
        raise ValueError(f"actual token {actual} missing from a side")
    kl = 0.0
    p_in = q_in = 0.0
    for t in shared:
        p, q = math.exp(ref[t]), math.exp(dep[t])
        p_in += p
        q_in += q
        if p > 0:
            kl += math.inf if q == 0 else p * (ref[t] - dep[t])
    p_rest, q_rest = 1.0 - p_in, 1.0 - q_in
    if p_rest > MASS_EPS:
        # floored, never infinite: a deployed top-1 logprob of exactly 0.0 (float32 rounding of a
        # near-certain token) sums its cells to >= 1, and the whole prompt's KL read inf, a fail
        kl += p_rest * math.log(p_rest / max(q_rest, MASS_EPS))
    return max(kl, 0.0), min(p_in, 1.0)


@dataclass
class Comparison:
    tokens: int  # scored positions
    ppl_deployed: float
    ppl_reference: float
    ppl_delta: float  # relative
    top1_agreement: float
    mean_kl: float | None  # None without top-k on both sides
    mean_captured_mass: float | None
    kl_per_position: list[float] = field(default_factory=list)
    nll_deployed: list[float] = field(default_factory=list)
    nll_reference: list[float] = field(default_factory=list)


def compare(deployed: PromptLogprobs, reference: PromptLogprobs, *, with_kl: bool = True) -> Comparison:
    if deployed.token_ids != reference.token_ids:
        raise AccuracyError("the two engines scored different token ids (different tokenizers?); "
                            "compare models that share a tokenizer")
    ppl_d, ppl_r = perplexity(deployed.actual), perplexity(reference.actual)
    kls: list[float] = []
    mass: list[float] = []
    if with_kl:
        for i, (r, d) in enumerate(zip(reference.top, deployed.top)):
            kl, m = cell_kl(r, d, reference.token_ids[i + 1])
            kls.append(kl)
            mass.append(m)
    return Comparison(
        tokens=len(deployed.actual), ppl_deployed=ppl_d, ppl_reference=ppl_r,
        ppl_delta=relative_delta(ppl_d, ppl_r), top1_agreement=top1_agreement(deployed.top1, reference.top1),
        mean_kl=math.fsum(kls) / len(kls) if kls else None, mean_captured_mass=sum(mass) / len(mass) if mass else None,
        kl_per_position=kls, nll_deployed=[-x for x in deployed.actual], nll_reference=[-x for x in reference.actual],
    )


# --------------------------------------------------------------------------- engines


def _base(url: str) -> str:
    return url.rstrip("/").removesuffix("/v1")


def tokenize(base_url: str, model: str, text: str, *, timeout: float = 60.0,
             headers: dict[str, str] | None = None) -> list[int]:
    url = _base(base_url) + "/tokenize"
    try:
        out = http_json(url, {"model": model, "prompt": text, "add_special_tokens": False}, timeout=timeout,
                        headers=headers)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise AccuracyError(f"{url}: cannot tokenize the evaluation text ({getattr(exc, 'reason', exc)})") from None
    tokens = out.get("tokens") if isinstance(out, dict) else None
    if not tokens:
        raise AccuracyError(f"{url}: no tokens for the evaluation text")
    return [int(t) for t in tokens]


def fetch_prompt_logprobs(base_url: str, model: str, token_ids: list[int], top_k: int, *,
                          timeout: float = 300.0, headers: dict[str, str] | None = None) -> PromptLogprobs:
    url = _base(base_url) + "/v1/completions"
    body = {"model": model, "prompt": token_ids, "max_tokens": 1, "temperature": 0.0,
            "prompt_logprobs": top_k, "return_token_ids": True}
    try:
        out = http_json(url, body, timeout=timeout, headers=headers)
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace")[:300]
        raise AccuracyError(f"{url}: HTTP {exc.code}: {' '.join(detail.split())}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise AccuracyError(f"{url}: {getattr(exc, 'reason', exc)}") from None
    return parse_prompt_logprobs(out["choices"][0], where=url)


def first_model(base_url: str, timeout: float = 30.0, headers: dict[str, str] | None = None) -> str:
    url = _base(base_url) + "/v1/models"
    try:
        names = [m["id"] for m in http_json(url, timeout=timeout, headers=headers).get("data", [])]
    except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
        raise AccuracyError(f"{url}: cannot list models ({getattr(exc, 'reason', exc)})") from None
    if not names:
        raise AccuracyError(f"{url}: serves no model")
    return names[0]


@dataclass
class Reference:
    """The engine the deployment is scored against, as the record describes it."""

    base_url: str
    model: str
    description: str
    attempts: list[dict[str, Any]] = field(default_factory=list)  # variant start-ups that failed
    headers: dict[str, str] = field(default_factory=dict)  # its bearer key: a variant day0 starts shares the site's


class NoReference(RuntimeError):
    """The profile names no usable reference; the message says which key to set."""


@contextlib.contextmanager
def reference_engine(profile: Any, settings: AccuracySettings, run_dir: Any, log: Callable[[str], None],
                     on_start: Callable[[EngineInfo], None] | None = None) -> Iterator[Reference]:
    """The reference for ``profile``'s deployment, stopped on exit when this started it.

    A variant tries each entry of ``reference_args`` in order; a start-up that fails (a kernel
    this CPU lacks, say) is kept in ``attempts`` and the next entry is tried.
    """
    if settings.reference == "none":
        raise NoReference("no reference declared ([risks.accuracy].reference = \"none\")")
    if settings.reference == "url":
        if not settings.reference_url:
            raise NoReference("[risks.accuracy].reference = \"url\" but reference_url is not set; point it at a "
                              "deployment of the unquantized model")
        model = settings.reference_served_name or first_model(settings.reference_url)
        yield Reference(_base(settings.reference_url), model, f"reference deployment at {settings.reference_url}")
        return
    eng = profile.engine
    update: dict[str, Any] = {}
    if settings.reference_model:
        update["model"] = profile.model.model_copy(update={
            "source": "path", "path": settings.reference_model, "served_model_name": served_name(profile)})
    attempts: list[dict[str, Any]] = []
    server: ServerEngine | None = None
    arg_sets = settings.reference_args or [{}]
    for n, args in enumerate(arg_sets):
        variant = profile.model_copy(update={**update, "engine": eng.model_copy(update={
            "mode": "server", "args": {**eng.args, **args}, "env": {**eng.env, **settings.reference_env}})})
        candidate = ServerEngine(variant, run_dir, log, name=f"accuracy-reference-{n}")
        try:
            info = candidate.start()
        except EngineError as exc:
            attempts.append({"args": args, "error": str(exc), "log_excerpt": exc.log_excerpt,
                             "log_path": str(exc.log_path) if exc.log_path else None})
            log(f"accuracy reference with {args} did not start: {exc}")
            continue
        if on_start:
            on_start(EngineInfo(**{**info.__dict__, "view": "variant:accuracy-reference"}))
        server = candidate
        break
    if server is None:
        last = attempts[-1] if attempts else {"error": "no reference_args"}
        raise EngineError(f"no accuracy reference started ({len(attempts)} tried); last: {last['error']}",
                          log_excerpt=str(last.get("log_excerpt") or ""))
    changed = dict(arg_sets[len(attempts)])
    what = ", ".join(f"{k}={v}" for k, v in changed.items())
    if settings.reference_model:
        what = f"weights {settings.reference_model}" + (f", {what}" if what else "")
    try:
        yield Reference(server.base_url, served_name(profile), f"the deployment's model served with {what}",
                        attempts, headers=server.endpoint.headers)
    finally:
        server.stop()


# --------------------------------------------------------------------------- checks


def accuracy_checks(cmp: Comparison, settings: AccuracySettings, reference: str,
                    evidence: dict[str, Any] | None = None) -> list[Check]:
    """Three checks: PPL delta, top-1 agreement, mean top-k KL, each against its profile limit."""
    base = {"reference": reference, "tokens_scored": cmp.tokens, "top_k": settings.top_k, **(evidence or {})}
    table = {"columns": ["figure", "deployed", "reference", "difference", "limit"], "rows": [
        ["perplexity", round(cmp.ppl_deployed, 4), round(cmp.ppl_reference, 4), f"{cmp.ppl_delta:+.4%}",
         f"|delta| <= {settings.max_ppl_delta:.2%}"],
        ["top-1 agreement", None, None, round(cmp.top1_agreement, 4), f">= {settings.min_top1_agreement:g}"],
        ["mean KL (nats/token)", None, None, None if cmp.mean_kl is None else f"{cmp.mean_kl:.3g}",
         f"<= {settings.max_mean_kl:g}"],
    ]}
    pos = list(range(1, cmp.tokens + 1))
    nll_chart = {"kind": "line", "title": "Per-token negative log-likelihood", "x_label": "position",
                 "y_label": "-log p (nats)", "x_log": False,
                 "series": [{"name": "deployed", "x": pos, "y": cmp.nll_deployed},
                            {"name": "reference", "x": pos, "y": cmp.nll_reference}], "reference": []}
    delta = abs(cmp.ppl_delta)
    ppl = measured(
        "risks.accuracy.ppl_delta", "Perplexity vs the reference (relative difference)", round(delta, 6),
        settings.max_ppl_delta, unit="ratio", direction="lower_is_better", source="http",
        message=(f"perplexity {cmp.ppl_deployed:.4g} vs {cmp.ppl_reference:.4g} for the reference "
                 f"({cmp.ppl_delta:+.3%}; limit {settings.max_ppl_delta:.2%}) over {cmp.tokens} tokens"),
        evidence={**base, "table": table, "charts": [nll_chart], "ppl_deployed": cmp.ppl_deployed,
                  "ppl_reference": cmp.ppl_reference, "signed_delta": cmp.ppl_delta})
    agree = measured(
        "risks.accuracy.top1_agreement", "Most likely next token agrees with the reference",
        round(cmp.top1_agreement, 6), settings.min_top1_agreement, unit="ratio", direction="higher_is_better",
        source="http",
        message=(f"the deployed model's most likely next token matches the reference at "
                 f"{cmp.top1_agreement:.1%} of {cmp.tokens} positions (limit {settings.min_top1_agreement:.0%})"),
        evidence=base)
    if cmp.mean_kl is None:
        kl = Check(id="risks.accuracy.mean_kl", title="Mean KL divergence from the reference (top-k)",
                   status="skip", message="no top-k logprobs from both engines", evidence=base, source="http")
    else:
        kl = measured(
            "risks.accuracy.mean_kl", "Mean KL divergence from the reference (top-k)", cmp.mean_kl,
            settings.max_mean_kl, unit="nats/token", direction="lower_is_better", source="http",
            message=(f"mean KL(reference || deployed) {cmp.mean_kl:.3g} nats/token over the shared top-{settings.top_k} "
                     f"(a lower bound; they hold {cmp.mean_captured_mass:.0%} of the reference's mass)"),
            evidence={**base, "samples": cmp.kl_per_position, "mean_captured_mass": cmp.mean_captured_mass})
    return [ppl, agree, kl]


def no_reference_checks(reason: str) -> list[Check]:
    """The three accuracy checks as skips that say why there is nothing to compare with."""
    return [Check(id=f"risks.accuracy.{cid}", title=f"Accuracy vs reference: {cid}", status="skip",
                  message=reason, source="profile") for cid in ("ppl_delta", "top1_agreement", "mean_kl")]


# --------------------------------------------------------------------------- the stage


def transformers_reference(profile: Any, settings: AccuracySettings, ids: list[int]) -> tuple[PromptLogprobs, str, float]:
    """transformers' scores of ``ids`` (CPU, float32), its description and its seconds (load included).

    Raises :class:`NoReference` when the checkpoint is not local or does not fit in host memory.
    """
    if settings.reference_model:
        model_dir = Path(settings.reference_model).expanduser()
        if not model_dir.is_dir():
            raise NoReference(f"[risks.accuracy].reference_model {settings.reference_model!r} is not a local "
                              "directory (the transformers reference reads the checkpoint on this host)")
    else:
        model_dir = local_model_dir(profile)
    reason = host_reference_unavailable(model_dir)
    if reason is not None:
        raise NoReference(f"not verified: no transformers reference here: {reason}")
    scores = score_tokens(model_dir, ids, settings.top_k)
    plp = PromptLogprobs(scores.token_ids, scores.actual, scores.top, scores.top1)
    return plp, f"transformers on {model_dir} (cpu/float32)", scores.seconds


def check_accuracy(endpoint: Endpoint, profile: Any, run_dir: Any, log: Callable[[str], None],
                   on_start: Callable[[EngineInfo], None] | None = None) -> list[Check]:
    """Score the deployment at ``endpoint`` and its reference (transformers in this process, or an
    engine from :func:`reference_engine`, stopped before this returns) on ``[risks.accuracy].text``;
    the three checks, or skips without a reference.

    Raises AssertionError (the run's verdict: fail) when the reference tokenizes the text differently.
    """
    settings: AccuracySettings = profile.risks.accuracy
    base_url, model, headers, timeout = endpoint.base_url, endpoint.model, endpoint.headers, endpoint.timeout_s
    ids = tokenize(base_url, model, settings.text, headers=headers)[: settings.max_tokens]
    t0 = time.perf_counter()
    deployed = fetch_prompt_logprobs(base_url, model, ids, settings.top_k, timeout=timeout, headers=headers)
    deployed_s = time.perf_counter() - t0
    attempts: list[dict[str, Any]] = []
    try:
        if settings.reference == "transformers":
            reference, description, reference_s = transformers_reference(profile, settings, ids)
            ref_ids = ids  # scored from the deployment's ids; the golden-token check holds the tokenizers equal
        else:
            with reference_engine(profile, settings, run_dir, log, on_start=on_start) as ref:
                ref_ids = tokenize(ref.base_url, ref.model, settings.text, headers=ref.headers)[: settings.max_tokens]
                t0 = time.perf_counter()
                reference = fetch_prompt_logprobs(ref.base_url, ref.model, ids, settings.top_k, timeout=timeout,
                                                  headers=ref.headers)
                reference_s = time.perf_counter() - t0
                description, attempts = ref.description, ref.attempts
    except NoReference as exc:
        return no_reference_checks(str(exc))
    if ref_ids != ids:
        raise AssertionError(f"the reference tokenizes the evaluation text differently ({description}); "
                             "compare models that share a tokenizer")
    evidence = {"engine_seconds": {"deployed": round(deployed_s, 3), "reference": round(reference_s, 3)},
                "reference_kind": settings.reference, "reference_attempts": attempts, "token_ids": ids}
    return accuracy_checks(compare(deployed, reference), settings, description, evidence)
