"""One rank's sweep: for each point, the op's spec builds the buffers and the call, the sweep
times it, then holds every output element to the spec's oracle.

What each op does is its spec's (:mod:`day0.core.collective_ops`); this module holds what every op
shares: the rank's device and dtype, the exact data, the timing loop, the check, and the
reduction of times across ranks (after the timed loop, so it does not perturb what was timed).
Every collective goes through ``torch.distributed``, or one bound to a subgroup. An op with
``uneven_splits`` gets its split sizes from the expert routing of the sweep's own ranks
(:mod:`day0.stages.collectives.routing`, drawn once per sweeper): the world's ranks, or a node's on
its subgroup, so intra- and inter-node expert traffic stay apart as every op's does.
"""

from __future__ import annotations

import re
import time
from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING, Any, Callable, Sequence

from day0.core.collective_ops import OPS, OpCall, OpSpec
from day0.core.stats import percentile
from day0.stages.collectives.busbw import BufferPlan, algbw_gbps, plan
from day0.stages.collectives.exact import ExactPattern
from day0.stages.collectives.rank_env import RankEnv
from day0.stages.collectives.result import SweepRow
from day0.stages.collectives.settings import DTYPES, CollectivesSection

if TYPE_CHECKING:
    from day0.stages.collectives.routing import Routing

_UNSUPPORTED = re.compile(r"not supported|does not support|unsupported|not implemented|no support", re.IGNORECASE)
_CHECK_CHUNK = 1 << 24


def nearest_rank(sorted_values: Sequence[float], q: float) -> float | None:
    """Per-iteration percentile as nccl-tests reports it (nearest rank); None, not NaN, for no
    values, since the result file is JSON."""
    return percentile(sorted_values, q, presorted=True, method="nearest") if sorted_values else None


def resolve_backend(settings: CollectivesSection, torch: Any, local_world_size: int) -> str:
    if settings.backend != "auto":
        return settings.backend
    if torch.cuda.is_available() and torch.cuda.device_count() >= max(1, local_world_size):
        return "nccl"
    return "gloo"


class PointContext:
    """One sweep point on one rank as a spec sees it (:class:`~day0.core.collective_ops.OpContext`):
    the sweeper's device, dtype and exact data, and the point's buffer plan."""

    def __init__(self, sw: "Sweeper", p: BufferPlan) -> None:
        self.sw, self.dist, self.rank, self.n = sw, sw.dist, sw.rank, sw.n
        self.root = sw.s.root % sw.n
        self.elements, self.chunk, self.traffic = p.elements, p.chunk, p.traffic

    def zeros(self, count: int) -> Any:
        return self.sw.torch.zeros(count, dtype=self.sw.tdtype, device=self.sw.device)

    def moved(self, rank: int, start: int, count: int) -> Any:
        return self.sw.moved.values(self.sw.torch, rank, start, count, self.sw.tdtype, self.sw.device)

    def summed(self, rank: int, start: int, count: int) -> Any:
        return self.sw.pattern.values(self.sw.torch, rank, start, count, self.sw.tdtype, self.sw.device)

    def sums(self, start: int, count: int) -> Any:
        return self.sw.pattern.sums(self.sw.torch, start, count, self.sw.tdtype, self.sw.device)

    def blocks(self, start: int, count: int, block: Callable[[int, int, int], Any],
               sizes: Sequence[int] | None = None) -> Any:
        ends = list(accumulate(sizes if sizes is not None else [self.chunk] * self.n))
        parts, pos, end = [], start, start + count
        while pos < end:
            j = bisect_right(ends, pos)  # the block holding pos (empty blocks are stepped over)
            if j == len(ends):
                raise IndexError(f"element {pos} is past the {ends[-1] if ends else 0} elements of the blocks")
            off = pos - (ends[j - 1] if j else 0)
            take = min(ends[j] - pos, end - pos)
            parts.append(block(j, off, take))
            pos += take
        return self.sw.torch.cat(parts) if len(parts) > 1 else parts[0]


@dataclass
class Point:
    """One sweep point: its plan, what the spec built, and its oracle bound to this rank."""

    plan: BufferPlan
    call: OpCall
    expected: Callable[[int, int], Any]  # (start, length) -> exact expected slice of out

    @property
    def fill(self) -> Callable[[], None]:
        return self.call.fill

    @property
    def run(self) -> Callable[[], None]:
        return self.call.run

    @property
    def inp(self) -> Any:
        return self.call.inp

    @property
    def out(self) -> Any:
        return self.call.out


