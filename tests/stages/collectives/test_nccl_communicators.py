"""A job's several NCCL communicators: a connection line's ranks are its communicator's, not the world's.

vLLM makes the world group and TP, PP (DP, EP) subgroups, each an NCCL communicator numbering its ranks
from 0, and torch and vLLM's pynccl each make their own. The logs below are written from the printf
formats of NCCL's src/init.cc (Init START/COMPLETE, the ``comm ... nRanks ... nNodes`` line, ncclCommSplit's
``parent ... color``) and transport/{p2p,net}.cc (``Channel %02d/%d : %d[%d] -> %d[%d] [send] via NET/...``),
one process's lines in the order it prints them, processes one after the other per node file.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field

import pytest

from day0.stages.collectives.nccl_debug import NcclLogError, parse_nccl_debug, parse_nccl_debug_lines, read_nccl_debug
from day0.stages.collectives.transport import TransportTopology, classify, log_checks

TOPO = {"intra_node": "nvlink", "inter_node": "infiniband", "nodes": 2, "devices_per_node": 4}


@dataclass
class Proc:
    """One rank's process: its host, pid, GPU, and every line it printed, in order."""

    host: str
    pid: int
    dev: int
    lines: list[str] = field(default_factory=list)
    comms: dict[str, tuple[str, int, int]] = field(default_factory=dict)  # name -> (pointer, rank, nranks)

    def say(self, tid: int, msg: str) -> None:
        self.lines.append(f"{self.host}:{self.pid}:{tid} [{self.dev}] NCCL INFO {msg}")


@dataclass
class Comm:
    """One communicator: its name, its members (processes, in rank order), and how it was made."""

    name: str
    members: list[Proc]
    comm_id: str | None = None  # ncclCommInitRank's commId; None: made by ncclCommSplit of ``parent``
    parent: str | None = None
    color: int = 0
    split_count: int = 1  # the parent's splits so far, this one included (2.24 on print it)


def init(comm: Comm, *, style: str = "2.27", tid_of=lambda p, c: p.pid + 16, connect=()) -> None:
    """Each member's init lines; ``connect``: (src, dst, via) set up inside init (NCCL < 2.22, eager)."""
    n, hosts = len(comm.members), [p.host for p in comm.members]
    for rank, p in enumerate(comm.members):
        ptr = f"0x{0x55d0_0000 + p.pid * 0x100 + len(p.comms) * 0x10:x}"
        p.comms[comm.name] = (ptr, rank, n)
        tid = tid_of(p, comm)
        dev = f"cudaDev {p.dev} nvmlDev {p.dev} busId {0x18000 + p.dev * 0x11000:x}"
        if comm.comm_id is not None:
            head = {"2.21": "ncclCommInitRank ", "2.27": "ncclCommInitRankConfig "}[style]
            what = f"{head}comm {ptr} rank {rank} nranks {n} {dev} commId {comm.comm_id}"
        else:
            parent = p.comms[comm.parent][0]
            what = {  # 2.21-2.22: the commId is hashed from "%016lx-%d" (parent's commHash, color), one per color
                "2.21": f"ncclCommSplit comm {ptr} rank {rank} nranks {n} {dev} parent {parent} color {comm.color} "
                        f"key {rank} commId {split_id(comm.parent, comm.color)}",
                "2.27": f"ncclCommSplit comm {ptr} rank {rank} nranks {n} {dev} parent {parent} splitCount {comm.split_count} "
                        f"color {comm.color} key {rank}",
            }[style]
        glued = comm.comm_id is None and style == "2.27"  # "key %d- Init START": NCCL >= 2.23's split omits the space
        p.say(tid, f"{what}- Init START" if glued else f"{what} - Init START")
        local = [q for q in comm.members if q.host == p.host]
        p.say(tid, f"comm {ptr} rank {rank} nRanks {n} nNodes {len(set(hosts))} localRanks {len(local)} "
                   f"localRank {local.index(p)} MNNVL 0")
        for src, dst, via in connect:
            if rank in (src, dst):
                line(comm, src, dst, via, tid=tid, only=p)
        p.say(tid, f"{what} - Init COMPLETE")


