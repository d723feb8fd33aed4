"""Tenant isolation in the prefix cache, measured against the live engine's HTTP API.

vLLM shares KV blocks between requests whose prompts start alike. Between tenants that is a side
channel: a tenant that gets a fast first token for a guessed prefix learns that someone else sent
it. vLLM's per-request ``cache_salt`` is mixed into the first block's hash, so requests with
different salts never share blocks. This module proves that on the deployment (tenant B gets no
cached tokens of tenant A's prompt, while A's own repeat does), measures how large the timing
signal is (TTFT of a hit vs a miss), and measures the declared production salting policy the same
way: with several tenants and unsalted requests, B's cached tokens are the leak.

Cached-token counts come from the engine: ``usage.prompt_tokens_details.cached_tokens`` when the
server reports it (``--enable-prompt-tokens-details``), otherwise the delta of
``vllm:prefix_cache_hits_total`` around the request (requests run one at a time, so the delta
is that request's). Network and storage isolation cannot be measured from here: they are
recorded from the profile as declared items a person confirms at sign-off.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import secrets
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import aiohttp

from day0.client.loadgen import SSEParser, TokenAccountant
from day0.client.prom import PromError, parse_counters, scrape
from day0.client.sse import SSEError
from day0.client.stream import max_output_tokens
from day0.config.risks import IsolationSettings
from day0.core.record import Check, measured
from day0.engine import Endpoint

HITS = "vllm:prefix_cache_hits"
QUERIES = "vllm:prefix_cache_queries"
SOURCE = "http"


class IsolationError(RuntimeError):
    """A probe that could not be made; the message names the URL and what went wrong."""


# --------------------------------------------------------------------------- /metrics counters


def counter_total(text: str, name: str) -> float | None:
    """Sum of a Prometheus counter over every label set (engines, models); None when absent.

    Counters appear as ``name_total`` samples (``name`` in older clients); both are accepted.
    """
    return parse_counters(text, [name]).get(name)


def counter_delta(before: str, after: str, name: str) -> float | None:
    """What a counter counted between two scrapes; a decrease means the server restarted."""
    a, b = counter_total(before, name), counter_total(after, name)
    if a is None or b is None:
        return None
    if b < a:
        raise PromError(f"{name}: went down between scrapes ({a:g} -> {b:g}); the server restarted")
    return b - a


# --------------------------------------------------------------------------- probes


@dataclass
class Probe:
    """One request as the isolation check saw it."""

    label: str  # what the probe is for: "A cold", "B", "miss 3", ...
    tenant: str
    salt: str | None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    cached_source: str = "none"  # usage | /metrics | none
    ttft_ms: float | None = None  # send -> first token-carrying message (vLLM bench's TTFT)
    error: str = ""

    def row(self) -> list[Any]:
        return [self.label, self.tenant, self.salt or "(none)", self.prompt_tokens, self.cached_tokens,
                self.cached_source, None if self.ttft_ms is None else round(self.ttft_ms, 2)]


PROBE_COLUMNS = ["request", "tenant", "cache_salt", "prompt tokens", "cached tokens", "cached from", "TTFT ms"]


def cached_from_usage(usage: dict[str, Any] | None) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens`` (OpenAI's field) when the server fills it."""
    details = (usage or {}).get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        return int(details["cached_tokens"])
    return None


