"""The collective ops day0 knows: one :class:`OpSpec` per op, held in one registry, :data:`OPS`.

A spec holds everything that makes one op differ from another: its name and the other spellings
seen in the field, the nccl-tests program that measures it, its busbw factor, how its buffer of
S bytes is laid out, the modes torch offers, whether it takes uneven splits, how one rank calls
it, and the exact result every rank's output must equal (the oracle). The sweep, the sweep on a
node's subgroup, the checks, the busbw formulas, the nccl-tests importers, the profile's
validation and the device check all read the registry; none of them names an op.

**Adding an op** is one :class:`OpSpec` in :data:`OPS` (below) plus its tests: the sweep runs
it, the exact check and busbw pick it up, the profile accepts its name, the importers read its
nccl-tests program. A test registers one for a while with ``with OPS.registered(spec): ...``.

``build`` and ``expect`` are written against :class:`OpContext`, what the sweep hands them (the
buffers, the exact data of :mod:`day0.stages.collectives.exact`, ``torch.distributed`` or one
bound to a subgroup, and for an op with ``uneven_splits`` the split sizes the expert routing of
:mod:`day0.stages.collectives.routing` gives), so this module imports neither torch nor the stage:
the profile checks op names against it before any rank starts.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

MODES = ("out_of_place", "in_place")
_NAME = re.compile(r"[a-z][a-z0-9_]*")

#: ``m[i][j]``: elements rank i sends rank j (an uneven all-to-all's split sizes, every rank's).
Traffic = tuple[tuple[int, ...], ...]


class UnknownCollective(ValueError):
    """An op name no spec answers to; the message names it and lists the known ones."""


class OpContext(Protocol):
    """What the sweep hands a spec's ``build`` and ``expect`` for one point on one rank.

    Ranks are the group's (0..n-1). Name a peer to ``dist`` by keyword (``src=``, ``dst=``,
    ``peer=``): a subgroup's ``dist`` reads those as ranks of its group.
    """

    dist: Any  # torch.distributed, or one bound to a subgroup
    rank: int
    n: int
    root: int  # the settings' root, modulo n
    elements: int  # E: elements in the larger buffer (S / element size)
    chunk: int  # c: elements of one rank's share for split ops, else E
    traffic: Traffic | None  # uneven_splits ops: the routing's split sizes in dispatch's direction; else None

    def zeros(self, count: int) -> Any:
        """A zeroed tensor of ``count`` elements in the sweep's dtype, on the rank's device."""

    def moved(self, rank: int, start: int, count: int) -> Any:
        """``rank``'s data that is only copied: each value exact, every rank's different."""

    def summed(self, rank: int, start: int, count: int) -> Any:
        """``rank``'s data that is reduced: its sums over any ranks, in any order, are exact."""

    def sums(self, start: int, count: int) -> Any:
        """The exact sum over all ranks of ``summed(., start, count)`` (a closed form: one pass)."""

    def blocks(self, start: int, count: int, block: Callable[[int, int, int], Any],
               sizes: Sequence[int] | None = None) -> Any:
        """Elements [start, start+count) of a buffer of n blocks of ``chunk`` elements (of ``sizes[j]``
        elements where given: an uneven all-to-all's), where ``block(j, offset, length)`` gives part of
        block j; an empty block is never asked for."""


@dataclass(frozen=True)
class OpCall:
    """One sweep point on one rank, as a spec's ``build`` makes it."""

    fill: Callable[[], None]  # write this rank's input and clear its output (before timing, and before the check)
    run: Callable[[], None]  # one call of the collective
    inp: Any  # the send buffer (the same tensor as ``out`` for in-place ops)
    out: Any  # what the oracle checks; None where the op leaves this rank no defined output
    idempotent: bool = True  # rerunning leaves ``out`` as it is (else the check refills and runs once more)


