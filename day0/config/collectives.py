"""The profile's ``[collectives]`` table: the sweep's ops, sizes, dtype and modes, its bounds in
time, the busbw a topology promises, and where a sweep run elsewhere left its result.

One definition, read by the profile (``Profile.collectives``), by the collectives stage, by
``day0 collectives run|import`` and by the ranks, which get it as JSON
(:meth:`CollectivesSection.to_dict` / :meth:`CollectivesSection.from_mapping`). The names of the
dtypes live here too; the ops (names, spellings, modes) are the registry's,
:mod:`day0.core.collective_ops`, which the table is validated against. This module imports
nothing above ``day0.config``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Optional

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from day0.config.errors import SettingsError, first_error
from day0.core.collective_ops import OPS, UnknownCollective, canonical_op

SCOPES = ("intra_node", "inter_node")

DTYPES: dict[str, tuple[str, int, int]] = {
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
DTYPE_ALIASES = {"float": "float32", "fp32": "float32", "half": "float16", "fp16": "float16", "bf16": "bfloat16",
                 "double": "float64", "fp64": "float64", "int": "int32"}

_SIZE = re.compile(r"\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*", re.IGNORECASE)


def _bytes(value: Any) -> int:
    """Bytes from an int or a string with a binary suffix, as nccl-tests' -b/-e take them (1K = 1024);
    raises ValueError with the reason (no key: the caller names it)."""
    if isinstance(value, bool):
        raise ValueError(f"expected bytes (int or '64M'), got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"must be >= 0, got {value}")
        return value
    m = _SIZE.fullmatch(str(value))
    if not m:
        raise ValueError(f"cannot read {value!r} as bytes (e.g. 1024, '64K', '1G')")
    mult = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2).upper()]
    return int(m.group(1)) * mult


def parse_size(value: Any, key: str = "size") -> int:
    """Bytes from an int or a string like ``"64M"``; a SettingsError names ``collectives.<key>``."""
    try:
        return _bytes(value)
    except ValueError as exc:
        raise SettingsError(f"collectives.{key}: {exc}") from None


#: Bytes as the table takes them: an integer, or a string with a binary suffix ("4M" = 4 MiB).
Bytes = Annotated[
    int,
    BeforeValidator(_bytes),
    WithJsonSchema({"anyOf": [{"type": "integer", "minimum": 0},
                              {"type": "string", "pattern": r"^\s*\d+\s*[KMGTkmgt]?(i?[Bb])?\s*$"}]}),
]
GBps = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class ExpertRouting(BaseModel):
    """``[collectives.expert_routing]``: the MoE routing whose uneven all-to-all ``expert_dispatch`` and
    ``expert_combine`` measure (day0/stages/collectives/routing.py). Each EP rank routes ``tokens``
    tokens to ``top_k`` distinct experts of ``experts``, placed contiguously on the ranks; expert
    popularity is Zipf with exponent ``skew``. The defaults give 256 rows per rank (1 KiB of float32
    holds a row of one element) and a hot rank 0, as an unbalanced MoE layer has."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)

    tokens: int = Field(128, ge=1, le=1 << 20, description="tokens per EP rank; each sends tokens x top_k rows")
    experts: int = Field(16, ge=1, le=1 << 14, description="experts E, contiguous on the ranks (E/n each; "
                                                           "a rank past E holds none)")
    top_k: int = Field(2, ge=1, le=256, description="distinct experts per token (at most experts)")
    skew: float = Field(1.0, ge=0, le=16, description="Zipf exponent of expert popularity: 0 uniform; above 0 the "
                                                      "first experts, all on rank 0, are hot")
    seed: int = Field(0, ge=0, le=2**63 - 1, description="the draws are a function of (seed, rank): same on every rank")

    @model_validator(mode="after")
    def _together(self) -> "ExpertRouting":
        if self.top_k > self.experts:
            raise ValueError(f"top_k: {self.top_k} is more than experts ({self.experts}); a token's experts are distinct")
        return self


