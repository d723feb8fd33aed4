"""Stage 3's settings: the profile's ``[latency]`` table (``LatencySection``, defined and validated
once in ``day0.config.latency`` with ``[sla]``) turned into the client's workload, load shape and
options."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from day0.client.loadgen import ClientOptions, LoadShape
from day0.client.workers import auto_workers, client_cores
from day0.client.workload import WorkloadSpec
from day0.config.errors import SettingsError
from day0.config.latency import LatencySection, length_bounds
from day0.stages.latency.datasets import DatasetLengths, long_context_range, sharegpt_lengths

# The prefix-cache allowance's block when the engine's is not known: vLLM's default on GPUs.
DEFAULT_BLOCK_SIZE = 16


@dataclass(frozen=True)
class EngineContext:
    """What the workload needs to know about the engine beyond its vocabulary: where the
    tokenizer is (dataset lengths in its tokens), the context length (long-context mix, dataset
    filter) and the KV block (a prefix cache hits whole blocks: the share's allowance)."""

    tokenizer_dir: Path | None = None
    max_model_len: int | None = None
    block_size: int | None = None


def engine_context(args: dict, tokenizer_dir: Path | None) -> EngineContext:
    """From a profile's ``engine.args`` (what vLLM is started with)."""
    def positive(key: str) -> int | None:
        v = args.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None

    return EngineContext(tokenizer_dir, positive("max_model_len"), positive("block_size"))


def dataset_lengths(s: LatencySection, ctx: EngineContext) -> DatasetLengths | None:
    """The dataset's (input, output) lengths, when ``latency.dataset`` names one (InputError if unusable)."""
    if not s.dataset:
        return None
    _, _, path = s.dataset.partition(":")
    return sharegpt_lengths(Path(path), ctx.tokenizer_dir, ctx.max_model_len)


def workload_spec(s: LatencySection, *, nonce: int | None = None, dataset: DatasetLengths | None = None,
                  ctx: EngineContext | None = None) -> WorkloadSpec:
    """The run's workload: ``nonce`` fresh per run (``latency.fresh_prompts``), lengths from the
    profile, the dataset or the long-context mix."""
    input_len, dist = s.input_len, "uniform"
    if s.length_mix == "long_context":
        max_len = (ctx or EngineContext()).max_model_len
        if not max_len:
            raise SettingsError("latency.length_mix: long_context needs the engine's max_model_len "
                                "(engine.args.max_model_len, or --max-model-len)")
        input_len, dist = list(long_context_range(max_len, length_bounds(s.output_len)[1])), "log_uniform"
    return WorkloadSpec(input_len, s.output_len, s.prefix_len, s.num_prefixes, s.seed, nonce, dist,
                        dataset.pairs if dataset else ())


def load_shape(s: LatencySection, rate: float | None = None, stream: str = "") -> LoadShape:
    """The measured load, or (``rate`` given) a sweep step: open loop, capped only when the
    profile's own load is open loop with a cap, its schedule rescaled to offer exactly ``rate``
    (``exact_rates``): a step's verdict names its rate, so it must be the rate offered. A step
    names its ``stream`` (its prompts' name) and draws its own arrivals from the seed: steps that
    shared one schedule shared its bursts, and one burst could decide them all."""
    if rate is None:
        return LoadShape(mode=s.load, concurrency=s.concurrency, request_rate=s.request_rate,
                         burstiness=s.burstiness, seed=s.seed, duration_s=s.duration_s, arrivals=s.arrivals)
    cap = s.concurrency if s.load == "rate" else 0
    return LoadShape(mode="rate", concurrency=cap, request_rate=rate, burstiness=s.burstiness,
                     seed=s.seed, duration_s=s.duration_s, arrivals=s.arrivals, exact_rate=s.exact_rates,
                     stream=stream)


def search_shape(s: LatencySection, x: float, stream: str = "") -> LoadShape:
    """A capacity-search point at ``x`` on its axis: a request rate (as a sweep step, on its own
    ``stream``'s arrivals), or a closed loop of ``x`` requests in flight."""
    if s.search is not None and s.search.over == "concurrency":
        return LoadShape(mode="concurrency", concurrency=int(x), seed=s.seed, duration_s=s.duration_s)
    return load_shape(s, x, stream)


def load_workers(s: LatencySection, base_url: str | None = None) -> int:
    """Load-generator processes for the run: ``workers`` as set, or (0) enough for the heaviest
    phase it will offer, at most the cores the client may take beside a server at ``base_url``
    (``client_cores``). The measured load and the highest sweep rate are known before the run; a
    capacity search's loads are not (up to what the server completes flat out), so with a search
    the run has every core it may take, and each phase uses what its own load needs
    (:func:`phase_workers`)."""
    if s.workers:
        return s.workers
    cores = client_cores(base_url)
    if s.search is not None:
        return cores
    shapes = [load_shape(s)] + [load_shape(s, rate) for rate in s.sweep_rates[-1:]]
    return max(_for_load(s, shape, cores) for shape in shapes)


def phase_workers(s: LatencySection, shape: LoadShape, pool: int) -> int:
    """The workers of a pool of ``pool`` that one phase at ``shape`` uses: the whole pool, as
    sized for the run's heaviest phase (each worker keeps its connections warm from one phase to
    the next), except in a run whose pool a search sized (``workers = 0``): there, one per
    ``AUTO_MESSAGES_PER_WORKER`` messages a second the phase offers."""
    if s.workers or s.search is None:
        return pool
    return _for_load(s, shape, pool)


def _for_load(s: LatencySection, shape: LoadShape, cores: int) -> int:
    """``auto_workers`` for ``shape`` at the workload's mean output length."""
    lo, hi = length_bounds(s.output_len)
    return auto_workers(shape, (lo + hi) / 2, cores)


def client_options(s: LatencySection, headers: dict[str, str] | None = None) -> ClientOptions:
    """How each request is shaped. ``headers`` are the engine's (``day0.engine.auth_headers``: the
    key ``engine.api_key_env`` names, the one key setting); this module never reads a key."""
    return ClientOptions(endpoint=s.endpoint, ignore_eos=s.ignore_eos, continuous_usage=s.continuous_usage,
                         return_token_ids=s.return_token_ids, extra_body=dict(s.extra_body),
                         headers=dict(headers or {}),
                         request_timeout_s=s.request_timeout_s, stall_timeout_s=s.stall_timeout_s)
