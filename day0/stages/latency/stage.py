"""Stage 3 against the run's engine: the profile's workload on whichever view the engine gives
(HTTP streaming, or vLLM's own engine in-process), returned as run-record checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from day0.client.workload import Vocab, read_vocab
from day0.config.profile import Profile
from day0.core.record import Check
from day0.engine import local_model_dir, served_name
from day0.stages.latency.checks import latency_checks
from day0.stages.latency.inprocess import inprocess_checks, run_latency_inprocess
from day0.stages.latency.run import run_latency
from day0.stages.latency.settings import engine_context
from day0.stages.latency.speculative import spec_checks, speculating


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


def run_stage(engine: Any, profile: Profile, *, progress: Callable[[str], None] | None = None) -> list[Check]:
    """The profile's ``[latency]`` load on ``engine``, judged against its ``[sla]``.

    On the HTTP view the client's figures are cross-checked with ``/metrics``; on the scheduler
    view (``engine.mode = "inprocess"``) vLLM's engine is driven directly, every check says
    ``source = "scheduler"`` and vLLM's per-request metrics replace ``/metrics``. A profile with
    ``speculative_config`` also gets speculative decoding's acceptance over the measured window.
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
        checks = latency_checks(run)
    # acceptance over this workload, held to the [parity] limits (the one place they are set)
    return checks + (spec_checks(run, profile.parity) if speculating(profile.engine.args) else [])
