"""Target profiles: one TOML file describes the deployment under test.

Presets ship in ``day0/presets``; a user's file may say ``extends = "h200x8"`` (or a path) and
override any key. Validation is strict (unknown keys, wrong types, missing values) and every
error is one line that names the file and the dotted key path, because a typo in a profile for
a 32-GPU allocation should cost seconds, not the allocation.

This module holds :class:`Profile`, the loader and the sections no stage owns (``[model]``,
``[engine]``, ``[report]``); every other section has its own module beside it, named after its
table (``kvcache``, ``weights``, ``preflight``, ``topology``, ``latency`` with ``[sla]``,
``collectives``, ``risks``, ``compare``), all built on :class:`day0.config.section.Section`.
"""

from __future__ import annotations

import copy
import os
import re
import reprlib
import tomllib
from datetime import date
from pathlib import Path
from typing import Any, Literal, Mapping, Optional

from pydantic import Field, ValidationError, field_validator, model_validator

from day0.config.agents import AgentsSection
from day0.config.collectives import CollectivesSection
from day0.config.compare import CompareSection
from day0.config.errors import first_error, known_keys
from day0.config.experts import ExpertsSection
from day0.config.kvcache import KvCacheSection
from day0.config.latency import LatencySection, SlaSection
from day0.config.parity import ParitySection
from day0.config.preflight import PreflightSection
from day0.config.risks import RisksSection
from day0.config.section import ENV_NAME, Section, checked_args, checked_env
from day0.config.tiny import TinySpec
from day0.config.topology import TopologySection
from day0.config.weights import WeightsSection
from day0.core.globs import MAX_GLOB
from day0.core.inputs import InputError, decode_utf8, path_problem, read_regular
from day0.core.redact import Redactor

PRESETS_DIR = Path(__file__).with_name("presets")
DEFAULT_PROFILE = "cpu-tiny"
# Bounds on what a profile file may be. A real profile is a few KB, extends one or two others and
# nests tables four deep; far past that it is a generated or corrupted file, refused in one line
# before it costs memory or Python's recursion limit.
MAX_PROFILE_BYTES = 1 << 20
MAX_EXTENDS = 16  # files in one extends chain, the profile itself included
MAX_NESTING = 32  # tables and arrays inside one another


def key_variable_problem(name: str | None) -> str:
    """Why ``name`` cannot be what ``engine.api_key_env`` (``--api-key-env``) names, never repeating it
    (it may be the key itself, pasted there); "" when it can. A key shaped like one (``hf_...``,
    ``ghp_...``, ``sk-...``) is refused even where it is a valid name; a hex key that is one cannot
    be told from a variable, so no message names a variable that is not in capitals."""
    if name is None:
        return ""
    if not ENV_NAME.fullmatch(name):
        return ("not an environment variable name (letters, digits and _, not starting with a digit): it names "
                "the variable that holds the key, never the key itself")
    if Redactor().text(name) != name:
        return "shaped like a key, not like a variable's name: it names the variable that holds the key, never the key"
    return ""


def shown_variable(name: str) -> str:
    """``name`` as a message may show it: in capitals, as variables are named; else not at all."""
    return name if name.isupper() else "(a name not in capitals, not shown: a key pasted there?)"


class ProfileError(ValueError):
    """A profile that cannot be used; the message is one line naming file and key path."""


class ModelSection(Section):
    source: Literal["tiny", "path"] = "tiny"
    path: Optional[str] = None  # local HF directory or hub id, as vLLM's --model takes it
    served_model_name: Optional[str] = None
    # config.json for planning without weights: a path, or a bundled example (day0/archconfigs)
    config: Optional[str] = None
    tiny: TinySpec = TinySpec()

    @model_validator(mode="after")
    def _path(self) -> "ModelSection":
        if self.source == "path" and not self.path:
            raise ValueError("path: required when source = \"path\"")
        return self


class EngineSection(Section):
    mode: Literal["inprocess", "server", "external"] = "server"
    url: Optional[str] = None  # external mode: base URL, e.g. http://10.0.0.5:8000
    startup_timeout_s: float = Field(600.0, gt=0)
    shutdown_timeout_s: float = Field(30.0, gt=0)
    # Launch a server-mode engine as the run starts, so its start-up overlaps preflight; the first
    # stage that needs it waits for it. Off by default: on a supernode, loading a terabyte of weights
    # before the memory plan says it fits wastes the nodes. The CPU presets turn it on (docs/engine.md).
    start_early: bool = False
    request_timeout_s: float = Field(120.0, gt=0)
    api_key_env: Optional[str] = None  # name of the env var holding the API key, never the key
    env: dict[str, str] = {}
    args: dict[str, Any] = {}  # vLLM engine arguments, passed through unchanged

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        return checked_env(value)

    @field_validator("api_key_env")
    @classmethod
    def _key_variable_name(cls, value: Optional[str]) -> Optional[str]:
        """A variable's name: a pasted key here would be printed by `profile show` and kept in the
        run record as a setting. The refusal does not repeat the value, which may be that key."""
        problem = key_variable_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("args")
    @classmethod
    def _finite_args(cls, value: dict[str, Any]) -> dict[str, Any]:
        return checked_args(value)

    @model_validator(mode="after")
    def _url(self) -> "EngineSection":
        if self.mode == "external" and not self.url:
            raise ValueError("url: required when mode = \"external\"")
        return self


