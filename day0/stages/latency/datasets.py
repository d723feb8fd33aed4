"""Workload lengths like production's: a site's ShareGPT file, or a long-context mix.

Synthetic prompts of one fixed length say little about a deployment whose users send a chat
history one moment and a one-line question the next. A ShareGPT-format file (the conversations
``vllm bench serve --dataset-name sharegpt`` reads) gives the joint distribution of prompt and
answer lengths real users produced; day0 keeps its own token-id prompts (exact lengths, fresh
per run) and takes only those lengths from the file. The long-context mix spreads prompts over
every decade up to the engine's context, since a 1M-token target is accepted on the long ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from day0.config.errors import SettingsError
from day0.core.inputs import InputError, key_path, read_regular, strict_json

DATASET_CAP = 2 << 30  # ShareGPT_V3_unfiltered_cleaned_split.json is ~670 MiB
# Parsed, a JSON object or list costs Python ~100-250 bytes whatever its size in the file: a file of
# 300,000 empty conversations (13 MB) held 14 times its bytes, which at DATASET_CAP is ~28 GB.
# Counting '{' and '[' before parsing bounds that part to a few GB. The count is an upper bound (text
# holds them too: code in answers); ShareGPT V3's structure is ~1M of them in ~670 MiB, and its text
# would need one in every ~25 bytes to reach the cap (not measured on the file: none on this box).
MAX_DATASET_CONTAINERS = 32_000_000
# vLLM bench's filter (benchmarks/datasets/datasets.py is_valid_sequence): prompt and output of at
# least 4 tokens; without the engine's max_model_len, its defaults (prompt <= 1024, total <= 2048).
MIN_TOKENS = 4
VLLM_MAX_PROMPT, VLLM_MAX_TOTAL = 1024, 2048
# Without the model's tokenizer.json: tokens from words at 4 tokens per 3 words (the usual
# ~0.75 English words per BPE token); a documented estimate, said so in the run.
TOKENS_PER_WORD = 4 / 3
LONG_CONTEXT_MIN = 4096  # the long-context mix's shortest prompt (tokens)


@dataclass(frozen=True)
class DatasetLengths:
    """(input, output) token lengths of the usable conversations of one file, and how counted."""

    path: str
    pairs: tuple[tuple[int, int], ...]
    counted_with: str  # "tokenizer.json at ..." or the words-to-tokens estimate
    skipped: int  # conversations without two turns or outside the filter


def _turns(data: Any, where: str) -> list[tuple[str, str]]:
    """(first human turn, first gpt turn) of every conversation that has both; a value of the
    wrong kind is refused with its key path (a file that is not ShareGPT must not look like one)."""
    if not isinstance(data, list):
        raise InputError(where, "(top level): expected a list of {\"conversations\": [...]} objects")
    out = []
    for i, entry in enumerate(data):
        if not isinstance(entry, dict):
            raise InputError(where, f"{key_path((i,))}: expected an object with \"conversations\"")
        conv = entry.get("conversations")
        if conv is None:
            continue  # vLLM skips these too
        if not isinstance(conv, list):
            raise InputError(where, f"{key_path((i, 'conversations'))}: expected a list of turns")
        first: dict[str, str] = {}
        for j, turn in enumerate(conv):
            if not isinstance(turn, dict) or not isinstance(turn.get("from"), str) \
                    or not isinstance(turn.get("value"), str):
                raise InputError(where, f"{key_path((i, 'conversations', j))}: expected "
                                        "{\"from\": text, \"value\": text}")
            if turn["from"] in ("human", "gpt") and turn["from"] not in first:
                if turn["from"] == "gpt" and "human" not in first:
                    continue  # an answer before any question is no request
                first[turn["from"]] = turn["value"]
        if len(first) == 2:
            out.append((first["human"], first["gpt"]))
    return out


def _counter(tokenizer_dir: Path | None) -> tuple[Any, str]:
    """A texts -> token counts function: the model's tokenizer when there is one, else the estimate."""
    tok_file = tokenizer_dir / "tokenizer.json" if tokenizer_dir is not None else None
    if tok_file is not None and tok_file.is_file():
        try:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(tok_file))
        except Exception:  # no tokenizers library, or a file it cannot read: fall back to the estimate
            tok = None
        if tok is not None:
            # as vLLM bench counts: tokenizer(text).input_ids, special tokens included
            return (lambda texts: [len(e.ids) for e in tok.encode_batch(list(texts))]), f"tokenizer {tok_file}"
    return ((lambda texts: [math.ceil(len(t.split()) * TOKENS_PER_WORD) for t in texts]),
            f"estimate: {TOKENS_PER_WORD:.3g} tokens per whitespace-separated word (no tokenizer.json)")


def sharegpt_lengths(path: Path | str, tokenizer_dir: Path | None = None,
                     max_model_len: int | None = None) -> DatasetLengths:
    """The (prompt, output) lengths of a ShareGPT file, filtered as vLLM bench filters them.

    :class:`InputError` (one line naming the file and the key path) for a file that cannot be
    used: unreadable, not JSON, not ShareGPT's shape, or nothing left after the filter."""
    where = str(path)
    raw = read_regular(path, "ShareGPT dataset", DATASET_CAP)
    containers = raw.count(b"{") + raw.count(b"[")
    if containers > MAX_DATASET_CONTAINERS:
        raise InputError(where, f"{containers:,} '{{' and '[' where a ShareGPT file of this kind holds at most "
                                f"{MAX_DATASET_CONTAINERS:,} (its parse would hold far more memory than its bytes); "
                                "pass a sample of its conversations")
    turns = _turns(strict_json(raw, where), where)
    del raw
    count, counted_with = _counter(tokenizer_dir)
    prompts, outputs = count(t for t, _ in turns), count(o for _, o in turns)
    max_prompt = max_model_len if max_model_len else VLLM_MAX_PROMPT
    max_total = max_model_len if max_model_len else VLLM_MAX_TOTAL
    pairs = tuple((p, o) for p, o in zip(prompts, outputs)
                  if p >= MIN_TOKENS and o >= MIN_TOKENS and p <= max_prompt and p + o <= max_total)
    if not pairs:
        raise InputError(where, f"conversations: none of {len(turns)} with a human and a gpt turn has a prompt and "
                                f"an answer of >= {MIN_TOKENS} tokens and <= {max_total} together")
    return DatasetLengths(where, pairs, counted_with, len(turns) - len(pairs))


def long_context_range(max_model_len: int, output_hi: int) -> tuple[int, int]:
    """[lo, hi] prompt tokens of the long-context mix: LONG_CONTEXT_MIN (less on a short context)
    up to what the context leaves after the longest output."""
    hi = max_model_len - output_hi
    if hi < 1:
        raise SettingsError(f"latency.length_mix: max_model_len {max_model_len} leaves no room for a prompt after "
                         f"output_len {output_hi}")
    return min(LONG_CONTEXT_MIN, hi), hi