def split_id(parent: str, color: int) -> str:
    """What NCCL 2.21-2.22 print as a split's commId: hashUniqueId of "%016lx-%d" (parent commHash, color)."""
    return "0x" + hashlib.sha256(f"{parent}-{color}".encode()).hexdigest()[:16]


def line(comm: Comm, src: int, dst: int, via: str, *, tid: int | None = None, only: Proc | None = None) -> None:
    """One connection as NCCL prints it: P2P/SHM by the sender, NET by both ends ([send], [receive])."""
    a, b = comm.members[src], comm.members[dst]
    text = f"Channel 00/0 : {src}[{a.dev}] -> {dst}[{b.dev}]"
    sides = [(a, f"{text} [send] via {via}"), (b, f"{text} [receive] via {via}")] if via.startswith("NET/") \
        else [(a, f"{text} via {via}")]
    for p, msg in sides:
        if only is None or p is only:
            p.say(tid if tid is not None else p.pid + 100, msg)


def ring(comm: Comm, intra: str = "P2P/CUMEM/read", inter: str = "NET/IB/0/GDRDMA") -> None:
    """The communicator's ring, connected at its first collective (NCCL >= 2.22: runtime connect)."""
    n = len(comm.members)
    for r in range(n if n > 2 else n - 1):
        nxt = (r + 1) % n
        same = comm.members[r].host == comm.members[nxt].host
        line(comm, r, nxt, intra if same else inter)
        if n == 2:
            line(comm, nxt, r, intra if same else inter)


