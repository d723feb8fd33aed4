"""The stage's command line: ``day0 collectives run|import`` and ``python -m day0.stages.collectives``.

``run`` sweeps on local ranks (or is one rank under torchrun/srun); ``import`` reads a site's
nccl-tests output. Both print the sweep as an nccl-tests-like table and the checks' verdicts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from day0.stages.collectives.checks import result_checks
from day0.stages.collectives.launcher import run_local, zygote_main
from day0.stages.collectives.nccl_tests import NcclParseError, import_nccl_tests
from day0.stages.collectives.rank import RankEnv, run_rank
from day0.stages.collectives.result import RESULT_FILE, CollectivesResult
from day0.stages.collectives.settings import CollectivesSettings, SettingsError


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
    imp.add_argument("path", help="nccl-tests output: its stdout (text) or its -J JSON file")
    imp.add_argument("--op", help="collective name when the output does not say (e.g. all_reduce)")
    imp.add_argument("--out", help="write the converted result JSON here")
    imp.set_defaults(func=_cmd_import)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv_l = list(sys.argv[1:] if argv is None else argv)
    if argv_l[:1] == ["_launch"]:  # run_local's launcher: _launch N SETTINGS OUT_DIR
        return zygote_main(int(argv_l[1]), Path(argv_l[2]), Path(argv_l[3]))
    parser = argparse.ArgumentParser(prog="python -m day0.stages.collectives")
    sub = parser.add_subparsers(dest="cmd", required=True)
    add_cli(sub)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("run", "import"):
        argv = ["collectives", *argv]
    args = parser.parse_args(argv)
    return int(args.func(args))
