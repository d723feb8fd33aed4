"""Stage 3's settings: the profile's ``[latency]`` table (``LatencySection``, defined and validated
once in ``day0.config.latency`` with ``[sla]``) turned into the client's workload, load shape and
options."""

from __future__ import annotations

import os

from day0.client.loadgen import ClientOptions, LoadShape
from day0.client.workers import auto_workers
from day0.client.workload import WorkloadSpec
from day0.config.latency import LatencySection, SettingsError, length_bounds


def workload_spec(s: LatencySection) -> WorkloadSpec:
    return WorkloadSpec(s.input_len, s.output_len, s.prefix_len, s.num_prefixes, s.seed)


def load_shape(s: LatencySection, rate: float | None = None) -> LoadShape:
    """The measured load, or (``rate`` given) a sweep step: open loop, capped only when the
    profile's own load is open loop with a cap."""
    if rate is None:
        return LoadShape(mode=s.load, concurrency=s.concurrency, request_rate=s.request_rate,
                         burstiness=s.burstiness, seed=s.seed, duration_s=s.duration_s, arrivals=s.arrivals)
    cap = s.concurrency if s.load == "rate" else 0
    return LoadShape(mode="rate", concurrency=cap, request_rate=rate, burstiness=s.burstiness,
                     seed=s.seed, duration_s=s.duration_s, arrivals=s.arrivals)


def load_workers(s: LatencySection) -> int:
    """Load-generator processes for the run: ``workers`` as set, or (0) enough for the heaviest
    phase it will offer (the measured load or the highest sweep rate), at most the usable cores."""
    if s.workers:
        return s.workers
    lo, hi = length_bounds(s.output_len)
    shapes = [load_shape(s)] + [load_shape(s, rate) for rate in s.sweep_rates[-1:]]
    return max(auto_workers(shape, (lo + hi) / 2) for shape in shapes)


def client_options(s: LatencySection, headers: dict[str, str] | None = None) -> ClientOptions:
    """How each request is shaped. ``headers`` are the engine's (``day0.engine.auth_headers``: the
    key of ``engine.api_key_env``); ``latency.api_key_env`` overrides them for a load path with its
    own key (a gateway in front of the engine). The key is read here, at run time, never stored."""
    headers = dict(headers or {})
    if s.api_key_env:
        key = os.environ.get(s.api_key_env)
        if not key:
            raise SettingsError(f"latency.api_key_env: environment variable {s.api_key_env} is not set")
        headers["Authorization"] = f"Bearer {key}"
    return ClientOptions(endpoint=s.endpoint, ignore_eos=s.ignore_eos, continuous_usage=s.continuous_usage,
                         return_token_ids=s.return_token_ids, extra_body=dict(s.extra_body), headers=headers,
                         request_timeout_s=s.request_timeout_s, stall_timeout_s=s.stall_timeout_s)
