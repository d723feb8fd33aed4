"""One phase's schedule split into shards, each run on its own event loop, and merged back exactly.

One Python process cannot time tens of thousands of streamed tokens a second without timing
itself (its event loop notices a token late when it is busy with others), so a phase can be
split: :func:`split_phase` deals the requests out in schedule order, request k to shard
k mod N, each keeping the offset the single schedule gave it, so the union of the shards is the
very schedule one process would have run; :func:`run_shard` runs one shard from a shared start
instant with the same code one process uses (``day0.client.loadgen.drive``); and
:func:`merge_shards` puts the raw per-request results back together (no histogram, no
approximation), so every statistic is computed as if one process had measured.

The seam for more hosts: a :class:`ShardSpec` is self-contained and JSON-able, and a
:class:`ShardResult` carries raw samples, so a shard may run anywhere that can reach the server;
``day0.client.workers`` runs them as local processes. Times are ``time.perf_counter`` values
(CLOCK_MONOTONIC on Linux, one clock for every process of a host); shards on other hosts would
need a start instant and results on a clock they share, which is what a node launcher adds.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

from day0.client.loadgen import LoadShape, LoopWatch, Part, PhaseResult, drive
from day0.client.stream import ClientOptions, RequestResult, endpoint_url
from day0.client.wire import StreamPool
from day0.client.workload import Request


@dataclass
class ShardSpec:
    """Everything one shard needs to run its part of a phase, and nothing it must share."""

    shard: int
    shards: int
    base_url: str
    model: str
    phase: str
    tag: str  # the phase's request-id tag, the same in every shard
    options: ClientOptions
    requests: list[Request]
    offsets: list[float] | None  # open loop: scheduled s after the phase's t=0; None: closed loop
    concurrency: int  # closed loop: this shard's share of the requests in flight; open loop: its share of the cap
    duration_s: float | None = None
    precise: bool = True

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "ShardSpec":
        return cls(**{**data, "options": ClientOptions(**data["options"]),
                      "requests": [Request(**r) for r in data["requests"]]})

    def part(self) -> Part:
        return Part(self.requests, self.offsets, self.concurrency, self.duration_s, self.precise)


@dataclass
class ShardResult:
    """What one shard measured: every request it sent, raw, and how many it kept back."""

    shard: int
    results: list[RequestResult]
    not_sent: int
    loop_stall_ms: float | None = None  # the longest its worker's loop did not run (None: not watched)

    def to_json(self) -> dict[str, Any]:
        return {"shard": self.shard, "not_sent": self.not_sent, "results": [asdict(r) for r in self.results],
                "loop_stall_ms": self.loop_stall_ms}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "ShardResult":
        stall = data.get("loop_stall_ms")
        return cls(int(data["shard"]), [RequestResult(**r) for r in data["results"]], int(data["not_sent"]),
                   None if stall is None else float(stall))


def shard_count(requested: int, requests: int, shape: LoadShape) -> int:
    """How many shards a phase can use: no more than asked, than requests, or than in-flight slots
    (each shard needs at least one of the closed loop's slots, or of the open loop's cap)."""
    n = max(1, min(requested, requests))
    return min(n, shape.concurrency) if shape.concurrency > 0 else n


def _share(total: int, shard: int, shards: int) -> int:
    """Shard ``shard``'s part of ``total`` slots: as even as integers allow, the first ones one more."""
    return total // shards + (1 if shard < total % shards else 0)


def split_phase(base_url: str, model: str, requests: Sequence[Request], shape: LoadShape, opts: ClientOptions,
                shards: int, *, phase: str, tag: str) -> tuple[list[ShardSpec], list[float]]:
    """The phase as ``shards`` shard specs, and the whole schedule's offsets (empty in closed loop).

    Deterministic: request k of the schedule goes to shard k mod N with the offset the whole
    schedule gave it, so each shard offers 1/N of the rate, interleaved with the others, and the
    shards together offer exactly the schedule one process would. The in-flight slots (closed
    loop) or the cap (open loop) are split as evenly as integers allow."""
    shape.validate()
    offsets = shape.offsets(len(requests))
    n = shard_count(shards, len(requests), shape)
    specs = []
    for i in range(n):
        mine = list(range(i, len(requests), n))
        specs.append(ShardSpec(
            shard=i, shards=n, base_url=base_url, model=model, phase=phase, tag=tag, options=opts,
            requests=[requests[k] for k in mine], offsets=None if offsets is None else [offsets[k] for k in mine],
            concurrency=_share(shape.concurrency, i, n) if shape.concurrency > 0 else 0,
            duration_s=shape.duration_s, precise=shape.precise_timing))
    return specs, offsets or []


async def run_shard(streams: StreamPool, spec: ShardSpec, t0: float, *,
                    finished: Callable[[RequestResult], None] | None = None,
                    stop: asyncio.Event | None = None) -> ShardResult:
    """Run one shard from the perf_counter instant ``t0`` (the phase's t=0, shared by every shard),
    its loop watched for stalls as a one-process phase's is. With ``finished`` each request goes
    to it as it ends, for a stop rule that judges the whole phase elsewhere, and ``stop``, once
    that rule has fired, ends the shard as the rule would end a one-process phase."""
    url = endpoint_url(spec.base_url, spec.options.endpoint)

    def mine(r: RequestResult) -> bool:
        r.shard = spec.shard
        if finished is not None:
            finished(r)
        return False

    async with LoopWatch() as watch:
        results, not_sent = await drive(streams, url, spec.model, spec.part(), spec.options, t0=t0,
                                        phase=spec.phase, tag=spec.tag, watch=watch, until=mine, stop=stop)
    return ShardResult(spec.shard, results, not_sent, watch.longest_ms)


def merge_shards(phase: str, shape: LoadShape, parts: Sequence[ShardResult], t0: float,
                 offsets: list[float]) -> PhaseResult:
    """The shards' raw results as one phase, exactly as one process would have reported it:
    every request once, in scheduled order, the window from t0 to the last stream's end; the
    longest stall of any worker's loop (each request carries what its own worker's loop stalled
    through: ``LoopWatch.stamp``)."""
    results = sorted((r for p in parts for r in p.results), key=lambda r: (r.scheduled, r.index))
    ended = max((r.finished for r in results), default=t0)
    watched = [p.loop_stall_ms for p in parts if p.loop_stall_ms is not None]
    return PhaseResult(phase, shape, results, t0, ended, sum(p.not_sent for p in parts), list(offsets),
                       workers=len(parts), loop_stall_ms=max(watched) if watched else None)
