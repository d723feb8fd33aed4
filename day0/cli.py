"""``day0`` command line. Each subcommand hands off to a plain module; errors are one line, exit 2."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Sequence

from day0.config import profile as profiles
from day0.core.record import RecordError

SUITES_DIR = Path(__file__).resolve().parent / "suites"  # shipped in the package (day0.suites)


def _cmd_profiles(args: argparse.Namespace) -> int:
    for name in profiles.preset_names():
        p = profiles.load_profile(name)
        print(f"{name:<24} {p.description}")
    return 0


def _cmd_profile_show(args: argparse.Namespace) -> int:
    overrides: dict = {}
    for text in args.set:
        overrides = profiles.deep_merge(overrides, profiles.parse_override(text))
    p = profiles.load_profile(args.name, overrides=overrides or None)
    data = p.resolved(redact=True)
    print(json.dumps(data, indent=2) if args.json else _toml(data).rstrip("\n"))
    return 0


def _cmd_profile_schema(args: argparse.Namespace) -> int:
    """The profile's JSON Schema, so an editor checks a profile as it is typed."""
    schema = profiles.Profile.model_json_schema()
    schema["properties"].pop("origin", None)  # where a profile came from, not a TOML key
    print(json.dumps(schema, indent=2))
    return 0


def _toml(data: dict, prefix: str = "") -> str:
    """A readable TOML rendering of the resolved profile (scalars first, then tables)."""
    out: list[str] = []
    scalars = {k: v for k, v in data.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    if prefix and (scalars or not tables):
        out.append(f"[{prefix}]")
    for k, v in scalars.items():
        if v is None:
            out.append(f"# {k} is not set")
        else:
            out.append(f"{k} = {json.dumps(v)}")
    if out:
        out.append("")
    for k, v in tables.items():
        out.append(_toml(v, f"{prefix}.{k}" if prefix else k))
    return "\n".join(out)


def _cmd_tiny_build(args: argparse.Namespace) -> int:
    from day0.model.tiny import build

    spec = profiles.load_profile(args.profile).model.tiny
    out = build(spec, Path(args.dir))
    print(f"built tiny model in {out}")
    return 0


def _cmd_record_rebuild(args: argparse.Namespace) -> int:
    from day0.core.record import rebuild

    record = rebuild(Path(args.dir))
    print(f"{Path(args.dir) / 'run.json'}: verdict {record.verdict} ({record.reason})")
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from day0.model.plan import format_table, parse_what_if
    from day0.stages.preflight import ConfigUnavailable, preflight

    what_if = parse_what_if(args.what_if) if args.what_if else None
    try:
        result = preflight(profiles.load_profile(args.profile), what_if)
    except ConfigUnavailable as exc:
        print(f"day0: {exc}", file=sys.stderr)
        return 2
    print(f"config: {result.config_source}")
    if result.findings:
        print("\nfindings:")
        for f in result.findings:
            print(f"  {f.severity.upper():<8} {f.key} = {f.value!r}: {f.why}")
            print(f"  {'':<8} fix: {f.fix}")
    else:
        print("\nfindings: none")
    print()
    if result.plan is None:
        print(f"no plan: {result.plan_error}")
        return 1
    print(format_table(result.plan))
    return 1 if result.errors else 0


def _cmd_weights_audit(args: argparse.Namespace) -> int:
    from day0.stages.weights import audit

    checks = audit(Path(args.dir), verify_manifest=not args.no_manifest, progress=True)
    for c in checks:
        print(f"{c.status.upper():<5} {c.id}: {c.message}")
    return 1 if any(c.failed for c in checks) else 0


def _cmd_weights_manifest(args: argparse.Namespace) -> int:
    from day0.stages.weights import write_manifest
    from day0.stages.weights.manifest import ManifestError

    try:
        path = write_manifest(Path(args.dir), progress=True)
    except ManifestError as exc:
        print(f"day0: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


def _cmd_weights_golden(args: argparse.Namespace) -> int:
    from day0.engine import Engines, served_name
    from day0.engine.loaded import write_golden

    profile = profiles.load_profile(args.profile)
    engines = Engines(profile, Path(args.out).resolve().parent, lambda m: print(f"[day0] {m}", file=sys.stderr))
    try:
        path = write_golden(engines.primary(), Path(args.out), model=served_name(profile))
    finally:
        engines.stop()
    print(f"wrote {path}")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    import pytest

    if args.repeat < 1:
        print(f"day0 run: --repeat {args.repeat}: expected a whole number >= 1", file=sys.stderr)
        return 2
    if not SUITES_DIR.is_dir():
        print(f"day0: suites not found at {SUITES_DIR} (a broken installation of day0?)", file=sys.stderr)
        return 2
    argv = [str(SUITES_DIR), "-m", args.marker, "--day0-profile", args.profile,
            *(["--day0-repeat", str(args.repeat)] if args.repeat > 1 else []), *args.pytest_args]
    return int(pytest.main(argv))


EXAMPLES = """examples:
  day0 run --profile mysite.toml                  every stage against your deployment; sign reports/latest/report.html
  day0 plan --profile h200x8 --what-if tp=8,pp=4  stage 0 only: does the model fit, and how, before any GPU-hour
  day0 compare reports/latest --baseline latest   the nightly judgement against the last runs in the history
"""


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"day0 {version('day0')}"
    except PackageNotFoundError:  # a source tree that was never installed
        return "day0 (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="day0", description="Day0 acceptance harness for vLLM deployments",
                                     epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("run", help="run the Day0 suites (pytest -m day0) against a profile")
    p.add_argument("--profile", default=profiles.DEFAULT_PROFILE,
                   help=f"preset name or TOML file (default: {profiles.DEFAULT_PROFILE})")
    p.add_argument("-m", "--marker", default="day0", help="pytest marker expression (default: day0)")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="measure the collectives, latency and kvcache stages N times on the same engine; the "
                        "report shows each check's spread and names any verdict that flipped (--day0-repeat)")
    p.add_argument("pytest_args", nargs=argparse.REMAINDER, help="further pytest arguments")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("plan", help="lint the profile against vLLM's rules and plan memory per rank (stage 0)")
    p.add_argument("--profile", default=profiles.DEFAULT_PROFILE, help="preset name or TOML file")
    p.add_argument("--what-if", default=None, metavar="K=V,...",
                   help="recompute with changes, e.g. tp=8,pp=4,max_model_len=1000000")
    p.set_defaults(func=_cmd_plan)

    p = sub.add_parser("weights", help="checkpoint audit, integrity manifest, golden tokens")
    psub = p.add_subparsers(dest="weights_command", required=True, metavar="ACTION")
    q = psub.add_parser("audit", help="audit shards, index and headers against config.json (no tensor data read)")
    q.add_argument("dir", help="checkpoint folder (config.json, *.safetensors, the index)")
    q.add_argument("--no-manifest", action="store_true", help="do not verify day0-manifest.json hashes")
    q.set_defaults(func=_cmd_weights_audit)
    q = psub.add_parser("manifest", help="write day0-manifest.json with the SHA-256 of every shard")
    q.add_argument("dir", help="checkpoint folder; the manifest is written into it")
    q.set_defaults(func=_cmd_weights_manifest)
    q = psub.add_parser("golden", help="record greedy tokens from a trusted engine as a golden file")
    q.add_argument("--profile", default=profiles.DEFAULT_PROFILE, help="preset name or TOML file of the trusted engine")
    q.add_argument("-o", "--out", required=True, help="golden file to write (JSON); set weights.golden to it")
    q.set_defaults(func=_cmd_weights_golden)

    p = sub.add_parser("profiles", help="list the preset profiles")
    p.set_defaults(func=_cmd_profiles)

    p = sub.add_parser("profile", help="work with one profile")
    psub = p.add_subparsers(dest="profile_command", required=True, metavar="ACTION")
    q = psub.add_parser("show", help="print the resolved profile (presets and extends applied)")
    q.add_argument("name", help="preset name or TOML file")
    q.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override one value, as --day0-set does (repeatable)")
    q.add_argument("--json", action="store_true", help="print JSON instead of TOML")
    q.set_defaults(func=_cmd_profile_show)
    q = psub.add_parser("schema", help="print the profile's JSON Schema (for editors: Taplo, VS Code Even Better TOML)")
    q.set_defaults(func=_cmd_profile_schema)

    p = sub.add_parser("tiny", help="the embedded tiny model")
    psub = p.add_subparsers(dest="tiny_command", required=True, metavar="ACTION")
    q = psub.add_parser("build", help="build the tiny model into DIR")
    q.add_argument("dir", help="folder to write the model into (created)")
    q.add_argument("--profile", default=profiles.DEFAULT_PROFILE, help="profile whose [model.tiny] spec to use")
    q.set_defaults(func=_cmd_tiny_build)

    p = sub.add_parser("record", help="run records")
    psub = p.add_subparsers(dest="record_command", required=True, metavar="ACTION")
    q = psub.add_parser("rebuild", help="rebuild run.json from a run folder's event log (e.g. after a crash)")
    q.add_argument("dir", help="run folder holding events.jsonl")
    q.set_defaults(func=_cmd_record_rebuild)

    for register in _plugins():
        register(sub)
    return parser


def _plugins() -> list[Callable[[argparse._SubParsersAction], None]]:
    """Subcommands that live beside their module (each module exposes ``add_cli``)."""
    from day0.results import compare, report
    from day0.stages import collectives, latency

    return [report.add_cli, collectives.add_cli, latency.add_cli, compare.add_cli]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest:
        if args.command != "run":
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        args.pytest_args = [*rest, *args.pytest_args]  # pytest's own options pass through
    try:
        return int(args.func(args) or 0)
    except (profiles.ProfileError, RecordError, FileNotFoundError, ValueError) as exc:
        print(f"day0: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
