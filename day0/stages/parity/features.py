"""Which features the deployment turns on, read from the resolved engine args with vLLM's defaults
where the profile is silent, and what each is (or is not yet) compared against.

A feature is judged only by a comparison that isolates it; listing every feature in force, with
where the setting came from, keeps a skipped or uncompared one visible in the record instead of
silently passing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# vLLM 0.32 (V1 engine) defaults for the args this stage reads, when the profile does not set them.
VLLM_DEFAULTS: dict[str, Any] = {
    "enable_prefix_caching": True,  # V1: on unless the platform turns it off (CPU MLA does)
    "enable_chunked_prefill": True,  # V1: always schedules prefill in chunks of max_num_batched_tokens
    "enforce_eager": False,  # compiled + graphs by default
    "max_num_seqs": 256,
    "tensor_parallel_size": 1,
    "pipeline_parallel_size": 1,
    "data_parallel_size": 1,
}


@dataclass(frozen=True)
class Feature:
    """One feature: in force or not, from where (``profile`` or ``vLLM default``), and what the
    stage compares it against (``not compared`` with the reason when this stage cannot yet)."""

    name: str  # the check id's suffix: parity.<name>
    label: str
    in_force: bool
    source: str  # "profile: key = value" | "vLLM default: key = value" | "always (HTTP API)"
    compared_against: str
    not_compared: str = ""  # why no comparison runs for a feature in force ("" when one does)

    def row(self) -> list[Any]:
        verdict = "not in force" if not self.in_force else ("not compared" if self.not_compared else "compared")
        return [self.label, "yes" if self.in_force else "no", self.source, self.compared_against,
                self.not_compared or verdict]

    def describe(self) -> dict[str, Any]:
        return asdict(self)


COLUMNS = ["feature", "in force", "from", "compared against", "status"]


def arg(args: dict[str, Any], key: str) -> tuple[Any, str]:
    """The arg's value and where it came from."""
    if key in args and args[key] is not None:
        return args[key], f"profile: {key} = {args[key]!r}"
    value = VLLM_DEFAULTS.get(key)
    return value, f"vLLM default: {key} = {value!r}"


def features(args: dict[str, Any]) -> list[Feature]:
    """Every feature the stage knows, compared or not, from ``profile.engine.args``."""
    prefix, prefix_src = arg(args, "enable_prefix_caching")
    seqs, seqs_src = arg(args, "max_num_seqs")
    spec = args.get("speculative_config")
    spec_src = f"profile: speculative_config = {spec!r}" if spec else "vLLM default: speculative_config = None"
    chunked, chunked_src = arg(args, "enable_chunked_prefill")
    eager, eager_src = arg(args, "enforce_eager")
    tp, _ = arg(args, "tensor_parallel_size")
    pp, _ = arg(args, "pipeline_parallel_size")
    dp, _ = arg(args, "data_parallel_size")
    layout = int(tp or 1) * int(pp or 1) * int(dp or 1) > 1
    return [
        Feature("prefix_caching", "prefix caching", bool(prefix), prefix_src,
                "the same prompt as a cold miss (fresh prompt) and as a full hit"),
        Feature("batch_invariance", "batch invariance", int(seqs or 1) > 1, seqs_src,
                "a request alone vs the same request inside a concurrent batch"),
        Feature("streaming", "streaming", True, "always (the HTTP API serves both)",
                "the same request streamed and not streamed: tokens, logprobs, finish reason"),
        Feature("speculative", "speculative decoding", bool(spec), spec_src,
                "greedy tokens vs transformers (cpu/float32); acceptance from /metrics"),
        Feature("chunked_prefill", "chunked prefill", bool(chunked), chunked_src, "",
                "not compared yet: needs a prompt longer than max_num_batched_tokens against the reference"
                if chunked else ""),
        Feature("graph_mode", "compilation / graph mode", not bool(eager), eager_src, "",
                "not compared yet: needs a second (eager) engine" if not eager else ""),
        Feature("parallel_layout", "parallel layout", layout,
                f"tensor/pipeline/data parallel = {tp}/{pp}/{dp}", "",
                "not compared here: TP=2 vs TP=1 is collectives.engine_tp2_matches_tp1; other layouts need "
                "a second engine" if layout else ""),
        Feature("long_context", "long context", True, "always (max_model_len)", "",
                "not compared yet: deep positions (3/4 of max_model_len) against the reference"),
    ]
