"""Synthetic request workloads with exact token lengths, reproducible from a seed.

Prompts are token-id lists (vLLM's /v1/completions accepts ``prompt`` as a list of ints), so
the input length the server sees is exactly the one we asked for: no tokenizer round trip can
add or merge tokens. Output length is pinned with ``max_tokens`` plus ``ignore_eos``. Ids are
drawn from ``[0, vocab_size)`` minus the special ids, because vLLM rejects ids outside the
vocabulary and special ids (BOS/EOS/pad) change what the model does.
"""

from __future__ import annotations

import bisect
import math
import os
import random
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence, Union

from day0.core.inputs import InputError, loose_json, read_regular

LengthSpec = Union[int, Sequence[int]]  # an exact length, or [lo, hi] drawn uniformly (inclusive)
TOKENIZER_CAP = 256 << 20  # bytes: a tokenizer.json runs to tens of MiB (Gemma's ~33), a config.json to kilobytes

_WORDS = (
    "time year people way day man thing woman life child world school state family student group "
    "country problem hand part place case week company system program question work government "
    "number night point home water room mother area money story fact month lot right study book "
    "eye job word business issue side kind head house service friend father power hour game line"
).split()


class WorkloadError(ValueError):
    """A workload that cannot be built; the message names the setting at fault."""


@dataclass(frozen=True)
class Request:
    """One synthetic request. ``prompt`` is a token-id list (completions) or text (chat)."""

    index: int
    prompt: list[int] | str
    input_len: int  # exact for token-id prompts; the requested length for text prompts
    output_len: int
    prefix_group: int | None = None  # which shared prefix it starts with, if any
    shared_len: int = 0  # leading tokens other requests of the run share by design (nonce + prefix)


@dataclass(frozen=True)
class Vocab:
    """What the workload needs to know about a tokenizer: its size and the ids to avoid."""

    size: int
    special_ids: frozenset[int] = frozenset()

    def usable(self) -> int:
        return self.size - len({i for i in self.special_ids if 0 <= i < self.size})


def read_vocab(model_dir: Path) -> Vocab:
    """Vocab size and special ids from a HF ``tokenizer.json`` (+ ``config.json``), json only.

    Reading the files directly keeps this usable where the tokenizer library is absent (an
    external deployment checked from a laptop); the model's ``config.json`` ``vocab_size`` wins
    over the tokenizer's count because the embedding matrix is what rejects an id. A file of the
    wrong shape is a WorkloadError naming the file and the key, never a traceback.
    """
    model_dir = Path(model_dir)
    tok_path = model_dir / "tokenizer.json"
    tok = _json_object(tok_path, missing="not found; pass vocab_size explicitly")
    assert tok is not None
    model = _object(tok.get("model"), tok_path, "model")
    vocab = model.get("vocab") or {}
    if isinstance(vocab, dict):
        ids = {_token_id(v, tok_path, f"model.vocab[{k!r}]") for k, v in vocab.items()}
    elif isinstance(vocab, list):
        ids = set(range(len(vocab)))
    else:
        raise WorkloadError(f"{tok_path}: model.vocab: expected an object or a list, got {type(vocab).__name__}")
    special: set[int] = set()
    added_tokens = tok.get("added_tokens") or []
    if not isinstance(added_tokens, list):
        raise WorkloadError(f"{tok_path}: added_tokens: expected a list, got {type(added_tokens).__name__}")
    for i, added in enumerate(added_tokens):
        added = _object(added, tok_path, f"added_tokens[{i}]")
        token_id = _token_id(added.get("id"), tok_path, f"added_tokens[{i}].id")
        ids.add(token_id)
        if added.get("special"):
            special.add(token_id)
    size = max(ids) + 1 if ids else 0
    cfg_path = model_dir / "config.json"
    cfg = _json_object(cfg_path, missing=None)
    if cfg is not None:
        cfg_size = cfg.get("vocab_size") or _object(cfg.get("text_config"), cfg_path, "text_config").get("vocab_size")
        if isinstance(cfg_size, int) and cfg_size > 0:
            size = min(size, cfg_size) if size else cfg_size
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            v = cfg.get(key)
            for x in v if isinstance(v, list) else [v]:
                if isinstance(x, int):
                    special.add(x)
    if size <= 0:
        raise WorkloadError(f"{tok_path}: no vocabulary found")
    return Vocab(size, frozenset(special))