class Sweeper:
    """Runs the sweep on one rank. Every collective goes through ``self.dist``."""

    def __init__(self, settings: CollectivesSection, env: RankEnv, dist: Any = None) -> None:
        """``dist``: torch.distributed, or one bound to a subgroup (``env`` then holds the group's ranks)."""
        import torch
        import torch.distributed

        self.torch, self.dist = torch, dist or torch.distributed
        self.s, self.env = settings, env
        self.rank, self.n = env.rank, env.world_size
        self.backend = resolve_backend(settings, torch, env.local_world_size)
        self.device = torch.device("cuda", env.local_rank) if self.backend == "nccl" else torch.device("cpu")
        self.tdtype = getattr(torch, DTYPES[settings.dtype][0])
        self.elem = DTYPES[settings.dtype][1]
        self.pattern = ExactPattern.for_dtype(settings.dtype, self.n)  # summed by reductions
        self.moved = ExactPattern.for_dtype(settings.dtype, self.n, reduce=False)  # only copied
        self.cuda = self.device.type == "cuda"
        self._routing: Routing | None = None

    @property
    def routing(self) -> Routing:
        """The expert routing of this sweep's ranks, drawn on first use (the same on every rank)."""
        if self._routing is None:
            from day0.stages.collectives.routing import route  # numpy: only where an uneven op runs

            r = self.s.expert_routing
            self._routing = route(self.n, tokens=r.tokens, top_k=r.top_k, experts=r.experts, skew=r.skew, seed=r.seed)
        return self._routing

    def plan(self, op: str, size: int) -> BufferPlan:
        """One point's elements; an op with ``uneven_splits`` gets this sweep's routing."""
        return plan(op, size, self.elem, self.n, self.routing if OPS.resolve(op).uneven_splits else None)

    def smallest_size(self, op: str) -> int:
        """The fewest bytes that make a point: one element (a chunk each for split ops, a row per token
        and expert for uneven ones); a smaller size is no point at all."""
        spec = OPS.resolve(op)
        return self.elem * (self.routing.per_rank if spec.uneven_splits else self.n if spec.split else 1)

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def count_wrong(self, out: Any, expected: Callable[[int, int], Any]) -> int:
        """Elements of ``out`` that differ from the oracle, in chunks (an 8 GiB output in one pass);
        0 where the op leaves this rank no output."""
        if out is None:
            return 0
        wrong = 0
        flat = out.reshape(-1)
        for s in range(0, flat.numel(), _CHECK_CHUNK):
            e = min(flat.numel(), s + _CHECK_CHUNK)
            wrong += int((flat[s:e] != expected(s, e - s)).sum().item())
        return wrong

    def build(self, op: str, mode: str, size: int) -> Point:
        """Buffers, data fill, the collective call and the exact expected output for one sweep point."""
        spec: OpSpec = OPS.resolve(op)
        if spec.build is None or spec.expect is None:
            raise ValueError(f"no runner for collective {op!r}")
        p = self.plan(op, size)
        ctx = PointContext(self, p)
        oracle = spec.expect
        return Point(p, spec.build(ctx, mode), lambda s, length: oracle(ctx, s, length))

    # -- measurement ----------------------------------------------------------------------
    def measure(self, op: str, mode: str, size: int) -> SweepRow | None:
        torch, dist, s = self.torch, self.dist, self.s
        pt = self.build(op, mode, size)
        p, fill, run, out, expected, idempotent = pt.plan, pt.fill, pt.run, pt.out, pt.expected, pt.call.idempotent
        if p.elements == 0:
            return None
        fill()
        for _ in range(s.warmup_iters):
            run()
        self.sync()
        dist.barrier()
        times: list[float] = []
        if self.cuda:
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(s.iters)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(s.iters)]
            t0 = time.perf_counter()
            for i in range(s.iters):
                starts[i].record()
                run()
                ends[i].record()
            self.sync()
            total = time.perf_counter() - t0
            times = [a.elapsed_time(b) / 1e3 for a, b in zip(starts, ends)]
        else:
            pc = time.perf_counter
            t0 = pc()
            for _ in range(s.iters):
                a = pc()
                run()
                times.append(pc() - a)
            total = pc() - t0
        wrong_local = 0
        if s.check:
            if not idempotent:  # in-place reductions changed their own input: fresh data, one more run
                fill()
                run()
                self.sync()
            wrong_local = self.count_wrong(out, expected)
        # Reduce across ranks after timing so the reduction does not perturb what was timed.
        stats = torch.tensor([total / s.iters, *times], dtype=torch.float64, device=self.device)
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
        wrong_t = torch.tensor([wrong_local], dtype=torch.int64, device=self.device)
        dist.all_reduce(wrong_t)
        mean_s = float(stats[0].item())
        per_iter_us = [float(x) * 1e6 for x in stats[1:].tolist()]
        srt = sorted(per_iter_us)
        algbw = algbw_gbps(p.size_bytes, mean_s)
        return SweepRow(
            op=op, mode=mode, size_bytes=p.size_bytes, count=p.count, dtype=s.dtype, nranks=self.n,
            time_us=mean_s * 1e6, algbw_gbps=algbw, busbw_gbps=algbw * p.bus_factor,
            wrong=int(wrong_t.item()) if s.check else None, iters=s.iters, times_us=per_iter_us,
            p50_us=nearest_rank(srt, 50), p90_us=nearest_rank(srt, 90), p99_us=nearest_rank(srt, 99),
            min_us=srt[0] if srt else None, max_us=srt[-1] if srt else None,
        )

    def probe(self, op: str, mode: str) -> str | None:
        """Run the op once at the smallest size; a backend that lacks it says so here (skip, not pass)."""
        size = max(self.s.min_bytes, self.elem * self.n, self.smallest_size(op))
        pt = self.build(op, mode, size)
        pt.fill()
        try:
            pt.run()
            self.sync()
        except (RuntimeError, NotImplementedError, ValueError) as exc:
            if _UNSUPPORTED.search(str(exc)):
                self.dist.barrier()
                return f"{self.backend} does not support {op} ({mode}): {str(exc).splitlines()[0][:200]}"
            raise
        return None