@dataclass(frozen=True)
class BusFactor:
    """busbw / algbw on n ranks, as nccl-tests corrects it (doc/PERFORMANCE.md): ``scale`` x
    (n-1)/n when ``ring`` (each rank's data crosses n-1 of the n links), else ``scale``."""

    scale: float = 1.0
    ring: bool = False

    def __call__(self, nranks: int) -> float:
        if nranks < 1:
            raise ValueError(f"nranks must be >= 1, got {nranks}")
        n = float(nranks)
        return self.scale * (n - 1.0) / n if self.ring else float(self.scale)

    def __str__(self) -> str:
        """As docs/metrics.md writes it: ``2(n-1)/n``, ``(n-1)/n``, ``1``."""
        if not self.ring:
            return f"{self.scale:g}"
        return ("" if self.scale == 1 else f"{self.scale:g}") + "(n-1)/n"


Build = Callable[[OpContext, str], OpCall]
Oracle = Callable[[OpContext, int, int], Any]


@dataclass(frozen=True)
class OpSpec:
    """One collective op. Only ``name`` and ``bus`` are required; an op without ``build`` and
    ``expect`` is known to the importers (nccl-tests measured it elsewhere) but never swept here."""

    name: str  # the canonical name: check ids (collectives.<name>.correct), settings, result rows
    bus: BusFactor  # busbw = algbw x bus(n)
    nccl_tests: str | None = None  # nccl-tests' program (all_reduce_perf); None where it has none
    aliases: tuple[str, ...] = ()  # other spellings, read everywhere (--op, the profile, programs, file names)
    loose_aliases: tuple[str, ...] = ()  # read where a person names the op, never picked out of a file name
    split: bool = False  # S is n equal chunks, one per rank (count = per-rank elements, as nccl-tests)
    uneven_splits: bool = False  # the sweep draws per-rank split sizes from the expert routing
    #                              ([collectives.expert_routing]) and hands them over as ctx.traffic; S is
    #                              each rank's tokens x top_k rows, busbw the busiest rank's bytes (docs/metrics.md)
    modes: tuple[str, ...] = ()  # what torch offers, in the order they run
    min_ranks: int = 1  # fewer ranks: the op is skipped, saying why
    label: str = ""  # how a message names the op (default: name)
    build: Build | None = None  # buffers, fill and call for one point on one rank
    expect: Oracle | None = None  # (ctx, start, length) -> what out[start:start+length] must equal, exactly

    def __post_init__(self) -> None:
        for word in (self.name, *self.aliases, *self.loose_aliases):
            if not _NAME.fullmatch(word):
                raise ValueError(f"collective {self.name!r}: {word!r} is not a lower-case name")
        if (self.build is None) != (self.expect is None):
            raise ValueError(f"collective {self.name!r}: build and expect come together (an op swept is an op checked)")
        if self.runnable and not self.modes:
            raise ValueError(f"collective {self.name!r}: a swept op needs modes (out_of_place, in_place)")
        if bad := [m for m in self.modes if m not in MODES]:
            raise ValueError(f"collective {self.name!r}: mode {bad[0]!r} is not one of {', '.join(MODES)}")
        if self.split and self.uneven_splits:
            raise ValueError(f"collective {self.name!r}: split (n equal chunks) and uneven_splits exclude each other")
        if self.nccl_tests is not None and not self.nccl_tests.endswith("_perf"):
            raise ValueError(f"collective {self.name!r}: nccl-tests programs end in _perf, not {self.nccl_tests!r}")

    @property
    def runnable(self) -> bool:
        """Swept by day0's ranks (else only read from nccl-tests output)."""
        return self.build is not None

    @property
    def words(self) -> tuple[str, ...]:
        """The spellings a file name may carry: the name, the aliases, the nccl-tests program's stem."""
        stem = (self.nccl_tests or "")[: -len("_perf")]
        return tuple(dict.fromkeys(w for w in (self.name, *self.aliases, stem) if w))


