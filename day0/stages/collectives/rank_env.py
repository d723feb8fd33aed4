"""Who a rank is and where it stands: its place in the job (:class:`RankEnv`), its node, and the
step file and heartbeat through which the launcher names a rank that died or hung.

Its own module because the rank's main (:mod:`~day0.stages.collectives.rank`), the sweep and the
sweep on a node's subgroup all use them; none of those imports another to get them.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from day0.core.outputs import write_file
from day0.engine.cluster.slurm import env_int
from day0.stages.collectives.result import RANKS_DIR

__all__ = ["RankEnv", "RankProgress", "node_name"]


@dataclass
class RankEnv:
    """A rank's place in the job as its launcher tells it (the local one, torchrun, srun); a sweep on a
    subgroup gets one holding the group's ranks."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> "RankEnv | None":
        """torchrun sets RANK/WORLD_SIZE/LOCAL_RANK; Slurm's srun sets SLURM_PROCID/NTASKS/LOCALID. A malformed
        one is a SlurmError naming the variable."""
        env = os.environ if environ is None else environ
        if "RANK" in env and "WORLD_SIZE" in env:
            r, w = env_int(env, "RANK"), env_int(env, "WORLD_SIZE")
            return cls(r, w, env_int(env, "LOCAL_RANK", r), env_int(env, "LOCAL_WORLD_SIZE", w))  # type: ignore[arg-type]
        if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
            r, w = env_int(env, "SLURM_PROCID"), env_int(env, "SLURM_NTASKS")
            per_node = {"SLURM_NTASKS_PER_NODE": env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0] or "1"}
            return cls(r, w, env_int(env, "SLURM_LOCALID", 0), env_int(per_node, "SLURM_NTASKS_PER_NODE"))  # type: ignore[arg-type]
        return None


def node_name() -> str:
    """The node this rank runs on: ``DAY0_NODE`` (set by the cluster's launcher; emulated nodes share
    one hostname), else the hostname."""
    return os.environ.get("DAY0_NODE") or socket.gethostname()


class RankProgress:
    """Per-rank step file and heartbeat, so the launcher can name the rank that died or hung."""

    def __init__(self, out_dir: Path, rank: int) -> None:
        self.dir = Path(out_dir) / RANKS_DIR
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        self.step_path = self.dir / f"rank{rank}.step.json"
        self.hb_path = self.dir / f"rank{rank}.heartbeat"
        self.err_path = self.dir / f"rank{rank}.error.txt"
        self.seq = 0
        self._stop = threading.Event()
        write_file(self.hb_path, b"")
        self._thread = threading.Thread(target=self._beat, name="day0-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(0.5):
            try:
                os.utime(self.hb_path)
            except OSError:
                pass

    def step(self, **info: Any) -> None:
        self.seq += 1
        data = {"rank": self.rank, "pid": os.getpid(), "host": node_name(), "seq": self.seq,
                "t": time.time(), **info}
        write_file(self.step_path, json.dumps(data))  # whole or not at all: the watcher reads it any time

    def error(self, exc: BaseException) -> None:
        text = f"{type(exc).__name__}: {exc}".strip()
        write_file(self.err_path, text + "\n\n" + "".join(traceback.format_exception(exc)))

    def stop(self) -> None:
        self._stop.set()
