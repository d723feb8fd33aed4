"""``day0`` command line. Each subcommand hands off to a plain module; errors are one line, exit 2."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from importlib import import_module
from pathlib import Path
from typing import NoReturn, Sequence

from day0.config import profile as profiles
from day0.config.tiny import ARCHS as TINY_ARCHS
from day0.core.inputs import refusal, term_safe
from day0.core.numbers import whole_number
from day0.core.record import RecordError
from day0.core.terminal import Terminal

SUITES_DIR = Path(__file__).resolve().parent / "suites"  # shipped in the package (day0.suites)
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _cmd_profiles(args: argparse.Namespace) -> int:
    term = Terminal()  # a site preset's description is its author's text
    for name in profiles.preset_names():
        p = profiles.load_profile(name)
        term.print(f"{name:<24} {p.description}")
    return 0


def _cmd_profile_show(args: argparse.Namespace) -> int:
    overrides: dict = {}
    for text in args.set:
        overrides = profiles.deep_merge(overrides, profiles.parse_override(text))
    p = profiles.load_profile(args.name, overrides=overrides or None)
    term = Terminal(p.redactor())  # a profile's values (a URL's password) and its keys are untrusted
    data = p.resolved(redact=True)
    if args.json:
        print(term.json(data))
    else:
        term.block(_toml(data).rstrip("\n"))
    return 0


def _cmd_profile_schema(args: argparse.Namespace) -> int:
    """The profile's JSON Schema, so an editor checks a profile as it is typed."""
    schema = profiles.Profile.model_json_schema()
    schema["properties"].pop("origin", None)  # where a profile came from, not a TOML key
    print(json.dumps(schema, indent=2))
    return 0


def _toml_key(key: object) -> str:
    """A bare TOML key, or a quoted one (escaped as JSON, which TOML reads): a key holding a newline
    or ``=`` stays one key on one line instead of forging another."""
    text = str(key)
    return text if _BARE_KEY.fullmatch(text) else json.dumps(text)


