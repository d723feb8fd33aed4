"""The profile's ``[latency]`` and ``[sla]`` tables: stage 3's load and the limits it is judged by.

One definition of each table's keys, defaults and validation; the profile, the latency stage,
``day0 latency`` (from its flags) and the risks stage's throughput run all build these models.
What turns them into client objects (workload, load shape, client options) lives in the latency
stage's ``settings`` module. ``from_table`` gives the profile's one-line error (``key.path: why``).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Mapping, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from day0.config.errors import SettingsError, first_error
from day0.core.stats import samples_to_bound

# The latency metrics a limit may name, in the order checks and sweeps list them.
LIMIT_METRICS = ("ttft", "tpot", "itl", "e2e")
# A latency limit: <metric>_p<NN>_ms, the percentile with "." or "_" for its decimal point (p99_9 = p99.9).
LIMIT_KEY = re.compile(rf"^({'|'.join(LIMIT_METRICS)})_p(\d+(?:[._]\d+)?)_ms$")
LIMIT_FORM = "<ttft|tpot|itl|e2e>_p<NN>_ms"
GOODPUT_METRICS = ("ttft", "tpot", "e2e")
# The measured phase's floor when its count is chosen for it: enough for the means and the
# server cross-checks to mean something where no limit asks for more.
MIN_REQUESTS = 32
DATASET_KINDS = ("sharegpt",)  # latency.dataset = "<kind>:<path>"  # per-request figures a goodput SLO may name (ITL is per gap)

# A length in tokens: fixed, or [lo, hi] drawn uniformly (inclusive).
Length = Union[Annotated[int, Field(ge=1)],
               Annotated[list[Annotated[int, Field(ge=1)]], Field(min_length=2, max_length=2)]]


def limit_at(key: str) -> tuple[str, float] | None:
    """(metric, percentile) of a limit key (``ttft_p99_9_ms`` -> ("ttft", 99.9)), or None."""
    m = LIMIT_KEY.match(key)
    return (m.group(1), float(m.group(2).replace("_", "."))) if m else None


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    @classmethod
    def _from_table(cls, table: Mapping[str, Any] | None, name: str) -> Any:
        try:
            return cls.model_validate(dict(table or {}))
        except ValidationError as exc:
            raise SettingsError(first_error(exc, cls, name)) from None


def length_bounds(spec: int | list[int]) -> tuple[int, int]:
    """(lo, hi) of a validated ``Length``."""
    return (spec, spec) if isinstance(spec, int) else (spec[0], spec[1])


class CapacitySearch(_Table):
    """``[latency.search]``: the highest offered request rate that meets every SLA limit, by
    bracketing then bisection, each point judged with confidence bounds (docs/stages/latency.md,
    "Capacity search"). The table's presence turns the search on. Every figure is finite: an
    ``inf`` target crashed the answer after the whole search, and a start at ``inf`` "sustained"
    it."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)

    over: Literal["rate", "concurrency"] = Field(
        "rate", description="what the search varies: the open loop's request rate (Poisson, or the profile's "
                            "burstiness and arrivals) or the closed loop's concurrency")
    start_rate: float = Field(1.0, gt=0, description="req/s of the first point (over = rate)")
    start_concurrency: int = Field(1, ge=1, description="requests in flight at the first point (over = concurrency)")
    max_concurrency: int = Field(1024, ge=1, description="concurrency the bracketing never goes past")
    growth: float = Field(2.0, gt=1, description="factor between points while bracketing")
    precision: float = Field(0.05, gt=0, lt=1, description="stop once the first missed rate is within this "
                                                          "fraction above the sustained one")
    max_points: int = Field(10, ge=2, le=100, description="full-sized points measured at most (probes and "
                                                          "confirmations not counted: a confirmation re-measures "
                                                          "a load a full point met)")
    max_rate: float = Field(10_000.0, gt=0, description="req/s the bracketing never goes past")
    requests: int = Field(0, ge=0, description="per point; 0 = the fewest that can bound the highest limited "
                                               "percentile at [sla] confidence (299 for p99 at 95%)")
    probe_requests: int = Field(32, ge=0, description="per point while bracketing upward, before anything missed: "
                                                      "such a probe only has to not miss for the bracket to move up "
                                                      "and is never the answer; 0 = every point full-sized")
    saturation_requests: int = Field(200, ge=0, description="a rate search first measures what the server completes "
                                                           "flat out: this many requests in a closed loop, whose "
                                                           "middle three fifths give the rate no open loop can be "
                                                           "sustained at; every rate at or past it misses and the "
                                                           "bisection starts under it; 0 = off (the climb from "
                                                           "start_rate)")
    saturation_concurrency: int = Field(0, ge=0, description="requests in flight while measuring saturation; 0 = all "
                                                             "saturation_requests at once. The figure is used only "
                                                             "when the server's /metrics showed requests waiting "
                                                             "(its batch full) in that window")
    saturation_max_requests: int = Field(3200, ge=0, description="while /metrics shows none of the flat-out "
                                                                 "run's requests waiting (the server's batch holds "
                                                                 "them all), it runs again with twice the requests "
                                                                 "(and twice saturation_concurrency, if set), while "
                                                                 "twice is at most this many (0 = one run): vLLM's "
                                                                 "default max_num_seqs is 1024 on an H100, H200 or "
                                                                 "B200 and 256 on other GPUs")
    confirm_requests: Optional[int] = Field(None, ge=0, description="with the saturation figure bounding the "
                                                                   "search: before the search ends on a rate, its "
                                                                   "point goes on to this many requests in all, "
                                                                   "judged as one sample (a p99 met over 299 requests "
                                                                   "is met by chance 5% of the time where it sits at "
                                                                   "the limit); a miss there moves the search below "
                                                                   "it. Default: 300 or twice a point's requests, "
                                                                   "whichever is more; 0 = off")
    confirm_s: float = Field(30.0, ge=0, description="with the saturation figure bounding the search: the answer is "
                                                     "judged over at least this many seconds of load at its rate, "
                                                     "its point's own included, as one sample (a few seconds can "
                                                     "miss the server's slow spells: on the cpu-tiny server rates "
                                                     "met over 6-second points missed over minutes); below one that "
                                                     "did not meet, each point is held from its start. MLPerf's "
                                                     "server runs last 600 s. 0 = by confirm_requests alone")
    target_rate: Optional[float] = Field(None, gt=0, description="req/s the launch must serve: replicas needed (from "
                                                                 "the sustained point's achieved req/s)")

    @model_validator(mode="after")
    def _starts_within_its_limit(self) -> "CapacitySearch":
        if self.start_rate > self.max_rate:
            raise ValueError(f"start_rate: {self.start_rate:g} is above max_rate ({self.max_rate:g})")
        if self.start_concurrency > self.max_concurrency:
            raise ValueError(f"start_concurrency: {self.start_concurrency} is above max_concurrency "
                             f"({self.max_concurrency})")
        return self


