"""Target profiles: one TOML file describes the deployment under test.

Presets ship in ``day0/presets``; a user's file may say ``extends = "h200x8"`` (or a path) and
override any key. Validation is strict (unknown keys, wrong types, missing values) and every
error is one line that names the file and the dotted key path, because a typo in a profile for
a 32-GPU allocation should cost seconds, not the allocation.
"""

from __future__ import annotations

import copy
import os
import re
import tomllib
from pathlib import Path
from typing import Any, Literal, Mapping, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from day0.config.collectives import CollectivesSection
from day0.config.compare import CompareSection
from day0.config.errors import first_error, known_keys
from day0.config.latency import LatencySection, SlaSection
from day0.config.risks import AccuracySettings, CostSettings, IsolationSettings
from day0.config.topology import (  # noqa: F401  (the bounds are read through the profile too)
    MAX_DEVICE_MEMORY_GIB,
    MAX_DEVICES_PER_NODE,
    MAX_NODES,
    TopologySection,
)
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


class ProfileError(ValueError):
    """A profile that cannot be used; the message is one line naming file and key path."""


class _Section(BaseModel):
    # inf and nan are TOML floats; no key here means "unbounded" by inf, and nan passes no check.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class TinySpec(_Section):
    """The embedded model: a Llama shaped for the CPU attention backend (head_dim 64)."""

    # Upper bounds keep it tiny: it is built with random weights on whatever machine runs day0.
    hidden_size: int = Field(256, gt=0, le=8192)
    intermediate_size: int = Field(512, gt=0, le=32768)
    num_hidden_layers: int = Field(4, gt=0, le=128)
    num_attention_heads: int = Field(4, gt=0, le=256)
    num_key_value_heads: int = Field(2, gt=0, le=256)
    vocab_size: int = Field(384, ge=300, le=65536, description="BPE target; 256 byte tokens + merges")
    max_position_embeddings: int = Field(131072, gt=0, le=1 << 24)
    num_shards: int = Field(3, ge=1, le=64)
    seed: int = 0
    rope_theta: float = 10000.0

    @model_validator(mode="after")
    def _heads(self) -> "TinySpec":
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be divisible by num_attention_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be divisible by num_key_value_heads")
        return self


class ModelSection(_Section):
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


class EngineSection(_Section):
    mode: Literal["inprocess", "server", "external"] = "server"
    url: Optional[str] = None  # external mode: base URL, e.g. http://10.0.0.5:8000
    startup_timeout_s: float = Field(600.0, gt=0)
    shutdown_timeout_s: float = Field(30.0, gt=0)
    request_timeout_s: float = Field(120.0, gt=0)
    api_key_env: Optional[str] = None  # name of the env var holding the API key, never the key
    env: dict[str, str] = {}
    args: dict[str, Any] = {}  # vLLM engine arguments, passed through unchanged

    @model_validator(mode="after")
    def _url(self) -> "EngineSection":
        if self.mode == "external" and not self.url:
            raise ValueError("url: required when mode = \"external\"")
        return self


class KvCacheSection(_Section):
    """Limits and the long-context workload of the kvcache stage (docs/stages/kvcache.md)."""

    fragmentation_limit: float = Field(0.05, gt=0, lt=1)
    target_context: int = Field(16384, gt=0, le=1 << 40)
    target_concurrency: int = Field(1, ge=1, le=1 << 30)
    # Workload: total context (prompt + output) of each long request; empty: target_context, /2, /4, /8.
    context_lengths: list[int] = []
    short_requests: int = Field(4, ge=0)  # short requests mixed in (chat-sized)
    short_lengths: list[int] = [256, 1024]  # [lo, hi] total context (prompt + output) of a short request
    shared_prefix_tokens: int = Field(3000, ge=0)  # 0: no shared-prefix requests
    shared_prefix_requests: int = Field(2, ge=0)  # requests starting with that one prefix
    output_tokens: int = Field(160, ge=3)  # per request (ignore_eos); must outlast the prefill of the rest
    workload_timeout_s: float = Field(600.0, gt=0)
    # Thresholds
    max_preemptions: int = Field(0, ge=0)
    min_capacity_margin: float = Field(0.0, ge=0)  # KV pool / (target_context x concurrency) - 1
    agreement_limit: float = Field(0.01, gt=0, lt=1)  # |exact - /metrics estimate|, absolute (0.01 = 1 pp)
    # Prefix-cache correctness: greedy tokens of a long prompt, cold then warm
    prefix_check_tokens: int = Field(4096, gt=1)
    prefix_check_output_tokens: int = Field(16, gt=0)
    scrape_interval_s: float = Field(0.05, gt=0)  # /metrics period of the black-box view in the steady window
    blackbox_passes: int = Field(3, ge=1)  # the workload again (fresh cache salt) until enough scrapes resolve
    min_resolved_scrapes: int = Field(5, ge=1)  # resolved /metrics scrapes that end the passes early
    seed: int = 0

    @model_validator(mode="after")
    def _workload(self) -> "KvCacheSection":
        if any(n <= self.output_tokens for n in self.context_lengths):
            raise ValueError(f"context_lengths: every length must exceed output_tokens ({self.output_tokens})")
        if len(self.short_lengths) != 2 or not self.output_tokens < self.short_lengths[0] <= self.short_lengths[1]:
            raise ValueError(f"short_lengths: expected [lo, hi] with output_tokens ({self.output_tokens}) < lo <= hi")
        if self.prefix_check_output_tokens >= self.prefix_check_tokens:
            raise ValueError("prefix_check_output_tokens: must be below prefix_check_tokens")
        return self