def _toml(data: dict, prefix: str = "") -> str:
    """A readable TOML rendering of the resolved profile (scalars first, then tables)."""
    out: list[str] = []
    scalars = {k: v for k, v in data.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    if prefix and (scalars or not tables):
        out.append(f"[{prefix}]")
    for k, v in scalars.items():
        if v is None:
            out.append(f"# {_toml_key(k)} is not set")
        else:
            out.append(f"{_toml_key(k)} = {json.dumps(v)}")
    if out:
        out.append("")
    for k, v in tables.items():
        out.append(_toml(v, f"{prefix}.{_toml_key(k)}" if prefix else _toml_key(k)))
    return "\n".join(out)


def _cmd_stages(args: argparse.Namespace) -> int:
    """The stages in the order they run and gate: day0's own and every site stage installed."""
    from day0.stages.registry import load

    stages, term = load().stages, Terminal()  # a site stage's title and question are its package's text
    if args.json:
        print(json.dumps([{**s.describe(), "marker": s.marker, "repeatable": s.repeatable} for s in stages], indent=2))
        return 0
    for i, s in enumerate(stages):
        origin = "" if s.origin == "day0" else f"  (from {s.origin})"
        term.print(f"{i}  {s.name:<12} {s.title}{origin}", f"   {'':<12} asks: {s.question}")
        if s.required:
            term.print(f"   {'':<12} requires: {', '.join(s.required)}")
        if s.figures:
            term.print(f"   {'':<12} headline: {', '.join(f.label for f in s.figures)}")
    return 0


def _cmd_tiny_build(args: argparse.Namespace) -> int:
    from day0.model.tiny import build

    spec = profiles.load_profile(args.profile).model.tiny
    if args.arch and args.arch != spec.arch:
        # Another architecture keeps the profile's shared dimensions and the MoE defaults, which
        # vLLM's CPU kernels take (head_dim 64, the MLA latent of 512 + 64).
        spec = type(spec).model_validate({**spec.model_dump(), "arch": args.arch}, strict=False)
    try:
        out = build(spec, Path(args.dir))
    except OSError as exc:  # a file, a folder under a file, no permission: the folder named, one line
        print(refusal(exc), file=sys.stderr)
        return 2
    Terminal().print(f"built tiny {spec.arch} model in {out}")  # the folder is the caller's text
    return 0


def _cmd_record_rebuild(args: argparse.Namespace) -> int:
    """Exit 2 with one line when nothing can be rebuilt; a log with unreadable lines is rebuilt
    from the rest, with one warning line naming them (the record names each in its notes)."""
    from day0.core.events import rebuild
    from day0.core.record import RUN_FILE, SKIPPED_NOTE, Skipped

    skipped, term = Skipped(), Terminal()
    try:
        record = rebuild(Path(args.dir), skipped)
    except (RecordError, OSError) as exc:
        print(refusal(exc, term.redactor), file=sys.stderr)
        return 2
    if skipped.count:
        term.print(f"day0: warning: {skipped.summary()}; rebuilt from the rest (notes.{SKIPPED_NOTE} in "
                   f"run.json names each), so the verdict is at best incomplete", err=True)
    term.print(f"{Path(args.dir) / RUN_FILE}: verdict {record.verdict} ({record.reason})")
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    """Exit 0: fits, no lint error; 1: a finding (does not fit, lint error, no layout priced); 2: unusable input."""
    from day0.model import arch_tensors, archs
    from day0.model.config import ConfigInvalid
    from day0.model.plan import format_table, parse_what_if
    from day0.model.sizing import plan_arguments
    from day0.stages.preflight import ConfigUnavailable, model_config, preflight
    from day0.stages.registry import load

    what_if = parse_what_if(args.what_if) if args.what_if else None
    profile = profiles.load_profile(args.profile)
    term = Terminal(profile.redactor())  # engine-arg names and values, config paths: the profile's text
    try:
        plan_arguments(profile, what_if)  # the engine args the plan reads: typed and in range
    except ValueError as exc:
        term.print(f"day0: {profile.origin}: {exc}", err=True)
        return 2
    try:
        config, source = model_config(profile)
        arch_tensors.check_config(config)  # every key the plan needs: unusable input, not "no plan" (exit 1)
        result = preflight(profile, what_if, stages=load().stages)
    except (ConfigUnavailable, ConfigInvalid) as exc:
        term.print(f"day0: {exc}", err=True)
        return 2
    except archs.ConfigError as exc:
        term.print(f"day0: {source}: {exc.key}: {exc.problem}", err=True)
        return 2
    term.print(f"config: {result.config_source}", "")
    term.print("findings:" if result.findings else "findings: none")
    for f in result.findings:
        term.print(f"  {f.severity.upper():<8} {f.key} = {f.value!r}: {f.why}", f"  {'':<8} fix: {f.fix}")
    term.print()
    if result.plan is None:
        term.print(f"no plan: {result.plan_error}")
        return 1
    term.block(format_table(result.plan))  # each line escaped where the table is formatted
    return 1 if result.errors or not result.plan.fits else 0


def _cmd_weights_audit(args: argparse.Namespace) -> int:
    """Exit 0: every check passed or was skipped; 1: a finding (a failed check); 2: DIR is not a folder."""
    from day0.config.errors import path_problem
    from day0.stages.weights import audit

    folder = Path(args.dir)
    term = Terminal()
    why = path_problem(folder)
    if why != "is a directory, not a file":
        term.print(f"day0: {folder}: {why or 'is a file, not a checkpoint folder'}", err=True)
        return 2
    checks = audit(folder, verify_manifest=not args.no_manifest, progress=sys.stderr.isatty())
    for c in checks:  # one line per check, whatever a file or tensor name holds
        term.print(f"{c.status.upper():<5} {c.id}: {c.message}")
    return 1 if any(c.failed for c in checks) else 0


def _cmd_weights_manifest(args: argparse.Namespace) -> int:
    from day0.stages.weights import write_manifest
    from day0.stages.weights.manifest import ManifestError

    term = Terminal()
    try:
        path = write_manifest(Path(args.dir), progress=sys.stderr.isatty())
    except ManifestError as exc:
        term.print(f"day0: {exc}", err=True)
        return 2
    term.print(f"wrote {path}")
    return 0


def _cmd_weights_golden(args: argparse.Namespace) -> int:
    from day0.core.events import export_path
    from day0.engine import Engines, local_model_dir, served_name
    from day0.engine.loaded import write_golden, write_reference_golden

    export_path(args.out, "--out")  # before the engine starts, which a refusal after it would waste
    profile = profiles.load_profile(args.profile)
    term = Terminal(profile.redactor())
    if args.reference == "transformers":  # no engine: an independent implementation reads the same shards
        from day0.model.reference import host_reference_unavailable

        model_dir = local_model_dir(profile)
        if model_dir is None:
            raise ValueError(f"{args.profile}: model: not a folder on this machine; --reference transformers "
                             "reads the checkpoint locally")
        why = host_reference_unavailable(model_dir)  # as the stage asks: float32 on this host, not the OOM killer
        if why:
            raise ValueError(f"--reference transformers: {why}")
        path = write_reference_golden(model_dir, Path(args.out), model=served_name(profile))
        term.print(f"wrote {path}")
        return 0
    engines = Engines(profile, Path(args.out).resolve().parent, lambda m: term.print(f"[day0] {m}", err=True))
    try:
        path = write_golden(engines.primary(), Path(args.out), model=served_name(profile))
    finally:
        engines.stop()
    term.print(f"wrote {path}")
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


PLAN_EXIT_CODES = """exit codes:
  0  the layout fits and the lint found no error
  1  a finding about the deployment: it does not fit (weights, KV cache or devices), a lint error,
     or no layout could be priced from the engine args
  2  unusable input: the profile, --what-if, an engine arg of the wrong type, or config.json
     (missing key, wrong type, absurd value); one line on stderr names the file and the key
"""
AUDIT_EXIT_CODES = """exit codes:
  0  every check passed or was skipped (skips say why)
  1  a finding: a check failed, each naming its shard or tensor (a broken config.json, index or
     shard is a finding, never a reason to stop: the other shards are still checked)
  2  unusable input: DIR does not exist or is not a folder; one line on stderr says which
"""
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


class OneLineParser(argparse.ArgumentParser):
    """A usage error is one line naming the command and the flag, exit 2, as every other unusable input
    is (argparse prints the whole usage first); ``--help`` still shows the usage. Subcommands inherit it."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, term_safe(f"{self.prog}: {message} (--help for usage)") + "\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser for ``command`` (its word from :func:`command_word`): every built-in subcommand, and
    of those beside their module only that command's; ``None``: every subcommand there is."""
    parser = OneLineParser(prog="day0", description="Day0 acceptance harness for vLLM deployments",
                           epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("run", help="run the Day0 suites (pytest -m day0) against a profile")
    p.add_argument("--profile", default=profiles.DEFAULT_PROFILE,
                   help=f"preset name or TOML file (default: {profiles.DEFAULT_PROFILE})")
    p.add_argument("-m", "--marker", default="day0", help="pytest marker expression (default: day0)")
    p.add_argument("--repeat", type=whole_number(1), default=1, metavar="N",
                   help="measure the repeatable stages (collectives, experts, latency, kvcache) N times on the same engine; the "
                        "report shows each check's spread and names any verdict that flipped (--day0-repeat)")
    p.add_argument("pytest_args", nargs=argparse.REMAINDER, help="further pytest arguments")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("plan", help="lint the profile against vLLM's rules and plan memory per rank (stage 0)",
                       epilog=PLAN_EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", default=profiles.DEFAULT_PROFILE, help="preset name or TOML file")
    p.add_argument("--what-if", default=None, metavar="K=V,...",
                   help="recompute with changes, e.g. tp=8,pp=4,max_model_len=1000000")
    p.set_defaults(func=_cmd_plan)

    p = sub.add_parser("weights", help="checkpoint audit, integrity manifest, golden tokens")
    psub = p.add_subparsers(dest="weights_command", required=True, metavar="ACTION")
    q = psub.add_parser("audit", help="audit shards, index and headers against config.json (no tensor data read)",
                        epilog=AUDIT_EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    q.add_argument("dir", help="checkpoint folder (config.json, *.safetensors, the index)")
    q.add_argument("--no-manifest", action="store_true", help="do not verify day0-manifest.json hashes")
    q.set_defaults(func=_cmd_weights_audit)
    q = psub.add_parser("manifest", help="write day0-manifest.json with the SHA-256 of every shard")
    q.add_argument("dir", help="checkpoint folder; the manifest is written into it")
    q.set_defaults(func=_cmd_weights_manifest)
    q = psub.add_parser("golden", help="record greedy tokens from a trusted engine as a golden file")
    q.add_argument("--profile", default=profiles.DEFAULT_PROFILE, help="preset name or TOML file of the trusted engine")
    q.add_argument("-o", "--out", required=True, help="golden file to write (JSON); set weights.golden to it")
    q.add_argument("--reference", choices=["engine", "transformers"], default="engine",
                   help="who computes the tokens: the profile's engine (default), or transformers on CPU in "
                        "float32 from the local checkpoint, with top-k logprobs so near-ties are known")
    q.set_defaults(func=_cmd_weights_golden)

    p = sub.add_parser("stages", help="list the stages in the order they run and gate, with the question each "
                                      "answers and the checks it requires")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=_cmd_stages)

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
    q.add_argument("--arch", choices=TINY_ARCHS, help="architecture instead of the profile's (default: its [model.tiny] arch)")
    q.set_defaults(func=_cmd_tiny_build)

    p = sub.add_parser("record", help="run records")
    psub = p.add_subparsers(dest="record_command", required=True, metavar="ACTION")
    q = psub.add_parser("rebuild", help="rebuild run.json from a run folder's event log (e.g. after a crash); "
                                        "unreadable lines are skipped and named")
    q.add_argument("dir", help="run folder holding events.jsonl")
    q.set_defaults(func=_cmd_record_rebuild)

    for module in _plugin_modules(command, built_in=set(sub.choices)):
        import_module(module).add_cli(sub)
    return parser


# The subcommands that live beside their module (each exposes ``add_cli``), by command word. Only the
# module of the command being run is imported: importing them all (aiohttp for `slurm`, Jinja2 for
# `report`, the launchers for `collectives`) cost every `day0` process ~0.9 s of its ~1.3 s, and the
# test suite starts hundreds. `day0 --help`, and a word that is not here, import them all, so the
# usage lists every command and a misspelt one is named among them.
PLUGIN_COMMANDS: dict[str, str] = {
    "report": "day0.results.report", "keygen": "day0.results.report", "sign": "day0.results.report",
    "verify": "day0.results.report", "collectives": "day0.stages.collectives", "latency": "day0.stages.latency",
    "compare": "day0.results.compare", "history": "day0.results.compare", "device-check": "day0.device_check",
    "cluster": "day0.engine.cluster.cli", "slurm": "day0.slurm_cli",
}


def _plugin_modules(command: str | None, built_in: set[str]) -> list[str]:
    """The modules to register: none for a built-in command, the command's own, or every one (in the
    table's order, once each)."""
    if command in built_in:
        return []
    if command in PLUGIN_COMMANDS:
        return [PLUGIN_COMMANDS[command]]
    return list(dict.fromkeys(PLUGIN_COMMANDS.values()))


def command_word(argv: Sequence[str]) -> str | None:
    """The subcommand named on a command line: its first word that is not an option (the top-level
    parser has only ``--help`` and ``--version``, neither of which takes a value)."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(command_word(argv))
    args, rest = parser.parse_known_args(argv)
    if rest:  # pytest's own options (run) and sbatch's (slurm submit) pass through, in their order
        dest = "pytest_args" if args.command == "run" else getattr(args, "passthrough", None)
        if not dest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        setattr(args, dest, [*rest, *getattr(args, dest)])
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a reader that went away (`| head`) is found here, not at interpreter exit
        return code
    except BrokenPipeError:
        # Python's recipe (library/signal.html, "Note on SIGPIPE"): the rest of the output goes to
        # devnull, so the flush at exit cannot raise again and print a traceback; exit 1 as Python does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except (profiles.ProfileError, RecordError, FileNotFoundError, ValueError) as exc:
        print(refusal(exc), file=sys.stderr)  # one line, whatever a path or value in it holds
        return 2


if __name__ == "__main__":
    sys.exit(main())
