"""The stage's command line: ``day0 collectives run|import|transport`` and ``python -m day0.stages.collectives``.

``run`` sweeps on local ranks (or is one rank under torchrun/srun); ``import`` reads a site's
nccl-tests output; ``transport`` holds NCCL_DEBUG=INFO logs to the links a topology promises.
Each prints what it read and the checks' verdicts: exit 0 all pass, 1 a check failed or could
not measure, 2 an input that cannot be used (one line, ``day0: <file>[:line[:col]]: <problem>``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from day0.config.profile import ProfileError, check_nesting, parse_override, toml_table
from day0.core.events import export_path
from day0.core.inputs import InputError, loose_json, read_text, term_safe
from day0.core.numbers import whole_number
from day0.core.outputs import write_file
from day0.core.record import Check
from day0.core.terminal import Terminal
from day0.engine.cluster.slurm import SlurmError, SlurmJob
from day0.stages.collectives.checks import result_checks
from day0.stages.collectives.launcher import run_local, zygote_main
from day0.stages.collectives.nccl_debug import read_nccl_debug
from day0.stages.collectives.nccl_tests import import_nccl_tests
from day0.stages.collectives.rank import run_rank
from day0.stages.collectives.rank_env import RankEnv
from day0.stages.collectives.result import RANKS_DIR, RESULT_FILE, CollectivesResult
from day0.stages.collectives.settings import CollectivesSection, SettingsError
from day0.stages.collectives.transport import INTER_LINKS, INTRA_LINKS, TransportTopology, log_checks

SETTINGS_CAP = 16 << 20  # a [collectives] table, or a whole profile, is kilobytes


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
    return "\n".join(term_safe(line) for line in lines)  # op names, reasons, the source: a file's text


def _load_settings_file(path: Path) -> dict[str, Any]:
    """A settings file read like any other input: bounded, and refused in one line naming it."""
    text = read_text(path, cap=SETTINGS_CAP)
    if Path(path).suffix == ".json":
        data = loose_json(text, str(path))
    else:
        data = toml_table(text, str(path))
    if isinstance(data, dict) and isinstance(data.get("collectives"), dict):
        data = data["collectives"]  # a whole profile: take its [collectives] table
    if not isinstance(data, dict):
        raise InputError(path, f"holds a {type(data).__name__}, not a [collectives] table")
    return data


def _parse_set(items: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs as a table, read as ``day0 run --day0-set`` reads its own: a dotted key
    (``expert_routing.skew=2``) sets one key of a sub-table, a bare word is a string, and a value
    nested or numbered past what TOML's parser takes is one line naming it."""
    out: dict[str, Any] = {}
    for item in items:
        try:
            _merge(out, parse_override(item))
        except ProfileError as exc:
            raise SettingsError("--set " + str(exc).removeprefix("override ")) from None
    return out


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` into ``base``, tables key by key (a --set of one sub-key keeps the file's others)."""
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value
    return base


def _settings_from_args(args: argparse.Namespace) -> CollectivesSection:
    data: dict[str, Any] = _load_settings_file(Path(args.settings)) if args.settings else {}
    _merge(data, _parse_set(args.set or []))
    check_nesting(data, args.settings or "--set")  # a JSON file or a --set value: as a profile's TOML is checked
    try:
        return CollectivesSection.from_mapping(data)
    except SettingsError as exc:
        raise SettingsError(f"{args.settings}: {exc}" if args.settings else str(exc)) from None


def _refuse(exc: BaseException) -> int:
    """The one stderr line of an unusable input (exit 2)."""
    Terminal().print(f"day0: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", err=True)
    return 2


def _report(checks: list[Check], json_path: str | None) -> int:
    """Print the verdicts (and write them as JSON); exit 1 unless every check passed or was skipped."""
    term = Terminal()  # messages quote the logs and files read: redacted, escaped
    term.print(*(f"{c.status.upper():5} {c.id}: {c.message}" for c in checks))
    if json_path:
        try:
            write_file(json_path, term.json([c.to_dict() for c in checks], indent=1) + "\n")
        except InputError as exc:  # a FIFO, folder or link there, or a folder that is not writable
            return _refuse(exc)
    return 1 if any(c.status in ("fail", "error") for c in checks) else 0


def rendezvous_addr(settings: CollectivesSection, environ: Mapping[str, str]) -> str:
    """Where the ranks meet when nobody exported MASTER_ADDR: inside a multi-node Slurm allocation the
    first host of its node list (a loopback default would leave every other node's ranks waiting
    forever), else ``collectives.master_addr``."""
    job = SlurmJob.from_environ(environ)
    if job is not None and job.nnodes > 1:
        return job.master_addr
    return settings.master_addr


def _cmd_run(args: argparse.Namespace) -> int:
    try:
        settings = _settings_from_args(args)
    except (SettingsError, OSError, ValueError) as exc:
        return _refuse(exc)
    out_dir = Path(args.out_dir)
    try:
        rank_env = RankEnv.from_environ()
    except SlurmError as exc:
        return _refuse(exc)
    if args.worker or (rank_env is not None and not args.local_ranks):
        if rank_env is None:
            print("day0 collectives run --worker: no RANK/WORLD_SIZE (torchrun) or SLURM_PROCID/SLURM_NTASKS (srun) "
                  "in the environment", file=sys.stderr)
            return 2
        try:
            os.environ.setdefault("MASTER_ADDR", rendezvous_addr(settings, os.environ))
        except SlurmError as exc:
            return _refuse(exc)
        if "MASTER_PORT" not in os.environ:
            if settings.master_port:
                os.environ["MASTER_PORT"] = str(settings.master_port)
            else:
                print("day0 collectives run: MASTER_PORT is not set (torchrun sets it; with srun export it)", file=sys.stderr)
                return 2
        return _worker(settings, rank_env, out_dir)
    result = run_local(settings, args.local_ranks or settings.world_size or 2, out_dir)
    checks, term = result_checks(result, settings), Terminal()
    term.block(format_table(result))
    term.print(*(f"{c.status.upper():5} {c.id}: {c.message}" for c in checks), f"# result: {out_dir / RESULT_FILE}")
    return 1 if any(c.status in ("fail", "error") for c in checks) else 0


def _worker(settings: CollectivesSection, rank_env: RankEnv, out_dir: Path) -> int:
    """One rank under torchrun/srun: its pid and exit status beside its step file, for the watcher
    (:func:`~day0.stages.collectives.multinode.run_cluster`); a rank that fails exits in run_rank."""
    ranks_dir = out_dir / RANKS_DIR
    ranks_dir.mkdir(parents=True, exist_ok=True)
    write_file(ranks_dir / f"rank{rank_env.rank}.pid", str(os.getpid()))
    code = run_rank(settings, rank_env, out_dir)
    write_file(ranks_dir / f"rank{rank_env.rank}.exit", str(code))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip torch's interpreter teardown: seconds of CPU on a busy box, nothing left to flush


def _cmd_import(args: argparse.Namespace) -> int:
    try:
        for flag, path in (("--out", args.out), ("--json", args.json)):
            if path:
                export_path(path, flag)
        result = import_nccl_tests(Path(args.path), op=args.op)
        settings = _settings_from_args(args) if (args.settings or args.set) else None
    except (SettingsError, OSError, ValueError) as exc:  # InputError is a ValueError
        return _refuse(exc)
    if args.out:
        try:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            result.write(Path(args.out))
        except InputError as exc:  # a FIFO, folder or link where the result goes
            return _refuse(exc)
        except OSError as exc:
            return _refuse(InputError(args.out, f"cannot write ({exc.strerror or exc})"))
    Terminal().block(format_table(result))
    return _report(result_checks(result, settings), args.json)


def _cmd_transport(args: argparse.Namespace) -> int:
    try:
        if args.json:
            export_path(args.json, "--json")
        topology = TransportTopology(args.intra_node, args.inter_node, args.nodes, args.devices_per_node)
        log = read_nccl_debug(args.logs)
    except ValueError as exc:  # InputError too
        return _refuse(exc)
    procs = log.comms.by_proc
    Terminal().print(f"# NCCL log: {len(args.logs)} file(s), {log.lines} lines, NCCL {', '.join(log.versions) or '?'}, "
                     f"{sum(c.count for c in log.connections)} channel connections, {len(procs)} process(es) with "
                     f"init lines on {len({host for host, _ in procs})} host(s) in {len(log.comms.groups())} "
                     "communicator(s)")
    return _report(log_checks(log, topology), args.json)


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
    run.add_argument("--local-ranks", type=whole_number(1), default=None, help="spawn N ranks on this host (default: settings.world_size or 2)")
    run.add_argument("--worker", action="store_true", help="be one rank (what torchrun/srun start); read RANK etc. from env")
    run.set_defaults(func=_cmd_run)
    imp = sub.add_parser("import", help="read nccl-tests output (text or -J JSON) and apply the same checks")
    common(imp)
    imp.add_argument("path", help="nccl-tests output: its stdout (text) or its -J JSON file")
    imp.add_argument("--op", help="the collective (e.g. all_reduce); wins over the output's program line and "
                                  "the file name")
    imp.add_argument("--out", help="write the converted result JSON here")
    imp.add_argument("--json", metavar="FILE", help="write the checks (id, status, value, message, ...) as JSON here")
    imp.set_defaults(func=_cmd_import)
    tr = sub.add_parser("transport", help="hold NCCL_DEBUG=INFO logs to the links the topology promises")
    tr.add_argument("logs", nargs="+", metavar="LOG", help="NCCL_DEBUG=INFO output: every node's NCCL_DEBUG_FILE")
    tr.add_argument("--intra-node", default="any", help=f"promised inside a node: {', '.join(INTRA_LINKS)}")
    tr.add_argument("--inter-node", default="any", help=f"promised between nodes: {', '.join(INTER_LINKS)}")
    tr.add_argument("--nodes", type=whole_number(1), default=None, help="nodes in the job (topology.nodes)")
    tr.add_argument("--devices-per-node", type=whole_number(1), default=None,
                    help="places ranks that logged nothing (a log from some nodes only)")
    tr.add_argument("--json", metavar="FILE", help="write the checks as JSON here")
    tr.set_defaults(func=_cmd_transport)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv_l = list(sys.argv[1:] if argv is None else argv)
    if argv_l[:1] == ["_launch"]:  # run_local's launcher: _launch N SETTINGS OUT_DIR
        return zygote_main(int(argv_l[1]), Path(argv_l[2]), Path(argv_l[3]))
    parser = argparse.ArgumentParser(prog="python -m day0.stages.collectives")
    sub = parser.add_subparsers(dest="cmd", required=True)
    add_cli(sub)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("run", "import", "transport"):
        argv = ["collectives", *argv]
    args = parser.parse_args(argv)
    return int(args.func(args))
