"""The fragmentation formula and the block count behind it, the pool sampled at one instant, summaries.

PagedAttention hands out KV memory in blocks of ``block_size`` token slots; a request's last block
is only partly filled, and that tail is the internal fragmentation the kvcache stage bounds
(definitions in docs/metrics.md, ``## KV cache``). Both views (exact.py, blackbox.py) reduce what
they see to :class:`KvSample` and are summarized alike by :func:`summarize`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence


def fragmentation(stored_tokens: int, allocated_tokens: int) -> float:
    """Internal fragmentation = 1 - stored / allocated (0 for an empty pool: nothing is wasted)."""
    if stored_tokens < 0 or allocated_tokens < 0:
        raise ValueError(f"fragmentation: negative counts (stored={stored_tokens}, allocated={allocated_tokens})")
    if stored_tokens > allocated_tokens:
        raise ValueError(f"fragmentation: {stored_tokens} tokens stored in {allocated_tokens} slots")
    return 0.0 if allocated_tokens == 0 else 1.0 - stored_tokens / allocated_tokens


@dataclass(frozen=True)
class Holding:
    """One request's hold on the pool: its block table and the tokens whose KV is written.

    ``shareable`` is how many leading blocks may be shared with other requests (prefix-cache
    hits are always a leading run of full blocks); ``None`` means any block may be, which is the
    general (slower) count. ``None`` entries in ``block_ids`` are placeholders (vLLM's null
    block for tokens outside a sliding window): they hold no memory and store nothing.
    """

    block_ids: Sequence[int | None]
    stored_tokens: int
    shareable: int | None = None


@dataclass(frozen=True)
class BlockCount:
    blocks: int  # distinct blocks held
    stored_tokens: int  # distinct tokens whose KV sits in them
    block_size: int

    @property
    def allocated_tokens(self) -> int:
        return self.blocks * self.block_size

    @property
    def fragmentation(self) -> float:
        return fragmentation(self.stored_tokens, self.allocated_tokens)


class BlockTable(Sequence[Any]):
    """A block table as count_blocks needs it: the ids of its leading (shareable) run, and its length.

    Building the full id list every step would cost O(blocks) per request; the rest is counted in O(1).
    """

    __slots__ = ("head", "n")

    def __init__(self, head: list[int | None], n: int) -> None:
        self.head = head
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: Any) -> Any:  # only the head is ever read (indices < len(head))
        return self.head[i]


def count_blocks(holdings: Iterable[Holding], block_size: int) -> BlockCount:
    """Distinct blocks and distinct stored tokens over every request's block table.

    A block held by several requests (a shared prefix) counts once, with the fill of its fullest
    holder. Block ``i`` of a request holding ``s`` tokens is filled with
    ``clamp(s - i * block_size, 0, block_size)`` tokens: tables are filled front to back, so a
    table's first ``s // block_size`` blocks are full and go into a set in one C-level call; only
    the block at the boundary and empty ones after it are looked at one by one. The part of a
    table past ``shareable`` is counted in O(1).
    """
    if block_size < 1:
        raise ValueError(f"block_size={block_size} must be >= 1")
    full: set[int | None] = set()
    partial: dict[int, int] = {}
    blocks = 0
    stored = 0
    for h in holdings:
        ids = h.block_ids
        n = len(ids)
        s = h.stored_tokens
        if s > n * block_size:
            raise ValueError(f"a request stores {s} tokens in {n} blocks of {block_size}")
        k = n if h.shareable is None else min(max(h.shareable, 0), n)
        if k:
            head = ids.head if isinstance(ids, BlockTable) and len(ids.head) == k else ids[:k]
            n_full = min(k, s // block_size)
            full.update(head if n_full == k else head[:n_full])
            for i in range(n_full, k):
                bid = head[i]
                if bid is not None:
                    fill = min(block_size, max(0, s - i * block_size))
                    if partial.get(bid, -1) < fill:
                        partial[bid] = fill
        rest = n - k
        if rest:
            blocks += rest
            stored += min(rest * block_size, max(0, s - k * block_size))
    full.discard(None)  # placeholders: no memory, nothing stored
    extra = [f for b, f in partial.items() if b not in full]
    return BlockCount(blocks + len(full) + len(extra), stored + len(full) * block_size + sum(extra), block_size)


@dataclass
class KvSample:
    """The pool at one instant: one engine step (exact) or one /metrics scrape (black box)."""

    t: float  # seconds since the workload started
    allocated_tokens: int  # distinct blocks held x block size
    stored_tokens: int  # distinct tokens whose KV is written
    usage: float  # pool usage 0..1 (vLLM's kv_cache_usage)
    running: int  # requests holding blocks
    waiting: int = 0
    steady: bool = False  # every workload request is finished or mid-decode: comparable across views
    step: int | None = None

    @property
    def fragmentation(self) -> float:
        return fragmentation(self.stored_tokens, self.allocated_tokens)


@dataclass(frozen=True)
class FragSummary:
    samples: int  # samples with blocks held
    mean: float | None  # token-weighted: 1 - sum(stored) / sum(allocated)
    peak: float | None  # max per-sample fragmentation among samples at long context
    peak_t: float | None
    peak_samples: int  # samples at long context
    stored_tokens: int
    allocated_tokens: int


def summarize(samples: Sequence[KvSample], *, long_context_tokens: int = 0, steady_only: bool = False) -> FragSummary:
    """Token-weighted mean over samples with blocks held; peak over those holding >= long_context_tokens.

    Weighting each sample by its allocated slots (``1 - sum S / sum A``) makes steps that hold
    long contexts count for what they hold, so an instant with one short request left cannot
    dominate the figure the way an unweighted mean of per-step ratios lets it.
    """
    held = [s for s in samples if s.allocated_tokens > 0 and (s.steady or not steady_only)]
    total_s = sum(s.stored_tokens for s in held)
    total_a = sum(s.allocated_tokens for s in held)
    long = [s for s in held if s.stored_tokens >= long_context_tokens]
    worst = max(long, key=lambda s: s.fragmentation, default=None)
    return FragSummary(
        samples=len(held),
        mean=fragmentation(total_s, total_a) if held else None,
        peak=worst.fragmentation if worst else None,
        peak_t=worst.t if worst else None,
        peak_samples=len(long),
        stored_tokens=total_s,
        allocated_tokens=total_a,
    )


def is_steady(outputs: Iterable[tuple[int, int, bool]]) -> bool:
    """(output tokens so far, max_tokens, finished) per request -> every one finished or mid-decode.

    Mid-decode means 1 <= out <= max_tokens - 2: the prefill is over (the stored count is exactly
    prompt + out - 1) and the request is not about to be freed, so a view that lags the engine
    by one step still counts the same blocks.
    """
    return all(done or 1 <= out <= max_tokens - 2 for out, max_tokens, done in outputs)