class OpRegistry(Mapping[str, OpSpec]):
    """Canonical name -> spec, in the order the ops run; every other spelling resolves through it."""

    def __init__(self, specs: Iterable[OpSpec] = ()) -> None:
        self._specs: dict[str, OpSpec] = {}
        self._spellings: dict[str, str] = {}
        self._programs: dict[str, str] = {}
        self._file_words: re.Pattern[str] | None = None
        for spec in specs:
            self.register(spec)

    def __getitem__(self, name: str) -> OpSpec:
        return self._specs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def runnable(self) -> tuple[str, ...]:
        """The ops day0's ranks sweep, in order (the profile's default ``ops``)."""
        return tuple(name for name, spec in self._specs.items() if spec.runnable)

    # ------------------------------------------------------------------ registering

    def register(self, spec: OpSpec, *, replace: bool = False) -> OpSpec:
        """Add ``spec``; a name, spelling or program another spec holds is refused (``replace``:
        the spec of the same name gives way, keeping its place in the order)."""
        if spec.name in self._specs and not replace:
            raise ValueError(f"collective {spec.name!r} is registered already")
        self._install({**self._specs, spec.name: spec})
        return spec

    def unregister(self, name: str) -> OpSpec:
        spec = self._specs[name]
        self._install({k: v for k, v in self._specs.items() if k != name})
        return spec

    @contextmanager
    def registered(self, spec: OpSpec, *, replace: bool = False) -> Iterator[OpSpec]:
        """``spec`` registered inside the block; after it, the registry as it was before."""
        old = self._specs.get(spec.name)
        self.register(spec, replace=replace)
        try:
            yield spec
        finally:
            if old is None:
                self.unregister(spec.name)
            else:
                self.register(old, replace=True)

    def _install(self, specs: dict[str, OpSpec]) -> None:
        """Index every alias and program name; a spelling two ops claim is refused before anything changes."""
        spellings: dict[str, str] = {}
        programs: dict[str, str] = {}
        for spec in specs.values():
            for word in (*spec.aliases, *spec.loose_aliases):
                owner = word if word in specs else spellings.setdefault(word, spec.name)
                if owner != spec.name:
                    raise ValueError(f"collective {spec.name!r}: {word!r} names {owner!r} already")
            if spec.nccl_tests is not None:
                owner = programs.setdefault(spec.nccl_tests, spec.name)
                if owner != spec.name:
                    raise ValueError(f"collective {spec.name!r}: nccl-tests' {spec.nccl_tests} is {owner!r}'s already")
        self._specs, self._spellings, self._programs, self._file_words = specs, spellings, programs, None

    # ------------------------------------------------------------------ reading names

    def resolve(self, name: str) -> OpSpec:
        """The spec for a spelling seen in the field (allreduce, alltoall, all_reduce_perf, AllGather,
        reduce-scatter); :class:`UnknownCollective` names it and lists the known ops."""
        key = name.strip().lower().replace("-", "_")
        if key in self._programs:
            return self._specs[self._programs[key]]
        if key.endswith("_perf"):
            key = key[: -len("_perf")]
        key = self._spellings.get(key, self._spellings.get(key.replace("_", ""), key))
        if key not in self._specs:
            raise UnknownCollective(f"unknown collective {name!r} (known: {', '.join(self._specs)})")
        return self._specs[key]

    def file_name_words(self) -> re.Pattern[str]:
        """The spellings a file name may use, each word whole ("preduce", "reducer" name nothing),
        underscores optional, longest first so "all_reduce" is never read as "reduce"."""
        if self._file_words is None:
            words = sorted({w for spec in self._specs.values() for w in spec.words}, key=lambda w: (-len(w), w))
            alternatives = dict.fromkeys("_?".join(re.escape(p) for p in w.split("_")) for w in words)
            self._file_words = re.compile(rf"(?<![a-z])({'|'.join(alternatives)})(?![a-z])")
        return self._file_words


# --------------------------------------------------------------------------- the ops day0 sweeps
# Each op: a build (buffers, fill, call) and an oracle. The data is ExactPattern's: ``summed`` for
# what is reduced (every partial sum exact), ``moved`` for what is only copied.


def _all_reduce(x: OpContext, mode: str) -> OpCall:
    buf = x.zeros(x.elements)
    return OpCall(lambda: buf.copy_(x.summed(x.rank, 0, x.elements)), lambda: x.dist.all_reduce(buf), buf, buf,
                  idempotent=False)