class WeightsSection(_Section):
    verify_manifest: bool = True  # check day0-manifest.json's SHA-256 per shard when present
    manifest: str = "day0-manifest.json"
    hash_workers: int = Field(0, ge=0)  # 0: one per usable CPU
    max_checks_per_category: int = Field(200, ge=1)
    memory_tolerance: float = Field(0.10, ge=0)  # measured weights per rank vs plan, relative
    load_time_limit_s: Optional[float] = Field(None, gt=0)  # engine start-up incl. weight loading
    golden: Optional[str] = None  # greedy tokens from a trusted run (day0 weights golden)


class PreflightSection(_Section):
    # peak activations, graphs and communicator buffers per rank, which vLLM measures at start-up
    activation_headroom_gib: float = Field(2.0, ge=0, le=MAX_DEVICE_MEMORY_GIB)


class RisksSection(_Section):
    """[risks]: tenant isolation, quantization accuracy, cost (tables in day0.config.risks)."""

    isolation: IsolationSettings = IsolationSettings()
    accuracy: AccuracySettings = AccuracySettings()
    cost: CostSettings = CostSettings()


class Signatory(_Section):
    name: str
    role: str


REQUIRED_GLOB = re.compile(r"[A-Za-z0-9_.*?\[\]!-]+")


class ReportSection(_Section):
    title: str = "Day0 acceptance report"
    out_dir: str = "reports"
    template_dir: Optional[str] = None
    signatories: list[Signatory] = []
    # Check ids (fnmatch globs) the verdict rests on: one that is skip, blocked, error or absent
    # makes the run INCOMPLETE (day0.core.record.run_verdict), so nobody accepts what was not verified.
    required: list[str] = []

    @model_validator(mode="after")
    def _required_globs(self) -> "ReportSection":
        for i, glob in enumerate(self.required):
            if not REQUIRED_GLOB.fullmatch(glob):
                raise ValueError(f"required[{i}]: {glob!r} is not a check id or glob "
                                 "(letters, digits, _ . - and the glob characters * ? [ ])")
        return self


class Profile(_Section):
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
    report: ReportSection = ReportSection()
    risks: RisksSection = RisksSection()
    compare: CompareSection = CompareSection()  # day0.config.compare
    # Where the profile came from (file path or preset name); not a TOML key.
    origin: str = Field("", exclude=True)

    def resolved(self, *, redact: bool = True) -> dict[str, Any]:
        """The profile as it will be used, for run.json; secret-looking values are removed."""
        data = self.model_dump(mode="json")
        return self.redactor()(data) if redact else data

    def redactor(self, environ: Mapping[str, str] | None = None) -> Redactor:
        """What is secret in a run of this profile: values under secret keys (``engine.args.api_key``),
        the variables ``api_key_env`` names, and variables named like secrets, the engine's own
        ``engine.env`` included (``HF_TOKEN``)."""
        environ = {**(os.environ if environ is None else environ), **self.engine.env}
        names = [self.engine.api_key_env or "", self.latency.api_key_env]
        return Redactor.from_sources(environ=environ, env_names=names, data=self.model_dump(mode="json"))


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
        _check_nesting(overrides, "--day0-set")
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
    if candidate.suffix == ".toml" or "/" in ref or os.path.lexists(candidate):
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
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path}: not valid TOML ({exc})") from None
    except RecursionError:
        raise ProfileError(f"{path}: arrays or tables nested deeper than {MAX_NESTING} levels") from None
    except ValueError as exc:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise ProfileError(f"{path}: not usable TOML ({str(exc).split(';')[0]})") from None
    _check_nesting(data, str(path))
    return data


def _check_nesting(data: dict[str, Any], where: str) -> None:
    """Refuse tables and arrays nested deeper than :data:`MAX_NESTING`, naming the key path.

    Why: merging, validating and redacting a profile all walk it recursively.
    """
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        value, key, depth = stack.pop()
        if depth > MAX_NESTING:
            raise ProfileError(f"{where}: {key or 'top level'}: arrays or tables nested deeper than "
                               f"{MAX_NESTING} levels")
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


def redact_secrets(data: Any) -> Any:
    """Values under keys that name a secret, redacted (day0.core.redact has the one rule)."""
    return Redactor()(data)


def parse_override(text: str) -> dict[str, Any]:
    """``engine.args.max_num_seqs=8`` -> nested dict; the value is parsed as TOML (falls back to a string)."""
    shown = text if len(text) <= 80 else text[:77] + "..."
    if "=" not in text:
        raise ProfileError(f"override {shown!r}: expected KEY.PATH=VALUE")
    key, raw = text.split("=", 1)
    parts = key.strip().split(".")
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