# The request-body keys the client sets itself (day0/client/stream.py, build_payload): where each
# comes from, as a refusal of it in ``extra_body`` says.
_FROM = "set by day0 from {}; set that instead"
OWNED_BODY_KEYS = {
    "model": _FROM.format("model.served_model_name"), "stream": "set by day0, which always streams",
    "stream_options": _FROM.format("latency.continuous_usage"),
    "prompt": _FROM.format("the workload (latency.input_len, length_mix or dataset)"),
    "messages": _FROM.format("the workload (latency.input_len, length_mix or dataset)"),
    "max_tokens": _FROM.format("latency.output_len"), "max_completion_tokens": _FROM.format("latency.output_len"),
    "ignore_eos": _FROM.format("latency.ignore_eos"), "return_token_ids": _FROM.format("latency.return_token_ids"),
}


class LatencySection(_Table):
    """``[latency]``: the load stage 3 offers, its workload, the client's options and the sweep."""

    endpoint: Literal["completions", "chat"] = "completions"
    load: Literal["concurrency", "rate"] = Field(
        "concurrency", description="concurrency: closed loop (`concurrency` workers); rate: open loop "
                                   "(`request_rate`)")
    concurrency: int = Field(4, ge=0, description="workers with load = concurrency (>= 1); with load = rate the "
                                                  "in-flight cap, 0 = none")
    request_rate: float = Field(1.0, gt=0, description="req/s with load = rate; inf = all at once")
    burstiness: float = Field(1.0, gt=0, description="gamma shape of the inter-arrival gaps; 1 = Poisson")
    num_requests: int = Field(0, ge=0, description="measured requests; 0 = enough to bound every limited "
                                                   "percentile at [sla] confidence (299 for p99 at 95%), at least 32")
    duration_s: float = Field(300.0, gt=0, description="stop scheduling new measured requests after this")
    warmup_requests: int = Field(2, ge=0, description="run to completion first, excluded from every statistic")
    input_len: Length = Field(128, description="prompt tokens (prefix included); [lo, hi] = uniform")
    output_len: Length = Field(32, description="generated tokens (max_tokens, ignore_eos); [lo, hi] = uniform")
    prefix_len: int = Field(0, ge=0, description="> 0: shared-prefix workload, below the shortest input_len")
    num_prefixes: int = Field(1, ge=1, description="distinct shared prefixes, round robin")
    seed: int = Field(0, description="fixes prompts and arrival times")
    fresh_prompts: bool = Field(True, description="a per-run nonce at the front of every prompt, so a repeated run "
                                                  "is not served from the prefix cache; false = the seed's prompts "
                                                  "exactly, run after run")
    dataset: str = Field("", description="prompt and output lengths from a local file: \"sharegpt:/path/to.json\" "
                                         "(replaces input_len and output_len)")
    length_mix: Literal["", "long_context"] = Field(
        "", description="long_context: prompt lengths log-uniform from 4096 tokens up to the engine's max_model_len "
                        "minus the longest output_len (replaces input_len)")
    arrivals: Literal["immediate", "vllm"] = Field(
        "immediate", description="open loop's first arrival: immediate = at t=0, no rescale; vllm = after one gap, "
                                 "rescaled so the last lands at n/rate (vllm bench serve)")
    exact_rates: bool = Field(True, description="a sweep step's or search point's schedule rescaled to offer exactly "
                                                "its rate (its bursts kept); false = as drawn, whose rate over 60 "
                                                "Poisson gaps is off by 13% (1 sd), one factor for all of a seed's points")
    workers: int = Field(0, ge=0, description="load-generator processes, each with its own event loop; 0 = one per "
                                              "8000 offered streamed messages/s, at most the usable cores "
                                              "(one fewer when the server runs on this host)")
    special_token_ids: list[int] = Field([], description="ids never drawn (added to those the engine reports)")
    request_timeout_s: float = Field(300.0, gt=0, description="from send to the end of the stream")
    stall_timeout_s: float = Field(60.0, gt=0, description="longest silence between two reads")
    ignore_eos: bool = True
    continuous_usage: bool = Field(True, description="vLLM per-chunk usage; false for servers that reject it")
    return_token_ids: bool = False
    extra_body: dict[str, Any] = Field({}, description="merged into every request body (e.g. temperature = 0)")
    percentiles: list[Annotated[float, Field(ge=0, le=100)]] = [50.0, 90.0, 95.0, 99.0, 99.9]
    server_metrics: bool = Field(True, description="scrape /metrics before and after, compare with the client (and "
                                                   "see a rate search's flat-out run keep the batch full)")
    agreement_rel: float = Field(0.25, ge=0, description="client vs engine means may differ by rel x client mean "
                                                         "+ 3 standard errors")
    sweep_rates: list[Annotated[float, Field(gt=0, allow_inf_nan=False)]] = Field(
        [], description="SLA sweep: ascending req/s, each finite (a step all at once has no schedule to keep)")
    sweep_requests: int = Field(0, ge=0, description="requests per sweep step (0 = as num_requests)")
    # Speculative decoding's gain (a profile with engine.args.speculative_config): vLLM cannot turn
    # speculation off per request, so the baseline is a second engine; only where one fits beside
    # the first (CPU targets). The speedup is mean TPOT without / with (docs/metrics.md).
    spec_baseline: bool = Field(False, description="the same workload at the same load on a second engine "
                                                   "without speculative_config: ITL/TPOT with vs without")
    min_spec_speedup: Optional[float] = Field(None, gt=0, description="limit on the speedup; unset: reported")
    search: Optional[CapacitySearch] = Field(None, description="the capacity search ([latency.search]); "
                                                               "unset: not run")

    @classmethod
    def from_table(cls, table: Mapping[str, Any] | None = None) -> "LatencySection":
        """From a ``[latency]`` table (or ``day0 latency``'s flags); :class:`SettingsError` names the key."""
        return cls._from_table(table, "latency")

    def measured_requests(self, sla: "SlaSection") -> int:
        """``num_requests``, else the fewest that let every limit of ``sla`` be decided (at least
        ``MIN_REQUESTS``): a p99 over 32 requests is their maximum, and no bound on it exists."""
        return self.num_requests or max(MIN_REQUESTS, sla.requests_to_bound())

    @model_validator(mode="before")
    @classmethod
    def _no_key_here(cls, data: Any) -> Any:
        """The key every request carries is the engine's: one setting, ``engine.api_key_env``."""
        if isinstance(data, Mapping) and "api_key_env" in data:
            raise ValueError("api_key_env: not a [latency] key; set engine.api_key_env (the one key setting, "
                             "sent with every request to the engine)")
        return data

    @field_validator("input_len", "output_len", mode="before")
    @classmethod
    def _length(cls, value: Any) -> Any:
        if isinstance(value, tuple):
            value = list(value)
        if isinstance(value, bool) or not (isinstance(value, int) or (
                isinstance(value, list) and len(value) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) for x in value))):
            raise ValueError(f"expected an int or [lo, hi], got {value!r}")
        lo, hi = length_bounds(value)
        if lo < 1 or hi < lo:
            raise ValueError(f"need 1 <= lo <= hi, got {value!r}")
        return value

    @field_validator("extra_body")
    @classmethod
    def _extra_only(cls, value: dict[str, Any]) -> dict[str, Any]:
        """``extra_body`` is merged last: a key day0 sets from a setting of its own would override
        it unseen, and the record would describe a workload that never ran (64 output tokens
        recorded, 8 asked for). ``n`` is how many choices the client counts tokens for
        (``requested_choices``): a ``"2"`` or ``2.0`` that a server might take as 2 would be counted
        as 1, and its second choice's tokens refused as malformed."""
        for key, why in OWNED_BODY_KEYS.items():
            if key in value:
                raise ValueError(f"{key}: {why}")
        n = value.get("n")
        if "n" in value and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"n: expected a whole number of choices >= 1, got {n!r}")
        return value

    @field_validator("sweep_rates")
    @classmethod
    def _ascending(cls, value: list[float]) -> list[float]:
        if value != sorted(value):
            raise ValueError(f"must be ascending, got {value!r}")
        return value

    @model_validator(mode="after")
    def _load_and_prefix(self) -> "LatencySection":
        if self.load == "concurrency" and self.concurrency < 1:
            raise ValueError(f"concurrency: must be >= 1 with load = 'concurrency' (got {self.concurrency})")
        if self.dataset:
            kind, sep, path = self.dataset.partition(":")
            if kind not in DATASET_KINDS or not sep or not path:
                raise ValueError(f"dataset: expected \"sharegpt:/path/to.json\", got {self.dataset!r}")
            if self.length_mix:
                raise ValueError("length_mix: not with dataset (the dataset gives the lengths)")
        if self.search is not None and self.search.confirm_s >= self.duration_s:
            raise ValueError(f"search.confirm_s: {self.search.confirm_s:g} s must be below duration_s "
                             f"({self.duration_s:g} s), which stops scheduling every phase: raise duration_s")
        shortest = length_bounds(self.input_len)[0]
        if self.prefix_len and self.prefix_len >= shortest and not (self.dataset or self.length_mix):
            raise ValueError(f"prefix_len: {self.prefix_len} must be below the shortest input_len ({shortest}) "
                             "so every prompt has a unique suffix")
        return self


