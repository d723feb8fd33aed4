"""A repeated run against a live prefix-caching server: fresh prompts keep the cache out of the
latency figures, the seed's prompts alone do not (so the check can fail).

One vLLM server (the cpu-tiny profile: the tiny model, ``enable_prefix_caching = true``, block
32) for the whole module, about 45 s to start on 2 cores; each run is a few short requests.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from day0.client.workload import read_vocab
from day0.config.latency import LatencySection
from day0.config.profile import load_profile
from day0.engine import ServerEngine, served_name
from day0.engine.rpc_folder import FOLDER_LINE
from day0.engine.server import RENDEZVOUS_FILE
from day0.model.tiny import cached_model
from day0.stages.latency.checks import latency_checks
from day0.stages.latency.run import run_latency
from day0.stages.latency.settings import engine_context

WORKLOAD = {"load": "concurrency", "concurrency": 4, "num_requests": 8, "warmup_requests": 1,
            "input_len": [96, 256], "output_len": 2, "seed": 7}

pytestmark = pytest.mark.engine  # starts vLLM: one such test at a time under xdist (tests/conftest.py)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    profile = load_profile("cpu-tiny")
    assert profile.engine.args.get("enable_prefix_caching") is True
    model_dir = cached_model(profile.model.tiny)
    engine = ServerEngine(profile, tmp_path_factory.mktemp("prefix-cache-live"), print, name="prefix-cache")
    try:
        engine.start()
        yield profile, engine, model_dir
    finally:
        engine.stop()


def _share(live, **overrides):
    profile, engine, model_dir = live
    settings = LatencySection.from_table({**WORKLOAD, **overrides})
    run = run_latency(engine.base_url, served_name(profile), read_vocab(model_dir), settings,
                      ctx=engine_context(profile.engine.args, model_dir))
    assert run.metrics.completed == settings.num_requests
    check = next(c for c in latency_checks(run) if c.id == "latency.prefix_cache_share")
    return check, run.cache


def test_a_repeated_run_with_fresh_prompts_is_not_served_from_the_cache(live):
    _share(live)
    check, cache = _share(live)  # the same seed again
    print(f"fresh prompts, repeated run: share {check.value} (limit {check.limit})")
    assert check.status == "pass", check.message
    assert cache.window.queries > 0 and check.value <= check.limit < 0.25


def test_the_seeds_prompts_alone_are_served_from_the_cache_and_fail(live):
    _share(live, fresh_prompts=False)
    check, cache = _share(live, fresh_prompts=False)
    print(f"seed-only prompts, repeated run: share {check.value} (limit {check.limit})")
    assert check.status == "fail" and check.value > 0.5, check.message


def test_a_shared_prefix_workload_hits_what_it_shares_and_passes(live):
    check, cache = _share(live, prefix_len=64, num_prefixes=1, seed=8)
    print(f"shared prefix: share {check.value}, intended {cache.intended:.3f}, limit {check.limit}")
    assert check.status == "pass", check.message
    assert check.value > 0.1  # the prefix (64 + nonce tokens: two 32-token blocks) was found


def test_what_the_server_puts_in_the_temp_folder_is_where_its_stop_finds_it(live):
    """vLLM binds its sockets in the folder ``vllm_cli serve`` made and names in the log (removed as
    the server exits), not in /tmp; and the log names the rendezvous file the stop removes
    (tests/engine/test_temp_leftovers.py; after a whole run, tests/harness/test_e2e.py)."""
    _, engine, _ = live
    log = engine.log_path.read_text(errors="replace")
    folder = FOLDER_LINE.search(log)
    assert folder, f"{engine.log_path} names no socket folder"
    sockets = [p for p in Path(folder.group(1)).iterdir() if p.is_socket()]
    assert sockets, f"vLLM bound no socket in {folder.group(1)}"
    named = {Path(m.group(1)) for m in RENDEZVOUS_FILE.finditer(log)}
    assert len(named) == 1 and next(iter(named)).is_file(), f"{engine.log_path} names no rendezvous file: {named}"
