"""Stage 2: collectives on torch.distributed (NCCL on GPUs, gloo on CPUs), measured like nccl-tests.

For each collective (all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, and
send/recv along the pipeline ring) the sweep runs sizes from ``min_bytes`` to ``max_bytes``,
out-of-place and in-place where torch.distributed has both, times warm-up plus timed
iterations, then checks every output element exactly. Inputs are small integers chosen so that
every partial sum is exactly representable in the dtype: any reduction order (ring, tree, NVLS)
gives the same bits, so one wrong element is a real fault, not rounding.

Ranks are started by real launchers: :func:`run_local` spawns one process per rank on this host
(each in its own process group, killed as a group), and ``torchrun`` / ``srun`` start
``python -m day0.stages.collectives run`` on supernodes. Rank 0 writes the result JSON that the stage
reads. Every collective runs under the settings' timeout; a rank that dies or hangs is named.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from day0.core.record import jsonable
from day0.stages.collectives.busbw import OPS, algbw_gbps, bus_factor, busbw_gbps, canonical_op, plan

RESULT_FILE = "collectives.json"
SETTINGS_FILE = "settings.json"
RANKS_DIR = "ranks"
RESULT_SCHEMA = "day0.collectives/1"
SCOPES = ("intra_node", "inter_node")

#: Which modes torch.distributed offers per op. all_reduce and broadcast are in-place only in
#: torch (nccl-tests' out-of-place variants have no torch API); all_to_all has no in-place form
#: (nccl-tests does not check it either); send/recv uses separate send and receive buffers.
OP_MODES: dict[str, tuple[str, ...]] = {
    "all_reduce": ("in_place",),
    "all_gather": ("out_of_place", "in_place"),
    "reduce_scatter": ("out_of_place", "in_place"),
    "all_to_all": ("out_of_place",),
    "broadcast": ("in_place",),
    "sendrecv": ("out_of_place",),
}

#: Realistic large-message busbw (GB/s) for presets. Sourced: H100/H200 8-GPU NVLink all_reduce
#: ~370 (ring) to ~480 (NVLS); NDR InfiniBand ~46 per NIC (one NIC per GPU, NCCL_ALGO=RING);
#: GB200 NVL72 all_reduce ~840. Other ops on NVLink are estimates near the ring figure: replace
#: them with a measured reference of the site's hardware.
EXPECTED_BUSBW_PRESETS: dict[str, dict[str, dict[str, float]]] = {
    "h100_h200_nvlink_8gpu": {
        "intra_node": {"all_reduce": 370.0, "all_gather": 340.0, "reduce_scatter": 340.0,
                       "all_to_all": 300.0, "broadcast": 300.0, "sendrecv": 300.0},
    },
    "ndr_infiniband": {
        "inter_node": {"all_reduce": 46.0, "all_gather": 46.0, "reduce_scatter": 46.0,
                       "all_to_all": 40.0, "broadcast": 40.0, "sendrecv": 40.0},
    },
    "gb200_nvl72": {
        "intra_node": {"all_reduce": 840.0},
        "inter_node": {"all_reduce": 840.0},
    },
    # Measured on a shared 2-core x86-64 box, gloo over loopback, 2 ranks, float32, 4 MiB:
    # 0.07-1.6 GB/s depending on the op and on the neighbours' load (docs/stages/collectives.md).
    # A floor that catches a broken setup (a 10x slowdown), not a performance target.
    "cpu_gloo_loopback": {
        "intra_node": {"all_reduce": 0.05, "all_gather": 0.05, "reduce_scatter": 0.05,
                       "all_to_all": 0.05, "broadcast": 0.05, "sendrecv": 0.05},
    },
}

_DTYPES: dict[str, tuple[str, int, int]] = {
    # name: (torch attribute, element size, largest integer every value up to which is exact)
    "float32": ("float32", 4, 2**24),
    "float16": ("float16", 2, 2**11),
    "bfloat16": ("bfloat16", 2, 2**8),
    "float64": ("float64", 8, 2**53),
    "int32": ("int32", 4, 2**31 - 1),
    "int64": ("int64", 8, 2**62),
    "int8": ("int8", 1, 127),
    "uint8": ("uint8", 1, 255),
}
_DTYPE_ALIASES = {"float": "float32", "fp32": "float32", "half": "float16", "fp16": "float16", "bf16": "bfloat16",
                  "double": "float64", "fp64": "float64", "int": "int32"}


class SettingsError(ValueError):
    """A [collectives] setting that cannot be used; one line naming the key."""


def parse_size(value: Any, key: str = "size") -> int:
    """Bytes from an int or a string with a binary suffix, as nccl-tests' -b/-e take them (1K = 1024)."""
    if isinstance(value, bool):
        raise SettingsError(f"collectives.{key}: expected bytes (int or '64M'), got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise SettingsError(f"collectives.{key}: must be >= 0, got {value}")
        return value
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*", str(value), re.IGNORECASE)
    if not m:
        raise SettingsError(f"collectives.{key}: cannot read {value!r} as bytes (e.g. 1024, '64K', '1G')")
    mult = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2).upper()]
    return int(m.group(1)) * mult


