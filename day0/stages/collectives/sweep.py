"""One rank's sweep: buffers, exact inputs and expected outputs per collective, timing, the check.

Every collective goes through ``torch.distributed``; times are reduced (max over ranks) after
the timed loop, so the reduction does not perturb what was timed.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from day0.core.stats import percentile
from day0.stages.collectives.busbw import algbw_gbps, busbw_gbps, plan
from day0.stages.collectives.exact import ExactPattern
from day0.stages.collectives.result import SweepRow
from day0.stages.collectives.settings import DTYPES, CollectivesSettings

if TYPE_CHECKING:
    from day0.stages.collectives.rank import RankEnv, _Progress

_UNSUPPORTED = re.compile(r"not supported|does not support|unsupported|not implemented|no support", re.IGNORECASE)
_CHECK_CHUNK = 1 << 24


def nearest_rank(sorted_values: Sequence[float], q: float) -> float | None:
    """Per-iteration percentile as nccl-tests reports it (nearest rank); None, not NaN, for no
    values, since the result file is JSON."""
    return percentile(sorted_values, q, presorted=True, method="nearest") if sorted_values else None


def resolve_backend(settings: CollectivesSettings, torch: Any, local_world_size: int) -> str:
    if settings.backend != "auto":
        return settings.backend
    if torch.cuda.is_available() and torch.cuda.device_count() >= max(1, local_world_size):
        return "nccl"
    return "gloo"


@dataclass
class _Point:
    plan: Any  # day0.busbw.BufferPlan
    fill: Callable[[], None]  # write this rank's crafted input (and clear the output)
    run: Callable[[], None]  # one collective call
    inp: Any  # the send buffer (the same tensor as out for in-place ops)
    out: Any  # what is checked
    expected: Callable[[int, int], Any]  # (start, length) -> exact expected slice of out
    idempotent: bool  # rerunning leaves out unchanged (else the check refills and runs once more)


class _Sweeper:
    """Runs the sweep on one rank. Every collective goes through ``self.dist``."""

    def __init__(self, settings: CollectivesSettings, env: RankEnv, out_dir: Path, progress: "_Progress",
                 dist: Any = None) -> None:
        """``dist``: torch.distributed, or one bound to a subgroup (``env`` then holds the group's ranks)."""
        import torch
        import torch.distributed

        self.torch, self.dist = torch, dist or torch.distributed
        self.s, self.env, self.out_dir, self.progress = settings, env, Path(out_dir), progress
        self.rank, self.n = env.rank, env.world_size
        self.backend = resolve_backend(settings, torch, env.local_world_size)
        self.device = torch.device("cuda", env.local_rank) if self.backend == "nccl" else torch.device("cpu")
        self.tdtype = getattr(torch, DTYPES[settings.dtype][0])
        self.elem = DTYPES[settings.dtype][1]
        self.pattern = ExactPattern.for_dtype(settings.dtype, self.n)  # summed by reductions
        self.moved = ExactPattern.for_dtype(settings.dtype, self.n, reduce=False)  # only copied
        self.cuda = self.device.type == "cuda"

    # -- helpers ------------------------------------------------------------------------
    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def zeros(self, n: int) -> Any:
        return self.torch.zeros(n, dtype=self.tdtype, device=self.device)

    def vals(self, rank: int, start: int, count: int, pattern: ExactPattern | None = None) -> Any:
        return (pattern or self.moved).values(self.torch, rank, start, count, self.tdtype, self.device)

    def count_wrong(self, out: Any, expected: Callable[[int, int], Any]) -> int:
        wrong = 0
        flat = out.reshape(-1)
        for s in range(0, flat.numel(), _CHECK_CHUNK):
            e = min(flat.numel(), s + _CHECK_CHUNK)
            wrong += int((flat[s:e] != expected(s, e - s)).sum().item())
        return wrong

    def blockwise(self, c: int, fn: Callable[[int, int, int], Any]) -> Callable[[int, int], Any]:
        """Expected values for a buffer made of n blocks of c elements, block j from fn(j, off, len)."""

        def expected(s: int, length: int) -> Any:
            parts, pos, end = [], s, s + length
            while pos < end:
                j, off = divmod(pos, c)
                take = min(c - off, end - pos)
                parts.append(fn(j, off, take))
                pos += take
            return self.torch.cat(parts) if len(parts) > 1 else parts[0]

        return expected

    # -- op construction ------------------------------------------------------------------
    def build(self, op: str, mode: str, size: int) -> "_Point":
        """Buffers, data fill, the collective call and the exact expected output for one sweep point."""
        torch, dist, r, n = self.torch, self.dist, self.rank, self.n
        p = plan(op, size, self.elem, n)
        c, E = p.chunk, p.elements
        ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        sums = lambda s, L, base=0: self.pattern.sums(torch, base + s, L, self.tdtype, self.device)  # noqa: E731

        if op == "all_reduce":
            buf = self.zeros(E)
            def fill() -> None: buf.copy_(self.vals(r, 0, E, self.pattern))
            def run() -> None: dist.all_reduce(buf)
            return _Point(p, fill, run, buf, buf, lambda s, L: sums(s, L), False)
        if op == "all_gather":
            out = self.zeros(n * c)
            inp = out[r * c:(r + 1) * c] if mode == "in_place" else self.zeros(c)
            def fill() -> None:
                out.zero_()
                inp.copy_(self.vals(r, r * c, c))
            def run() -> None: ag(out, inp)
            exp = self.blockwise(c, lambda j, off, L: self.vals(j, j * c + off, L))
            return _Point(p, fill, run, inp, out, exp, True)
        if op == "reduce_scatter":
            inp = self.zeros(n * c)
            out = inp[r * c:(r + 1) * c] if mode == "in_place" else self.zeros(c)
            def fill() -> None:
                inp.copy_(self.vals(r, 0, n * c, self.pattern))
                if mode != "in_place":
                    out.zero_()
            def run() -> None: rs(out, inp)
            return _Point(p, fill, run, inp, out, lambda s, L: sums(s, L, base=r * c), mode != "in_place")
        if op == "all_to_all":
            inp, out = self.zeros(n * c), self.zeros(n * c)
            def fill() -> None:
                inp.copy_(self.vals(r, 0, n * c))
                out.zero_()
            def run() -> None: dist.all_to_all_single(out, inp)
            exp = self.blockwise(c, lambda j, off, L: self.vals(j, r * c + off, L))
            return _Point(p, fill, run, inp, out, exp, True)
        if op == "broadcast":
            root = self.s.root % n
            buf = self.zeros(E)
            def fill() -> None:
                if r == root:
                    buf.copy_(self.vals(root, 0, E))
                else:
                    buf.zero_()
            def run() -> None: dist.broadcast(buf, src=root)
            return _Point(p, fill, run, buf, buf, lambda s, L: self.vals(root, s, L), True)
        if op == "sendrecv":
            send, recv = self.zeros(E), self.zeros(E)
            nxt, prv = (r + 1) % n, (r - 1) % n
            def fill() -> None:
                send.copy_(self.vals(r, 0, E))
                recv.zero_()
            def run() -> None:
                reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, nxt), dist.P2POp(dist.irecv, recv, prv)])
                for q in reqs:
                    q.wait()
            return _Point(p, fill, run, send, recv, lambda s, L: self.vals(prv, s, L), True)
        raise ValueError(f"no runner for collective {op!r}")

    # -- measurement ----------------------------------------------------------------------
    def measure(self, op: str, mode: str, size: int) -> SweepRow | None:
        torch, dist, s = self.torch, self.dist, self.s
        pt = self.build(op, mode, size)
        p, fill, run, out, expected, idempotent = pt.plan, pt.fill, pt.run, pt.out, pt.expected, pt.idempotent
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
        return SweepRow(
            op=op, mode=mode, size_bytes=p.size_bytes, count=p.count, dtype=s.dtype, nranks=self.n,
            time_us=mean_s * 1e6, algbw_gbps=algbw_gbps(p.size_bytes, mean_s),
            busbw_gbps=busbw_gbps(op, p.size_bytes, mean_s, self.n),
            wrong=int(wrong_t.item()) if s.check else None, iters=s.iters, times_us=per_iter_us,
            p50_us=nearest_rank(srt, 50), p90_us=nearest_rank(srt, 90), p99_us=nearest_rank(srt, 99),
            min_us=srt[0] if srt else None, max_us=srt[-1] if srt else None,
        )

    def probe(self, op: str, mode: str) -> str | None:
        """Run the op once at the smallest size; a backend that lacks it says so here (skip, not pass)."""
        size = max(self.s.min_bytes, self.elem * self.n)
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