class Prober:
    """Sends probes one at a time (so /metrics deltas belong to one request) and times them."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, model: str, *,
                 headers: dict[str, str] | None = None, settle_s: float = 3.0) -> None:
        self.session = session
        self.base = base_url.rstrip("/").removesuffix("/v1")
        self.model = model
        self.headers = headers or {}
        self.settle_s = settle_s

    async def tokenize(self, text: str) -> list[int]:
        url = self.base + "/tokenize"
        try:
            async with self.session.post(url, json={"model": self.model, "prompt": text,
                                                    "add_special_tokens": False}, headers=self.headers) as resp:
                if resp.status != 200:
                    raise IsolationError(f"{url}: HTTP {resp.status}: {(await resp.text())[:200]}")
                data = await resp.json(content_type=None)
        except aiohttp.ClientError as exc:
            raise IsolationError(f"{url}: {type(exc).__name__}: {exc}") from None
        tokens = data.get("tokens") if isinstance(data, dict) else None
        if not isinstance(tokens, list) or not tokens:
            raise IsolationError(f"{url}: no tokens in the answer")
        return [int(t) for t in tokens]

    async def _metrics(self) -> str | None:
        try:
            return await scrape(self.session, self.base)
        except PromError:
            return None

    async def send(self, label: str, tenant: str, prompt: list[int], salt: str | None) -> Probe:
        """One streaming request with ``max_tokens = 1``: TTFT plus the cached-token count."""
        probe = Probe(label, tenant, salt)
        before = await self._metrics()
        body: dict[str, Any] = {"model": self.model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0,
                                "stream": True, "stream_options": {"include_usage": True},
                                "return_token_ids": True}
        if salt is not None:
            body["cache_salt"] = salt
        url = self.base + "/v1/completions"
        acct = TokenAccountant(max_output_tokens(body))  # a count past what the body asks cannot be true
        usage: dict[str, Any] | None = None
        perf = time.perf_counter
        sent = perf()
        try:
            async with self.session.post(url, json=body, headers=self.headers) as resp:
                if resp.status != 200:
                    probe.error = f"{url}: HTTP {resp.status}: {' '.join((await resp.text())[:200].split())}"
                    return probe
                parser = SSEParser()
                async for chunk in resp.content.iter_any():
                    now = perf()
                    for ev in parser.feed(chunk):
                        if ev.data == "[DONE]":
                            continue
                        try:
                            carries = acct.tokens_in(ev.data) > 0
                        except Exception as exc:  # loadgen's own failure kinds: an error event, bad JSON
                            probe.error = f"{url}: {getattr(exc, 'reason', exc)}"
                            return probe
                        if carries and probe.ttft_ms is None:
                            probe.ttft_ms = (now - sent) * 1000.0
                        try:
                            obj = json.loads(ev.data)
                        except json.JSONDecodeError:
                            continue
                        if isinstance(obj, dict) and obj.get("usage"):
                            usage = obj["usage"]
        except (aiohttp.ClientError, TimeoutError, SSEError) as exc:  # SSEError: a line or event without end
            probe.error = f"{url}: {type(exc).__name__}: {exc}"
            return probe
        probe.prompt_tokens = (usage or {}).get("prompt_tokens", len(prompt))
        from_usage = cached_from_usage(usage)
        if from_usage is not None:
            probe.cached_tokens, probe.cached_source = from_usage, "usage"
        elif before is not None:
            probe.cached_tokens = await self._hits_since(before, probe.prompt_tokens or len(prompt))
            probe.cached_source = "/metrics" if probe.cached_tokens is not None else "none"
        return probe

    async def _hits_since(self, before: str, prompt_tokens: int) -> int | None:
        """Hits counted since ``before``, once the queries counter shows this request's tokens.

        The counters are updated from the engine step that scheduled the request; polling until
        the queried tokens have arrived keeps a slow stats path from reading as "no hits".
        """
        deadline = time.perf_counter() + self.settle_s
        while True:
            after = await self._metrics()
            if after is None:
                return None
            queries = counter_delta(before, after, QUERIES)
            hits = counter_delta(before, after, HITS)
            if queries is None or hits is None:
                return None
            if queries >= prompt_tokens or time.perf_counter() > deadline:
                return int(round(hits))
            await asyncio.sleep(0.05)


def fresh_prompt(pool: Sequence[int], length: int, rng: random.Random) -> list[int]:
    """``length`` ids drawn from ``pool`` (ids the tokenizer produced, so all valid): a prefix
    no earlier request can have cached, with overwhelming probability."""
    if not pool:
        raise IsolationError("no token ids to build a probe prompt from")
    return [rng.choice(pool) for _ in range(length)]


# --------------------------------------------------------------------------- the measurement


@dataclass
class IsolationRun:
    """Everything the isolation check measured, in the order it was sent."""

    settings: IsolationSettings
    nonce: str
    salted: list[Probe] = field(default_factory=list)  # A cold, A repeat, B (different salts)
    policy: list[Probe] = field(default_factory=list)  # A, B under the declared salting policy
    hits: list[Probe] = field(default_factory=list)
    misses: list[Probe] = field(default_factory=list)

    def probes(self) -> list[Probe]:
        return [*self.salted, *self.policy, *self.hits, *self.misses]


def tenant_salt(nonce: str, tenant: str) -> str:
    """The per-tenant salt a gateway would set (a fresh nonce per run, so runs never share)."""
    return f"day0-{nonce}-{tenant}"


async def measure_isolation(base_url: str, model: str, settings: IsolationSettings, *,
                            headers: dict[str, str] | None = None, timeout_s: float = 120.0,
                            seed: int | None = None) -> IsolationRun:
    nonce = secrets.token_hex(4) if seed is None else f"seed{seed}"
    rng = random.Random(nonce)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    run = IsolationRun(settings, nonce)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        prober = Prober(session, base_url, model, headers=headers)
        from day0.config.risks import EVAL_TEXT

        pool = sorted(set(await prober.tokenize(EVAL_TEXT)))
        n = settings.prompt_tokens
        # (a) distinct salts: A cold, A again (must hit), B (must not)
        shared = fresh_prompt(pool, n, rng)
        salt_a, salt_b = tenant_salt(nonce, "tenant-a"), tenant_salt(nonce, "tenant-b")
        run.salted = [await prober.send("A cold", "tenant-a", shared, salt_a),
                      await prober.send("A repeat", "tenant-a", shared, salt_a),
                      await prober.send("B same prompt", "tenant-b", shared, salt_b)]
        # (c) the declared production policy with several tenants
        if settings.tenants > 1 and settings.salt == "none":
            other = fresh_prompt(pool, n, rng)
            run.policy = [await prober.send("A (policy)", "tenant-a", other, None),
                          await prober.send("B (policy)", "tenant-b", other, None)]
        # (b) timing signal: interleaved misses (a new salt each) and hits (one primed salt)
        timed = fresh_prompt(pool, n, rng)
        hit_salt = tenant_salt(nonce, "timing-hit")
        await prober.send("prime", "timing", timed, hit_salt)
        for i in range(settings.timing_samples):
            run.misses.append(await prober.send(f"miss {i + 1}", "timing", timed,
                                                tenant_salt(nonce, f"timing-miss-{i}")))
            run.hits.append(await prober.send(f"hit {i + 1}", "timing", timed, hit_salt))
    return run


def run_isolation(base_url: str, model: str, settings: IsolationSettings, **kw: Any) -> IsolationRun:
    return asyncio.run(measure_isolation(base_url, model, settings, **kw))


# --------------------------------------------------------------------------- statistics


def median(values: Sequence[float]) -> float:
    xs = sorted(values)
    if not xs:
        return math.nan
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2.0


def separability(fast: Sequence[float], slow: Sequence[float]) -> float:
    """P(a random ``fast`` sample < a random ``slow`` one), ties counting half (the ROC AUC of
    telling them apart by a threshold). 0.5: no signal; 1.0: one TTFT tells a hit from a miss."""
    if not fast or not slow:
        return math.nan
    wins = sum((f < s) + 0.5 * (f == s) for f in fast for s in slow)
    return wins / (len(fast) * len(slow))


# --------------------------------------------------------------------------- checks


def _probe_failure(probes: Sequence[Probe]) -> str | None:
    bad = [p for p in probes if p.error]
    return f"{bad[0].label}: {bad[0].error}" if bad else None


def isolation_checks(run: IsolationRun) -> list[Check]:
    s = run.settings
    table = {"columns": PROBE_COLUMNS, "rows": [p.row() for p in run.probes()]}
    checks = [_salt_check(run, table), _policy_check(run), _timing_check(run)]
    checks += declared_checks(s)
    return checks


def _error(id: str, title: str, message: str, evidence: dict[str, Any] | None = None) -> Check:
    return Check(id=id, title=title, status="error", message=message, evidence=evidence or {}, source=SOURCE)


def _salt_check(run: IsolationRun, table: dict[str, Any]) -> Check:
    cid, title = "risks.isolation.cache_salt", "Different cache_salt: no KV blocks shared between tenants"
    failure = _probe_failure(run.salted)
    if failure:
        return _error(cid, title, failure, {"table": table})
    cold, repeat, other = run.salted
    if other.cached_tokens is None:
        return Check(id=cid, title=title, status="skip", source=SOURCE, evidence={"table": table},
                     message="the engine reports no cached-token counts (no usage.prompt_tokens_details and no "
                             "vllm:prefix_cache_* on /metrics); start vLLM with --enable-prompt-tokens-details")
    evidence = {"table": table, "tenant_a_repeat_cached_tokens": repeat.cached_tokens,
                "cached_from": other.cached_source, "salts": [cold.salt, other.salt]}
    if not repeat.cached_tokens:
        message = (f"prefix caching is off or reused nothing (tenant A's own repeat got 0 cached tokens): "
                   f"no KV blocks are shared, tenant B got {other.cached_tokens}")
    elif other.cached_tokens == 0:
        message = (f"tenant B got 0 cached tokens of tenant A's {other.prompt_tokens}-token prompt with another "
                   f"cache_salt, while A's repeat reused {repeat.cached_tokens} (from {other.cached_source})")
    else:
        message = (f"tenant B reused {other.cached_tokens} cached tokens of tenant A's prompt despite a different "
                   f"cache_salt: this vLLM does not separate tenants by salt; upgrade it or disable prefix caching")
    return measured(cid, title, other.cached_tokens, 0, unit="tokens", direction="exact", message=message,
                    evidence=evidence, source=SOURCE)


def _policy_check(run: IsolationRun) -> Check:
    s = run.settings
    cid, title = "risks.isolation.tenant_policy", "Declared salting policy keeps tenants apart"
    if s.tenants == 1:
        return Check(id=cid, title=title, status="skip", source=SOURCE, evidence={"tenants": 1},
                     message="one tenant declared ([risks.isolation].tenants = 1): no other tenant to leak to")
    probes = run.policy if s.salt == "none" else run.salted[::2]  # per_tenant: the salted A/B pair
    failure = _probe_failure(probes)
    if failure:
        return _error(cid, title, failure)
    b = probes[-1]
    table = {"columns": PROBE_COLUMNS, "rows": [p.row() for p in probes]}
    evidence = {"tenants": s.tenants, "salt_policy": s.salt, "table": table}
    if b.cached_tokens is None:
        return Check(id=cid, title=title, status="skip", source=SOURCE, evidence=evidence,
                     message="the engine reports no cached-token counts; cannot measure the declared policy")
    if b.cached_tokens == 0:
        how = ("requests carry a per-tenant cache_salt" if s.salt == "per_tenant"
               else "requests carry no cache_salt, but nothing was reused (prefix caching off)")
        message = f"{s.tenants} tenants: tenant B got 0 cached tokens of tenant A's prompt; {how}"
    else:
        message = (f"{s.tenants} tenants share prefix-cache blocks: tenant B reused {b.cached_tokens} of "
                   f"{b.prompt_tokens} cached tokens of tenant A's prompt because requests carry no cache_salt "
                   f"([risks.isolation].salt = \"none\"); set cache_salt per tenant in the gateway or disable "
                   f"prefix caching")
    return measured(cid, title, b.cached_tokens, 0, unit="tokens", direction="exact", message=message,
                    evidence=evidence, source=SOURCE)


def _timing_check(run: IsolationRun) -> Check:
    cid, title = "risks.isolation.timing_signal", "TTFT of a prefix-cache miss minus a hit (the side channel)"
    failure = _probe_failure([*run.hits, *run.misses])
    if failure:
        return _error(cid, title, failure)
    hits = [p.ttft_ms for p in run.hits if p.ttft_ms is not None]
    misses = [p.ttft_ms for p in run.misses if p.ttft_ms is not None]
    if not hits or not misses:
        return _error(cid, title, "no TTFT samples (no token-carrying message came back)")
    h, m = median(hits), median(misses)
    auc = separability(hits, misses)
    hit_cached = [p.cached_tokens for p in run.hits]
    miss_cached = [p.cached_tokens for p in run.misses]
    evidence = {
        "hit_ttft_ms": hits, "miss_ttft_ms": misses, "hit_cached_tokens": hit_cached,
        "miss_cached_tokens": miss_cached, "median_hit_ms": h, "median_miss_ms": m,
        "ratio": m / h if h > 0 else None, "separability": auc,
        "table": {"columns": ["", "median TTFT ms", "samples", "cached tokens"],
                  "rows": [["miss (new cache_salt each)", round(m, 2), len(misses), miss_cached],
                           ["hit (same cache_salt)", round(h, 2), len(hits), hit_cached]]},
        "charts": [{"kind": "scatter", "title": "TTFT per probe: hit vs miss", "x_label": "probe",
                    "y_label": "TTFT (ms)", "x_log": False,
                    "series": [{"name": "miss", "x": list(range(1, len(misses) + 1)), "y": misses},
                               {"name": "hit", "x": list(range(1, len(hits) + 1)), "y": hits}],
                    "reference": []}],
    }
    if not any(hit_cached):
        message = (f"no prefix-cache hits (prefix caching off, or counts not reported): repeats took {h:.1f} ms "
                   f"vs {m:.1f} ms for new salts; the difference is not a cache signal")
    else:
        message = (f"a cache hit answers in {h:.1f} ms vs {m:.1f} ms for a miss (x{m / h:.1f}); one TTFT tells "
                   f"them apart with probability {auc:.2f} on this deployment: cache_salt per tenant closes it")
    return measured(cid, title, round(m - h, 3), None, unit="ms", direction="lower_is_better", message=message,
                    evidence=evidence, source=SOURCE)


def declared_checks(settings: IsolationSettings) -> list[Check]:
    """Network and storage isolation: recorded as declared, for a person to confirm at sign-off."""
    out = []
    for key, what in (("network", "Network isolation between tenants"),
                      ("storage", "Storage isolation between tenants")):
        text = getattr(settings, key).strip()
        cid = f"risks.isolation.{key}"
        if text:
            out.append(Check(id=cid, title=what, status="skip", source="profile",
                             message=f"declared, not measured: {text}; confirm at sign-off",
                             evidence={"declared": True, "mechanism": text, "profile_key": f"risks.isolation.{key}"}))
        elif settings.tenants > 1:
            out.append(Check(id=cid, title=what, status="fail", source="profile",
                             message=f"not declared: {settings.tenants} tenants share this deployment but "
                                     f"[risks.isolation].{key} is empty; state the mechanism so it can be confirmed",
                             evidence={"declared": False, "profile_key": f"risks.isolation.{key}"}))
        else:
            out.append(Check(id=cid, title=what, status="skip", source="profile",
                             message=f"not declared ([risks.isolation].{key}); one tenant, nothing to separate",
                             evidence={"declared": False, "profile_key": f"risks.isolation.{key}"}))
    return out


def run_evidence(run: IsolationRun) -> dict[str, Any]:
    return {"nonce": run.nonce, "probes": [asdict(p) for p in run.probes()]}


def check_isolation(endpoint: Endpoint, profile: Any) -> list[Check]:
    """Probe the deployment with ``[risks.isolation]``'s tenants and judge it: the checks, with
    every probe in the first one's evidence."""
    run = run_isolation(endpoint.base_url, endpoint.model, profile.risks.isolation, headers=endpoint.headers,
                        timeout_s=endpoint.timeout_s)
    checks = isolation_checks(run)
    checks[0].evidence["probes"] = run_evidence(run)["probes"]
    return checks
