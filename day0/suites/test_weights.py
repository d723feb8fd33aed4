"""Stage 1 - weights: the shards are complete and consistent, the engine loaded them right, and
memory per rank is within the plan."""

from pathlib import Path

import pytest

from day0.core.record import Check
from day0.engine import local_model_dir
from day0.engine.loaded import read_golden, weight_bytes_per_rank
from day0.stages.preflight import ConfigUnavailable, preflight
from day0.stages.weights import audit

pytestmark = [pytest.mark.day0, pytest.mark.weights]

SMOKE_PROMPTS = ["The supernode serves", "Paged attention keeps blocks", "A signed report says"]
SMOKE_TOKENS = 16


@pytest.fixture(scope="module")
def model_dir(day0_profile) -> Path:
    path = local_model_dir(day0_profile)
    if path is None:
        pytest.skip(f"model.path {day0_profile.model.path!r} is not a local directory: nothing to audit here")
    return path


def test_checkpoint_audit(model_dir, day0_profile, day0_checks):
    """Index, shards, header offsets, dtypes/shapes vs config.json, parameter count, manifest."""
    w = day0_profile.weights
    day0_checks.extend(audit(model_dir, verify_manifest=w.verify_manifest, workers=w.hash_workers or None,
                             manifest_name=w.manifest, max_checks_per_category=w.max_checks_per_category))


def test_engine_is_live(engine, day0_checks):
    """Smoke: greedy decoding of fixed prompts returns the requested tokens, twice the same."""
    first = engine.greedy(SMOKE_PROMPTS, SMOKE_TOKENS)
    second = engine.greedy(SMOKE_PROMPTS, SMOKE_TOKENS)
    counts = [c.completion_tokens for c in first + second]
    short = [n for n in counts if n != SMOKE_TOKENS]
    day0_checks.measured(
        "weights.smoke.tokens", "Greedy decoding returns the requested number of tokens",
        len(short), 0, unit="requests", direction="exact", source=engine.view,
        message=(f"every request returned {SMOKE_TOKENS} tokens" if not short
                 else f"{len(short)} of {len(counts)} requests returned {short} tokens, not {SMOKE_TOKENS}"),
        evidence={"completion_tokens": counts},
    )
    differ = [p for p, a, b in zip(SMOKE_PROMPTS, first, second)
              if (a.token_ids, a.text) != (b.token_ids, b.text)]
    day0_checks.measured(
        "weights.smoke.deterministic", "Greedy decoding is deterministic across two passes",
        len(differ), 0, unit="prompts", direction="exact", source=engine.view,
        message=("greedy tokens identical across two passes" if not differ
                 else f"greedy tokens differ between passes for {differ}"),
        evidence={"prompts": SMOKE_PROMPTS, "token_ids": [c.token_ids for c in first],
                  "text": [c.text for c in first]},
    )


def test_load_time(engine, day0_profile, day0_checks):
    """Engine start-up, weight loading included, against weights.load_time_limit_s (if set)."""
    info = engine.info
    day0_checks.measured("weights.load_time", "Engine start-up including weight loading",
                         round(info.startup_s, 2), day0_profile.weights.load_time_limit_s, unit="s",
                         direction="lower_is_better", source=engine.view, evidence={"mode": info.mode},
                         performance=True)


def test_weight_memory_per_rank(engine, day0_profile, day0_checks):
    """Parameter bytes each worker holds (vLLM's collective_rpc) vs the plan's weights per rank."""
    if getattr(engine, "llm", None) is None:
        pytest.skip(f"weight memory per rank is read through vLLM's worker RPC, which the {engine.info.mode} "
                    "mode does not expose; run with engine.mode = \"inprocess\" to measure it")
    ranks = weight_bytes_per_rank(engine.llm)
    per_rank = [r["loaded_bytes"] for r in ranks]
    if None in per_rank:
        pytest.skip("this vLLM worker does not record the memory its weight load took (the CPU backend repacks "
                    "linear weights into oneDNN handles, so parameter bytes undercount: "
                    f"{[round(r['parameter_bytes'] / 2**20, 2) for r in ranks]} MiB seen); measured on GPU workers")
    try:
        planned = preflight(day0_profile).plan
    except ConfigUnavailable as exc:
        planned = None
        reason = str(exc)
    tol = day0_profile.weights.memory_tolerance
    table = {"columns": ["rank", "measured GiB"], "rows": [[r, round(b / 2**30, 4)] for r, b in enumerate(per_rank)]}
    if planned is None:
        day0_checks.add(Check(id="weights.memory_per_rank", title="Weight memory per rank", status="skip",
                              value=max(per_rank), unit="bytes", source="scheduler",
                              message=f"no plan to compare with: {reason}", evidence={"table": table}))
        return
    plan_bytes = planned.weight_bytes_per_rank
    worst = max(abs(b - plan_bytes) / plan_bytes for b in per_rank)
    day0_checks.measured(
        "weights.memory_per_rank", "Weight memory per rank matches the plan", round(worst, 4), tol,
        unit="relative deviation", direction="lower_is_better", source="scheduler",
        message=(f"ranks hold {[round(b / 2**20, 2) for b in per_rank]} MiB of weights; plan {plan_bytes / 2**20:.2f} MiB "
                 f"(worst deviation {worst:.1%}, tolerance {tol:.0%})"),
        evidence={"table": table, "plan_bytes": plan_bytes, "measured_bytes": per_rank},
    )
    capacity = day0_profile.topology.device_memory_gib * 2**30 * float(
        day0_profile.engine.args.get("gpu_memory_utilization", 0.9))
    day0_checks.measured(
        "weights.memory_headroom", "Weights per rank within device capacity x utilization",
        round(max(per_rank) / 2**30, 4), round(capacity / 2**30, 4), unit="GiB", direction="lower_is_better",
        source="scheduler")


def test_golden_tokens(engine, day0_profile, day0_checks):
    """Greedy tokens equal a golden file recorded from a trusted run (weights.golden)."""
    if not day0_profile.weights.golden:
        pytest.skip("weights.golden is not set (record one from a trusted run with `day0 weights golden`)")
    golden = read_golden(Path(day0_profile.weights.golden))
    prompts = [p["prompt"] for p in golden["prompts"]]
    outs = engine.greedy(prompts, int(golden["max_tokens"]))
    differ = [p["prompt"] for p, o in zip(golden["prompts"], outs) if p["token_ids"] != o.token_ids]
    day0_checks.measured("weights.golden_tokens", "Greedy tokens equal the golden file", len(differ), 0,
                         unit="prompts", direction="exact", source=engine.view,
                         message=("greedy tokens equal the golden file" if not differ
                                  else f"greedy tokens differ from {day0_profile.weights.golden} for {differ}"),
                         evidence={"golden": day0_profile.weights.golden})
