"""The long-context request mix, whether it fits the engine, and the vocabulary its prompts come from."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from day0.config.kvcache import default_context_lengths
from day0.stages.kvcache.errors import KvCacheError, WorkloadRejected


@dataclass(frozen=True)
class KvRequest:
    """One request of the long-context workload (token ids inside the vocabulary)."""

    index: int
    kind: str  # long | short | shared
    prompt: list[int]
    max_tokens: int
    prefix_group: int | None = None
    prefix_len: int = 0

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def context(self) -> int:
        return len(self.prompt) + self.max_tokens


def build_workload(settings: Any, vocab_size: int, special_ids: Iterable[int] = (), *, salt: str = "") -> list[KvRequest]:
    """The stage's request mix from ``[kvcache]`` settings, reproducible from ``settings.seed``.

    Order is the FCFS order the engine sees: long requests, longest first, then the shared-prefix
    group (the second member hits the first's cached blocks), then short requests. Longest first
    keeps the requests' decode phases overlapping: the request that starts decoding first is the
    one whose prefill took longest, so every request is decoding at once for about
    ``output_tokens`` minus the remaining prefill steps; those steady steps are the ones both views
    can measure. ``salt`` gives a different, equally shaped set (benchmarks run it twice).
    """
    specials = {i for i in special_ids if 0 <= i < vocab_size}
    usable = [i for i in range(vocab_size) if i not in specials]
    if not usable:
        raise KvCacheError(f"vocab_size {vocab_size}: every id is special; no prompt can be built")
    out_n = int(settings.output_tokens)
    lengths = list(settings.context_lengths) or default_context_lengths(settings.target_context, out_n)
    lo, hi = settings.short_lengths

    def rng(kind: str, k: int) -> random.Random:
        return random.Random(f"day0-kvcache:{settings.seed}:{salt}:{kind}:{k}")

    reqs: list[KvRequest] = []
    for k, ctx in enumerate(sorted(lengths, reverse=True)):
        reqs.append(KvRequest(len(reqs), "long", rng("long", k).choices(usable, k=ctx - out_n), out_n))
    if settings.shared_prefix_tokens and settings.shared_prefix_requests:
        prefix = rng("prefix", 0).choices(usable, k=settings.shared_prefix_tokens)
        for k in range(settings.shared_prefix_requests):
            r = rng("shared", k)
            n = r.randint(lo, hi) - out_n
            reqs.append(KvRequest(len(reqs), "shared", prefix + r.choices(usable, k=n), out_n,
                                  prefix_group=0, prefix_len=len(prefix)))
    for k in range(settings.short_requests):
        r = rng("short", k)
        n = r.randint(lo, hi) - out_n
        reqs.append(KvRequest(len(reqs), "short", r.choices(usable, k=n), out_n))
    return reqs


def check_fits(workload: Sequence[KvRequest], max_model_len: int, **keys: str) -> None:
    """Raise WorkloadRejected for the longest request that exceeds the engine's max_model_len."""
    worst = max(workload, key=lambda r: r.context, default=None)
    if worst is not None and worst.context > max_model_len:
        raise WorkloadRejected(worst.context, max_model_len,
                               f"prompt {worst.prompt_len} + output {worst.max_tokens} tokens", **keys)


_ENGINE_LEN = re.compile(r"(?:maximum (?:model|context) length (?:of |is )?)(\d+)")
_ASKED_LEN = re.compile(r"(?:\(length |requested |contains (?:at least )?)(\d+)")


def rejection_from_message(message: str, asked: int, **keys: str) -> WorkloadRejected | None:
    """An engine's "longer than the maximum model length" refusal as a WorkloadRejected (else None)."""
    m = _ENGINE_LEN.search(message)
    if not m:
        return None
    a = _ASKED_LEN.search(message)
    return WorkloadRejected(int(a.group(1)) if a else asked, int(m.group(1)),
                            "engine said: " + " ".join(message.split())[:300], **keys)


def workload_vocab(profile: Any) -> tuple[int, frozenset[int]]:
    """(vocab size, special ids) for prompts the engine accepts: the local tokenizer when there is
    one, else config.json's ``vocab_size`` minus its BOS/EOS/pad ids."""
    from day0.client.workload import read_vocab
    from day0.engine import local_model_dir

    path = local_model_dir(profile)
    if path is not None and (path / "tokenizer.json").is_file():
        v = read_vocab(path)
        return v.size, v.special_ids
    from day0.model.config import model_config

    config, source = model_config(profile)
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    if not isinstance(size, int) or size <= 0:
        raise KvCacheError(f"{source}: no vocab_size; prompts cannot be kept inside the vocabulary")
    special = {x for k in ("bos_token_id", "eos_token_id", "pad_token_id")
               for x in (config.get(k) if isinstance(config.get(k), list) else [config.get(k)]) if isinstance(x, int)}
    return size, frozenset(special)
