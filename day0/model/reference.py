"""Greedy tokens of a checkpoint computed by transformers, and a comparison that knows near-ties.

A served model's greedy tokens can only be trusted against a reference that shares none of the
serving stack: transformers on the same shards, its own tokenizer, one prompt at a time. Two
correct numerics (CPU float32, GPU float32, GPU bfloat16) still disagree where the two best
candidates are almost tied, and from there on the sequences part ways for good. So each step
keeps its top-k logprobs, and :func:`compare_tokens` calls a first difference a ``near_tie`` when
both sides rank the two picks within ``margin`` of each other, and a ``diverged`` otherwise: a
divergence is a wrong weight, a wrong kernel or a wrong tokenizer, never rounding.

Decoding runs exactly ``max_new_tokens`` steps and ignores EOS, as vLLM's ``ignore_eos`` does, so
every sequence has a known length (the weights stage's smoke and golden checks use the same rule).
torch and transformers are imported when a reference is computed, never at import time.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

from day0.core.inputs import InputError
from day0.model.jsonfile import MAX_CONFIG_BYTES, read_json

DTYPES = ("float32", "bfloat16", "float16")
# Near-tie margin and drift limit, nats: how far two correct numerics may move a logprob. float32 on
# both sides moved them by under 1e-6 wherever measured (golden tokens: 4.8e-7 on Qwen3-MoE at TP 2
# across two nodes, 9.5e-7 on DeepSeek-V3; parity's 2.5K- and 6K-token prompts: 9.5e-7), so 1e-3
# leaves a thousandfold; 1e-2 let a rope that differed past position 4096 through (it moved the
# tiny model's deep logprobs by 3e-3; docs/stages/parity.md). bfloat16 engines move them by up to a
# few 1e-2.
NEAR_TIE_MARGINS = {"float32": 0.001, "other": 0.05}


def near_tie_margin(dtype: str) -> float:
    """The margin for an engine serving in ``dtype`` (an engine arg: ``float32``, ``auto``, ...)."""
    return NEAR_TIE_MARGINS["float32" if str(dtype) in ("float32", "float") else "other"]
Status = Literal["match", "near_tie", "diverged"]
_REQUIRED = frozenset({"prompt", "prompt_ids", "tokens", "logprobs", "top_ids", "top_logprobs"})


def _is(value: Any, kind: type) -> bool:
    """An int (not a bool), or a float (an int too: JSON writes -0.0 as a number either way)."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) if kind is int else isinstance(value, (int, float))


@dataclass
class RefSequence:
    """One prompt's greedy continuation, with each step's top-k candidates (best first)."""

    prompt: str
    prompt_ids: list[int]
    tokens: list[int]
    logprobs: list[float]  # of the chosen token, per step
    top_ids: list[list[int]]
    top_logprobs: list[list[float]]
    text: str = ""
    device: str = "cpu"
    dtype: str = "float32"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RefSequence":
        """A sequence as :meth:`to_dict` wrote it (a golden file's, a device run's); ValueError naming
        the field where it is not one: a hand-edited file must not become a TypeError mid-judgement."""
        if not isinstance(data, Mapping):
            raise ValueError(f"expected an object, got {type(data).__name__}")
        known = set(cls.__dataclass_fields__)
        seq = cls(**{k: v for k, v in data.items() if k in known}) if _REQUIRED <= data.keys() else None
        if seq is None:
            raise ValueError(f"missing {', '.join(sorted(_REQUIRED - data.keys()))}")
        n = len(seq.tokens) if isinstance(seq.tokens, list) else -1
        for name, row_of in (("prompt_ids", int), ("tokens", int), ("logprobs", float)):
            value = getattr(seq, name)
            if not isinstance(value, list) or not all(_is(v, row_of) for v in value):
                raise ValueError(f"{name}: expected a list of {row_of.__name__}s")
        for name, row_of in (("top_ids", int), ("top_logprobs", float)):
            value = getattr(seq, name)
            if not isinstance(value, list) or not all(isinstance(r, list) and all(_is(v, row_of) for v in r)
                                                      for r in value):
                raise ValueError(f"{name}: expected a list of lists of {row_of.__name__}s")
        if not len(seq.logprobs) == len(seq.top_ids) == len(seq.top_logprobs) == n:
            raise ValueError(f"tokens, logprobs, top_ids and top_logprobs differ in length ({n}, "
                             f"{len(seq.logprobs)}, {len(seq.top_ids)}, {len(seq.top_logprobs)})")
        return seq

    def logprob_of(self, position: int, token: int) -> float | None:
        """This side's logprob of ``token`` at ``position``; None when it is outside the top-k kept."""
        for tid, lp in zip(self.top_ids[position], self.top_logprobs[position]):
            if tid == token:
                return lp
        return None


