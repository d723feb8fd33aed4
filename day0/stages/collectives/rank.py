"""The per-rank main: one process of the sweep, started by the local launcher, torchrun or srun.

Each rank reports where it is (:class:`~day0.stages.collectives.rank_env.RankProgress`: a step
file and a heartbeat under ``<out-dir>/ranks/``) so the launcher can name a rank that died or
hung; rank 0 writes the result after every op, so a later fault loses nothing already measured.
Which ops exist, their modes and how many ranks they need are the registry's
(:mod:`day0.core.collective_ops`).
"""

from __future__ import annotations

import datetime as _dt
import os
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from day0.core.collective_ops import OPS
from day0.stages.collectives.faults import clean_error
from day0.stages.collectives.links import measure_links
from day0.stages.collectives.rank_env import RankEnv, RankProgress, node_name
from day0.stages.collectives.result import RESULT_FILE, CollectivesResult, OpOutcome
from day0.stages.collectives.settings import CollectivesSection
from day0.stages.collectives.sockets import gather_sockets
from day0.stages.collectives.subgroup import intra_node_rows
from day0.stages.collectives.sweep import Sweeper, resolve_backend


def run_rank(settings: CollectivesSection, env: RankEnv, out_dir: Path) -> int:
    """The per-rank main: sweep every op, rank 0 writes the result JSON. Returns an exit code."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    progress = RankProgress(out_dir, env.rank)
    progress.step(phase="import")
    run = _RankRun(settings, env, out_dir, progress)
    try:
        return run.main()
    except BaseException as exc:  # noqa: BLE001 - every failure must be reported, then the process ends
        run.fail(exc)


class _RankRun:
    """One rank's sweep; what it measured so far (``result``) and the op it was in survive a failure."""

    def __init__(self, settings: CollectivesSection, env: RankEnv, out_dir: Path, progress: RankProgress) -> None:
        self.s, self.env, self.out_dir, self.progress = settings, env, out_dir, progress
        self.result: CollectivesResult | None = None
        self.current: str | None = None  # the op being swept
        self.scope = "intra_node"  # of the sweep's rows: inter_node once the ranks are seen on several nodes

    def main(self) -> int:
        import torch
        import torch.distributed as dist

        settings, env = self.s, self.env
        backend = self._init_process_group(torch, dist)
        sw = Sweeper(settings, env)
        hosts: list[Any] = [None] * env.world_size
        dist.all_gather_object(hosts, node_name())
        self.scope = "inter_node" if len(set(hosts)) > 1 else "intra_node"
        started = time.perf_counter()
        self.result = result = CollectivesResult(
            source="day0", backend=backend, world_size=env.world_size, hosts=[str(h) for h in hosts],
            dtype=settings.dtype, settings=settings.to_dict(),
            started_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            versions=_versions(torch), ops={op: OpOutcome(op) for op in settings.ops},
        )
        for op in settings.ops:
            self.current = op
            if self._sweep_op(sw, result.ops[op]) and env.rank == 0:
                result.duration_s = time.perf_counter() - started
                result.write(self.out_dir / RESULT_FILE)  # after every op: a later fault loses nothing measured
        self.current = None
        self._across_nodes(dist, torch, [str(h) for h in hosts], backend)
        self.progress.step(phase="finish")
        dist.barrier()
        result.duration_s = time.perf_counter() - started
        result.complete = True
        if env.rank == 0:
            result.nccl_logs = sorted(str(p) for p in self.out_dir.glob("nccl-debug.*.log"))
            result.write(self.out_dir / RESULT_FILE)
        dist.destroy_process_group()
        self.progress.step(phase="done")
        self.progress.stop()
        return 0

    def _across_nodes(self, dist: Any, torch: Any, hosts: list[str], backend: str) -> None:
        """Ranks on several nodes: the node-to-node links, and (gloo) the sockets every rank's traffic used."""
        if len(set(hosts)) < 2:
            return
        if self.env.local_world_size > 1:
            intra = intra_node_rows(dist, self.s, self.env, hosts, self.result, self.progress)
            if self.result is not None:
                self.result.rows.extend(intra)
        self.progress.step(phase="links")
        device = torch.device("cuda", self.env.local_rank) if backend == "nccl" else torch.device("cpu")
        links = measure_links(dist, torch, self.s, self.env.rank, hosts, device)
        sockets = None
        if backend == "gloo":
            self.progress.step(phase="sockets")
            sockets = gather_sockets(dist, self.env.rank, hosts)
        if self.env.rank == 0 and self.result is not None:
            self.result.links, self.result.sockets = links, sockets
            self.result.write(self.out_dir / RESULT_FILE)

    def _init_process_group(self, torch: Any, dist: Any) -> str:
        """Pick the backend, route NCCL's debug log to per-rank files, and join the group."""
        settings, env = self.s, self.env
        backend = resolve_backend(settings, torch, env.local_world_size)
        if backend == "nccl":
            if settings.nccl_debug:
                os.environ.setdefault("NCCL_DEBUG", "INFO")
                os.environ.setdefault("NCCL_DEBUG_SUBSYS", "INIT,GRAPH,ENV")
                os.environ.setdefault("NCCL_DEBUG_FILE", str(self.out_dir / "nccl-debug.%h.%p.log"))
            torch.cuda.set_device(env.local_rank)
        self.progress.step(phase="rendezvous")
        kwargs: dict[str, Any] = {}
        if backend == "nccl":
            kwargs["device_id"] = torch.device("cuda", env.local_rank)
        dist.init_process_group(
            backend=backend, rank=env.rank, world_size=env.world_size,
            timeout=_dt.timedelta(seconds=float(settings.timeout_s)), **kwargs,
        )
        return backend

    def _sweep_op(self, sw: Sweeper, outcome: OpOutcome) -> bool:
        """Probe and sweep one op in each of its modes; False when it was skipped without running."""
        op, settings = outcome.op, self.s
        spec, modes = OPS[op], settings.modes(op)
        if self.env.world_size < spec.min_ranks:
            outcome.status, outcome.reason = "skip", f"{spec.label or op} needs at least {spec.min_ranks} ranks"
            return False
        if not modes:
            outcome.status, outcome.reason = "skip", f"{op} has only {'/'.join(spec.modes)}, which the settings turned off"
            return False
        if (need := sw.smallest_size(op)) > max(settings.sizes()):
            outcome.status, outcome.reason = "skip", (f"{spec.label or op} needs messages of {need} B or more on "
                                                      f"{sw.n} ranks; max_bytes is {settings.max_bytes}")
            return False
        skipped: list[str] = []
        for mode in modes:
            self.progress.step(phase="probe", op=op, mode=mode)
            why = sw.probe(op, mode)
            if why:
                skipped.append(why)
                continue
            outcome.modes.append(mode)
            for size in settings.sizes():
                self.progress.step(phase="sweep", op=op, mode=mode, size=size)
                row = sw.measure(op, mode, size)
                if row is not None:
                    row.scope = self.scope
                    self.result.rows.append(row)  # type: ignore[union-attr]
        if outcome.modes:
            outcome.status = "ok"
            outcome.reason = "; ".join(skipped)
        else:
            outcome.status, outcome.reason = "skip", "; ".join(skipped)
        return True

    def fail(self, exc: BaseException) -> NoReturn:
        """Report the failure (rank 0 keeps what was measured), then end the process at once."""
        result, rank = self.result, self.env.rank
        self.progress.error(exc)
        if result is not None and rank == 0:
            if self.current is not None:
                result.ops[self.current].status = "error"
                first = str(exc).splitlines()[0] if str(exc) else ""
                result.ops[self.current].reason = clean_error(f"{type(exc).__name__}: {first}")[:300]
            try:
                result.write(self.out_dir / RESULT_FILE)
            except OSError:
                pass
        self.progress.stop()
        sys.stderr.write(f"day0.stages.collectives rank {rank}: {type(exc).__name__}: {exc}\n")
        sys.stderr.flush()
        # No destroy_process_group: with a peer gone it can block; the OS reclaims sockets.
        os._exit(1)


def _versions(torch: Any) -> dict[str, str]:
    v = {"torch": str(torch.__version__), "python": sys.version.split()[0]}
    try:
        if torch.cuda.is_available():
            v["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
            v["cuda"] = str(torch.version.cuda)
    except Exception:  # noqa: BLE001 - versions are informative only
        pass
    return v