# MLPerf Inference's server-scenario latency constraints (p99 TTFT, p99 TPOT, ms), per benchmark
# model: the standard and the interactive scenario. `[sla] preset = "llama2-70b-interactive"`.
SLA_PRESETS: dict[str, tuple[float, float]] = {
    "llama2-70b": (2000.0, 200.0), "llama2-70b-interactive": (450.0, 40.0),
    "llama3.1-405b": (6000.0, 175.0), "llama3.1-405b-interactive": (4500.0, 80.0),
    "llama3.1-8b": (2000.0, 100.0), "llama3.1-8b-interactive": (500.0, 30.0),
    "deepseek-r1": (2000.0, 80.0), "deepseek-r1-interactive": (1500.0, 15.0),
}


class SlaSection(_Table):
    """``[sla]``: the limits stage 3 is judged by.

    Latency limits are ``<metric>_p<NN>_ms`` keys: the p99 ones are fields; any other percentile
    (``ttft_p90_ms``, ``tpot_p99_9_ms``) may be written in the table itself or under ``limits``
    and is kept in ``limits``. For goodput a request is good when it meets every per-request SLO
    at once (DistServe): ``goodput_slo_ms`` when given, else the loosest limit set for each of
    TTFT, TPOT and E2E.
    """

    model_config = ConfigDict(allow_inf_nan=False, json_schema_extra={"patternProperties": {
        LIMIT_KEY.pattern: {"type": "number", "exclusiveMinimum": 0,
                            "description": "latency limit (ms) at another percentile; kept in `limits`"}}})

    preset: Optional[Literal[tuple(SLA_PRESETS)]] = Field(  # type: ignore[valid-type]
        None, description="MLPerf's p99 TTFT/TPOT limits for a benchmark model (ttft_p99_ms and tpot_p99_ms "
                          "set in the table win)")
    ttft_p99_ms: float | None = Field(None, gt=0)
    tpot_p99_ms: float | None = Field(None, gt=0)
    itl_p99_ms: float | None = Field(None, gt=0)
    e2e_p99_ms: float | None = Field(None, gt=0)
    min_output_throughput_tok_s: float | None = Field(None, ge=0)
    min_request_throughput_req_s: float | None = Field(None, ge=0)
    min_goodput_req_s: float | None = Field(None, ge=0)
    max_error_rate: float = Field(0.0, ge=0, le=1, description="share of failed requests allowed")
    confidence: float = Field(0.95, gt=0.5, lt=1, description="of the order-statistic bounds each limited "
                                                              "percentile is judged by (docs/metrics.md, Confidence)")
    goodput_slo_ms: dict[str, Annotated[float, Field(gt=0)]] = Field(
        {}, description="per-request SLO goodput judges (ms), e.g. {ttft = 500, tpot = 50}; empty = the loosest "
                        "latency limit set for each of ttft, tpot, e2e")
    limits: dict[str, Annotated[float, Field(gt=0)]] = Field(
        {}, description=f"other percentiles, {LIMIT_FORM}, e.g. {{ttft_p90_ms = 800, tpot_p99_9_ms = 300}}")

    @classmethod
    def from_table(cls, table: Mapping[str, Any] | None = None) -> "SlaSection":
        """From an ``[sla]`` table (or ``day0 latency``'s flags); :class:`SettingsError` names the key."""
        return cls._from_table(table, "sla")

    @model_validator(mode="before")
    @classmethod
    def _preset_limits(cls, data: Any) -> Any:
        """A preset fills ``ttft_p99_ms`` and ``tpot_p99_ms`` where the table leaves them unset."""
        if not isinstance(data, dict) or data.get("preset") not in SLA_PRESETS:
            return data
        ttft, tpot = SLA_PRESETS[data["preset"]]
        return {"ttft_p99_ms": ttft, "tpot_p99_ms": tpot, **{k: v for k, v in data.items() if v is not None}}

    @model_validator(mode="before")
    @classmethod
    def _limits_in_the_table(cls, data: Any) -> Any:
        """``ttft_p90_ms = 800`` written in the table itself goes into ``limits``."""
        if not isinstance(data, dict) or not isinstance(data.get("limits", {}), dict):
            return data
        moved = {k: v for k, v in data.items() if k not in cls.model_fields and LIMIT_KEY.match(str(k))}
        if not moved:
            return data
        rest = {k: v for k, v in data.items() if k not in moved}
        return {**rest, "limits": {**rest.get("limits", {}), **moved}}

    @field_validator("limits")
    @classmethod
    def _limit_keys(cls, value: dict[str, float]) -> dict[str, float]:
        for key in value:
            at = limit_at(key)
            if at is None:
                raise ValueError(f"{key}: not a '{LIMIT_FORM}' limit")
            # p0/p100: the sample's extremes, which no sample bounds; as the fraction the bounds use
            # (p0_000...1 with 322 zeros is 0 once divided by 100)
            if not 0 < at[1] / 100.0 < 1:
                raise ValueError(f"{key}: the percentile must lie strictly between 0 and 100")
        return value

    @model_validator(mode="after")
    def _one_key_a_percentile(self) -> "SlaSection":
        """Two keys for one percentile of one metric (``ttft_p99_ms`` and ``ttft_p99.0_ms``, or
        digits past a float's precision: ``ttft_p99_9000000000000001_ms`` is p99.9's float) would be
        one check id with one of the limits silently dropped: refused, naming both."""
        seen: dict[tuple[str, float], str] = {}
        for key, at, _ in self._limits_set():
            if at in seen:
                raise ValueError(f"{seen[at]} and {key}: the same percentile of {at[0]} ({at[1]!r}); keep one")
            seen[at] = key
        return self

    @field_validator("goodput_slo_ms")
    @classmethod
    def _goodput_keys(cls, value: dict[str, float]) -> dict[str, float]:
        for key in value:
            if key not in GOODPUT_METRICS:
                raise ValueError(f"{key}: not a per-request metric (expected {', '.join(GOODPUT_METRICS)})")
        return value

    def latency_limits(self) -> list[tuple[str, float, float]]:
        """(metric, percentile, limit ms) for every latency limit set, in a stable order."""
        out = {at: float(val) for _, at, val in self._limits_set()}
        order = sorted(out.items(), key=lambda kv: (LIMIT_METRICS.index(kv[0][0]), kv[0][1]))
        return [(m, p, v) for (m, p), v in order]

    def _limits_set(self) -> list[tuple[str, tuple[str, float], float]]:
        """(key, (metric, percentile), limit) of every latency limit set: the ``*_p99_ms`` fields,
        then ``limits``, in that order."""
        items = [(f"{m}_p99_ms", getattr(self, f"{m}_p99_ms")) for m in LIMIT_METRICS] + list(self.limits.items())
        return [(key, at, val) for key, val in items if val is not None and (at := limit_at(key)) is not None]

    def requests_to_bound(self) -> int:
        """The fewest requests whose sample can bound every limited percentile from above at
        ``confidence`` (0 without a latency limit): below it a limit can only be ``error``."""
        return max((samples_to_bound(p, self.confidence) for _, p, _ in self.latency_limits()), default=0)

    def per_request_slo(self) -> dict[str, float]:
        """The limit (ms) each metric of one request is held to for goodput: ``goodput_slo_ms`` as
        written when set (each metric at the limit the user set, nothing derived); otherwise the
        loosest percentile limit set for each of TTFT, TPOT and E2E."""
        if self.goodput_slo_ms:
            return {m: float(self.goodput_slo_ms[m]) for m in GOODPUT_METRICS if m in self.goodput_slo_ms}
        slo: dict[str, float] = {}
        for metric, _, limit in self.latency_limits():
            if metric in ("ttft", "tpot", "e2e"):
                slo[metric] = max(slo.get(metric, 0.0), limit)
        return slo