@dataclass
class TokenComparison:
    """How two references of one prompt relate: equal, parted at a near-tie, or diverged."""

    prompt: str
    status: Status
    position: int | None = None  # first generated position that differs (None: equal, or prompts differ)
    token_a: int | None = None
    token_b: int | None = None
    logprob_a: float | None = None  # each side's logprob of its own pick there
    logprob_b: float | None = None
    gap_a: float | None = None  # in a's distribution: its pick minus b's pick (None: b's pick not in a's top-k)
    gap_b: float | None = None
    max_logprob_delta: float | None = None  # largest |logprob_a - logprob_b| over the equal prefix
    compared: int = 0  # positions compared (the equal prefix, plus the differing one)
    message: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare_tokens(a: RefSequence, b: RefSequence, margin: float, *,
                   drift_limit: float | None = None) -> TokenComparison:
    """Compare two references of the same prompt; near-tie when, at the first difference, each
    side's pick is within ``margin`` (nats) of the other's pick in both distributions.

    Holding both sides to the margin (not only the side that looks tied) bounds how far the two
    numerics moved: the two gaps add up to at most twice the largest logit perturbation between them.

    ``drift_limit`` (nats) also holds the numbers on the equal prefix: the same tokens from
    logprobs further apart than that is a divergence too (named at the position of the largest
    difference), and a near-tie after such a prefix is not credible. Same tokens are not the same
    function: vLLM 0.32's CPU rotary op, wrong for MLA's strided views, moved DeepSeek-V3's
    logprobs by 0.016 nats while 16 tokens still matched (docs/engine.md).
    """
    if a.prompt != b.prompt:
        raise ValueError(f"compare_tokens: prompts differ ({a.prompt!r} vs {b.prompt!r})")
    if margin < 0:
        raise ValueError(f"compare_tokens: margin {margin} must be >= 0")
    who = f"{a.device}/{a.dtype} vs {b.device}/{b.dtype}"
    if a.prompt_ids != b.prompt_ids:
        return TokenComparison(a.prompt, "diverged", message=f"{a.prompt!r}: prompt token ids differ ({who}): "
                               "the two sides did not use the same tokenizer",
                               evidence={"prompt_ids_a": a.prompt_ids, "prompt_ids_b": b.prompt_ids})
    n = min(len(a.tokens), len(b.tokens))
    delta, at = _max_delta(a.logprobs[:n], b.logprobs[:n], a.tokens[:n], b.tokens[:n])
    if delta == math.inf:  # a NaN or infinite logprob: no numerics that work produce one
        return TokenComparison(
            a.prompt, "diverged", position=at, token_a=a.tokens[at], token_b=b.tokens[at], logprob_a=a.logprobs[at],
            logprob_b=b.logprobs[at], max_logprob_delta=delta, compared=at + 1,
            message=(f"{a.prompt!r}: logprob not a finite number at generated position {at} ({who}): token "
                     f"{a.tokens[at]} has logprob {a.logprobs[at]} vs {b.logprobs[at]}"))
    if drift_limit is not None and delta is not None and delta > drift_limit:
        return TokenComparison(
            a.prompt, "diverged", position=at, token_a=a.tokens[at], token_b=b.tokens[at], logprob_a=a.logprobs[at],
            logprob_b=b.logprobs[at], max_logprob_delta=delta, compared=at + 1,
            message=(f"{a.prompt!r}: logprobs drifted at generated position {at} ({who}): token {a.tokens[at]} "
                     f"has logprob {_fmt(a.logprobs[at])} vs {_fmt(b.logprobs[at])}, |d| {_fmt(delta)} nats, beyond "
                     f"the {drift_limit:g} two correct numerics stay within (the tokens so far are equal)"))
    for pos in range(n):
        if a.tokens[pos] != b.tokens[pos]:
            return _at_difference(a, b, pos, margin, delta, who)
    if len(a.tokens) != len(b.tokens):
        return TokenComparison(a.prompt, "diverged", position=n, max_logprob_delta=delta, compared=n,
                               message=f"{a.prompt!r}: {len(a.tokens)} vs {len(b.tokens)} tokens ({who}); "
                               f"the first {n} are equal")
    return TokenComparison(a.prompt, "match", max_logprob_delta=delta, compared=n,
                           message=f"{a.prompt!r}: {n} tokens equal ({who}), logprobs within {_fmt(delta)}")


