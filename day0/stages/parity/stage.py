"""The parity stage against the run's engine: which features are in force, then for each the
cheapest request-level comparison that isolates it, in an order that keeps them apart.

Prompts are fresh per run (a random nonce leads each one), so the first request of the prefix
comparison is a real miss even on an engine that served the same stage before. Where prefix
caching is on, the other comparisons give every request its own ``cache_salt``: a repeat of the
same prompt must not turn a batching or streaming comparison into a cache comparison.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, TypeVar

import aiohttp

from day0.client.prom import PromError, prefix_cache_window
from day0.config.parity import ParitySection
from day0.config.profile import Profile
from day0.core.record import Check, measured
from day0.engine import Endpoint
from day0.stages.parity.answers import Answer, AnswerError, Ask, ask_many, ask_one, metrics_text
from day0.stages.parity.compare import Pair, feature_check, margin_for, not_in_force, unmeasured
from day0.stages.parity.features import COLUMNS, Feature, chunk_budget, features, long_context_depth
from day0.stages.parity.reference import long_prompt_check, speculative_check
from day0.stages.parity.speculative import acceptance_checks

Progress = Callable[[str], None]
T = TypeVar("T")
# Words the prompts are made of: plain ASCII, so any byte-level tokenizer takes them.
WORDS = ("river", "stone", "garden", "window", "market", "silver", "morning", "engine", "paper", "orange",
         "harbor", "pencil", "forest", "signal", "castle", "winter", "bridge", "copper", "planet", "lantern")
SETTLE_S = 3.0  # how long vLLM's stats path may take to count a finished request on /metrics


def prompt(nonce: str, index: int, words: int) -> str:
    """A prompt no earlier run sent (the nonce leads it: the first KV block already differs)."""
    return f"{nonce} " + " ".join(WORDS[(index * 7 + j * 3 + j // len(WORDS)) % len(WORDS)] for j in range(words))


def spec_prompt(nonce: str, index: int, words: int) -> str:
    """A prompt that repeats a short phrase, so n-gram lookup (and any drafter) has something to propose."""
    phrase = " ".join(WORDS[(index * 5 + j) % len(WORDS)] for j in range(4))
    return f"{nonce} " + " ".join([phrase] * max(2, words // 4))


class Parity:
    """One run of the stage: the endpoint, the settings and what it learns on the way."""

    def __init__(self, endpoint: Endpoint, profile: Profile, section: ParitySection, progress: Progress) -> None:
        self.endpoint, self.profile, self.section, self.progress = endpoint, profile, section, progress
        self.args: dict[str, Any] = dict(profile.engine.args)
        device = profile.topology.device
        self.features = {f.name: f for f in features(self.args, device=device,
                                                     long_context_tokens=section.long_context_tokens)}
        self.budget, _ = chunk_budget(self.args, device)
        self.depth, self.depth_why = long_context_depth(self.args, section.long_context_tokens)
        self.margin = margin_for(self.args, section.margin)
        self.dtype = str(self.args.get("dtype", "auto"))
        self.nonce = secrets.token_hex(4)
        self.salting = self.features["prefix_caching"].in_force

    def ask(self, index: int, *, salt: str | None = None, ignore_eos: bool = True, words: int | None = None) -> Ask:
        s = self.section
        return Ask(prompt(self.nonce, index, words or s.prompt_words), s.max_tokens, s.top_k,
                   salt=(f"{self.nonce}-{salt}" if salt and self.salting else None), ignore_eos=ignore_eos)

    async def settled(self, session: aiohttp.ClientSession, before: str | None, tokens: int) -> str | None:
        """/metrics once the prefix-cache queries counter has counted ``tokens`` more prompt tokens
        (vLLM updates it from the step that scheduled the request), or after SETTLE_S."""
        deadline = time.perf_counter() + SETTLE_S
        while True:
            after = await metrics_text(session, self.endpoint)
            if after is None or before is None:
                return after
            try:
                window = prefix_cache_window(before, after)
            except PromError:
                return after
            if window is None or window.queries >= tokens or time.perf_counter() > deadline:
                return after
            await asyncio.sleep(0.05)

    async def prefix_caching(self, session: aiohttp.ClientSession) -> Check:
        f = self.features["prefix_caching"]
        ask = self.ask(0)
        before = await metrics_text(session, self.endpoint)
        cold = await ask_one(session, self.endpoint, ask)
        tokens = len(cold.prompt_ids or []) or 1
        mid = await self.settled(session, before, tokens)
        hit = await ask_one(session, self.endpoint, ask)
        after = await self.settled(session, mid, tokens)
        cold_hits, hit_hits = _cached(cold, before, mid), _cached(hit, mid, after)
        if cold_hits:
            return unmeasured(f, f"the first request was not a miss ({cold_hits} prompt tokens cached)")
        if hit_hits == 0:
            return unmeasured(f, f"the repeat was not served from the cache (0 of {tokens} prompt tokens cached): "
                                 "the comparison would not isolate prefix caching (vLLM turns the cache off "
                                 "on some platforms, e.g. MLA on CPU: see the engine log)")
        note = (f"repeat served {hit_hits} of {tokens} prompt tokens from the cache" if hit_hits is not None
                else "the hit is not confirmed: no cached-token count (usage or /metrics)")
        check = feature_check(f, [Pair(cold, hit, ("cold miss", "full hit"))], self.margin, self.dtype, note=note,
                              evidence={"cached_tokens": {"miss": cold_hits, "hit": hit_hits}, "prompt_tokens": tokens})
        if hit_hits is None and check.status == "pass":  # two misses would match as well: nothing isolated
            return unmeasured(f, "the repeat's cache hit cannot be confirmed: the server reports no cached-token "
                                 "count (usage.prompt_tokens_details) and /metrics could not be read, so two misses "
                                 "would pass the same (a divergence between the two still fails)")
        return check

    async def streaming(self, session: aiohttp.ClientSession) -> Check:
        f = self.features["streaming"]
        whole = await ask_one(session, self.endpoint, self.ask(1, salt="whole", ignore_eos=False))
        streamed = await ask_one(session, self.endpoint, self.ask(1, salt="streamed", ignore_eos=False), stream=True)
        return feature_check(f, [Pair(whole, streamed, ("not streamed", "streamed"))], self.margin, self.dtype,
                             note="EOS honoured, so the finish reason is the engine's own")

    async def batch_invariance(self, session: aiohttp.ClientSession) -> Check:
        f = self.features["batch_invariance"]
        n = self.section.batch_size
        alone = await ask_one(session, self.endpoint, self.ask(2, salt="alone"))
        others = [self.ask(3 + i, salt=f"other{i}", words=self.section.prompt_words // 2 + 5 * i) for i in range(n - 1)]
        batch = await ask_many(session, self.endpoint, [self.ask(2, salt="batched"), *others])
        return feature_check(f, [Pair(alone, batch[0], ("alone", f"in a batch of {n}"))], self.margin, self.dtype,
                             note=f"{n} requests in flight at once (different prompt lengths)")

    async def long_answer(self, session: aiohttp.ClientSession, name: str, text: str) -> Answer:
        """The engine's greedy answer to a long prompt, salted: an earlier run's cache must not
        serve it, or nothing would be prefilled."""
        s = self.section
        return await ask_one(session, self.endpoint, Ask(text, s.max_tokens, s.top_k, salt=f"{self.nonce}-{name}"))

    async def speculative_answers(self, session: aiohttp.ClientSession) -> tuple[list[Answer], str | None, str | None]:
        s = self.section
        asks = [Ask(spec_prompt(self.nonce, i, s.prompt_words), s.spec_max_tokens, s.top_k,
                    salt=f"{self.nonce}-spec{i}" if self.salting else None) for i in range(s.spec_prompts)]
        before = await metrics_text(session, self.endpoint)
        answers = [await ask_one(session, self.endpoint, a) for a in asks]
        await asyncio.sleep(0.2)  # the last step's spec-decode stats reach /metrics with the step's stats
        return answers, before, await metrics_text(session, self.endpoint)


def sized_prompt(model_dir: Path, nonce: str, tokens: int) -> str:
    """A fresh prompt of the fewest words that make at least ``tokens`` tokens in the checkpoint's own
    tokenizer (a word over at most): a bisection over the word count, a dozen tokenizer passes."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))

    def length(words: int) -> int:
        return len(tok(prompt(nonce, 0, words))["input_ids"])

    lo, hi = 1, max(8, tokens // 4)
    while length(hi) < tokens:  # a word is at least one token: this doubles a few times at most
        lo, hi = hi, hi * 2
    while lo < hi:  # the fewest words that reach ``tokens``
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if length(mid) < tokens else (lo, mid)
    return prompt(nonce, 0, hi)


def _cached(answer: Answer, before: str | None, after: str | None) -> int | None:
    """Prompt tokens served from the cache: the usage field when given, else the /metrics hits delta."""
    details = (answer.usage or {}).get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        return int(details["cached_tokens"])
    if before is None or after is None:
        return None
    try:
        window = prefix_cache_window(before, after)
    except PromError:
        return None
    return None if window is None else int(round(window.hits))


COMPARED = ("prefix_caching", "streaming", "batch_invariance", "speculative", "chunked_prefill",
            "long_context")  # the order the stage runs them
# Compared through another stage's check: the deployment as configured against transformers
THROUGH_GOLDEN = ("graph_mode", "parallel_layout")
GOLDEN = "weights.golden_tokens"


def check_feature(p: Parity, name: str, model_dir: Path | None = None) -> list[Check]:
    """``parity.<name>`` (and speculation's acceptance checks): a skip when the feature is not in force,
    an error when the comparison could not be made. Each comparison has its own client session."""
    f = p.features[name]
    if not f.in_force:
        return [not_in_force(f)]
    p.progress(f"parity: {f.label}: {f.compared_against}")
    try:
        if name == "speculative":
            answers, before, after = asyncio.run(_with_session(p, p.speculative_answers))
            return [speculative_check(f, answers, model_dir, p.margin, p.dtype, p.section.top_k),
                    *acceptance_checks(before, after, p.section)]
        if name in ("chunked_prefill", "long_context"):
            return [_long_prompt(p, f, model_dir)]
        step = {"prefix_caching": p.prefix_caching, "streaming": p.streaming,
                "batch_invariance": p.batch_invariance}[name]
        return [asyncio.run(_with_session(p, step))]
    except (AnswerError, TimeoutError) as exc:
        return [unmeasured(f, str(exc) or f"no answer within parity.timeout_s={p.section.timeout_s:g}")]


def _long_prompt(p: Parity, f: Feature, model_dir: Path | None) -> Check:
    """Chunked prefill (a prompt a quarter past the chunk budget, so it takes two engine steps or
    more) or long context (the stage's depth) against transformers on the same text."""
    if f.not_compared:
        return unmeasured(f, f.not_compared)
    if model_dir is None:
        return unmeasured(f, "no local checkpoint for transformers to read")
    if f.name == "chunked_prefill":
        tokens, why = p.budget + p.budget // 4, f"past the chunk budget of {p.budget}"
    else:
        tokens, why = p.depth, p.depth_why
    text = sized_prompt(model_dir, p.nonce, tokens)
    return long_prompt_check(f, text, lambda: asyncio.run(_with_session(p, lambda s: p.long_answer(s, f.name, text))),
                             model_dir, p.margin, p.dtype, p.section.top_k, p.section.max_tokens,
                             min_tokens=p.budget + 1 if f.name == "chunked_prefill" else tokens, why_long=why)


def through_golden(feature: Feature, golden: Check | None) -> Check:
    """``parity.graph_mode`` / ``parity.parallel_layout``: no request-level comparison isolates
    them, so the deployment as configured (compiled, or across its ranks) against transformers,
    which is ``weights.golden_tokens``, answers for them; a second vLLM engine (eager, or at one
    rank) would cost a start-up. Its status is carried over, never upgraded."""
    if not feature.in_force:
        return not_in_force(feature)
    if golden is None:
        return unmeasured(feature, f"{GOLDEN} is not in this run's record")
    title = f"Output with {feature.label} equals the reference"
    message = (f"{feature.label}: {feature.compared_against}: {golden.status}: {golden.message}"
               + ("" if golden.status == "pass" else f" (carried over from {GOLDEN})"))
    return Check(id=f"parity.{feature.name}", title=title, status=golden.status, value=golden.value,
                 limit=golden.limit, unit=golden.unit, direction=golden.direction, source="record",
                 message=message, evidence={"feature": feature.describe(), "through": GOLDEN})


async def _with_session(p: Parity, step: Callable[[aiohttp.ClientSession], Awaitable[T]]) -> T:
    async with p.endpoint.session() as session:
        return await asyncio.wait_for(step(session), p.section.timeout_s)


def feature_matrix(found: dict[str, Feature], checks: list[Check]) -> Check:
    """``parity.features``: every feature, in force or not, with what it was compared against."""
    status = {c.id: c.status for c in checks}
    rows = [[*f.row(), status.get(f"parity.{f.name}", "")] for f in found.values()]
    # compared: a verdict was reached (pass or fail); an error or a skip of a feature in force is not
    compared = [f.label for f in found.values() if f.in_force and status.get(f"parity.{f.name}") in ("pass", "fail")]
    left = [f"{f.label} ({f.not_compared or status.get(f'parity.{f.name}', 'no check')})" for f in found.values()
            if f.in_force and f.label not in compared]
    message = (f"{len(compared)} feature(s) in force compared: {', '.join(compared) or 'none'}; not compared: "
               f"{'; '.join(left) or 'none'}")
    return measured("parity.features", "Features in force, and what each was compared against", len(compared),
                    unit="features", source="profile", message=message,
                    evidence={"table": {"columns": [*COLUMNS, "check"], "rows": rows}})


def run_parity(endpoint: Endpoint, profile: Profile, section: ParitySection, progress: Progress, *,
               model_dir: Path | None = None, golden: Check | None = None) -> list[Check]:
    """The whole stage in one call (the suite runs the same steps one test each); ``model_dir`` is
    the checkpoint transformers reads for the references, ``golden`` the run's weights.golden_tokens."""
    p = Parity(endpoint, profile, section, progress)
    checks = [c for name in COMPARED for c in check_feature(p, name, model_dir)]
    checks += [through_golden(p.features[name], golden) for name in THROUGH_GOLDEN]
    checks.append(feature_matrix(p.features, checks))
    return checks