class Signatory(Section):
    name: str
    role: str


REQUIRED_GLOB = re.compile(rf"[A-Za-z0-9_.*?\[\]!-]{{1,{MAX_GLOB}}}")


class Waiver(Section):
    """A known failure the signatories accept for now: the check stays ``fail`` and the report shows
    it as waived, with the reason; it no longer rejects the run or gates the stages after it."""

    check: str = Field(description="check id or glob")
    # The failure kind the check's evidence must show, and nothing else (evidence["findings"],
    # e.g. "control_character"): a new kind of failure in the same check is not covered.
    finding: Optional[str] = Field(None, pattern=r"^[a-z_]+$")
    reason: str = Field(min_length=10, description="why, and the upstream issue that tracks it")
    until: Optional[str] = Field(None, pattern=r"^\d{4}-\d{2}-\d{2}$", description="last day it applies (UTC)")

    @model_validator(mode="after")
    def _glob(self) -> "Waiver":
        if self.until is not None:
            try:  # the pattern takes 2026-13-45, compared as text it would never lapse the right day
                date.fromisoformat(self.until)
            except ValueError:
                raise ValueError(f"until: {self.until!r} is not a date") from None
        if not REQUIRED_GLOB.fullmatch(self.check):
            raise ValueError(f"check: {reprlib.repr(self.check)} is not a check id or glob (at most {MAX_GLOB} characters)")
        return self


class ReportSection(Section):
    title: str = "Day0 acceptance report"
    out_dir: str = "reports"
    template_dir: Optional[str] = None
    signatories: list[Signatory] = []
    # Check ids (fnmatch globs) the verdict rests on: one that is skip, blocked, error or absent
    # makes the run INCOMPLETE (day0.core.record.run_verdict), so nobody accepts what was not verified.
    required: list[str] = []
    # Known failures accepted for now (day0.core.verdict.waiver_for): shown as waived, never as a pass.
    waivers: list[Waiver] = []

    @model_validator(mode="after")
    def _required_globs(self) -> "ReportSection":
        for i, glob in enumerate(self.required):
            if not REQUIRED_GLOB.fullmatch(glob):
                raise ValueError(f"required[{i}]: {reprlib.repr(glob)} is not a check id or glob (letters, digits, "
                                 f"_ . - and the glob characters * ? [ ], at most {MAX_GLOB} characters)")
        return self


class Profile(Section):
    name: str
    description: str = ""
    extends: Optional[str] = None
    model: ModelSection = ModelSection()
    engine: EngineSection = EngineSection()
    topology: TopologySection = TopologySection()
    preflight: PreflightSection = PreflightSection()
    weights: WeightsSection = WeightsSection()
    sla: SlaSection = SlaSection()
    kvcache: KvCacheSection = KvCacheSection()
    collectives: CollectivesSection = CollectivesSection()  # day0.config.collectives
    latency: LatencySection = LatencySection()  # day0.config.latency, with [sla]
    experts: ExpertsSection = ExpertsSection()  # day0.config.experts
    parity: ParitySection = ParitySection()  # day0.config.parity
    agents: AgentsSection = AgentsSection()  # day0.config.agents
    report: ReportSection = ReportSection()
    risks: RisksSection = RisksSection()
    compare: CompareSection = CompareSection()  # day0.config.compare
    # A site stage's own settings, [stages.<name>] (entry-point group day0.stages): validated by the
    # stage's settings model when it runs, since the profile cannot know which stages are installed.
    stages: dict[str, dict[str, Any]] = {}
    # Where the profile came from (file path or preset name); not a TOML key.
    origin: str = Field("", exclude=True)

    @model_validator(mode="after")
    def _name_is_text(self) -> "Profile":
        """Any name is kept as data (the run folder gets it through day0.core.names.file_name), but
        it must be text the record can be read back with: a lone surrogate (command-line or file-name
        bytes that are not UTF-8) would make run.json unreadable and lose the run."""
        if any("\ud800" <= c <= "\udfff" for c in self.name):
            raise ValueError(f"name: {self.name!r} is not Unicode text (bytes that are not UTF-8)")
        return self

    def resolved(self, *, redact: bool = True) -> dict[str, Any]:
        """The profile as it will be used, for run.json; secret-looking values are removed."""
        data = self.model_dump(mode="json")
        return self.redactor()(data) if redact else data

    def redactor(self, environ: Mapping[str, str] | None = None) -> Redactor:
        """What is secret in a run of this profile: values under secret keys (``engine.args.api_key``),
        the variable ``engine.api_key_env`` names, and variables named like secrets, the engine's own
        ``engine.env`` included (``HF_TOKEN``)."""
        environ = {**(os.environ if environ is None else environ), **self.engine.env}
        return Redactor.from_sources(environ=environ, env_names=[self.engine.api_key_env or ""],
                                     data=self.model_dump(mode="json"))