def vllm_job(hosts: tuple[str, str], gpus: int = 4, inter: str = "NET/IB/0/GDRDMA") -> list[Proc]:
    """2 nodes: the world (8), TP groups of ``gpus`` (one per node), PP groups of 2 (across the nodes),
    each made twice, as torch's device group and vLLM's pynccl communicator (the same ranks)."""
    procs = [Proc(hosts[r // gpus], 41000 + r, r % gpus) for r in range(2 * gpus)]
    for p in procs:
        p.say(p.pid, "NCCL version 2.27.7+cuda12.9")
    comms = []
    for maker in ("torch", "pynccl"):
        comms += [Comm(f"{maker}-world", procs, f"0x7d3f2a1c5e6b4a9{len(maker)}")]
        comms += [Comm(f"{maker}-tp", procs[n * gpus:(n + 1) * gpus], f"0x{len(maker)}1{n:x}") for n in range(2)]
        comms += [Comm(f"{maker}-pp", [procs[d], procs[gpus + d]], f"0x{len(maker)}2{d:x}") for d in range(gpus)]
    for c in comms:  # every process inits every group it is in, in the same order
        init(c)
    for c in comms:
        ring(c, inter=inter)
    return procs


def text_of(procs: list[Proc]) -> str:
    return "".join(ln + "\n" for p in procs for ln in p.lines)


def node_files(tmp_path, procs: list[Proc]) -> list:
    """One NCCL_DEBUG_FILE per node, named by its host, listed sorted as a shell glob lists them."""
    paths = []
    for host in dict.fromkeys(p.host for p in procs):
        path = tmp_path / f"nccl-debug.{host}.log"
        path.write_text(text_of([p for p in procs if p.host == host]))
        paths.append(path)
    return sorted(paths)


HOSTS = [("gpu-a", "gpu-b"), ("zulu", "alpha")]  # node 0's name sorts first, then last


@pytest.mark.parametrize("hosts", HOSTS)
def test_subgroup_ranks_are_placed_by_their_communicator_not_by_the_world(tmp_path, hosts):
    """The PP group's 0 -> 1 over IB joins node 0 and node 1; read as world ranks 0 and 1 it was
    intra-node, and a healthy cluster failed its NVLink promise (whichever node's file came first)."""
    procs = vllm_job(hosts)
    log = read_nccl_debug(node_files(tmp_path, procs))
    checks = {c.id: c for c in log_checks(log, TOPO)}
    intra, inter = checks["collectives.transport.intra_node"], checks["collectives.transport.inter_node"]
    assert (intra.status, inter.status) == ("pass", "pass"), (intra.message, inter.message)
    groups = classify(log, TransportTopology.coerce(TOPO))
    assert not groups["unknown"]
    assert all(c.transport == "P2P" for c in groups["intra_node"])
    assert all(c.transport == "NET" for c in groups["inter_node"])
    pp = [c for c in log.connections if c.transport == "NET" and {c.src, c.dst} == {0, 1}]
    # 4 PP groups x 2 directions x (send, receive), each line printed for torch's and pynccl's communicator
    assert len(pp) == 16 and {c.count for c in pp} == {2}
    for c in pp:
        ends = log.ends(c)
        assert set(ends[:2]) == set(hosts) and ends.why == "", (c.line, ends)
    summary = {(c["nranks"], tuple(c["hosts"])) for c in log.to_dict()["communicators"]}
    assert summary == {(8, tuple(sorted(hosts))), (4, (hosts[0],)), (4, (hosts[1],)), (2, tuple(sorted(hosts)))}


@pytest.mark.parametrize("hosts", HOSTS)
def test_a_node_on_sockets_is_found_and_named_whatever_the_file_order(tmp_path, hosts):
    procs = vllm_job(hosts, inter="NET/Socket/0")
    checks = {c.id: c for c in log_checks(read_nccl_debug(node_files(tmp_path, procs)), TOPO)}
    inter = checks["collectives.transport.inter_node"]
    assert checks["collectives.transport.intra_node"].status == "pass"
    assert inter.status == "fail" and "NET/Socket/0 where the topology promises infiniband" in inter.message
    assert {row[4] for row in inter.evidence["table"]["rows"]} == set(hosts)  # both nodes logged the sockets


def test_the_world_size_is_the_largest_communicator_whatever_printed_last():
    log = parse_nccl_debug(text_of(vllm_job(("gpu-a", "gpu-b"))))
    assert (log.nranks, log.nnodes) == (8, 2)  # the PP groups (2 ranks, 2 nodes) print their comm line last


def two_nodes_and_a_pair(*, eager: bool = False, style: str = "2.27") -> tuple[list[Proc], Comm]:
    """The world of 8 on 2 nodes, and a communicator of node A's GPU 0 and node B's GPU 1 (an expert
    group, say): A's GPU 0 is rank 0 of both, and rank 1 of both is a GPU 1, one on A, one on B."""
    procs = [Proc("gpu-a" if r < 4 else "gpu-b", 7000 + r, r % 4) for r in range(8)]
    world, pair = Comm("world", procs, "0x51"), Comm("pair", [procs[0], procs[5]], "0x52")
    init(world, style=style)
    init(pair, style=style, connect=[(0, 1, "NET/IB/0/GDRDMA")] if eager else ())
    if not eager:
        line(pair, 0, 1, "NET/IB/0/GDRDMA")
    ring(world)
    return procs, pair


def test_a_line_two_communicators_fit_is_said_to_be_unplaced_not_guessed():
    procs, _ = two_nodes_and_a_pair()
    log = parse_nccl_debug(text_of(procs))
    checks = {c.id: c for c in log_checks(log, TOPO)}
    intra, inter = checks["collectives.transport.intra_node"], checks["collectives.transport.inter_node"]
    assert (intra.status, inter.status) == ("pass", "pass"), (intra.message, inter.message)
    assert "1 connections not placed on a node, so not judged (gpu-a:7000 is rank 0 of 2" in inter.message
    [send] = [c for c in log.connections if c.side == "send" and (c.src, c.dst) == (0, 1)]
    assert inter.evidence["unknown_why"][0][1] == send.line
    ends = log.ends(send)
    assert ends.src == "gpu-a" and ends.dst is None
    assert "gpu-a:7000 is rank 0 of 2 communicators" in ends.why and "NCCL names no communicator" in ends.why
    [receive] = [c for c in log.connections if c.side == "receive" and (c.src, c.dst) == (0, 1)]
    assert log.ends(receive)[:2] == ("gpu-a", "gpu-b")  # on B the process is world rank 5: only the pair fits


def test_the_only_inter_node_line_unplaced_is_an_error_saying_why():
    procs, pair = two_nodes_and_a_pair()
    text = "".join(ln + "\n" for p in procs for ln in p.lines
                   if "[receive]" not in ln and not ("Channel" in ln and "NET/" in ln and "7000" not in ln))
    checks = {c.id: c for c in log_checks(parse_nccl_debug(text), TOPO)}
    inter = checks["collectives.transport.inter_node"]
    assert inter.status == "error" and "could not be told from the log (gpu-a:7000 is rank 0 of 2" in inter.message


def test_a_line_printed_inside_a_communicator_s_init_is_that_communicator_s():
    """Before NCCL 2.22 (and with NCCL_RUNTIME_CONNECT=0) init connects the rings on its own thread."""
    procs, _ = two_nodes_and_a_pair(eager=True, style="2.21")
    a0 = procs[0]
    after = a0.pid + 16  # the init thread, once the pair's Init COMPLETE closed it
    a0.say(after, "Channel 01/0 : 0[0] -> 1[1] [send] via NET/IB/0/GDRDMA")
    log = parse_nccl_debug(text_of(procs))
    inside, later = [c for c in log.connections if c.side == "send" and (c.src, c.dst) == (0, 1)]
    assert inside.opened is not None and log.ends(inside) == ("gpu-a", "gpu-b", "")
    assert later.opened is None and log.ends(later)[:2] == ("gpu-a", None)


def pairs_of_four_hosts(style: str) -> list[Proc]:
    """4 one-GPU hosts: the world, split in two pairs (colors 0 and 1), each pair connected both ways."""
    procs = [Proc(f"n{r}", 9000 + r, 0) for r in range(4)]
    world = Comm("world", procs, "0x61")
    pairs = [Comm("pair", procs[2 * k:2 * k + 2], parent="world", color=k) for k in range(2)]
    for c in (world, *pairs):
        init(c, style=style)
    for c in pairs:
        line(c, 0, 1, "NET/IB/0")
        line(c, 1, 0, "NET/IB/0")
    return procs


@pytest.mark.parametrize("style", ["2.21", "2.27"])
def test_a_split_is_told_by_its_parent_and_color(style):
    """A split is told by its commId (2.21-2.22: hashed from the parent's commHash and the color), or
    by its parent, split count and color (2.23 on print no commId): rank 1 of the pair split with color 1
    is n3, not n1."""
    log = parse_nccl_debug(text_of(pairs_of_four_hosts(style)))
    for c in log.connections:
        pair = {"n0", "n1"} if c.host in ("n0", "n1") else {"n2", "n3"}
        assert set(log.ends(c)[:2]) == pair, (c.line, log.ends(c))
    assert {(c["nranks"], tuple(c["hosts"])) for c in log.to_dict()["communicators"]} == {
        (4, ("n0", "n1", "n2", "n3")), (2, ("n0", "n1")), (2, ("n2", "n3"))}


def test_without_commid_a_rank_two_hosts_claim_is_reported():
    """NCCL < 2.17 prints no commId: two pairs of the same size are told apart only where no rank clashes."""
    text = "".join(
        ln + "\n" for ln in (
            f"n{r}:{9000 + r}:{9000 + r} [0] NCCL INFO {msg}" for r in range(4) for msg in (
                "NCCL version 2.9.9+cuda11.3",
                f"Channel 00 : 0[1b000] -> 1[1b000] [{'send' if r % 2 == 0 else 'receive'}] via NET/IB/0",
                f"comm 0x{0x7f00 + r:x} rank {r % 2} nranks 2 cudaDev 0 busId 1b000 - Init COMPLETE",
            )
        )
    )
    log = parse_nccl_debug(text)
    for c in log.connections:
        ends = log.ends(c)
        assert c.host in ends[:2] and None in ends[:2], ends
        assert "is claimed by processes on n" in ends.why and "a communicator of 2 ranks" in ends.why


def test_a_reused_address_is_a_new_communicator_and_the_table_is_capped(monkeypatch):
    from day0.stages.collectives import nccl_comms

    text = "\n".join([
        "h:1:2 [0] NCCL INFO ncclCommInitRank comm 0xabc0 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 18000 commId 0x11 - Init COMPLETE",
        "h:1:2 [0] NCCL INFO comm 0xabc0 rank 0 nranks 2 cudaDev 0 busId 18000 - Destroy COMPLETE",
        "h:1:2 [0] NCCL INFO ncclCommInitRank comm 0xabc0 rank 3 nranks 8 cudaDev 0 nvmlDev 0 busId 18000 commId 0x22 - Init COMPLETE",
    ])
    log = parse_nccl_debug(text)
    assert [(c.rank, c.nranks, c.comm_id) for c in log.comms.by_proc[("h", 1)]] == [(0, 2, "11"), (3, 8, "22")]
    monkeypatch.setattr(nccl_comms, "MAX_COMMS", 1)
    with pytest.raises(NcclLogError, match=r"<log>:3: more than 1 communicators"):
        parse_nccl_debug(text)


def destroy(p: Proc, name: str) -> None:
    """``ncclCommDestroy``'s line (init.cc: ``comm %p rank %d nranks %d cudaDev %d busId %lx - Destroy COMPLETE``)."""
    ptr, rank, n = p.comms.pop(name)
    p.say(p.pid + 16, f"comm {ptr} rank {rank} nranks {n} cudaDev {p.dev} busId {0x18000 + p.dev * 0x11000:x} "
                      "- Destroy COMPLETE")


@pytest.mark.parametrize("style", ["2.21", "2.27"])
def test_a_destroyed_communicator_s_address_given_to_the_next_split_is_another_communicator(style):
    """torch splits per-node groups from the world, uses and destroys them, then splits cross-node pairs:
    malloc hands the pairs the freed address. Read as one communicator, the pair's IB links were the
    per-node group's and a healthy cluster failed "intra-node 0->1 used NET/IB"."""
    procs = [Proc("gpu-a" if r < 2 else "gpu-b", 4100 + r, r % 2) for r in range(4)]
    world = Comm("world", procs, "0x5001")
    init(world, style=style)
    for k in range(2):  # per node: ranks {0, 1} and {2, 3}, colors 0 and 1
        node = Comm(f"node{k}", procs[2 * k:2 * k + 2], parent="world", color=k)
        init(node, style=style)
        line(node, 0, 1, "P2P/CUMEM/read")
        line(node, 1, 0, "P2P/CUMEM/read")
    for p in procs:
        ptr = p.comms[f"node{p.pid % 4 // 2}"][0]
        destroy(p, f"node{p.pid % 4 // 2}")
        p.comms["free"] = (ptr, 0, 0)  # the next communicator gets this address
    for d in range(2):  # cross-node pairs {0, 2} and {1, 3}, colors 0 and 1 again
        pair = Comm("pair", [procs[d], procs[2 + d]], parent="world", color=d, split_count=2)
        for p in pair.members:
            p.comms = {k: v for k, v in p.comms.items() if k != "free"} | {"free": p.comms["free"]}
        init_at_freed(pair, style)
        line(pair, 0, 1, "NET/IB/0/GDRDMA")
        line(pair, 1, 0, "NET/IB/0/GDRDMA")
    ring(world)
    log = parse_nccl_debug(text_of(procs))
    groups = classify(log, TransportTopology.coerce(dict(TOPO, devices_per_node=2)))
    assert {c.transport for c in groups["intra_node"]} == {"P2P"}
    checks = {c.id: c for c in log_checks(log, dict(TOPO, devices_per_node=2))}
    intra, inter = checks["collectives.transport.intra_node"], checks["collectives.transport.inter_node"]
    assert (intra.status, inter.status) == ("pass", "pass"), (intra.message, inter.message)
    if style == "2.27":  # 2.21-2.22 print one commId per parent and color: the pairs' share the node groups'
        assert "not placed" not in intra.message + inter.message
    assert [c.color for c in log.comms.by_proc[("gpu-a", 4100)]] == [None, 0, 0]  # three records, one address twice


def init_at_freed(comm: Comm, style: str) -> None:
    """``init`` for a communicator placed at each member's freed address (the one ``destroy`` released)."""
    text_before = {id(p): len(p.lines) for p in comm.members}
    init(comm, style=style)
    for p in comm.members:
        ptr = p.comms[comm.name][0]
        freed = p.comms.pop("free")[0]
        p.lines[text_before[id(p)]:] = [ln.replace(f"comm {ptr} ", f"comm {freed} ") for ln in p.lines[text_before[id(p)]:]]
        p.comms[comm.name] = (freed, *p.comms[comm.name][1:])


@pytest.mark.parametrize("style", ["2.19", "2.27"])
def test_one_node_whole_and_the_other_s_excerpt_are_placed_by_the_world(style):
    """Node B's file is ``grep Channel`` of it: its processes print world ranks and no init line, node A's
    processes are the world's members; each side looks the other up (it was an error, unplaced)."""
    procs = [Proc("gpu-a" if r < 4 else "gpu-b", 6100 + r, r % 4) for r in range(8)]
    world = Comm("world", procs, "0xc0ffee")
    init(world)
    ring(world)
    keep = []
    for p in procs:
        for ln in p.lines:
            if p.host == "gpu-b" and " Channel " not in ln:
                continue
            if style == "2.19" and (" nNodes " in ln or "Init START" in ln):
                continue  # 2.19 prints no nRanks/nNodes line
            keep.append(ln.replace("ncclCommInitRankConfig ", "") if style == "2.19" else ln)
    log = parse_nccl_debug("\n".join(keep))
    checks = {c.id: c for c in log_checks(log, {"intra_node": "nvlink", "inter_node": "infiniband"})}
    inter = checks["collectives.transport.inter_node"]
    assert inter.status == "pass" and "not placed" not in inter.message, inter.message
    assert sum(c.count for c in classify(log, TransportTopology.coerce(TOPO))["inter_node"]) == 4


def test_the_communicators_are_grouped_once_until_the_next_line():
    """The transport command's header counts them and its evidence lists them: one grouping of every record."""
    log = parse_nccl_debug(text_of(vllm_job(HOSTS[0])))
    groups = log.comms.groups()
    assert log.comms.groups() is groups and len(groups) == 14
    parse_nccl_debug_lines([(1, "gpu-a:41000:41016 [0] NCCL INFO ncclCommInitRankConfig comm 0x7f00 rank 0 nranks 2 "
                                "cudaDev 0 nvmlDev 0 busId 18000 commId 0xabc - Init COMPLETE")], log=log)
    assert len(log.comms.groups()) == 15 and list(log.comms.groups())[-1] == ("id", "abc")
    # a copy of the table is grouped anew (replace() of a table holding 14 groups, to one record's)
    first = dataclasses.replace(log.comms, records=log.comms.records[:1])
    assert len(first.groups()) == 1
    # a copy shares the records list (replace(), copy.copy): a record it adds there, which bumps only
    # the copy's version, is not missed by the original's kept grouping
    kept = log.comms.groups()
    log.comms.records.append(log.comms.records[0])
    assert log.comms.groups() is not kept
