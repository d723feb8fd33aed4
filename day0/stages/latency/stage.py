"""Stage 3 against the run's engine: the profile's workload on whichever view the engine gives
(HTTP streaming, or vLLM's own engine in-process), returned as run-record checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from day0.client.workload import Vocab, read_vocab
from day0.config.profile import Profile
from day0.core.record import Check
from day0.engine import EngineError, local_model_dir, served_name
from day0.stages.latency.checks import latency_checks
from day0.stages.latency.inprocess import inprocess_checks, run_latency_inprocess
from day0.stages.latency.run import run_latency
from day0.stages.latency.settings import engine_context
from day0.stages.latency.speculative import spec_checks, speculating, speedup_check


class NoTokenizer(RuntimeError):
    """The model has no local ``tokenizer.json`` to build the synthetic prompts from."""


def tokenizer_dir(profile: Profile) -> Path:
    """The local model folder holding ``tokenizer.json``; :class:`NoTokenizer` when there is none."""
    path = local_model_dir(profile)
    if path is None or not (path / "tokenizer.json").is_file():
        raise NoTokenizer(f"synthetic prompts need the model's tokenizer.json locally; model.path "
                          f"{profile.model.path!r} is not a local directory with one")
    return path


def workload_vocab(profile: Profile) -> Vocab:
    """The vocabulary (size and special ids) prompts are drawn from; :class:`NoTokenizer` without one."""
    return read_vocab(tokenizer_dir(profile))


def run_stage(engine: Any, profile: Profile, *, progress: Callable[[str], None] | None = None,
              engines: Any = None) -> list[Check]:
    """The profile's ``[latency]`` load on ``engine``, judged against its ``[sla]``.

    On the HTTP view the client's figures are cross-checked with ``/metrics``; on the scheduler
    view (``engine.mode = "inprocess"``) vLLM's engine is driven directly, every check says
    ``source = "scheduler"`` and vLLM's per-request metrics replace ``/metrics``. A profile with
    ``speculative_config`` also gets speculative decoding's acceptance over the measured window,
    and with ``latency.spec_baseline`` its speedup against a second engine from ``engines`` (the
    session's :class:`day0.engine.Engines`) that does not speculate.
    """
    model_dir = tokenizer_dir(profile)
    settings, sla = profile.latency, profile.sla
    vocab = read_vocab(model_dir)
    ctx = engine_context(profile.engine.args, model_dir)
    if engine.view == "scheduler":
        run, agreement = run_latency_inprocess(engine.llm, served_name(profile), vocab, settings, sla,
                                               progress=progress, ctx=ctx)
        checks = inprocess_checks(run, agreement)
    else:
        endpoint = engine.endpoint
        run = run_latency(endpoint.base_url, endpoint.model, vocab, settings, sla, progress=progress,
                          headers=endpoint.headers, ctx=ctx)
        run.devices = profile.topology.world_size
        checks = latency_checks(run)
    if not speculating(profile.engine.args):
        return checks
    # acceptance over this workload, held to the [parity] limits (the one place they are set)
    checks += spec_checks(run, profile.parity)
    if settings.spec_baseline:
        baseline, why = _baseline(engine, engines, profile, vocab, ctx, progress)
        checks.append(speedup_check(run.metrics, baseline, settings.min_spec_speedup, why=why))
    return checks


def _baseline(engine: Any, engines: Any, profile: Profile, vocab: Vocab, ctx: Any,
              progress: Callable[[str], None] | None) -> tuple[Any, str]:
    """(the measured phase's metrics on a second engine without speculation, "") or (None, why not).

    The same settings and seed give the same request shapes at the same load (a fresh nonce in
    front of each prompt, as every run has); the sweep and the capacity search are not repeated.
    The engine under test stays up (idle) while the baseline runs, as it would on a host that fits
    both. Only beside a server day0 started: an external deployment's twin is not day0's to start."""
    if engine.view != "http" or engines is None or profile.engine.mode != "server":
        return None, (f"the baseline engine is a second server day0 starts; engine.mode = {profile.engine.mode!r} "
                      "(only 'server' has one)")
    settings = profile.latency.model_copy(update={"sweep_rates": [], "search": None})
    if progress:
        progress("latency: the same workload on a second engine without speculative_config")
    try:
        with engines.variant("no-spec", {"speculative_config": None}) as other:
            endpoint = other.endpoint
            run = run_latency(endpoint.base_url, endpoint.model, vocab, settings, profile.sla, progress=progress,
                              headers=endpoint.headers, ctx=ctx)
    except EngineError as exc:
        return None, f"the engine without speculative_config did not start: {exc}"
    return run.metrics, ""