def _all_gather(x: OpContext, mode: str) -> OpCall:
    r, c = x.rank, x.chunk
    out = x.zeros(x.n * c)
    inp = out[r * c:(r + 1) * c] if mode == "in_place" else x.zeros(c)
    gather = getattr(x.dist, "all_gather_single", None) or x.dist.all_gather_into_tensor

    def fill() -> None:
        out.zero_()
        inp.copy_(x.moved(r, r * c, c))

    return OpCall(fill, lambda: gather(out, inp), inp, out)


def _reduce_scatter(x: OpContext, mode: str) -> OpCall:
    r, c = x.rank, x.chunk
    inp = x.zeros(x.n * c)
    out = inp[r * c:(r + 1) * c] if mode == "in_place" else x.zeros(c)
    scatter = getattr(x.dist, "reduce_scatter_single", None) or x.dist.reduce_scatter_tensor

    def fill() -> None:
        inp.copy_(x.summed(r, 0, x.n * c))
        if mode != "in_place":
            out.zero_()

    return OpCall(fill, lambda: scatter(out, inp), inp, out, idempotent=mode != "in_place")


def _all_to_all(x: OpContext, mode: str) -> OpCall:
    inp, out = x.zeros(x.n * x.chunk), x.zeros(x.n * x.chunk)

    def fill() -> None:
        inp.copy_(x.moved(x.rank, 0, x.n * x.chunk))
        out.zero_()

    return OpCall(fill, lambda: x.dist.all_to_all_single(out, inp), inp, out)


def transpose(m: Traffic) -> Traffic:
    """Combine's split sizes from dispatch's: what rank j received from rank i, it sends back to i."""
    return tuple(zip(*m)) if m else ()


def _routed(x: OpContext, op: str, back: bool) -> Traffic:
    """The point's split sizes, turned round for the way back (combine)."""
    if x.traffic is None:
        raise ValueError(f"{op} takes its split sizes from the expert routing; this context carries none")
    return transpose(x.traffic) if back else x.traffic


def _uneven_all_to_all(x: OpContext, m: Traffic) -> OpCall:
    """all_to_all_single with ``m[rank]`` out and ``m[.][rank]`` in: this rank's input holds one block
    per destination, in rank order, each element the sender's own value for its place (``moved``), so
    a block from the wrong sender, or shifted within the sender's buffer, shows in the check."""
    send, recv = list(m[x.rank]), [row[x.rank] for row in m]
    inp, out = x.zeros(sum(send)), x.zeros(sum(recv))
    dist = x.dist

    def fill() -> None:
        inp.copy_(x.moved(x.rank, 0, sum(send)))
        out.zero_()

    def run() -> None:
        dist.all_to_all_single(out, inp, output_split_sizes=recv, input_split_sizes=send)

    return OpCall(fill, run, inp, out)


def _uneven_oracle(x: OpContext, m: Traffic, start: int, count: int) -> Any:
    """Block i of this rank's output is sender i's block for this rank: its elements from where that
    block starts in i's input (the sum of what i sends the ranks before this one)."""
    begins = [sum(row[:x.rank]) for row in m]
    return x.blocks(start, count, lambda i, off, k: x.moved(i, begins[i] + off, k), sizes=[row[x.rank] for row in m])


def _expert_dispatch(x: OpContext, mode: str) -> OpCall:
    return _uneven_all_to_all(x, _routed(x, "expert_dispatch", back=False))


def _expert_combine(x: OpContext, mode: str) -> OpCall:
    return _uneven_all_to_all(x, _routed(x, "expert_combine", back=True))


def _broadcast(x: OpContext, mode: str) -> OpCall:
    buf = x.zeros(x.elements)

    def fill() -> None:  # receivers start from zeros: a broadcast that does nothing is caught
        if x.rank == x.root:
            buf.copy_(x.moved(x.root, 0, x.elements))
        else:
            buf.zero_()

    return OpCall(fill, lambda: x.dist.broadcast(buf, src=x.root), buf, buf)