def _json_object(path: Path, *, missing: str | None) -> dict | None:
    """A JSON file holding an object; None for a file that is not there when ``missing`` is None
    (optional), else WorkloadError ``f"{path}: {missing}"``. Any other problem (a FIFO, a file past
    the cap, bad JSON, an integer of 5,000 digits): WorkloadError naming the file, in bounded time
    and memory."""
    if not os.path.lexists(path):  # a dangling link is there: the reader names it
        if missing is None:
            return None
        raise WorkloadError(f"{path}: {missing}")
    try:
        data = loose_json(read_regular(path, None, TOKENIZER_CAP), str(path))
    except InputError as exc:
        raise WorkloadError(str(exc)) from None
    if not isinstance(data, dict):
        raise WorkloadError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _object(value: object, path: Path, key: str) -> dict:
    """``value`` where a JSON object (or nothing: an empty one) belongs at ``key``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise WorkloadError(f"{path}: {key}: expected an object, got {type(value).__name__}")
    return value


def _token_id(value: object, path: Path, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        got = "nothing" if value is None else repr(value)[:40]
        raise WorkloadError(f"{path}: {key}: expected a token id (a whole number >= 0), got {got}")
    return value


def _length_bounds(name: str, spec: LengthSpec, minimum: int) -> tuple[int, int]:
    if isinstance(spec, bool):
        raise WorkloadError(f"{name}: expected an int or [lo, hi], got {spec!r}")
    if isinstance(spec, int):
        lo = hi = spec
    elif isinstance(spec, Sequence) and not isinstance(spec, str) and len(spec) == 2 and all(
        isinstance(x, int) and not isinstance(x, bool) for x in spec
    ):
        lo, hi = int(spec[0]), int(spec[1])
    else:
        raise WorkloadError(f"{name}: expected an int or [lo, hi], got {spec!r}")
    if lo < minimum or hi < lo:
        raise WorkloadError(f"{name}: need {minimum} <= lo <= hi, got {spec!r}")
    return lo, hi


@dataclass(frozen=True)
class WorkloadSpec:
    """The request mix. Lengths are an int (fixed) or ``[lo, hi]`` (uniform, inclusive).

    ``prefix_len > 0`` makes the shared-prefix workload: each prompt starts with one of
    ``num_prefixes`` fixed prefixes of that many tokens (round-robin), then a unique suffix,
    which is what exercises prefix caching. ``input_len`` counts the prefix.

    ``nonce`` (a per-run value) makes the prompts fresh: a seed alone gives the same prompts on
    every run, and a server with prefix caching then serves a repeated run from its cache. The
    nonce's tokens go first, before any shared prefix, so nothing of one run matches another's
    first block; lengths, arrival times and everything after the nonce stay the seed's.
    ``input_dist = "log_uniform"`` draws ``input_len``'s ``[lo, hi]`` log-uniformly (a long-context
    mix spends as many prompts per decade); ``lengths`` (pairs of input, output tokens, e.g. from
    a dataset) replace both lengths: each request takes one pair, drawn by the seed.
    """

    input_len: LengthSpec = 128
    output_len: LengthSpec = 64
    prefix_len: int = 0
    num_prefixes: int = 1
    seed: int = 0
    nonce: int | None = None
    input_dist: str = "uniform"
    lengths: tuple[tuple[int, int], ...] = ()

    def validate(self) -> tuple[tuple[int, int], tuple[int, int]]:
        ilo, ihi = _length_bounds("input_len", self.input_len, 1)
        olo, ohi = _length_bounds("output_len", self.output_len, 1)
        if self.prefix_len < 0:
            raise WorkloadError(f"prefix_len: must be >= 0, got {self.prefix_len}")
        if self.prefix_len and self.prefix_len >= ilo:
            raise WorkloadError(
                f"prefix_len: {self.prefix_len} must be below the shortest input_len ({ilo}) "
                "so every prompt has a unique suffix"
            )
        if self.num_prefixes < 1:
            raise WorkloadError(f"num_prefixes: must be >= 1, got {self.num_prefixes}")
        if self.input_dist not in INPUT_DISTS:
            raise WorkloadError(f"input_dist: expected one of {', '.join(INPUT_DISTS)}, got {self.input_dist!r}")
        if self.lengths:
            if any(i < 1 or o < 1 for i, o in self.lengths):
                raise WorkloadError("lengths: every input and output length must be >= 1")
            ilo, ihi = min(i for i, _ in self.lengths), max(i for i, _ in self.lengths)
            olo, ohi = min(o for _, o in self.lengths), max(o for _, o in self.lengths)
            if self.prefix_len and self.prefix_len >= ilo:
                raise WorkloadError(f"prefix_len: {self.prefix_len} must be below the shortest dataset prompt ({ilo})")
        return (ilo, ihi), (olo, ohi)

    def nonce_tokens(self) -> int:
        """How many tokens the nonce takes: NONCE_TOKENS, fewer when the shortest prompt is short
        (one token after the nonce and the prefix always stays the request's own), 0 without one.
        The same for every request, so a shared prefix stays shared within the run."""
        if self.nonce is None:
            return 0
        (ilo, _), _ = self.validate()
        return max(0, min(NONCE_TOKENS, ilo - self.prefix_len - 1))


INPUT_DISTS: tuple[str, ...] = ("uniform", "log_uniform")
# Tokens of the per-run nonce: with the smallest vocabularies day0 meets (a few hundred ids) 8
# random ids still give ~1e20 values, so two runs' nonces never collide.
NONCE_TOKENS = 8


def _draw_lengths(spec: WorkloadSpec, rng: random.Random, bounds: tuple[tuple[int, int], tuple[int, int]]
                  ) -> tuple[int, int]:
    """One request's (input, output) lengths, in the draw order today's prompts were made with."""
    (ilo, ihi), (olo, ohi) = bounds
    if spec.lengths:
        return spec.lengths[rng.randrange(len(spec.lengths))]
    if spec.input_dist == "log_uniform" and ihi > ilo:
        n_in = min(ihi, max(ilo, round(math.exp(rng.uniform(math.log(ilo), math.log(ihi))))))
    else:
        n_in = rng.randint(ilo, ihi)
    return n_in, rng.randint(olo, ohi)


def _id_sampler(vocab: Vocab):
    """A function rng -> token id, uniform over the usable ids, O(1) per draw."""
    if vocab.size <= 0:
        raise WorkloadError(f"vocab_size: must be > 0, got {vocab.size}")
    specials = sorted(i for i in vocab.special_ids if 0 <= i < vocab.size)
    usable = vocab.size - len(specials)
    if usable <= 0:
        raise WorkloadError(f"vocab_size {vocab.size}: every id is special; nothing to draw from")

    # The x-th usable id is x plus the number of specials at or below it; with
    # shifted[j] = specials[j] - j that count is bisect_right(shifted, x): O(log n) per draw.
    shifted = [s - j for j, s in enumerate(specials)]

    def draw(rng: random.Random) -> int:
        x = rng.randrange(usable)
        return x + bisect.bisect_right(shifted, x)

    return draw


def build_requests(spec: WorkloadSpec, vocab: Vocab | int, count: int, *, start_index: int = 0,
                   stream: str = "main") -> list[Request]:
    """``count`` token-id requests; the same (spec, vocab, count, stream) always gives the same list.

    ``stream`` names an independent random stream, so warm-up requests never shift the
    measured ones (changing the warm-up count leaves the measured prompts identical).
    """
    if isinstance(vocab, int):
        vocab = Vocab(vocab)
    bounds = spec.validate()
    if count < 0:
        raise WorkloadError(f"count: must be >= 0, got {count}")
    draw = _id_sampler(vocab)
    prefix_rng = random.Random(f"{spec.seed}:prefix")
    prefixes = [[draw(prefix_rng) for _ in range(spec.prefix_len)] for _ in range(spec.num_prefixes)]
    k_nonce = spec.nonce_tokens()
    nonce_rng = random.Random(f"nonce:{spec.nonce}")
    nonce = [draw(nonce_rng) for _ in range(k_nonce)]
    shared = k_nonce + spec.prefix_len if spec.prefix_len else 0
    rng = random.Random(f"{spec.seed}:{stream}")
    out: list[Request] = []
    for k in range(count):
        n_in, n_out = _draw_lengths(spec, rng, bounds)
        group = None
        ids: list[int] = []
        if spec.prefix_len:
            group = k % spec.num_prefixes
            ids = list(prefixes[group])
        ids.extend(draw(rng) for _ in range(n_in - len(ids)))
        if k_nonce:  # the nonce goes first and the prompt keeps its length: the last ids make way
            ids = nonce + ids[: n_in - k_nonce]
        out.append(Request(start_index + k, ids, n_in, n_out, group, shared))
    return out


def new_nonce() -> int:
    """A per-run nonce from the OS's entropy: never derived from the seed, which repeats by design."""
    return secrets.randbits(63)


def shared_share(requests: Sequence[Request]) -> float:
    """Of the prompt tokens of ``requests``, the share the workload means to share (exact)."""
    total = sum(r.input_len for r in requests)
    return sum(r.shared_len for r in requests) / total if total else 0.0


def as_text(requests: Sequence[Request], seed: int = 0) -> list[Request]:
    """Text versions of token-id requests for chat endpoints, which take no token ids.

    Without the server's tokenizer the input length cannot be exact: one common English word
    per requested token is a fair approximation for BPE vocabularies; the true count comes back
    in ``usage.prompt_tokens`` and is what the results report.
    """
    out = []
    for r in requests:
        rng = random.Random(f"{seed}:text:{r.index}")
        words = [_WORDS[t % len(_WORDS)] for t in r.prompt] if isinstance(r.prompt, list) else []
        if not words:
            words = [rng.choice(_WORDS) for _ in range(r.input_len)]
        out.append(Request(r.index, " ".join(words), r.input_len, r.output_len, r.prefix_group, r.shared_len))
    return out


ARRIVALS: tuple[str, ...] = ("immediate", "vllm")


def arrival_offsets(count: int, rate: float, burstiness: float, seed: int, *, first: str = "immediate",
                    exact: bool = False, stream: str = "") -> list[float]:
    """Scheduled send times (s from the start) of an open-loop arrival process.

    Gaps are gamma distributed with shape ``burstiness`` and mean ``1/rate``: burstiness 1 is a
    Poisson process, below 1 burstier, above 1 more regular. ``first`` says where the schedule
    starts, since the two conventions differ by one gap and a rescale:

    - ``immediate`` (day0's default): the first request goes at t=0, then ``count - 1`` gaps; the
      last lands wherever the draws put it (about ``(count - 1) / rate``).
    - ``vllm`` (``vllm bench serve``, ``benchmarks/serve.py:get_request``): ``count`` gaps, so
      the first request waits one; then every time is rescaled by one factor so the last request
      lands exactly at ``count / rate`` (vLLM does this to steady throughput across seeds).

    ``exact`` rescales an ``immediate`` schedule the same way, so its last request lands at
    ``(count - 1) / rate``: the schedule then offers exactly ``rate``. Unscaled, the rate a schedule
    realises is a draw: over 60 Poisson gaps it is off by 13% (one standard deviation, 1/sqrt(59)),
    and a capacity search would carry that factor into its answer. Rescaled, the gaps are the same
    process conditioned on where the last arrival falls (a Poisson schedule's times are then uniform
    order statistics), so the bursts inside a point stay.

    ``stream`` names one of the seed's schedules: the phases of a sweep or a search, many at one
    seed, each draw their own. Without it every point's gaps were the same draws rescaled, so one
    burst of the seed's sat at the same request of every point, and a point long enough to reach it
    missed wherever it was put (2026-12-06: five 30 s holds at four rates from 35.9 down to 31.0 req/s
    each stopped at request 872-882, where seed 38082's schedule crowds 1.67x its rate into one
    second). The unnamed stream is the seed's own schedule, so a measured phase is the same run
    after run.

    ``rate = inf`` sends everything at t=0 under either. The draws come from this seed's own
    random stream (not numpy's), so a schedule never matches vLLM's draw for draw, only in law.
    """
    if count <= 0:
        return []
    if not rate > 0:
        raise WorkloadError(f"request_rate: must be > 0, got {rate}")
    if not burstiness > 0:
        raise WorkloadError(f"burstiness: must be > 0, got {burstiness}")
    if first not in ARRIVALS:
        raise WorkloadError(f"arrivals: expected one of {', '.join(ARRIVALS)}, got {first!r}")
    if math.isinf(rate):
        return [0.0] * count
    rng = random.Random(f"{seed}:{stream}:arrivals" if stream else f"{seed}:arrivals")

    def gap() -> float:
        return 1.0 / rate if math.isinf(burstiness) else rng.gammavariate(burstiness, 1.0 / (rate * burstiness))

    t = 0.0
    out = [0.0] if first == "immediate" else []
    for _ in range(count - len(out)):
        t += gap()
        out.append(t)
    span = count / rate if first == "vllm" else (count - 1) / rate if exact else None
    if span is not None and out[-1] > 0:
        scale = span / out[-1]
        out = [x * scale for x in out]
    return out