def _at_difference(a: RefSequence, b: RefSequence, pos: int, margin: float, delta: float | None,
                   who: str) -> TokenComparison:
    ta, tb = a.tokens[pos], b.tokens[pos]
    la, lb = a.logprobs[pos], b.logprobs[pos]
    a_of_b, b_of_a = a.logprob_of(pos, tb), b.logprob_of(pos, ta)
    gap_a = None if a_of_b is None else la - a_of_b
    gap_b = None if b_of_a is None else lb - b_of_a
    # each side's pick within the margin of the other's, in both distributions: a gap below zero is a
    # side that did not pick its own best (-4.99 once passed as a tie), and a NaN gap decides nothing
    tied = all(g is not None and math.isfinite(g) and abs(g) <= margin for g in (gap_a, gap_b))
    status: Status = "near_tie" if tied else "diverged"
    what = "near-tie" if tied else "diverged"
    message = (f"{a.prompt!r}: {what} at generated position {pos} ({who}): token {ta} "
               f"(logprob {_fmt(la)}) vs {tb} (logprob {_fmt(lb)}); gaps {_fmt(gap_a)} / {_fmt(gap_b)} "
               f"nats, margin {margin:g}")
    evidence = {"top_a": list(zip(a.top_ids[pos], a.top_logprobs[pos])),
                "top_b": list(zip(b.top_ids[pos], b.top_logprobs[pos]))}
    return TokenComparison(a.prompt, status, pos, ta, tb, la, lb, gap_a, gap_b, delta, pos + 1, message, evidence)


def _max_delta(la: Sequence[float], lb: Sequence[float], ta: Sequence[int],
               tb: Sequence[int]) -> tuple[float | None, int]:
    """The largest |logprob difference| over the equal prefix, and its position; infinite at the
    first logprob that is not a finite number (a NaN compared as no difference at all)."""
    best, at = None, 0
    for pos, (x, y, i, j) in enumerate(zip(la, lb, ta, tb)):
        if i != j:
            break
        if not (math.isfinite(x) and math.isfinite(y)):
            return math.inf, pos
        if best is None or abs(x - y) > best:
            best, at = abs(x - y), pos
    return best, at


def _fmt(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.4g}"


def compare_all(a: Sequence[RefSequence], b: Sequence[RefSequence], margin: float, *,
                drift_limit: float | None = None) -> list[TokenComparison]:
    """:func:`compare_tokens` prompt by prompt; both lists must hold the same prompts in the same order."""
    if [s.prompt for s in a] != [s.prompt for s in b]:
        raise ValueError("compare_all: the two references hold different prompts")
    return [compare_tokens(x, y, margin, drift_limit=drift_limit) for x, y in zip(a, b)]


def summarize(comparisons: Sequence[TokenComparison]) -> dict[str, int]:
    """Counts per status (every status present, so two runs' summaries line up)."""
    counts = {"match": 0, "near_tie": 0, "diverged": 0}
    for c in comparisons:
        counts[c.status] += 1
    return counts


def greedy_reference(
    model_dir: Path | str,
    prompts: Sequence[str],
    max_new_tokens: int = 16,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    top_k: int = 5,
) -> list[RefSequence]:
    """Greedy continuation of each prompt by transformers, on ``device`` in ``dtype``.

    The checkpoint's own tokenizer encodes each prompt as vLLM would (special tokens as its
    tokenizer_config says). float32 runs with TF32 off, so a GPU float32 reference is a float32
    reference; the previous setting is restored afterwards.
    """
    if max_new_tokens < 1:
        raise ValueError(f"greedy_reference: max_new_tokens={max_new_tokens} must be >= 1")
    if top_k < 2:
        raise ValueError(f"greedy_reference: top_k={top_k} must be >= 2 (a near-tie needs the runner-up)")
    if dtype not in DTYPES:
        raise ValueError(f"greedy_reference: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, dtype))
    dev = torch.device(device)
    model.to(dev).eval()
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        with torch.inference_mode():
            return [_greedy_one(torch, model, tokenizer, p, max_new_tokens, top_k, dev, dtype) for p in prompts]
    finally:
        torch.set_float32_matmul_precision(precision)
        del model
        if dev.type == "cuda":
            torch.cuda.empty_cache()


def _greedy_one(torch: Any, model: Any, tokenizer: Any, prompt: str, steps: int, top_k: int, dev: Any,
                dtype: str) -> RefSequence:
    """Prefill once, then one token per step through the KV cache; argmax ties go to the lowest id."""
    ids = list(tokenizer(prompt)["input_ids"])
    if not ids:
        raise ValueError(f"greedy_reference: prompt {prompt!r} encodes to no tokens")
    k = min(top_k, int(model.config.vocab_size))
    out = model(input_ids=torch.tensor([ids], device=dev), use_cache=True)
    seq = RefSequence(prompt, ids, [], [], [], [], device=str(dev), dtype=dtype)
    for step in range(steps):
        logprobs = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
        values, indices = torch.topk(logprobs, k)
        token = int(torch.argmax(logprobs))
        seq.tokens.append(token)
        seq.logprobs.append(float(logprobs[token]))
        seq.top_ids.append([int(i) for i in indices.tolist()])
        seq.top_logprobs.append([float(v) for v in values.tolist()])
        if step + 1 < steps:
            nxt = torch.tensor([[token]], device=dev)
            out = model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
    seq.text = tokenizer.decode(seq.tokens, skip_special_tokens=True)
    return seq


@dataclass
class PromptScores:
    """What transformers says about every position of a token sequence (teacher forcing), in the
    shape vLLM's ``prompt_logprobs`` has: position i (1..n-1) is predicted from tokens 0..i-1."""

    token_ids: list[int]
    actual: list[float]  # log p(t_i | t_<i), i = 1..n-1
    top: list[dict[int, float]]  # top-k plus the actual token, per position
    top1: list[int]  # the argmax per position (ties: lowest id)
    seconds: float = 0.0


def score_tokens(model_dir: Path | str, token_ids: Sequence[int], top_k: int = 5, *,
                 dtype: str = "float32") -> PromptScores:
    """One forward pass of transformers over ``token_ids`` on the CPU: the accuracy reference that
    needs no second vLLM server (and shares none of vLLM's kernels)."""
    import time

    if len(token_ids) < 2:
        raise ValueError(f"score_tokens: {len(token_ids)} tokens, at least 2 are needed")
    if dtype not in DTYPES:
        raise ValueError(f"score_tokens: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    t0 = time.perf_counter()
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, dtype)).eval()
    try:
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([list(token_ids)])).logits[0, :-1].float()
        logprobs = torch.log_softmax(logits, dim=-1)
    finally:
        del model
    k = min(top_k, logprobs.shape[-1])
    values, indices = torch.topk(logprobs, k, dim=-1)
    actual, top, top1 = [], [], []
    for i in range(logprobs.shape[0]):
        tok = int(token_ids[i + 1])
        cells = {int(t): float(v) for t, v in zip(indices[i].tolist(), values[i].tolist())}
        cells[tok] = float(logprobs[i, tok])
        actual.append(cells[tok])
        top.append(cells)
        top1.append(int(torch.argmax(logprobs[i])))
    return PromptScores([int(t) for t in token_ids], actual, top, top1, time.perf_counter() - t0)