def _sendrecv(x: OpContext, mode: str) -> OpCall:
    send, recv = x.zeros(x.elements), x.zeros(x.elements)
    dist = x.dist

    def fill() -> None:
        send.copy_(x.moved(x.rank, 0, x.elements))
        recv.zero_()

    def run() -> None:  # along the ring: to rank+1, from rank-1 (the pipeline's pattern)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, peer=(x.rank + 1) % x.n),
                                       dist.P2POp(dist.irecv, recv, peer=(x.rank - 1) % x.n)])
        for q in reqs:
            q.wait()

    return OpCall(fill, run, send, recv)


OPS = OpRegistry([
    OpSpec("all_reduce", BusFactor(2.0, ring=True), "all_reduce_perf", aliases=("allreduce",),
           modes=("in_place",),  # torch's all_reduce is in-place only
           build=_all_reduce, expect=lambda x, s, k: x.sums(s, k)),
    OpSpec("all_gather", BusFactor(1.0, ring=True), "all_gather_perf", aliases=("allgather",), split=True,
           modes=MODES, build=_all_gather,
           expect=lambda x, s, k: x.blocks(s, k, lambda j, off, m: x.moved(j, j * x.chunk + off, m))),
    OpSpec("reduce_scatter", BusFactor(1.0, ring=True), "reduce_scatter_perf", aliases=("reducescatter",),
           split=True, modes=MODES, build=_reduce_scatter,
           expect=lambda x, s, k: x.sums(x.rank * x.chunk + s, k)),
    OpSpec("all_to_all", BusFactor(1.0, ring=True), "alltoall_perf", aliases=("alltoall", "all2all"), split=True,
           modes=("out_of_place",),  # no in-place form (nccl-tests does not check one either)
           build=_all_to_all,
           expect=lambda x, s, k: x.blocks(s, k, lambda j, off, m: x.moved(j, x.rank * x.chunk + off, m))),
    # Expert parallelism's all-to-all: the split sizes of a MoE layer's routing (uneven), tokens out to
    # their experts' ranks and back; (n-1)/n is the even-split factor, the sweep's busbw the busiest rank's.
    OpSpec("expert_dispatch", BusFactor(1.0, ring=True), aliases=("ep_dispatch", "moe_dispatch"),
           uneven_splits=True, modes=("out_of_place",), label="expert-parallel dispatch (uneven all_to_all)",
           build=_expert_dispatch, expect=lambda x, s, k: _uneven_oracle(x, _routed(x, "expert_dispatch", False), s, k)),
    OpSpec("expert_combine", BusFactor(1.0, ring=True), aliases=("ep_combine", "moe_combine"),
           uneven_splits=True, modes=("out_of_place",), label="expert-parallel combine (uneven all_to_all back)",
           build=_expert_combine, expect=lambda x, s, k: _uneven_oracle(x, _routed(x, "expert_combine", True), s, k)),
    OpSpec("broadcast", BusFactor(), "broadcast_perf", aliases=("bcast",), modes=("in_place",),
           build=_broadcast, expect=lambda x, s, k: x.moved(x.root, s, k)),
    OpSpec("sendrecv", BusFactor(), "sendrecv_perf", aliases=("send_recv",), loose_aliases=("p2p",),
           modes=("out_of_place",), min_ranks=2, label="send/recv along the ring",
           build=_sendrecv, expect=lambda x, s, k: x.moved((x.rank - 1) % x.n, s, k)),
    # Only read from nccl-tests output (day0 does not sweep them):
    OpSpec("reduce", BusFactor(), "reduce_perf"),
    OpSpec("gather", BusFactor(1.0, ring=True), "gather_perf", split=True),
    OpSpec("scatter", BusFactor(1.0, ring=True), "scatter_perf", split=True),
    OpSpec("hypercube", BusFactor(), "hypercube_perf"),
])


def canonical_op(name: str) -> str:
    """The canonical name of a spelling seen in the field (allreduce, alltoall, all_reduce_perf)."""
    return OPS.resolve(name).name
