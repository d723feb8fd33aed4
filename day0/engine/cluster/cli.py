"""``day0 cluster up|status|down``: the emulated cluster of a profile, for a person rehearsing by hand.

``up`` builds the namespaces a run of the profile would (same addresses, same shaping) and leaves
them up, printing how to run a command on a node; ``status`` lists every day0 cluster on this host
with its nodes, links and processes; ``down`` removes one (or ``--all``). A run never reuses a
cluster brought up by hand, and its sweep of stale clusters never removes one either.
Exit codes: 0 done, 1 nothing to act on, 2 unusable input (a profile, a host that cannot emulate).
"""

from __future__ import annotations

import argparse
from typing import Any

from day0.config.profile import ProfileError, deep_merge, load_profile, parse_override
from day0.core.terminal import Terminal
from day0.engine.cluster.netns import (
    STATE_DIR,
    EmulatedCluster,
    EmulationBlocked,
    EmulationError,
    cluster_ids,
    day0_leftovers,
    teardown_cid,
)


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("cluster", help="bring an emulated cluster (network namespaces) up, show it, "
                                              "take it down: the multi-node rehearsal by hand")
    sub = p.add_subparsers(dest="cluster_command", required=True, metavar="ACTION")
    q = sub.add_parser("up", help="build the profile's emulated nodes and leave them up")
    q.add_argument("--profile", default="cpu-2node", help="a preset name or TOML path with [topology.emulate]")
    q.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a profile key, e.g. topology.emulate.degrade.node1=20mbit")
    q.add_argument("--slurm", action="store_true", help="run a real Slurm on the nodes (topology.emulate.scheduler "
                                                       "= \"slurm\"): SLURM_CONF is printed to export")
    q.add_argument("--json", action="store_true", help="print the cluster as JSON")
    q.set_defaults(func=cmd_up)
    q = sub.add_parser("status", help="every day0 cluster on this host: nodes, addresses, links, processes")
    q.add_argument("--json", action="store_true", help="print the clusters as JSON")
    q.set_defaults(func=cmd_status)
    q = sub.add_parser("down", help="remove a cluster (its namespaces, links and every process in them)")
    q.add_argument("cid", nargs="?", help="the cluster id `status` shows")
    q.add_argument("--all", action="store_true", help="remove every day0 cluster on this host")
    q.set_defaults(func=cmd_down)


def cmd_up(args: argparse.Namespace) -> int:
    overrides: dict[str, Any] = {}
    term = Terminal()
    try:
        if args.slurm:
            overrides = parse_override('topology.emulate.scheduler="slurm"')
        for item in args.overrides:
            overrides = deep_merge(overrides, parse_override(item))
        profile = load_profile(args.profile, overrides=overrides or None)
    except (ProfileError, ValueError) as exc:
        term.print(f"day0: {exc}", err=True)
        return 2
    term = Terminal(profile.redactor())  # printed lines quote the profile and commands' stderr
    topo = profile.topology
    if topo.emulate is None:
        term.print(f"day0: {profile.origin}: topology.emulate: not set; this profile's nodes are not emulated", err=True)
        return 2
    try:
        cluster = EmulatedCluster.up(topo.nodes, topo.emulate, owner_pid=None,
                                     log=lambda m: term.print(f"[day0] {m}", err=True))
    except EmulationBlocked as exc:
        term.print(f"day0: blocked: {exc}", err=True)
        return 2
    except EmulationError as exc:
        term.print(f"day0: {exc}", err=True)
        return 2
    if args.json:
        print(term.json(cluster.status(), indent=1, by_key=False))
        return 0
    _print(cluster.status())
    first = cluster.nodes[0]
    term.print("", f"run a command on a node:  ip netns exec {first.netns} python -m ...   (node0 = {first.address})")
    if cluster.slurm_conf:
        term.print(f"use its Slurm:            export SLURM_CONF={cluster.slurm_conf}; sbatch --nodes={len(cluster.nodes)} ...")
    term.print(f"take it down:             day0 cluster down {cluster.cid}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    try:
        namespaces, links = day0_leftovers()
    except EmulationError as exc:  # no iproute2: one line, as `up` says it
        Terminal().print(f"day0: blocked: {exc}", err=True)
        return 2
    clusters = _known()
    known_ns = {nd["netns"] for c in clusters for nd in c["nodes"]}  # type: ignore[index]
    orphans = [ns for ns in namespaces if ns not in known_ns]
    term = Terminal()
    if args.json:
        print(term.json({"clusters": clusters, "orphan_namespaces": orphans, "links": links}, indent=1, by_key=False))
        return 0
    if not clusters and not orphans:
        term.print("no day0 cluster on this host")
        return 1
    for c in clusters:
        _print(c)
    if orphans:
        term.print(f"namespaces without a state file (`day0 cluster down --all` removes them): {', '.join(orphans)}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    term = Terminal()
    if not args.cid and not args.all:
        term.print("day0: cluster down: name a cluster id (see `day0 cluster status`) or --all", err=True)
        return 2
    try:
        targets = sorted(cluster_ids()) if args.all else [args.cid]
        removed = [cid for cid in targets if teardown_cid(cid)]
    except EmulationBlocked as exc:
        term.print(f"day0: blocked: {exc}", err=True)
        return 2
    except EmulationError as exc:
        term.print(f"day0: {exc}", err=True)
        return 1
    if not removed:
        term.print("nothing to remove" if args.all else f"day0: no cluster {args.cid!r} on this host", err=True)
        return 1
    term.print(f"removed: {', '.join(removed)}")
    return 0


def _known() -> list[dict[str, object]]:
    out = []
    for path in sorted(STATE_DIR.glob("*.json")) if STATE_DIR.is_dir() else []:
        try:
            out.append(EmulatedCluster.load(path.stem).status())
        except (OSError, ValueError, TypeError, KeyError):
            continue
    return out


def _print(status: dict[str, Any]) -> None:
    owner = f"run pid {status['owner_pid']}" if status.get("owner_pid") else "by hand"
    term = Terminal()  # a state file's names and sinfo's answer are printed redacted and escaped
    term.print(f"cluster {status['cid']} ({owner}): {status['subnet']}, bridge {status['bridge']} "
               f"(this host reaches the nodes from {status['gateway']})")
    for nd in status["nodes"]:
        state = "up" if nd["up"] else "MISSING"
        pids = f", {len(nd['pids'])} processes" if nd["pids"] else ""
        term.print(f"  {nd['name']:<7} {nd['address']:<15} {nd['netns']:<22} link {nd['rate']:<10} {state}{pids}")
    if status.get("slurm_conf"):
        term.print(f"  Slurm: SLURM_CONF={status['slurm_conf']}",
                   *(f"    {line}" for line in (status.get("sinfo") or "sinfo did not answer").split("\n")))