def host_reference_unavailable(model_dir: Path | str | None, *, headroom: float = 1.5) -> str | None:
    """Why transformers cannot be the reference for ``model_dir`` on this host, or None when it can.

    The reference runs in float32 on the host CPU, so the checkpoint, widened to 4 bytes a
    weight, times ``headroom`` (activations, the loader's copies), must fit in the memory the
    host has available now. A quantized checkpoint is not widened by transformers the way vLLM
    runs it, so it never counts as fitting.
    """
    if model_dir is None:
        return "the model is not a local directory"
    root = Path(model_dir)
    try:
        config = read_json(root / "config.json", limit=MAX_CONFIG_BYTES, what="a config.json")
    except InputError as exc:  # a FIFO, a folder, 50 MB, not JSON: named, never waited on or read whole
        return str(exc)  # names the file and why
    if not isinstance(config, dict):
        return f"{root / 'config.json'}: top level is {type(config).__name__}, not an object"
    quant = config.get("quantization_config")
    if quant:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else str(quant)[:64]
        return f"the checkpoint is quantized ({method}): transformers does not reproduce vLLM's kernels for it"
    width = _DTYPE_BYTES.get(str(config.get("torch_dtype") or config.get("dtype") or "float32"), 2)
    need = 0
    for shard in sorted(root.glob("*.safetensors")):
        try:
            need += shard.stat().st_size
        except OSError as exc:  # a dangling link: an HF cache whose blob is gone
            return f"{shard}: cannot be read ({exc.strerror or exc})"
    need *= (4 / width) * headroom
    have = _available_bytes()
    if have is not None and need > have:
        return (f"the float32 reference needs ~{need / 2**30:.1f} GiB of host memory, "
                f"{have / 2**30:.1f} GiB is available")
    return None


_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1}


def _available_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def from_completion(prompt: str, prompt_ids: Sequence[int], tokens: Sequence[int],
                    top_logprobs: Sequence[Mapping[int, float]], *, device: str, dtype: str) -> RefSequence:
    """A served engine's greedy answer with per-step top logprobs as a :class:`RefSequence`, so
    :func:`compare_tokens` can hold it against a transformers reference."""
    if len(top_logprobs) != len(tokens):
        raise ValueError(f"{prompt!r}: {len(top_logprobs)} logprob steps for {len(tokens)} tokens")
    seq = RefSequence(prompt, list(prompt_ids), list(tokens), [], [], [], device=device, dtype=dtype)
    for token, cells in zip(tokens, top_logprobs):
        ranked = sorted(cells.items(), key=lambda kv: (-kv[1], kv[0]))
        seq.logprobs.append(float(cells[token]) if token in cells else float("nan"))
        seq.top_ids.append([int(t) for t, _ in ranked])
        seq.top_logprobs.append([float(v) for _, v in ranked])
    return seq