def human_bytes(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


# --------------------------------------------------------------------------- settings


@dataclass
class CollectivesSettings:
    """The profile's ``[collectives]`` table. Defaults suit the CPU demo (gloo, ~20 s sweep).

    ``expected_busbw`` maps a scope (``intra_node`` / ``inter_node``) to per-op GB/s; the
    busbw check passes when the large-message busbw is at least ``pass_fraction`` of it.
    """

    ops: list[str] = field(default_factory=lambda: list(OPS))
    min_bytes: int | str = "1K"
    max_bytes: int | str = "4M"
    step_factor: int = 4
    dtype: str = "float32"
    warmup_iters: int = 3
    iters: int = 10
    out_of_place: bool = True
    in_place: bool = True
    check: bool = True
    backend: str = "auto"  # auto (nccl when each rank has a GPU, else gloo) | nccl | gloo
    timeout_s: float = 60.0  # every collective; a rank stuck longer fails the run and is named
    grace_s: float = 3.0  # after a rank fails, time the others get to report before the group is killed
    startup_timeout_s: float = 120.0  # launching + rendezvous of all ranks
    pass_fraction: float = 0.8
    expected_busbw: dict[str, dict[str, float]] = field(default_factory=dict)
    scope: str = "auto"  # auto: inter_node when the ranks span several hosts
    root: int = 0
    world_size: int | None = None  # how many ranks the local launcher starts (run_local's argument wins)
    master_addr: str = "127.0.0.1"
    master_port: int = 0  # 0: a free port (local launcher only)
    nccl_debug: bool = True  # NCCL_DEBUG=INFO into per-rank files, for the transport checks
    large_message_bytes: int | str | None = None  # busbw check uses sizes >= this (default: the largest)

    def __post_init__(self) -> None:
        if isinstance(self.ops, str):
            self.ops = [self.ops]
        try:
            self.ops = [canonical_op(o) for o in self.ops]
        except ValueError as exc:
            raise SettingsError(f"collectives.ops: {exc}") from None
        bad = [o for o in self.ops if o not in OPS]
        if bad:
            raise SettingsError(f"collectives.ops: {bad[0]!r} is only importable from nccl-tests, not run here")
        self.min_bytes = parse_size(self.min_bytes, "min_bytes")
        self.max_bytes = parse_size(self.max_bytes, "max_bytes")
        if self.large_message_bytes is not None:
            self.large_message_bytes = parse_size(self.large_message_bytes, "large_message_bytes")
        if self.max_bytes < self.min_bytes:
            raise SettingsError(f"collectives.max_bytes ({self.max_bytes}) is below min_bytes ({self.min_bytes})")
        if self.min_bytes < 1:
            raise SettingsError("collectives.min_bytes: must be >= 1")
        if not isinstance(self.step_factor, int) or self.step_factor < 2:
            raise SettingsError(f"collectives.step_factor: an integer >= 2, got {self.step_factor!r}")
        self.dtype = _DTYPE_ALIASES.get(str(self.dtype).lower(), str(self.dtype).lower())
        if self.dtype not in _DTYPES:
            raise SettingsError(f"collectives.dtype: {self.dtype!r} is not one of {', '.join(_DTYPES)}")
        for key in ("warmup_iters", "iters"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < (1 if key == "iters" else 0):
                raise SettingsError(f"collectives.{key}: expected an integer >= {1 if key == 'iters' else 0}, got {v!r}")
        for key in ("timeout_s", "grace_s", "startup_timeout_s"):
            v = getattr(self, key)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
                raise SettingsError(f"collectives.{key}: expected seconds > 0, got {v!r}")
        if self.backend not in ("auto", "nccl", "gloo"):
            raise SettingsError(f"collectives.backend: {self.backend!r} is not auto, nccl or gloo")
        if not (0 < float(self.pass_fraction) <= 1.5):
            raise SettingsError(f"collectives.pass_fraction: expected a fraction like 0.8, got {self.pass_fraction!r}")
        if self.scope not in ("auto", *SCOPES):
            raise SettingsError(f"collectives.scope: {self.scope!r} is not auto, intra_node or inter_node")
        if not (self.out_of_place or self.in_place):
            raise SettingsError("collectives: out_of_place and in_place are both false; nothing would run")
        self.expected_busbw = _check_expected(self.expected_busbw)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None) -> "CollectivesSettings":
        """Build from a TOML table; unknown keys are errors that name the key."""
        data = dict(data or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SettingsError(f"collectives.{unknown[0]}: unknown key (known: {', '.join(sorted(known))})")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def sizes(self) -> list[int]:
        out, s = [], int(self.min_bytes)
        while s <= int(self.max_bytes):
            out.append(s)
            s *= self.step_factor
        return out

    def modes(self, op: str) -> list[str]:
        want = {"out_of_place": self.out_of_place, "in_place": self.in_place}
        return [m for m in OP_MODES[op] if want[m]]


def _check_expected(exp: Any) -> dict[str, dict[str, float]]:
    if not isinstance(exp, Mapping):
        raise SettingsError("collectives.expected_busbw: expected a table of scopes (intra_node, inter_node)")
    out: dict[str, dict[str, float]] = {}
    for scope, table in exp.items():
        if scope not in SCOPES:
            raise SettingsError(f"collectives.expected_busbw.{scope}: scope must be intra_node or inter_node")
        if not isinstance(table, Mapping):
            raise SettingsError(f"collectives.expected_busbw.{scope}: expected a table op = GB/s")
        out[scope] = {}
        for op, v in table.items():
            try:
                name = canonical_op(op)
            except ValueError:
                raise SettingsError(f"collectives.expected_busbw.{scope}.{op}: unknown collective") from None
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise SettingsError(f"collectives.expected_busbw.{scope}.{op}: expected GB/s >= 0, got {v!r}")
            out[scope][name] = float(v)
    return out


def coerce_settings(settings: CollectivesSettings | Mapping[str, Any] | None) -> CollectivesSettings:
    if isinstance(settings, CollectivesSettings):
        return settings
    if settings is not None and not isinstance(settings, Mapping) and hasattr(settings, "model_dump"):
        settings = settings.model_dump()  # a pydantic profile section
    return CollectivesSettings.from_mapping(settings)


# --------------------------------------------------------------------------- result structure


@dataclass
class SweepRow:
    op: str
    mode: str  # out_of_place | in_place
    size_bytes: int
    count: int
    dtype: str
    nranks: int
    time_us: float | None  # mean per iteration (nccl-tests' figure: total / iters, max over ranks)
    algbw_gbps: float | None
    busbw_gbps: float | None
    wrong: int | None  # mismatched elements summed over ranks; None: not checked
    iters: int | None = None
    times_us: list[float] | None = None  # per-iteration, max over ranks
    p50_us: float | None = None
    p90_us: float | None = None
    p99_us: float | None = None
    min_us: float | None = None
    max_us: float | None = None
    max_error: float | None = None  # only from older nccl-tests output


@dataclass
class OpOutcome:
    op: str
    status: str = "not_run"  # ok | skip | error | not_run
    reason: str = ""
    modes: list[str] = field(default_factory=list)
    out_of_bounds: int | None = None  # nccl-tests footer, when imported
    avg_busbw_gbps: float | None = None  # nccl-tests footer, when imported


@dataclass
class RankState:
    """What the launcher knows of one rank after the run: exit, last step, error, heartbeat."""

    rank: int
    pid: int | None = None
    host: str | None = None
    returncode: int | None = None  # None: still running when the harness killed it
    killed_by_harness: bool = False
    heartbeat_age_s: float | None = None
    step: dict[str, Any] | None = None  # last sweep point the rank entered
    error: str | None = None  # first line of the rank's exception, if it wrote one


@dataclass
class Fault:
    kind: str  # died | hung | error | timeout | startup
    ranks: list[int]
    message: str
    ranks_state: list[RankState] = field(default_factory=list)
    elapsed_s: float | None = None


@dataclass
class CollectivesResult:
    source: str = "day0"  # day0 | nccl-tests
    backend: str = ""
    world_size: int = 0
    hosts: list[str] = field(default_factory=list)  # per rank
    dtype: str = ""
    ops: dict[str, OpOutcome] = field(default_factory=dict)
    rows: list[SweepRow] = field(default_factory=list)
    fault: Fault | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    started_at: str = ""
    duration_s: float | None = None
    versions: dict[str, str] = field(default_factory=dict)
    nccl_logs: list[str] = field(default_factory=list)
    complete: bool = False
    schema: str = RESULT_SCHEMA

    @property
    def nnodes(self) -> int:
        return max(1, len(set(self.hosts))) if self.hosts else 1

    def rows_for(self, op: str) -> list[SweepRow]:
        return [r for r in self.rows if r.op == op]

    def to_dict(self) -> dict[str, Any]:
        return jsonable(asdict(self))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CollectivesResult":
        d = dict(data)
        d["ops"] = {k: OpOutcome(**v) for k, v in (d.get("ops") or {}).items()}
        d["rows"] = [SweepRow(**r) for r in d.get("rows") or []]
        f = d.get("fault")
        if f:
            f = dict(f)
            f["ranks_state"] = [RankState(**s) for s in f.get("ranks_state") or []]
            d["fault"] = Fault(**f)
        known = {x.name for x in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    def write(self, path: Path) -> Path:
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)
        return path


def nccl_log_text(result: CollectivesResult) -> str:
    """The NCCL_DEBUG output the ranks wrote (for :func:`day0.stages.collectives.nccl_logs.transport_checks`)."""
    parts = []
    for p in result.nccl_logs:
        try:
            parts.append(Path(p).read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
    return "\n".join(parts)


def load_result(path: Path) -> CollectivesResult:
    path = Path(path)
    if path.is_dir():
        path = path / RESULT_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no collectives result (rank 0 writes it)") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if data.get("schema") != RESULT_SCHEMA:
        raise ValueError(f"{path}: schema {data.get('schema')!r} is not {RESULT_SCHEMA}")
    return CollectivesResult.from_dict(data)


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (nccl-tests' per-iteration report uses the same rank rule)."""
    n = len(sorted_values)
    if n == 0:
        return None
    idx = min(n - 1, max(0, math.ceil(n * q / 100.0) - 1))
    return float(sorted_values[idx])


# --------------------------------------------------------------------------- exact data


@dataclass(frozen=True)
class ExactPattern:
    """Input values whose sums over any subset of ranks are exact in the dtype.

    value(rank, g) = (7 g mod m) + h(rank), h(rank) = (13 rank mod k) + 1, with
    n (m - 1 + k) <= the largest exact integer of the dtype. The sum over ranks has the closed
    form n (7 g mod m) + sum h, so checking an 8 GiB buffer costs one pass, not n.
    With more ranks than exact integers (bfloat16 beyond 256 ranks) only the first ``cap``
    ranks contribute (ones), the rest send zeros: still exact, less able to spot a lost rank.
    """

    m: int
    k: int
    nranks: int
    cap: int

    @classmethod
    def for_dtype(cls, dtype: str, nranks: int, *, reduce: bool = True) -> "ExactPattern":
        """``reduce=False`` for data that is only moved (gathers, broadcast, send/recv): each value
        alone must be exact, so the whole range of the dtype is used and every rank differs."""
        limit = _DTYPES[dtype][2]
        cap = max(1, min(nranks, limit)) if reduce else max(1, nranks)
        budget = max(1, limit // cap) if reduce else limit
        m = max(1, min(251, budget // 2))
        k = max(1, min(127, budget - (m - 1)))
        return cls(m, k, nranks, cap)

    def h(self, rank: int) -> int:
        return (13 * rank) % self.k + 1 if rank < self.cap else 0

    @property
    def h_sum(self) -> int:
        return sum(self.h(r) for r in range(self.nranks))

    def values(self, torch: Any, rank: int, start: int, count: int, dtype: Any, device: Any) -> Any:
        idx = torch.arange(start, start + count, device=device, dtype=torch.int64)
        return ((idx * 7) % self.m + self.h(rank)).to(dtype)

    def sums(self, torch: Any, start: int, count: int, dtype: Any, device: Any) -> Any:
        idx = torch.arange(start, start + count, device=device, dtype=torch.int64)
        return ((idx * 7) % self.m * self.nranks + self.h_sum).to(dtype)


# --------------------------------------------------------------------------- per-rank sweep


_UNSUPPORTED = re.compile(r"not supported|does not support|unsupported|not implemented|no support", re.IGNORECASE)
_CHECK_CHUNK = 1 << 24


@dataclass
class RankEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> "RankEnv | None":
        """torchrun sets RANK/WORLD_SIZE/LOCAL_RANK; Slurm's srun sets SLURM_PROCID/NTASKS/LOCALID."""
        env = os.environ if environ is None else environ
        if "RANK" in env and "WORLD_SIZE" in env:
            r, w = int(env["RANK"]), int(env["WORLD_SIZE"])
            lr = int(env.get("LOCAL_RANK", r))
            lw = int(env.get("LOCAL_WORLD_SIZE", w))
            return cls(r, w, lr, lw)
        if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
            r, w = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
            lr = int(env.get("SLURM_LOCALID", 0))
            lw = int(env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0] or 1)
            return cls(r, w, lr, lw)
        return None


class _Progress:
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
        self.hb_path.touch()
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
        data = {"rank": self.rank, "pid": os.getpid(), "host": socket.gethostname(), "seq": self.seq,
                "t": time.time(), **info}
        tmp = self.step_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, self.step_path)

    def error(self, exc: BaseException) -> None:
        text = f"{type(exc).__name__}: {exc}".strip()
        self.err_path.write_text(text + "\n\n" + "".join(traceback.format_exception(exc)), encoding="utf-8")

    def stop(self) -> None:
        self._stop.set()


def _resolve_backend(settings: CollectivesSettings, torch: Any, local_world_size: int) -> str:
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

    def __init__(self, settings: CollectivesSettings, env: RankEnv, out_dir: Path, progress: _Progress) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        self.s, self.env, self.out_dir, self.progress = settings, env, Path(out_dir), progress
        self.rank, self.n = env.rank, env.world_size
        self.backend = _resolve_backend(settings, torch, env.local_world_size)
        self.device = torch.device("cuda", env.local_rank) if self.backend == "nccl" else torch.device("cpu")
        self.tdtype = getattr(torch, _DTYPES[settings.dtype][0])
        self.elem = _DTYPES[settings.dtype][1]
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
            p50_us=percentile(srt, 50), p90_us=percentile(srt, 90), p99_us=percentile(srt, 99),
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


def run_rank(settings: CollectivesSettings, env: RankEnv, out_dir: Path) -> int:
    """The per-rank main: sweep every op, rank 0 writes the result JSON. Returns an exit code."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    progress = _Progress(out_dir, env.rank)
    progress.step(phase="import")
    result: CollectivesResult | None = None
    current: str | None = None
    try:
        import torch
        import torch.distributed as dist

        backend = _resolve_backend(settings, torch, env.local_world_size)
        if backend == "nccl":
            if settings.nccl_debug:
                os.environ.setdefault("NCCL_DEBUG", "INFO")
                os.environ.setdefault("NCCL_DEBUG_SUBSYS", "INIT,GRAPH,ENV")
                os.environ.setdefault("NCCL_DEBUG_FILE", str(out_dir / "nccl-debug.%h.%p.log"))
            torch.cuda.set_device(env.local_rank)
        progress.step(phase="rendezvous")
        kwargs: dict[str, Any] = {}
        if backend == "nccl":
            kwargs["device_id"] = torch.device("cuda", env.local_rank)
        dist.init_process_group(
            backend=backend, rank=env.rank, world_size=env.world_size,
            timeout=_dt.timedelta(seconds=float(settings.timeout_s)), **kwargs,
        )
        sw = _Sweeper(settings, env, out_dir, progress)
        hosts: list[Any] = [None] * env.world_size
        dist.all_gather_object(hosts, socket.gethostname())
        started = time.perf_counter()
        result = CollectivesResult(
            source="day0", backend=backend, world_size=env.world_size, hosts=[str(h) for h in hosts],
            dtype=settings.dtype, settings=settings.to_dict(),
            started_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            versions=_versions(torch), ops={op: OpOutcome(op) for op in settings.ops},
        )
        for op in settings.ops:
            current = op
            outcome = result.ops[op]
            modes = settings.modes(op)
            if op == "sendrecv" and env.world_size < 2:
                outcome.status, outcome.reason = "skip", "send/recv along the ring needs at least 2 ranks"
                continue
            if not modes:
                outcome.status, outcome.reason = "skip", f"{op} has only {'/'.join(OP_MODES[op])}, which the settings turned off"
                continue
            skipped: list[str] = []
            for mode in modes:
                progress.step(phase="probe", op=op, mode=mode)
                why = sw.probe(op, mode)
                if why:
                    skipped.append(why)
                    continue
                outcome.modes.append(mode)
                for size in settings.sizes():
                    progress.step(phase="sweep", op=op, mode=mode, size=size)
                    row = sw.measure(op, mode, size)
                    if row is not None:
                        result.rows.append(row)
            if outcome.modes:
                outcome.status = "ok"
                outcome.reason = "; ".join(skipped)
            else:
                outcome.status, outcome.reason = "skip", "; ".join(skipped)
            if env.rank == 0:
                result.duration_s = time.perf_counter() - started
                result.write(out_dir / RESULT_FILE)  # after every op: a later fault loses nothing measured
        current = None
        progress.step(phase="finish")
        dist.barrier()
        result.duration_s = time.perf_counter() - started
        result.complete = True
        if env.rank == 0:
            result.nccl_logs = sorted(str(p) for p in out_dir.glob("nccl-debug.*.log"))
            result.write(out_dir / RESULT_FILE)
        dist.destroy_process_group()
        progress.step(phase="done")
        progress.stop()
        return 0
    except BaseException as exc:  # noqa: BLE001 - every failure must be reported, then the process ends
        progress.error(exc)
        if result is not None and env.rank == 0:
            if current is not None:
                result.ops[current].status = "error"
                first = str(exc).splitlines()[0] if str(exc) else ""
                result.ops[current].reason = clean_error(f"{type(exc).__name__}: {first}")[:300]
            try:
                result.write(out_dir / RESULT_FILE)
            except OSError:
                pass
        progress.stop()
        sys.stderr.write(f"day0.stages.collectives rank {env.rank}: {type(exc).__name__}: {exc}\n")
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


# --------------------------------------------------------------------------- local launcher


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


_PEER_ERROR = re.compile(
    r"closed by peer|reset by peer|connection reset|broken pipe|timed out|timeout|watchdog|aborted|"
    r"connection refused|EOF|peer|remote process exited|socket", re.IGNORECASE,
)


def clean_error(text: str) -> str:
    """Drop build paths like "[/__w/pytorch/.../pair.cc:537]" and boilerplate from backend errors."""
    text = re.sub(r"\[/[^\]]*\.(?:cc|cpp|h|hpp|cu):\d+\]\s*", "", text)
    text = re.sub(r"\s*This is typically caused by.*$", "", text)
    return text.strip()


def diagnose(states: list[RankState], timeout_s: float) -> Fault | None:
    """Name the rank(s) that caused a failed run; peers that only saw the failure are victims.

    Order of blame: a rank killed by a signal the harness did not send; a rank that exited
    non-zero without a report or with an error that is not about its peers; a rank whose
    heartbeat stopped (frozen); a rank still running after its peers gave up; else all ranks
    that timed out.
    """
    if all(s.returncode == 0 for s in states):
        return None

    def where(s: RankState) -> str:
        st = s.step or {}
        if st.get("phase") == "sweep":
            return f" during {st.get('op')} {st.get('mode')} {human_bytes(int(st.get('size', 0)))}"
        if st.get("phase"):
            return f" during {st.get('phase')}" + (f" of {st['op']}" if st.get("op") else "")
        return ""

    died = [s for s in states if s.returncode is not None and s.returncode < 0 and not s.killed_by_harness
            and not (s.error and _PEER_ERROR.search(s.error))]
    silent = [s for s in states if s.returncode is not None and s.returncode > 0 and not s.error]
    own_err = [s for s in states if s.returncode is not None and s.returncode > 0 and s.error
               and not _PEER_ERROR.search(s.error)]
    frozen = [s for s in states if (s.returncode is None or s.killed_by_harness) and s.heartbeat_age_s is not None
              and s.heartbeat_age_s > min(timeout_s, 10.0)]
    # Alive = still running when the harness stopped the run (the harness then killed it).
    alive = [s for s in states if s.returncode is None or s.killed_by_harness]
    failed = [s for s in states if s.returncode not in (None, 0) and not s.killed_by_harness]

    def names(xs: Iterable[RankState]) -> str:
        return ",".join(str(s.rank) for s in xs)

    def victims(culprits: list[RankState]) -> str:
        rest = [s for s in failed + alive if s not in culprits]
        if not rest:
            return ""
        err = next((s.error for s in rest if s.error), "")
        return f"; ranks {names(rest)} failed after it" + (f" ({err[:160]})" if err else "")

    if died:
        d = died[0]
        sig = _signame(-d.returncode)
        msg = f"rank {d.rank} died ({sig}){where(d)}" + victims(died)
        return Fault("died", [s.rank for s in died], msg, states)
    if silent:
        d = silent[0]
        msg = f"rank {d.rank} exited with code {d.returncode} without reporting an error{where(d)}" + victims(silent)
        return Fault("died", [s.rank for s in silent], msg, states)
    if own_err:
        d = own_err[0]
        msg = f"rank {d.rank} failed{where(d)}: {d.error[:200]}" + victims(own_err)
        return Fault("error", [s.rank for s in own_err], msg, states)
    if frozen:
        d = frozen[0]
        msg = f"rank {d.rank} hung{where(d)}: no heartbeat for {d.heartbeat_age_s:.0f} s" + victims(frozen)
        return Fault("hung", [s.rank for s in frozen], msg, states)
    if alive and failed:
        d = alive[0]
        msg = f"rank {d.rank} hung{where(d)}: still running after its peers timed out" + victims(alive)
        return Fault("hung", [s.rank for s in alive], msg, states)
    if alive:
        msg = f"ranks {names(alive)} made no progress within the run's time limit" + (where(alive[0]))
        return Fault("timeout", [s.rank for s in alive], msg, states)
    d = failed[0]
    msg = f"ranks {names(failed)} failed{where(d)}: {(d.error or '')[:200]}"
    return Fault("timeout" if d.error and "time" in d.error.lower() else "error", [s.rank for s in failed], msg, states)


def _signame(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


class _Rank:
    """One local rank as the harness sees it: a pid the zygote reported and an exit file it writes."""

    def __init__(self, rank: int, ranks_dir: Path) -> None:
        self.rank = rank
        self.dir = ranks_dir
        self.pid: int | None = None
        self.rc: int | None = None
        self.killed_by_harness = False

    def _read_pid(self) -> int | None:
        if self.pid is None:
            try:
                self.pid = int((self.dir / f"rank{self.rank}.pid").read_text())
            except (OSError, ValueError):
                return None
        return self.pid

    def poll(self, launcher_rc: int | None = None) -> int | None:
        """The rank's exit status (-signal or code), or None while it runs."""
        if self.rc is not None:
            return self.rc
        try:
            self.rc = int((self.dir / f"rank{self.rank}.exit").read_text())
            return self.rc
        except (OSError, ValueError):
            pass
        pid = self._read_pid()
        if pid is None:
            # Never forked: the launcher died first (its exit code says why), else still starting.
            if launcher_rc is not None:
                self.rc = launcher_rc if launcher_rc != 0 else 1
            return self.rc
        try:
            os.kill(pid, 0)
            return None  # running (or a zombie the launcher is about to reap and record)
        except ProcessLookupError:
            if launcher_rc is None:
                return None  # exited: the launcher is writing its exit file
            self.rc = 1  # the launcher is gone and the exit status with it
            return self.rc
        except PermissionError:  # pragma: no cover - pid reused by another user's process
            return None

    def kill_group(self) -> None:
        """SIGKILL the rank's process group (each rank is a session leader)."""
        pid = self._read_pid()
        if pid is None:
            return
        if self.poll() is None:
            self.killed_by_harness = True
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _zygote_main(n: int, settings_path: Path, out_dir: Path) -> int:
    """Import torch once, fork the n ranks (each in its own session), reap them, record exit codes.

    Importing torch costs seconds of CPU per process; forking after the import (as torch's own
    DataLoader workers do) pays it once. CUDA is never touched here, so NCCL ranks may init it.
    """
    import torch  # noqa: F401 - the point: imported before fork
    import torch.distributed  # noqa: F401

    settings = CollectivesSettings.from_mapping(json.loads(Path(settings_path).read_text(encoding="utf-8")))
    ranks_dir = Path(out_dir) / RANKS_DIR
    children: dict[int, int] = {}
    for r in range(n):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the rank
            code = 1
            try:
                os.setsid()
                fd = os.open(ranks_dir / f"rank{r}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                os.close(fd)
                os.environ.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n), GROUP_RANK="0")
                code = run_rank(settings, RankEnv(r, n, r, n), Path(out_dir))
            except BaseException:  # noqa: BLE001
                traceback.print_exc()
            finally:
                os._exit(code)
        children[pid] = r
        _atomic_write(ranks_dir / f"rank{r}.pid", str(pid))
    while children:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        r = children.pop(pid, None)
        if r is None:
            continue
        rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        _atomic_write(ranks_dir / f"rank{r}.exit", str(rc))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip torch's interpreter teardown (seconds on a busy box); nothing is left to flush


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def run_local(
    settings: CollectivesSettings | Mapping[str, Any] | None,
    world_size: int | None = None,
    out_dir: Path | str = "reports/collectives",
    *,
    env: Mapping[str, str] | None = None,
    poll_s: float = 0.05,
) -> CollectivesResult:
    """Start ``world_size`` ranks on this host (gloo on CPU, one rank per GPU with NCCL), wait, judge.

    A launcher process imports torch once and forks the ranks, each in its own session/process
    group with torchrun's environment variables; whatever happens, every rank's group and the
    launcher are SIGKILLed before this returns, so no process outlives the call.
    """
    s = coerce_settings(settings)
    n = int(world_size or s.world_size or 2)
    if n < 1:
        raise SettingsError(f"collectives.world_size: must be >= 1, got {n}")
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    ranks_dir = out / RANKS_DIR
    ranks_dir.mkdir(exist_ok=True)
    for stale in [out / RESULT_FILE, *ranks_dir.glob("rank*"), *ranks_dir.glob("launcher*"), *out.glob("nccl-debug.*.log")]:
        stale.unlink(missing_ok=True)
    (out / SETTINGS_FILE).write_text(json.dumps(s.to_dict(), indent=1), encoding="utf-8")
    port = s.master_port or free_port(s.master_addr)
    repo_root = str(Path(__file__).resolve().parents[3])  # day0/stages/collectives/ -> the folder holding day0
    e = dict(os.environ if env is None else env)
    e["PYTHONPATH"] = repo_root + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e.setdefault("OMP_NUM_THREADS", "1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        e.pop(k, None)
    e.update(MASTER_ADDR=s.master_addr, MASTER_PORT=str(port))
    ranks = [_Rank(r, ranks_dir) for r in range(n)]
    t_start = time.monotonic()
    fault: Fault | None = None
    with (ranks_dir / "launcher.log").open("wb") as log:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "day0.stages.collectives", "_launch", str(n), str(out / SETTINGS_FILE), str(out)],
            env=e, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, cwd=repo_root,
        )
        _atomic_write(ranks_dir / "launcher.pid", str(launcher.pid))
        try:
            fault = _watch(ranks, launcher, s, out, t_start, poll_s)
        finally:
            _kill_all(ranks, launcher)
    elapsed = time.monotonic() - t_start
    try:
        result = load_result(out)
    except (FileNotFoundError, ValueError):
        result = CollectivesResult(source="day0", world_size=n, dtype=s.dtype, settings=s.to_dict(),
                                   ops={op: OpOutcome(op) for op in s.ops})
    if fault is not None:
        fault.elapsed_s = elapsed
        result.fault = fault
        result.complete = False
        for o in result.ops.values():
            if o.status == "not_run":
                o.reason = o.reason or "not reached: " + fault.message
    result.nccl_logs = sorted(str(p) for p in out.glob("nccl-debug.*.log"))
    result.write(out / RESULT_FILE)
    return result


def _rank_states(ranks: list[_Rank], out: Path, launcher_rc: int | None) -> list[RankState]:
    now = time.time()
    states = []
    rd = out / RANKS_DIR
    for c in ranks:
        step = None
        try:
            step = json.loads((rd / f"rank{c.rank}.step.json").read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            pass
        err = None
        try:
            err = clean_error((rd / f"rank{c.rank}.error.txt").read_text(encoding="utf-8").splitlines()[0])
        except (OSError, IndexError):
            err = _log_hint(rd / f"rank{c.rank}.log")
        try:
            hb = now - (rd / f"rank{c.rank}.heartbeat").stat().st_mtime
        except OSError:
            hb = None
        states.append(RankState(
            rank=c.rank, pid=c.pid, host=(step or {}).get("host"), returncode=c.poll(launcher_rc),
            killed_by_harness=c.killed_by_harness, heartbeat_age_s=hb, step=step, error=err,
        ))
    return states


_TIMEOUT_LINE = re.compile(r"Watchdog caught collective operation timeout|timed out|Timeout|NCCL communicator was aborted", re.I)


def _log_hint(path: Path) -> str | None:
    """A rank that died without writing its error (NCCL's watchdog aborts the process on a
    collective timeout) still logged why: the timeout line marks it as a victim, not a culprit."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 65536))
            tail = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        if _TIMEOUT_LINE.search(line):
            return clean_error(line.strip())[:300]
    return None


def _started(st: RankState) -> bool:
    return bool(st.step) and st.step.get("phase") not in ("import", "rendezvous")


def _watch(ranks: list[_Rank], launcher: subprocess.Popen, s: CollectivesSettings, out: Path, t_start: float,
           poll_s: float) -> Fault | None:
    """Wait for the ranks; on the first failure give the rest ``grace_s``, then kill and diagnose."""
    first_fail: float | None = None
    hb_limit = float(s.timeout_s) + float(s.grace_s)
    started = False
    while True:
        lrc = launcher.poll()
        codes = [c.poll(lrc) for c in ranks]
        now = time.monotonic()
        if all(code == 0 for code in codes):
            return None
        if first_fail is None and any(code not in (None, 0) for code in codes):
            first_fail = now
        if first_fail is not None and (now - first_fail >= s.grace_s or all(code is not None for code in codes)):
            break
        if first_fail is None:
            states = _rank_states(ranks, out, lrc)
            started = started or all(_started(st) for st in states)
            if not started and now - t_start > s.startup_timeout_s:
                where = ", ".join(f"{st.rank}:{(st.step or {}).get('phase', 'not started')}" for st in states)
                _kill_all(ranks, launcher)
                states = _rank_states(ranks, out, launcher.poll())
                return Fault("startup", [st.rank for st in states if not _started(st)],
                             f"ranks did not all start within startup_timeout_s={s.startup_timeout_s:g} s ({where})",
                             states)
            if any(st.returncode is None and st.heartbeat_age_s is not None and st.heartbeat_age_s > hb_limit
                   for st in states):
                break  # a frozen rank (SIGSTOP, a stuck driver call): its heartbeat thread stopped too
        time.sleep(poll_s)
    before = _rank_states(ranks, out, launcher.poll())
    _kill_all(ranks, launcher)
    states = _rank_states(ranks, out, launcher.poll())
    for st, b in zip(states, before):  # the heartbeat age seen before the kill is the evidence
        st.heartbeat_age_s = b.heartbeat_age_s
    if all(st.pid is None for st in states):
        tail = _tail(out / RANKS_DIR / "launcher.log")
        return Fault("startup", [st.rank for st in states], f"the local launcher failed before starting ranks: {tail}", states)
    return diagnose(states, float(s.timeout_s))


def _tail(path: Path, n: int = 300) -> str:
    try:
        lines = [ln for ln in path.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no launcher log)"
    return (lines[-1] if lines else "(empty launcher log)")[:n]


def _kill_all(ranks: list[_Rank], launcher: subprocess.Popen) -> None:
    """SIGKILL every rank group, let the launcher reap and record them, then kill the launcher."""
    for c in ranks:
        c.kill_group()
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and launcher.poll() is None:
        if all(c.poll() is not None for c in ranks):
            break
        time.sleep(0.02)
    try:
        os.killpg(launcher.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        launcher.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
        pass
    for c in ranks:  # a rank whose exit was never recorded: its group may still hold helpers
        c.poll(launcher.returncode)
        if c.pid is not None:
            try:
                os.killpg(c.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


# --------------------------------------------------------------------------- checks


@dataclass
class BusbwExpectations:
    expected: dict[str, dict[str, float]] = field(default_factory=dict)  # scope -> op -> GB/s
    pass_fraction: float = 0.8
    scope: str = "auto"
    large_message_bytes: int | None = None

    @classmethod
    def coerce(cls, x: Any) -> "BusbwExpectations":
        if isinstance(x, cls):
            return x
        if x is None:
            return cls()
        if isinstance(x, CollectivesSettings) or (isinstance(x, Mapping) and ("expected_busbw" in x or "pass_fraction" in x)) or hasattr(x, "model_dump"):
            s = coerce_settings(x)
            return cls(s.expected_busbw, float(s.pass_fraction), s.scope, s.large_message_bytes)  # type: ignore[arg-type]
        if isinstance(x, Mapping):  # a bare {scope: {op: GB/s}} table
            return cls(_check_expected(x))
        raise TypeError(f"cannot read busbw expectations from {type(x).__name__}")


def result_checks(result: CollectivesResult, expectations: Any = None) -> list["Check"]:
    """Checks for a sweep (measured here or imported): ranks healthy, then per op correct + busbw."""
    from day0.core.record import Check

    exp = BusbwExpectations.coerce(expectations)
    scope = exp.scope if exp.scope != "auto" else ("inter_node" if result.nnodes > 1 else "intra_node")
    src = "nccl-tests" if result.source == "nccl-tests" else f"torch.distributed/{result.backend or '?'}"
    checks: list[Check] = []
    ranks_ev = {"world_size": result.world_size, "hosts": sorted(set(result.hosts)), "backend": result.backend}
    if result.fault is None:
        checks.append(Check(
            id="collectives.ranks", title="Every rank completed the sweep", status="pass",
            value=0, limit=0, direction="exact",
            message=f"{result.world_size} ranks on {result.nnodes} node(s) completed ({result.backend or result.source})",
            evidence=ranks_ev, source=src,
        ))
    else:
        f = result.fault
        ranks_ev["table"] = {
            "columns": ["rank", "pid", "host", "exit", "killed by harness", "heartbeat age (s)", "last step", "error"],
            "rows": [[st.rank, st.pid, st.host, st.returncode, st.killed_by_harness,
                      None if st.heartbeat_age_s is None else round(st.heartbeat_age_s, 1),
                      _step_str(st.step), st.error] for st in f.ranks_state],
        }
        ranks_ev["fault"] = {"kind": f.kind, "ranks": f.ranks, "elapsed_s": f.elapsed_s}
        checks.append(Check(
            id="collectives.ranks", title="Every rank completed the sweep", status="fail",
            value=len(f.ranks), limit=0, direction="exact", message=f.message, evidence=ranks_ev, source=src,
        ))
    for op, outcome in result.ops.items():
        checks.extend(_op_checks(result, op, outcome, exp, scope, src))
    return checks


def _step_str(step: Mapping[str, Any] | None) -> str:
    if not step:
        return ""
    if step.get("phase") == "sweep":
        return f"{step.get('op')} {step.get('mode')} {human_bytes(int(step.get('size', 0)))}"
    return str(step.get("phase", "")) + (f" {step['op']}" if step.get("op") else "")


def _op_checks(result: CollectivesResult, op: str, outcome: OpOutcome, exp: BusbwExpectations, scope: str, src: str) -> list["Check"]:
    from day0.core.record import Check, measured

    cid_c, cid_b = f"collectives.{op}.correct", f"collectives.{op}.busbw"
    t_c, t_b = f"{op}: exact results", f"{op}: bus bandwidth at large messages"
    rows = result.rows_for(op)
    table = _rows_table(rows)
    expected = exp.expected.get(scope, {}).get(op)
    limit = None if expected is None else round(expected * exp.pass_fraction, 6)
    if outcome.status == "skip":
        msg = f"skipped: {outcome.reason}" if outcome.reason else "skipped"
        return [Check(id=cid_c, title=t_c, status="skip", message=msg, source=src),
                Check(id=cid_b, title=t_b, status="skip", limit=limit, unit="GB/s", direction="higher_is_better", message=msg, source=src)]
    if outcome.status in ("error", "not_run") or not rows:
        # The fault names the culprit; a rank's own exception usually only names the symptom.
        why = result.fault.message if result.fault else (outcome.reason or "no rows measured")
        msg = f"{op} did not complete: {why}"
        ev = {"table": table} if rows else {}
        return [Check(id=cid_c, title=t_c, status="error", message=msg, evidence=ev, source=src),
                Check(id=cid_b, title=t_b, status="error", limit=limit, unit="GB/s", direction="higher_is_better",
                      message=msg, evidence=dict(ev), source=src)]

    # -- correctness
    known = [r for r in rows if r.wrong is not None]
    if known:
        wrong = sum(int(r.wrong or 0) for r in known)
        bad = [r for r in known if r.wrong]
        if bad:
            detail = ", ".join(f"{human_bytes(r.size_bytes)} {r.mode}: {r.wrong}" for r in bad[:6])
            msg = f"{wrong} wrong elements in {op} ({detail}); results must be exact, suspect the fabric or NCCL/driver versions"
        else:
            msg = f"all {len(known)} sweep points exact (#wrong 0 at every size and mode)"
        correct = measured(cid_c, t_c, wrong, 0, unit="elements", direction="exact", message=msg,
                           evidence={"table": {"columns": ["size", "mode", "count", "#wrong"],
                                               "rows": [[r.size_bytes, r.mode, r.count, r.wrong] for r in rows]}},
                           source=src)
    elif outcome.out_of_bounds is not None:
        msg = (f"nccl-tests reported {outcome.out_of_bounds} out-of-bounds values" if outcome.out_of_bounds
               else "nccl-tests reported 0 out-of-bounds values (older max-error layout)")
        correct = measured(cid_c, t_c, outcome.out_of_bounds, 0, unit="elements", direction="exact", message=msg,
                           evidence={"table": {"columns": ["size", "mode", "max error"],
                                               "rows": [[r.size_bytes, r.mode, r.max_error] for r in rows]}}, source=src)
    else:
        correct = Check(id=cid_c, title=t_c, status="skip", unit="elements",
                        message="correctness was not checked (nccl-tests -c 0 or check = false); rerun with validation",
                        source=src)

    # -- bandwidth at large messages
    big = exp.large_message_bytes
    cand = [r for r in rows if r.busbw_gbps is not None and (big is None or r.size_bytes >= big)]
    if big is None and cand:
        top = max(r.size_bytes for r in cand)
        cand = [r for r in cand if r.size_bytes == top]
    if not cand:
        bw = Check(id=cid_b, title=t_b, status="error", limit=limit, unit="GB/s", direction="higher_is_better",
                   message=f"no busbw measured for {op} at sizes >= {big}", evidence={"table": table}, source=src)
        return [correct, bw]
    best = max(cand, key=lambda r: r.busbw_gbps or 0.0)
    value = round(float(best.busbw_gbps or 0.0), 4)
    series: dict[str, tuple[list, list]] = {}
    for r in rows:
        if r.busbw_gbps is not None:
            xs, ys = series.setdefault(r.mode, ([], []))
            xs.append(r.size_bytes)
            ys.append(r.busbw_gbps)
    reference = []
    if expected is not None:
        reference = [{"y": expected, "label": f"expected {expected:g} GB/s ({scope})"},
                     {"y": limit, "label": f"pass line {exp.pass_fraction:g} x expected"}]
    evidence: dict[str, Any] = {
        "table": table,
        "charts": [{"kind": "line", "title": f"{op} busbw vs message size ({result.world_size} ranks, {src})",
                    "x_label": "message size S (bytes)", "y_label": "busbw (GB/s)", "x_log": True,
                    "series": [{"name": m, "x": xs, "y": ys} for m, (xs, ys) in series.items()],
                    "reference": reference}],
        "scope": scope, "expected_gbps": expected, "pass_fraction": exp.pass_fraction,
        "size_bytes": best.size_bytes, "mode": best.mode, "nranks": best.nranks,
        "bus_factor": bus_factor(op, best.nranks) if best.nranks else None,
    }
    if best.times_us:
        evidence["samples"] = [busbw_gbps(op, best.size_bytes, t / 1e6, best.nranks) for t in best.times_us if t > 0]
    if expected is None:
        msg = (f"{value:g} GB/s at {human_bytes(best.size_bytes)} ({best.mode}); no expected busbw for {op} at "
               f"{scope} scope, recorded only")
    else:
        verdict = "meets" if value >= (limit or 0) else "misses"
        msg = (f"{value:g} GB/s at {human_bytes(best.size_bytes)} ({best.mode}) {verdict} {exp.pass_fraction:g} x "
               f"expected {expected:g} GB/s = {limit:g} GB/s ({scope})")
    bw = measured(cid_b, t_b, value, limit, unit="GB/s", direction="higher_is_better", message=msg,
                  evidence=evidence, source=src, performance=True)
    return [correct, bw]


def _rows_table(rows: list[SweepRow]) -> dict[str, Any]:
    def r3(x: float | None) -> float | None:
        return None if x is None else round(float(x), 3)

    return {
        "columns": ["size (B)", "count", "type", "mode", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "#wrong",
                    "p50 (us)", "p99 (us)"],
        "rows": [[r.size_bytes, r.count, r.dtype, r.mode, r3(r.time_us), r3(r.algbw_gbps), r3(r.busbw_gbps), r.wrong,
                  r3(r.p50_us), r3(r.p99_us)] for r in rows],
    }


def expected_busbw_preset(*names: str) -> dict[str, dict[str, float]]:
    """Merge named presets of :data:`EXPECTED_BUSBW_PRESETS` (later names win per op)."""
    out: dict[str, dict[str, float]] = {}
    for name in names:
        if name not in EXPECTED_BUSBW_PRESETS:
            raise KeyError(f"no busbw preset {name!r} (known: {', '.join(EXPECTED_BUSBW_PRESETS)})")
        for scope, table in EXPECTED_BUSBW_PRESETS[name].items():
            out.setdefault(scope, {}).update(table)
    return out


# --------------------------------------------------------------------------- nccl-tests import


def import_nccl_tests(path: Path | str, *, op: str | None = None) -> CollectivesResult:
    """Turn a site's nccl-tests output (text or -J JSON; several programs concatenated) into a result."""
    from day0.stages.collectives.nccl_logs import read_nccl_tests

    path = Path(path)
    runs = read_nccl_tests(path, op=op)
    result = CollectivesResult(source="nccl-tests", backend="nccl", complete=True,
                               settings={"imported_from": str(path)})
    errors: list[str] = []
    for run in runs:
        n = run.world_size or 0
        outcome = result.ops.setdefault(run.op, OpOutcome(run.op))
        outcome.status = "ok" if run.rows else "error"
        outcome.reason = "" if run.rows else "no result rows"
        outcome.out_of_bounds = run.out_of_bounds if run.validated else None
        outcome.avg_busbw_gbps = run.avg_busbw_gbps
        for row in run.rows:
            if row.mode not in outcome.modes:
                outcome.modes.append(row.mode)
            pi = row.per_iter or {}
            result.rows.append(SweepRow(
                op=run.op, mode=row.mode, size_bytes=row.size_bytes, count=row.count, dtype=row.dtype, nranks=n,
                time_us=row.time_us, algbw_gbps=row.algbw_gbps, busbw_gbps=row.busbw_gbps, wrong=row.wrong,
                p50_us=pi.get("p50_us"), p99_us=pi.get("p99_us", pi.get("i_p99")),
                min_us=pi.get("min_us", pi.get("i_min")), max_us=pi.get("max_us", pi.get("i_max")),
                max_error=row.max_error,
            ))
        if run.world_size and not result.world_size:
            result.world_size = run.world_size
        if run.hosts and not result.hosts:
            result.hosts = run.hosts
        if run.rows and not result.dtype:
            result.dtype = run.rows[0].dtype
        errors.extend(f"{run.program or run.op}: {e}" for e in run.errors)
        if run.errors:
            outcome.status, outcome.reason = "error", run.errors[0][:300]
    if errors:
        result.fault = Fault("error", [], f"nccl-tests reported errors: {errors[0][:300]}")
        result.complete = False
    return result


# --------------------------------------------------------------------------- CLI


def format_table(result: CollectivesResult) -> str:
    """The sweep as an nccl-tests-like table, for terminals and logs."""
    lines = [f"# collectives: {result.world_size} ranks, {result.nnodes} node(s), backend {result.backend}, "
             f"dtype {result.dtype}, source {result.source}",
             f"# {'op':>14} {'mode':>12} {'size(B)':>12} {'count':>12} {'time(us)':>10} {'algbw':>8} {'busbw':>8} "
             f"{'#wrong':>7} {'p50(us)':>9} {'p99(us)':>9}"]

    def f(x: float | None, w: int, p: int = 2) -> str:
        return f"{'N/A':>{w}}" if x is None else f"{x:>{w}.{p}f}"

    for r in result.rows:
        lines.append(f"  {r.op:>14} {r.mode:>12} {r.size_bytes:>12} {r.count:>12} {f(r.time_us, 10)} "
                     f"{f(r.algbw_gbps, 8)} {f(r.busbw_gbps, 8)} {('N/A' if r.wrong is None else r.wrong):>7} "
                     f"{f(r.p50_us, 9)} {f(r.p99_us, 9)}")
    for op, o in result.ops.items():
        if o.status != "ok":
            lines.append(f"# {op}: {o.status}{': ' + o.reason if o.reason else ''}")
    if result.fault:
        lines.append(f"# FAULT ({result.fault.kind}): {result.fault.message}")
    if result.duration_s is not None:
        lines.append(f"# sweep time {result.duration_s:.1f} s")
    return "\n".join(lines)


def _load_settings_file(path: Path) -> dict[str, Any]:
    text = Path(path).read_text(encoding="utf-8")
    if Path(path).suffix == ".json":
        data = json.loads(text)
    else:
        import tomllib

        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"{path}: not valid TOML ({exc})") from None
    if isinstance(data, dict) and isinstance(data.get("collectives"), dict):
        data = data["collectives"]  # a whole profile: take its [collectives] table
    return data


def _parse_set(items: Sequence[str]) -> dict[str, Any]:
    import tomllib

    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep:
            raise SettingsError(f"--set {item!r}: expected KEY=VALUE")
        try:
            out[key.strip()] = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            out[key.strip()] = raw  # a bare word: keep it as a string
    return out


def _settings_from_args(args: argparse.Namespace) -> CollectivesSettings:
    data: dict[str, Any] = _load_settings_file(Path(args.settings)) if args.settings else {}
    data.update(_parse_set(args.set or []))
    return CollectivesSettings.from_mapping(data)


def _cmd_run(args: argparse.Namespace) -> int:
    try:
        settings = _settings_from_args(args)
    except (SettingsError, OSError, ValueError) as exc:
        print(f"day0 collectives: {exc}", file=sys.stderr)
        return 2
    out_dir = Path(args.out_dir)
    rank_env = RankEnv.from_environ()
    if args.worker or (rank_env is not None and not args.local_ranks):
        if rank_env is None:
            print("day0 collectives run --worker: no RANK/WORLD_SIZE (torchrun) or SLURM_PROCID/SLURM_NTASKS (srun) "
                  "in the environment", file=sys.stderr)
            return 2
        os.environ.setdefault("MASTER_ADDR", settings.master_addr)
        if "MASTER_PORT" not in os.environ:
            if settings.master_port:
                os.environ["MASTER_PORT"] = str(settings.master_port)
            else:
                print("day0 collectives run: MASTER_PORT is not set (torchrun sets it; with srun export it)", file=sys.stderr)
                return 2
        return run_rank(settings, rank_env, out_dir)
    result = run_local(settings, args.local_ranks or settings.world_size or 2, out_dir)
    print(format_table(result))
    checks = result_checks(result, settings)
    for c in checks:
        print(f"{c.status.upper():5} {c.id}: {c.message}")
    print(f"# result: {out_dir / RESULT_FILE}")
    return 1 if any(c.status in ("fail", "error") for c in checks) else 0


def _cmd_import(args: argparse.Namespace) -> int:
    from day0.stages.collectives.nccl_logs import NcclParseError

    try:
        result = import_nccl_tests(Path(args.path), op=args.op)
        settings = _settings_from_args(args) if (args.settings or args.set) else None
    except (NcclParseError, SettingsError, OSError, ValueError) as exc:
        print(f"day0 collectives import: {exc}", file=sys.stderr)
        return 2
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        result.write(Path(args.out))
    print(format_table(result))
    checks = result_checks(result, settings)
    for c in checks:
        print(f"{c.status.upper():5} {c.id}: {c.message}")
    return 1 if any(c.status in ("fail", "error") for c in checks) else 0


def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``collectives run|import`` on an argparse subparsers object; each sets ``func``."""
    p = subparsers.add_parser("collectives", help="collective benchmark (exact check, busbw) and nccl-tests import")
    sub = p.add_subparsers(dest="collectives_cmd", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--settings", help="TOML/JSON file: a [collectives] table, or a whole profile")
        sp.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one setting (TOML value)")

    run = sub.add_parser("run", help="run the sweep: local ranks, or one rank under torchrun/srun")
    common(run)
    run.add_argument("--out-dir", default="reports/collectives", help="where rank 0 writes collectives.json")
    run.add_argument("--local-ranks", type=int, default=None, help="spawn N ranks on this host (default: settings.world_size or 2)")
    run.add_argument("--worker", action="store_true", help="be one rank (what torchrun/srun start); read RANK etc. from env")
    run.set_defaults(func=_cmd_run)
    imp = sub.add_parser("import", help="read nccl-tests output (text or -J JSON) and apply the same checks")
    common(imp)
    imp.add_argument("path")
    imp.add_argument("--op", help="collective name when the output does not say (e.g. all_reduce)")
    imp.add_argument("--out", help="write the converted result JSON here")
    imp.set_defaults(func=_cmd_import)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv_l = list(sys.argv[1:] if argv is None else argv)
    if argv_l[:1] == ["_launch"]:  # run_local's launcher: _launch N SETTINGS OUT_DIR
        return _zygote_main(int(argv_l[1]), Path(argv_l[2]), Path(argv_l[3]))
    parser = argparse.ArgumentParser(prog="python -m day0.stages.collectives")
    sub = parser.add_subparsers(dest="cmd", required=True)
    add_cli(sub)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("run", "import"):
        argv = ["collectives", *argv]
    args = parser.parse_args(argv)
    return int(args.func(args))

