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
# max_num_batched_tokens when the profile is silent: vLLM 0.32's OpenAI-server defaults
# (engine/arg_utils.py get_batch_defaults): 2048 x world size on CPU; on GPUs it depends on the
# card (1024-16384), so the largest is taken, which a prompt must exceed to be chunked anywhere.
CPU_SERVER_BATCHED_TOKENS = 2048
GPU_SERVER_BATCHED_TOKENS_MAX = 16384
LONG_CONTEXT_FRACTION = 0.75  # how deep the long-context comparison reaches into max_model_len


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


def chunk_budget(args: dict[str, Any], device: str) -> tuple[int, str]:
    """Prompt tokens one engine step prefills (``max_num_batched_tokens``) and where that came from."""
    if args.get("max_num_batched_tokens"):
        budget = int(args["max_num_batched_tokens"])
        return budget, f"profile: max_num_batched_tokens = {budget}"
    world = int(args.get("tensor_parallel_size") or 1) * int(args.get("pipeline_parallel_size") or 1)
    if device == "cpu":
        return CPU_SERVER_BATCHED_TOKENS * world, f"vLLM default on CPU: 2048 x {world} rank(s)"
    return GPU_SERVER_BATCHED_TOKENS_MAX, "vLLM default on GPUs: at most 16384"


def long_context_depth(args: dict[str, Any], setting: int | None) -> tuple[int, str]:
    """Prompt tokens of the long-context comparison, or 0 and why it is not made."""
    if setting == 0:
        return 0, "parity.long_context_tokens = 0"
    if setting:
        return int(setting), f"parity.long_context_tokens = {setting}"
    if not args.get("max_model_len"):
        return 0, "engine.args.max_model_len is not set (vLLM takes the model's, often far beyond what a " \
                  "reference can run here): set it, or parity.long_context_tokens"
    depth = int(int(args["max_model_len"]) * LONG_CONTEXT_FRACTION)
    return depth, f"3/4 of max_model_len = {args['max_model_len']}"


def features(args: dict[str, Any], *, device: str = "cpu", long_context_tokens: int | None = None) -> list[Feature]:
    """Every feature the stage knows, compared or not, from ``profile.engine.args``. Graph mode and
    the parallel layout have no request-level comparison that isolates them: the weights stage's
    golden tokens (the deployment as configured against transformers) stand for them, and a
    second vLLM engine in eager mode or at one rank is not started (it would cost a start-up)."""
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
    budget, budget_src = chunk_budget(args, device)
    depth, depth_src = long_context_depth(args, long_context_tokens)
    return [
        Feature("prefix_caching", "prefix caching", bool(prefix), prefix_src,
                "the same prompt as a cold miss (fresh prompt) and as a full hit"),
        Feature("batch_invariance", "batch invariance", int(seqs or 1) > 1, seqs_src,
                "a request alone vs the same request inside a concurrent batch"),
        Feature("streaming", "streaming", True, "always (the HTTP API serves both)",
                "the same request streamed and not streamed: tokens, logprobs, finish reason"),
        Feature("speculative", "speculative decoding", bool(spec), spec_src,
                "greedy tokens vs transformers (cpu/float32); acceptance from /metrics"),
        Feature("chunked_prefill", "chunked prefill", bool(chunked), chunked_src,
                f"a prompt past the chunk budget ({budget} tokens, {budget_src}) vs transformers"),
        Feature("graph_mode", "compilation / graph mode", not bool(eager), eager_src,
                "transformers, through weights.golden_tokens (the compiled engine as deployed)"),
        Feature("parallel_layout", "parallel layout", layout, f"tensor/pipeline/data parallel = {tp}/{pp}/{dp}",
                "transformers, through weights.golden_tokens (the layout as deployed; TP=2 vs TP=1 is "
                "collectives.engine_tp2_matches_tp1)"),
        Feature("long_context", "long context", True, "always (max_model_len)",
                f"greedy tokens after a {depth}-token prompt ({depth_src}) vs transformers" if depth else "",
                "" if depth else f"not compared: {depth_src}"),
    ]