# --------------------------------------------------------------------------- loading


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.toml"))


def preset_path(name: str) -> Path:
    return PRESETS_DIR / f"{name}.toml"


def load_profile(ref: str | Path | None = None, *, overrides: dict[str, Any] | None = None) -> Profile:
    """Load a preset name or a TOML path, following ``extends``; raise ProfileError on any problem."""
    ref = str(ref) if ref is not None else DEFAULT_PROFILE
    path = _locate(ref, base=Path.cwd())
    data = _read_chain(path)
    if overrides:
        check_nesting(overrides, "--day0-set")
        if "extends" in overrides:  # applied after the chain is read: it would change the record, not the profile
            raise ProfileError("--day0-set: extends: a profile's parent cannot be overridden; name the profile "
                               "to run with --day0-profile")
        data = deep_merge(data, overrides)
    data.setdefault("name", path.stem)
    return validate(data, origin=str(path), overrides=overrides)


def validate(data: dict[str, Any], origin: str = "<profile>", overrides: dict[str, Any] | None = None) -> Profile:
    """The profile, or a ProfileError naming where the bad value came from: the file, or the
    ``--day0-set`` override that put it there (a typo on the command line is not the preset's)."""
    try:
        return Profile.model_validate({**data, "origin": origin})
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        where = origin
        if overrides and _set_by(overrides, [p for p in err["loc"] if isinstance(p, str)]):
            where = "--day0-set"
        raise ProfileError(f"{where}: {_first_error(exc)}") from None


def _set_by(overrides: dict[str, Any], loc: list[str]) -> bool:
    """Whether the key path (or a table above it) was given as an override."""
    cur: Any = overrides
    for part in loc:
        if not isinstance(cur, dict) or part not in cur:
            return False
        cur = cur[part]
    return True


def _locate(ref: str, base: Path) -> Path:
    if "\0" in ref:
        raise ProfileError(f"{ref!r}: not a profile name or path (it holds a NUL byte)")
    candidate = Path(ref)
    # A bare name that names a preset is the preset: a file of that name in the current folder (or
    # beside the profile) must not shadow it. A path says so with a "/" or ".toml" (./h200x8).
    bare_preset = candidate.suffix != ".toml" and "/" not in ref and preset_path(ref).is_file()
    if not bare_preset and (candidate.suffix == ".toml" or "/" in ref or os.path.lexists(base / candidate)):
        path = candidate if candidate.is_absolute() else (base / candidate)
        why = path_problem(path)
        if why:
            raise ProfileError(f"{path}: {'profile file not found' if why == 'does not exist' else why}")
        return path.resolve()
    path = preset_path(ref)
    if not path.is_file():
        raise ProfileError(f"{ref}: no such preset and no such file (presets: {', '.join(preset_names())})")
    return path


def _read_chain(path: Path) -> dict[str, Any]:
    """The profile at ``path`` merged over its ``extends`` ancestors.

    Why a loop with a bound rather than recursion: a chain of thousands of generated files, or a
    cycle, must end in one line naming the files, not in Python's recursion limit.
    """
    chain: list[Path] = []
    layers: list[dict[str, Any]] = []
    while True:
        if path in chain:
            cycle = " -> ".join(str(p) for p in (*chain, path))
            raise ProfileError(f"{path}: extends forms a cycle ({cycle})")
        if len(chain) >= MAX_EXTENDS:
            raise ProfileError(f"{chain[0]}: extends: chain of more than {MAX_EXTENDS} files "
                               f"({chain[0]} -> {chain[1]} -> ... -> {path})")
        chain.append(path)
        data = _read_file(path)
        layers.append(data)
        parent = data.get("extends")
        if parent is None:
            break
        if not isinstance(parent, str):
            raise ProfileError(f"{path}: extends: expected a string (a preset name or a path)")
        try:
            path = _locate(parent, base=path.parent)
        except ProfileError as exc:
            raise ProfileError(f"{path}: extends: {exc}") from None
    merged = layers.pop()
    while layers:
        merged.pop("name", None)
        merged.pop("description", None)
        merged = deep_merge(merged, layers.pop())
    return merged