class CollectivesSection(BaseModel):
    """``[collectives]``: defaults suit the CPU demo (gloo, ~20 s sweep); docs/stages/collectives.md.

    ``expected_busbw`` maps a scope (``intra_node`` / ``inter_node``) to per-op GB/s; the busbw
    check passes when the large-message busbw is at least ``pass_fraction`` of it.
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    ops: list[str] = Field(list(OPS.runnable()),
                           description=f"collectives to run, a subset of {', '.join(OPS.runnable())} "
                                       "(nccl-tests spellings such as allreduce are read too)")
    min_bytes: Bytes = Field(1 << 10, ge=1, description="smallest message (nccl-tests -b); 1K = 1024")
    max_bytes: Bytes = Field(4 << 20, description="largest message (nccl-tests -e)")
    step_factor: int = Field(4, ge=2, description="size multiplier per step (nccl-tests -f)")
    dtype: str = Field("float32", description="element type (an alias such as bf16 is read as bfloat16)",
                       json_schema_extra={"enum": [*DTYPES, *DTYPE_ALIASES]})
    warmup_iters: int = Field(3, ge=0, description="untimed calls per size and mode")
    iters: int = Field(10, ge=1, description="timed calls per size and mode")
    out_of_place: bool = True
    in_place: bool = True
    check: bool = Field(True, description="exact check of every output element after timing")
    backend: Literal["auto", "nccl", "gloo"] = Field(
        "auto", description="auto: nccl when each rank has a GPU, else gloo")
    timeout_s: float = Field(60.0, gt=0, description="bound on every collective; a rank stuck longer fails the run")
    grace_s: float = Field(3.0, gt=0, description="after a rank fails, time the others get to report before the kill")
    startup_timeout_s: float = Field(120.0, gt=0, description="launching + rendezvous of all ranks")
    pass_fraction: float = Field(0.8, gt=0, le=1.5, description="busbw pass line as a fraction of expected_busbw")
    expected_busbw: dict[Literal["intra_node", "inter_node"], dict[str, GBps]] = Field(
        {}, description="GB/s per scope and op, e.g. {intra_node = {all_reduce = 370.0}}")
    scope: Literal["auto", "intra_node", "inter_node"] = Field(
        "auto", description="auto: inter_node when the ranks span several hosts")
    root: int = Field(0, ge=0, description="broadcast root")
    world_size: Optional[int] = Field(
        None, ge=1, description="ranks the local launcher starts (run_local's argument wins)")
    master_addr: str = "127.0.0.1"
    master_port: int = Field(0, ge=0, le=65535, description="0: a free port (local launcher only)")
    nccl_debug: bool = Field(True, description="NCCL_DEBUG=INFO into per-rank files, for the transport checks")
    large_message_bytes: Optional[Bytes] = Field(
        None, description="the busbw check uses sizes >= this (default: the largest)")
    expert_routing: ExpertRouting = Field(
        default_factory=ExpertRouting, description="expert_dispatch / expert_combine: tokens per rank, experts, "
                                                   "top_k and skew of the routing their uneven splits come from")
    links_bytes: Bytes = Field(4 << 20, ge=4, description="message of the node-to-node link test (collectives.links)")
    links_time_s: float = Field(2.0, gt=0, description="time per directed link over all rounds: repeats stop after it (one timed "
                                                       "transfer after a warm-up at least)")
    links_rounds: int = Field(3, ge=1, le=20, description="rounds over all the links; a link's figure is the median "
                                                          "over rounds of each round's fastest repeat")
    expected_link_gbps: Optional[GBps] = Field(
        None, description="GB/s every directed node-to-node link should carry (default: expected_busbw.inter_node."
                          "sendrecv); a link fails below pass_fraction x this or half the median link")
    # Read by the suite, not by the ranks:
    results_file: Optional[str] = Field(
        None, description="collectives.json written by torchrun/srun ranks (or `day0 collectives import`): "
                          "judged instead of spawning local ranks")
    tp_equivalence: bool = Field(False, description="start a TP=2 engine and compare its greedy tokens with TP=1")

    @field_validator("ops", mode="before")
    @classmethod
    def _ops(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(o, str) for o in value):
            return value  # the type check names it
        try:
            ops = [canonical_op(o) for o in value]
        except UnknownCollective as exc:
            raise ValueError(str(exc)) from None
        bad = [o for o in ops if not OPS[o].runnable]
        if bad:
            raise ValueError(f"{bad[0]!r} is only importable from nccl-tests, not run here")
        return ops

    @field_validator("dtype", mode="before")
    @classmethod
    def _dtype(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        name = DTYPE_ALIASES.get(value.lower(), value.lower())
        if name not in DTYPES:
            raise ValueError(f"{value!r} is not one of {', '.join(DTYPES)}")
        return name

    @field_validator("expected_busbw", mode="before")
    @classmethod
    def _expected(cls, value: Any) -> Any:
        """Scopes and op names checked under the names the profile used, ops made canonical."""
        if not isinstance(value, Mapping):
            raise ValueError("expected a table of scopes (intra_node, inter_node)")
        out: dict[Any, Any] = {}
        for scope, table in value.items():
            if scope not in SCOPES:
                raise ValueError(f"{scope}: scope must be intra_node or inter_node")
            if not isinstance(table, Mapping):
                raise ValueError(f"{scope}: expected a table op = GB/s")
            out[scope] = {}
            for op, gbps in table.items():
                try:
                    name = canonical_op(str(op))
                except UnknownCollective:
                    raise ValueError(f"{scope}.{op}: unknown collective") from None
                if isinstance(gbps, bool) or not isinstance(gbps, (int, float)) or not 0 <= gbps < math.inf:
                    raise ValueError(f"{scope}.{op}: expected GB/s >= 0, got {gbps!r}")
                out[scope][name] = gbps
        return out

    @model_validator(mode="after")
    def _together(self) -> "CollectivesSection":
        if self.max_bytes < self.min_bytes:
            raise ValueError(f"max_bytes: {self.max_bytes} is below min_bytes ({self.min_bytes})")
        if not (self.out_of_place or self.in_place):
            raise ValueError("out_of_place and in_place are both false; nothing would run")
        return self

    # ----------------------------------------------------------------------- reading and writing

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None) -> "CollectivesSection":
        """From a TOML table or the JSON the ranks read; a SettingsError names the key in one line."""
        try:
            return cls.model_validate(dict(data or {}))
        except ValidationError as exc:
            raise SettingsError(first_error(exc, cls, "collectives")) from None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types (sizes in bytes), as :meth:`from_mapping` reads them back."""
        return self.model_dump(mode="json")

    # ----------------------------------------------------------------------- what the sweep runs

    def sizes(self) -> list[int]:
        out, s = [], self.min_bytes
        while s <= self.max_bytes:
            out.append(s)
            s *= self.step_factor
        return out

    def modes(self, op: str) -> list[str]:
        want = {"out_of_place": self.out_of_place, "in_place": self.in_place}
        return [m for m in OPS[op].modes if want[m]]


def check_expected(exp: Any) -> dict[str, dict[str, float]]:
    """An ``expected_busbw`` table normalised to {scope: {canonical op: GB/s}}; errors name the key."""
    return CollectivesSection.from_mapping({"expected_busbw": exp}).expected_busbw  # type: ignore[return-value]