def _read_file(path: Path) -> dict[str, Any]:
    """One profile file as TOML: a regular UTF-8 file of bounded size and nesting, or one line why not."""
    try:
        text = decode_utf8(read_regular(path, "profile", MAX_PROFILE_BYTES), str(path))
    except InputError as exc:
        raise ProfileError(str(exc)) from None
    return toml_table(text, str(path))


def toml_table(text: str, where: str) -> dict[str, Any]:
    """TOML text (a profile, a stage's settings file) as a table, or a ProfileError naming ``where``:
    invalid TOML, nesting past :data:`MAX_NESTING` (deep enough to exhaust the parser's recursion
    first), an integer of more digits than Python converts."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{where}: not valid TOML ({exc})") from None
    except RecursionError:
        raise ProfileError(f"{where}: arrays or tables nested deeper than {MAX_NESTING} levels") from None
    except ValueError as exc:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise ProfileError(f"{where}: not usable TOML ({str(exc).split(';')[0]})") from None
    check_nesting(data, where)
    return data


def check_nesting(data: dict[str, Any], where: str) -> None:
    """Refuse tables and arrays nested deeper than :data:`MAX_NESTING`, and a key holding a NUL byte
    (TOML's ``\\u0000``), naming the key path.

    Why: merging, validating and redacting a profile all walk it recursively; and a key becomes a
    flag, a variable or a path, none of which can hold a NUL (the OS refuses it later as "embedded
    null byte", naming nothing). A value may (a run's name is made safe where it becomes a path);
    the engine's arguments and environment are checked where they are declared.
    """
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        value, key, depth = stack.pop()
        if depth > MAX_NESTING:
            raise ProfileError(f"{where}: {key or 'top level'}: arrays or tables nested deeper than "
                               f"{MAX_NESTING} levels")
        if "\0" in key:  # a key becomes a flag, a variable or a heading; a value may be a name (made safe where used)
            raise ProfileError(f"{where}: {key}: the key holds a NUL byte, which no flag, variable or path can")
        if isinstance(value, dict):
            stack.extend((v, f"{key}.{k}" if key else str(k), depth + 1) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, key, depth + 1) for v in value)


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Tables merge key by key; any other value (arrays included) is replaced whole."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _known_keys(loc: tuple[Any, ...]) -> list[str]:
    """The keys the table at ``loc`` (a key path ending in the unknown key) accepts."""
    return known_keys(Profile, loc)


def _first_error(exc: ValidationError) -> str:
    """``key.path: why`` for the first error (day0.config.errors), key paths from the profile's top."""
    return first_error(exc, Profile)


def _split_assignment(text: str) -> tuple[str, str] | None:
    """KEY=VALUE at the first ``=`` outside a quoted key part (``engine.env."A=B"=1``); None without one."""
    quote = ""
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "=":
            return text[:i], text[i + 1:]
    return None


def _key_parts(key: str, shown: str) -> list[str]:
    """The key path as TOML reads a dotted key, so a quoted part keeps its dots
    (``compare.tolerances."collectives.*.busbw"``); an unquoted path splits on every dot, as before."""
    key = key.strip()
    if '"' not in key and "'" not in key:
        return [part.strip() for part in key.split(".")]  # as TOML reads `a. b`: the blank is not the key's
    try:
        cur: Any = tomllib.loads(f"{key} = 0")
    except (tomllib.TOMLDecodeError, RecursionError, ValueError):
        raise ProfileError(f"override {shown!r}: the key path is not a TOML dotted key") from None
    parts: list[str] = []
    while isinstance(cur, dict) and len(cur) == 1:
        (name, cur), = cur.items()
        parts.append(name)
    return parts


def parse_override(text: str) -> dict[str, Any]:
    """``engine.args.max_num_seqs=8`` -> nested dict; the value is parsed as TOML (falls back to a string)."""
    shown = text if len(text) <= 80 else text[:77] + "..."
    split = _split_assignment(text)
    if split is None:
        raise ProfileError(f"override {shown!r}: expected KEY.PATH=VALUE")
    key, raw = split
    parts = _key_parts(key, shown)
    if not all(p.strip() for p in parts):
        raise ProfileError(f"override {shown!r}: the key path has an empty part")
    if len(parts) > MAX_NESTING:
        raise ProfileError(f"override {shown!r}: a key path of more than {MAX_NESTING} parts")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    except (RecursionError, ValueError):  # nested past the recursion limit, or a number past int() limits
        raise ProfileError(f"override {shown!r}: the value is not usable TOML (too deep or too long)") from None
    out: dict[str, Any] = {}
    cur = out
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
    cur[parts[-1]] = value
    return out
