"""Static audit of a safetensors checkpoint: index, shard files, headers, config, manifest.

Why static: a checkpoint that is missing a shard, was truncated by a failed copy, or belongs to a
different config fails minutes into an engine start-up (or, worse, loads and produces garbage).
Every one of those faults is visible in the index, the shard headers and ``config.json`` alone,
so this audit reads only those (kilobytes per shard, seconds for a 1,000-shard checkpoint) and
names each broken shard and tensor before any engine is started.

Every problem becomes one failed :class:`~day0.core.record.Check`; a category without problems gives
one passing summary check; a category that cannot be judged (no config, no manifest) gives one
skip saying why. Broken input never raises out of :func:`audit`.
"""

from __future__ import annotations

import gc
import json
import math
import sys
import time
import traceback
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from day0.core.record import Check
from day0.model.safetensors_header import (
    HeaderError,
    ShardHeader,
    TensorEntry,
    loads_json,
    parse_header,
    read_header_bytes,
)
from day0.stages.weights import manifest as manifest_mod
from day0.stages.weights.manifest import MANIFEST_NAME, ManifestError, Progress

INDEX_NAME = "model.safetensors.index.json"
CONFIG_NAME = "config.json"
SOURCE = "static"
DEFAULT_MAX_CHECKS_PER_CATEGORY = 200
_PROBE_READS = 8  # header reads timed before deciding whether threads would help
_SLOW_READ_S = 0.0005  # slower than this per header read: a remote file system, read in parallel

# Buffers some exporters save that vLLM skips when it loads weights.
IGNORED_TENSOR_SUFFIXES: tuple[str, ...] = ("rotary_emb.inv_freq",)
# Tensors published in F32 whatever the model dtype (DeepSeek-V3's router bias).
F32_BY_DESIGN_SUFFIXES: tuple[str, ...] = ("e_score_correction_bias",)
FP8_SCALE_SUFFIX = "_scale_inv"  # block-wise FP8 (DeepSeek-V3, Qwen3-FP8): W.weight + W.weight_scale_inv

TORCH_DTYPES: dict[str, str] = {
    "bfloat16": "BF16",
    "float16": "F16",
    "half": "F16",
    "float32": "F32",
    "float": "F32",
    "float64": "F64",
    "double": "F64",
}

TITLES: dict[str, str] = {
    "weights.index": "Shard index readable and well-formed",
    "weights.config": "config.json readable and describes a known model",
    "weights.shards_present": "Every shard named in the index exists",
    "weights.orphan_shards": "No shard file outside the index",
    "weights.shard_header": "Every shard header is readable",
    "weights.shard_layout": "Shard data offsets are contiguous and match dtype x shape",
    "weights.shard_size": "Shard file sizes match their headers (no truncation or padding)",
    "weights.tensor_placement": "Every tensor is in the shard the index names, and only there",
    "weights.total_size": "Index metadata.total_size matches the shards",
    "weights.dtypes": "Tensor dtypes agree with config.json",
    "weights.shapes": "Tensor names and shapes agree with config.json",
    "weights.param_count": "Parameter count agrees with config.json",
    "weights.manifest": "Files match the SHA-256 manifest",
}
CATEGORIES: tuple[str, ...] = tuple(TITLES)


def audit(
    model_dir: Path,
    *,
    verify_manifest: bool = True,
    workers: int | None = None,
    progress: Progress = False,
    manifest_name: str = MANIFEST_NAME,
    max_checks_per_category: int = DEFAULT_MAX_CHECKS_PER_CATEGORY,
) -> list[Check]:
    """Audit ``model_dir`` without loading tensor data; one check list, every problem in it.

    ``workers`` bounds the threads that read headers and hash files (default: usable CPUs).
    ``progress`` is True for a stderr bar, or a callable ``(bytes_done, bytes_total)`` for hashing.
    At most ``max_checks_per_category`` failed checks are emitted per category; the rest are
    folded into one more failed check whose evidence table lists them all.
    """
    run = _Audit(Path(model_dir), verify_manifest, workers, progress, manifest_name)
    try:
        with _gc_paused():
            run.run()
    except Exception as exc:  # a bug here must not cost the caller the checks already made
        run.crash(exc)
    return run.checks(max_checks_per_category)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while building ~10 objects per tensor.

    Why: a 200,000-tensor checkpoint makes millions of long-lived objects and no cycles; the
    collector's repeated full passes over them cost about a third of the audit's CPU time.
    The previous state is restored, whatever happens.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def write_manifest(
    model_dir: Path,
    *,
    workers: int | None = None,
    progress: Progress = False,
    manifest_name: str = MANIFEST_NAME,
) -> Path:
    """Hash every shard (plus the index and config.json) into ``model_dir/day0-manifest.json``.

    Raises :class:`~day0.stages.weights.manifest.ManifestError` (one line) when there is nothing to hash or a
    file cannot be read; unlike :func:`audit` this is a command, so failure is an exception.
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ManifestError(f"{model_dir}: not a directory")
    shards, _ = _shard_names(model_dir)
    present = [s for s in shards if (model_dir / s).is_file()]
    if not present:
        raise ManifestError(f"{model_dir}: no safetensors shard to hash")
    extra = [n for n in (INDEX_NAME, CONFIG_NAME) if (model_dir / n).is_file()]
    return manifest_mod.write(model_dir, present + extra, workers=workers, progress=progress,
                              manifest_name=manifest_name)


# --------------------------------------------------------------------------- internals


@dataclass
class _Finding:
    message: str
    shard: str | None = None
    tensor: str | None = None
    value: Any = None
    limit: Any = None
    unit: str = ""


@dataclass
class _Summary:
    status: str  # pass | skip
    message: str
    value: Any = None
    limit: Any = None
    unit: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)


def _shard_names(model_dir: Path) -> tuple[list[str], dict[str, str] | None]:
    """(shard names, weight_map or None): the index's shards, else every *.safetensors file."""
    index_path = model_dir / INDEX_NAME
    if index_path.is_file():
        try:
            weight_map = loads_json(index_path.read_bytes()).get("weight_map")
            if isinstance(weight_map, dict):
                names = sorted({v for v in weight_map.values() if isinstance(v, str)})
                return names, weight_map
        except (OSError, ValueError, AttributeError):
            pass
    return sorted(p.name for p in model_dir.glob("*.safetensors")), None


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"


class _Audit:
    """One audit run: collects findings per category, then renders them as checks."""

    def __init__(self, model_dir: Path, verify_manifest: bool, workers: int | None,
                 progress: Progress, manifest_name: str) -> None:
        self.dir = model_dir
        self.verify_manifest = verify_manifest
        self.workers = workers or manifest_mod.default_workers()
        self.progress = progress
        self.manifest_name = manifest_name
        self.findings: dict[str, list[_Finding]] = {c: [] for c in CATEGORIES}
        self.summaries: dict[str, _Summary] = {}
        self.crashed: Check | None = None
        # what the run learns
        self.weight_map: dict[str, str] | None = None  # tensor -> shard, when the index is usable
        self.index_meta: dict[str, Any] = {}
        self.shards: list[str] = []  # the files that make up the checkpoint
        self.missing: set[str] = set()
        self.headers: dict[str, ShardHeader] = {}
        self.unreadable: set[str] = set()
        self.located: dict[str, list[str]] = {}  # tensor -> shards whose header holds it

    # ----------------------------------------------------------------- bookkeeping

    def fail(self, cat: str, message: str, **kw: Any) -> None:
        self.findings[cat].append(_Finding(message, **kw))

    def ok(self, cat: str, message: str, **kw: Any) -> None:
        self.summaries[cat] = _Summary("pass", message, **kw)

    def skip(self, cat: str, message: str) -> None:
        self.summaries.setdefault(cat, _Summary("skip", message))

    def crash(self, exc: BaseException) -> None:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        self.crashed = Check(
            id="weights.audit",
            title="Static weights audit ran to completion",
            status="error",
            message=f"{self.dir}: audit stopped by {type(exc).__name__}: {exc} (a day0 bug; checks above still hold)",
            evidence={"log_excerpt": tb[-4000:]},
            source=SOURCE,
        )

    def checks(self, cap: int) -> list[Check]:
        out: list[Check] = []
        for cat in CATEGORIES:
            found = self.findings[cat]
            if found:
                for f in found[:cap]:
                    ev = {k: v for k, v in (("shard", f.shard), ("tensor", f.tensor)) if v is not None}
                    out.append(Check(id=cat, title=TITLES[cat], status="fail", value=f.value, limit=f.limit,
                                     unit=f.unit, direction="exact", message=f.message, evidence=ev,
                                     source=SOURCE))
                rest = found[cap:]
                if rest:
                    out.append(Check(
                        id=cat, title=TITLES[cat], status="fail", value=len(found), limit=0, unit="problems",
                        direction="exact",
                        message=f"{len(rest)} more {cat} problems (of {len(found)}), first: {rest[0].message}",
                        evidence={"table": {"columns": ["shard", "tensor", "message"],
                                            "rows": [[f.shard, f.tensor, f.message] for f in rest]}},
                        source=SOURCE,
                    ))
                continue
            s = self.summaries.get(cat) or _Summary("skip", "not checked: an earlier problem stopped the audit")
            out.append(Check(id=cat, title=TITLES[cat], status=s.status, value=s.value,  # type: ignore[arg-type]
                             limit=s.limit, unit=s.unit, direction="exact", message=s.message,
                             evidence=s.evidence, source=SOURCE))
        if self.crashed is not None:
            out.append(self.crashed)
        return out

    # ----------------------------------------------------------------- the audit

    def run(self) -> None:
        if not self.dir.is_dir():
            why = "does not exist" if not self.dir.exists() else "is not a directory"
            self.fail("weights.index", f"{self.dir}: {why}")
            for cat in CATEGORIES[1:]:
                self.skip(cat, f"not checked: model folder {self.dir} {why}")
            return
        self._index()
        self._presence()
        self._orphans()
        self._read_headers()
        self._placement()
        self._total_size()
        self._against_config()
        self._manifest()

    def _index(self) -> None:
        path = self.dir / INDEX_NAME
        on_disk = sorted(p.name for p in self.dir.glob("*.safetensors"))
        if not path.exists():
            self.shards = on_disk
            if not on_disk:
                others = sorted(p.name for p in self.dir.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".gguf"))
                hint = f" (found {', '.join(others[:3])}: this audit covers safetensors only)" if others else ""
                self.fail("weights.index", f"{self.dir}: no {INDEX_NAME} and no *.safetensors file{hint}")
            else:
                kind = "single-file checkpoint" if len(on_disk) == 1 else f"{len(on_disk)} *.safetensors files"
                self.ok("weights.index", f"no {INDEX_NAME}: {kind}, vLLM loads every *.safetensors file",
                        value=len(on_disk), unit="shards")
            self.skip("weights.shards_present", f"not checked: no {INDEX_NAME} names shards that could be missing")
            self.skip("weights.orphan_shards", f"not checked: without {INDEX_NAME} every *.safetensors file is a shard")
            self.skip("weights.total_size", f"not checked: no {INDEX_NAME}")
            return
        fallback = f"; auditing the {len(on_disk)} *.safetensors files found instead"
        try:
            doc = loads_json(path.read_bytes())
        except (OSError, UnicodeDecodeError) as exc:
            return self._index_unusable(f"{INDEX_NAME}: cannot read ({exc}){fallback}", on_disk)
        except json.JSONDecodeError as exc:
            return self._index_unusable(
                f"{INDEX_NAME}: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno}){fallback}", on_disk)
        weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(weight_map, dict):
            return self._index_unusable(f"{INDEX_NAME}: no \"weight_map\" object{fallback}", on_disk)
        good: dict[str, str] = {}
        verdicts: dict[Any, bool] = {}  # per distinct shard value: thousands of tensors share one
        for tensor, shard in weight_map.items():
            try:
                fine = verdicts[shard]
            except (KeyError, TypeError):
                fine = isinstance(shard, str) and bool(shard) and not (
                    Path(shard).is_absolute() or ".." in Path(shard).parts)
                if isinstance(shard, str):
                    verdicts[shard] = fine
            if fine:
                good[tensor] = shard
            elif not isinstance(shard, str) or not shard:
                self.fail("weights.index", f"{INDEX_NAME}: weight_map[{tensor!r}] is {shard!r}, not a file name",
                          tensor=tensor)
            else:
                self.fail("weights.index", f"{INDEX_NAME}: weight_map[{tensor!r}] = {shard!r} points outside the model folder",
                          tensor=tensor, shard=shard)
        meta = doc.get("metadata")
        self.index_meta = meta if isinstance(meta, dict) else {}
        self.weight_map = good
        self.shards = sorted(set(good.values()))
        if not good:
            self.fail("weights.index", f"{INDEX_NAME}: weight_map names no tensor")
        self.ok("weights.index", f"{INDEX_NAME}: {len(good)} tensors in {len(self.shards)} shards",
                value=len(self.shards), unit="shards")

    def _index_unusable(self, message: str, on_disk: list[str]) -> None:
        self.fail("weights.index", message)
        self.shards = on_disk
        for cat in ("weights.shards_present", "weights.orphan_shards", "weights.total_size"):
            self.skip(cat, f"not checked: {INDEX_NAME} is unusable")

    def _presence(self) -> None:
        if self.weight_map is None:
            return
        per_shard = Counter(self.weight_map.values())
        total = 0
        for shard in self.shards:
            path = self.dir / shard
            if path.is_file():
                total += path.stat().st_size
                continue
            self.missing.add(shard)
            if path.is_symlink():
                why = f"is a symlink to {path.readlink()}, which does not exist (incomplete download?)"
            elif path.exists():
                why = "is not a regular file"
            else:
                why = f"is missing from {self.dir}"
            self.fail("weights.shards_present",
                      f"{shard}: named in the index for {per_shard[shard]} tensors but {why}", shard=shard)
        self.ok("weights.shards_present",
                f"all {len(self.shards)} shards named in the index exist ({_human(total)} in all)",
                value=len(self.shards), limit=len(self.shards), unit="shards")

    def _orphans(self) -> None:
        if self.weight_map is None:
            return
        named = set(self.shards)
        for path in sorted(self.dir.glob("*.safetensors")):
            if path.name in named:
                continue
            try:
                size = _human(path.stat().st_size)
            except OSError:
                size = "unreadable"
            self.fail("weights.orphan_shards",
                      f"{path.name} ({size}) is not named in {INDEX_NAME}; vLLM skips it: delete it or regenerate the index",
                      shard=path.name)
        self.ok("weights.orphan_shards", f"no *.safetensors file outside {INDEX_NAME}", value=0, limit=0, unit="files")

    def _read_headers(self) -> None:
        todo = [s for s in self.shards if s not in self.missing]
        bar = None
        if self.progress is True and len(todo) > 1:
            from tqdm import tqdm

            bar = tqdm(total=len(todo), unit="shard", desc="headers", file=sys.stderr, leave=False)

        def fetch(shard: str) -> tuple[bytes, int] | HeaderError:
            try:
                return read_header_bytes(self.dir / shard, shard)
            except HeaderError as exc:
                return exc

        def parse(shard: str, got: tuple[bytes, int] | HeaderError) -> ShardHeader | HeaderError:
            if bar is not None:
                bar.update(1)
            if isinstance(got, HeaderError):
                return got
            try:
                return parse_header(got[0], got[1], shard)
            except HeaderError as exc:
                return exc

        # A local or page-cached read takes tens of microseconds, and threads would only add GIL
        # hand-offs; a network file system (Lustre, NFS, a FUSE bucket) takes milliseconds per
        # open, and there threads overlap the waits. So time a few reads first and decide.
        # Parsing holds the GIL either way and stays in this thread, consuming reads in order.
        try:
            probe = todo[:_PROBE_READS]
            t0 = time.perf_counter()
            fetched = [fetch(s) for s in probe]
            per_read = (time.perf_counter() - t0) / max(1, len(probe))
            results = [parse(s, got) for s, got in zip(probe, fetched)]
            rest = todo[len(probe):]
            if rest and self.workers > 1 and per_read > _SLOW_READ_S:
                with ThreadPoolExecutor(max_workers=min(4 * self.workers, 32), thread_name_prefix="day0-header") as pool:
                    results += [parse(s, got) for s, got in zip(rest, pool.map(fetch, rest))]
            else:
                results += [parse(s, fetch(s)) for s in rest]
        finally:
            if bar is not None:
                bar.close()
        n_tensors = header_bytes = 0
        rows = []
        for shard, res in zip(todo, results):
            if isinstance(res, HeaderError):
                self.unreadable.add(shard)
                self.fail("weights.shard_header", str(res), shard=shard)
                continue
            self.headers[shard] = res
            n_tensors += len(res.tensors)
            header_bytes += res.header_len
            rows.append([shard, res.file_size, len(res.tensors), res.header_len])
            for name in res.tensors:
                self.located.setdefault(name, []).append(shard)
            for p in res.problems:
                cat = "weights.shard_size" if p.kind == "size" else "weights.shard_layout"
                self.fail(cat, p.message, shard=shard, tensor=p.tensor, value=p.value, limit=p.limit,
                          unit="bytes" if p.kind == "size" else "")
        if not todo:
            for cat in ("weights.shard_header", "weights.shard_layout", "weights.shard_size"):
                self.skip(cat, "not checked: no shard file to read")
            return
        table = {"columns": ["shard", "bytes", "tensors", "header bytes"], "rows": rows[:2000]}
        self.ok("weights.shard_header",
                f"{len(self.headers)} shard headers read: {n_tensors} tensors, {_human(header_bytes)} of JSON",
                value=len(self.headers), unit="shards", evidence={"table": table})
        self.ok("weights.shard_layout",
                f"in all {len(self.headers)} readable shards the tensors tile the data exactly (dtype x shape = bytes)",
                value=n_tensors, unit="tensors")
        total = sum(h.file_size for h in self.headers.values())
        self.ok("weights.shard_size",
                f"all {len(self.headers)} readable shards are exactly the size their headers declare ({_human(total)})",
                value=total, limit=total, unit="bytes")

    def _placement(self) -> None:
        cat = "weights.tensor_placement"
        if not self.headers:
            self.skip(cat, "not checked: no readable shard header")
            return
        unverified = 0
        if self.weight_map is not None:
            for tensor, shard in self.weight_map.items():
                if shard not in self.headers:
                    unverified += 1  # missing or unreadable shard: reported once, per shard
                    continue
                if tensor in self.headers[shard].tensors:
                    continue
                elsewhere = [s for s in self.located.get(tensor, []) if s != shard]
                where = f" (it is in {', '.join(elsewhere)})" if elsewhere else ""
                self.fail(cat, f"{shard}: tensor {tensor} is listed in the index for this shard but is not in its header{where}",
                          shard=shard, tensor=tensor)
        for tensor, shards in self.located.items():
            indexed = self.weight_map.get(tensor) if self.weight_map is not None else None
            if len(shards) > 1:
                note = f"; the index names {indexed}" if indexed else ""
                self.fail(cat, f"tensor {tensor} is in the headers of {len(shards)} shards: {', '.join(shards)}{note}",
                          shard=shards[0], tensor=tensor, value=len(shards), limit=1, unit="shards")
            elif self.weight_map is not None and indexed is None:
                self.fail(cat, f"{shards[0]}: tensor {tensor} is in the header but not in {INDEX_NAME}",
                          shard=shards[0], tensor=tensor)
        if self.weight_map is not None:
            note = f" ({unverified} tensors of missing/unreadable shards not verifiable)" if unverified else ""
            self.ok(cat, f"each of {len(self.weight_map) - unverified} indexed tensors is in the header of the shard "
                         f"the index names, and only there{note}", value=len(self.weight_map) - unverified, unit="tensors")
        else:
            self.ok(cat, f"no tensor appears in more than one of the {len(self.headers)} shards",
                    value=len(self.located), unit="tensors")

    def _total_size(self) -> None:
        cat = "weights.total_size"
        if self.weight_map is None:
            return
        declared = self.index_meta.get("total_size")
        if declared is None:
            self.skip(cat, f"not checked: {INDEX_NAME} has no metadata.total_size")
            return
        if self.missing or self.unreadable or len(self.headers) != len(self.shards):
            self.skip(cat, "not checked: some shards are missing or unreadable")
            return
        actual = sum(t.nbytes for h in self.headers.values() for t in h.tensors.values())
        if not isinstance(declared, (int, float)) or int(declared) != actual:
            self.fail(cat, f"{INDEX_NAME}: metadata.total_size is {declared!r} bytes, the shards' tensors hold {actual} "
                           "(index written for other shards?)", value=actual, limit=declared, unit="bytes")
            return
        self.ok(cat, f"metadata.total_size {actual} bytes = sum of tensor bytes in the shards",
                value=actual, limit=int(declared), unit="bytes")

    # ----------------------------------------------------------------- config: dtypes, shapes, count

    def _against_config(self) -> None:
        config = self._config()
        later = ("weights.dtypes", "weights.shapes", "weights.param_count")
        if config is None:
            for cat in later:
                self.skip(cat, f"not checked: {CONFIG_NAME} unusable")
            return
        from day0.model import archs  # lazy: the audit's file checks must work even if archs breaks

        arch: str | None = None
        arch_error = ""
        try:
            arch = archs.architecture(config)
        except ValueError as exc:  # not a model day0 knows: shapes are skipped, dtypes still checked
            arch_error = str(exc)
        except (TypeError, KeyError, IndexError, AttributeError) as exc:
            arch_error = f"{CONFIG_NAME}: 'architectures' is malformed ({exc})"
            self.fail("weights.config", arch_error)
        dtype = _config_dtype(config) or "no torch_dtype"
        quant = config.get("quantization_config")
        qnote = f", quantized ({quant.get('quant_method')})" if isinstance(quant, dict) else ""
        self.ok("weights.config", f"{CONFIG_NAME}: {arch or 'architecture unknown to day0'}, "
                                  f"{config.get('num_hidden_layers')} layers, {dtype}{qnote}")
        if not self.headers:
            for cat in later:
                self.skip(cat, "not checked: no readable shard header")
            return
        fp8_block: tuple[int, int] | None = None
        if isinstance(quant, dict):
            method = quant.get("quant_method")
            block = quant.get("weight_block_size")
            if method == "fp8" and isinstance(block, list) and len(block) == 2 and all(_pos_int(b) for b in block):
                fp8_block = (int(block[0]), int(block[1]))
            else:
                msg = (f"not checked: quantized checkpoint (quant_method={method!r}); day0's expected tensors "
                       "describe the unquantized model")
                for cat in later:
                    self.skip(cat, msg)
                return
        expected: dict[str, tuple[int, ...]] | None = None
        optional: dict[str, tuple[int, ...]] = {}
        if arch is not None:
            try:
                expected = archs.expected_tensors(config)
                if archs.num_mtp_layers(config):
                    optional = {k: v for k, v in archs.expected_tensors(config, include_mtp=True).items()
                                if k not in expected}
            except (ValueError, TypeError, KeyError) as exc:  # a key missing or of the wrong type
                msg = str(exc)
                self.fail("weights.config", msg if msg.startswith(CONFIG_NAME) else f"{CONFIG_NAME}: {msg}")
                for cat in ("weights.shapes", "weights.param_count"):
                    self.skip(cat, f"not checked: {CONFIG_NAME} does not describe the model fully")
        else:
            for cat in ("weights.shapes", "weights.param_count"):
                self.skip(cat, f"not checked: {arch_error}")
        # every copy of every tensor: a duplicate is judged (and counted) like any other tensor
        actual: list[tuple[str, TensorEntry]] = [
            (shard, entry) for shard, header in self.headers.items() for entry in header.tensors.values()
            if entry.valid  # a malformed entry is already a shard_layout failure
        ]
        if not actual:
            for cat in later:
                self.skip(cat, "not checked: no well-formed tensor entry in any readable header")
            return
        scales = self._fp8_scales(self.located, fp8_block)
        self._dtypes(config, actual, scales, fp8_block)
        if expected is not None:
            self._shapes(arch or "", expected, optional, actual, scales, fp8_block)
            self._param_count(config, archs, expected, optional, actual, scales)

    def _config(self) -> dict[str, Any] | None:
        path = self.dir / CONFIG_NAME
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            self.fail("weights.config", f"{CONFIG_NAME} is missing from {self.dir}: dtypes, shapes and parameter count cannot be checked")
            return None
        except (OSError, UnicodeDecodeError) as exc:
            self.fail("weights.config", f"{CONFIG_NAME}: cannot read ({exc})")
            return None
        try:
            config = json.loads(text)
        except json.JSONDecodeError as exc:
            self.fail("weights.config", f"{CONFIG_NAME}: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})")
            return None
        if not isinstance(config, dict):
            self.fail("weights.config", f"{CONFIG_NAME}: top level is a {type(config).__name__}, not an object")
            return None
        return config

    @staticmethod
    def _fp8_scales(present: dict[str, list[str]], block: tuple[int, int] | None) -> set[str]:
        """Names of FP8 block-scale tensors (``W.weight_scale_inv`` next to a ``W.weight``)."""
        if block is None:
            return set()
        return {n for n in present if n.endswith(FP8_SCALE_SUFFIX) and n[: -len(FP8_SCALE_SUFFIX)] in present}

    def _dtypes(self, config: dict[str, Any], actual: list[tuple[str, TensorEntry]], scales: set[str],
                fp8_block: tuple[int, int] | None) -> None:
        cat = "weights.dtypes"
        declared = _config_dtype(config)
        want = TORCH_DTYPES.get(str(declared)) if declared else None
        if declared and want is None:
            self.fail(cat, f"{CONFIG_NAME}: torch_dtype {declared!r} is not a floating dtype vLLM serves")
            return
        source = f"{CONFIG_NAME} torch_dtype is {declared}"
        if want is None:  # no declared dtype: the checkpoint must at least agree with itself
            counts = Counter(e.dtype for _, e in actual if e.name not in scales)
            want = counts.most_common(1)[0][0]
            source = f"{CONFIG_NAME} sets no torch_dtype; the majority dtype is {want}"
        quantized = {n[: -len(FP8_SCALE_SUFFIX)] for n in scales}
        ok = 0
        for shard, e in actual:
            if e.dtype == want and not scales:  # fast path: outside FP8 the model dtype is always right
                ok += 1
                continue
            name = e.name
            if name in scales:
                allowed, why = ("F32",), "an FP8 block scale"
            elif name in quantized:
                allowed, why = ("F8_E4M3",), "an FP8 block-quantized weight"
            elif name.endswith(F32_BY_DESIGN_SUFFIXES):
                allowed, why = (want, "F32"), "kept in F32 by design"
            else:
                allowed, why = (want,), source
            if e.dtype in allowed:
                ok += 1
                continue
            self.fail(cat, f"{shard}: tensor {name} is {e.dtype}, expected {' or '.join(allowed)} ({why})",
                      shard=shard, tensor=name, value=e.dtype, limit=allowed[0])
        counts = Counter(e.dtype for _, e in actual)
        mix = ", ".join(f"{n} {d}" for d, n in counts.most_common())
        note = f" with FP8 blocks {list(fp8_block)}" if fp8_block else ""
        self.ok(cat, f"all {ok} tensors are {want} as {source}{note} ({mix})",
                value=ok, unit="tensors", evidence={"dtype_counts": dict(counts)})

    def _shapes(self, arch: str, expected: dict[str, tuple[int, ...]], optional: dict[str, tuple[int, ...]],
                actual: list[tuple[str, TensorEntry]], scales: set[str], fp8_block: tuple[int, int] | None) -> None:
        cat = "weights.shapes"
        unverifiable = 0
        for name, shape in expected.items():
            if name in self.located:
                continue
            indexed = self.weight_map.get(name) if self.weight_map is not None else None
            if indexed is not None and indexed not in self.headers:
                unverifiable += 1  # its shard is missing/unreadable: reported once, per shard
                continue
            if self.missing or self.unreadable:
                if self.weight_map is None:
                    unverifiable += 1
                    continue
            where = f" (the index names {indexed})" if indexed else ""
            self.fail(cat, f"tensor {name} {list(shape)}, which {arch} needs per {CONFIG_NAME}, is in no shard{where}",
                      tensor=name, limit=list(shape))
        for shard, e in actual:
            name = e.name
            if expected.get(name) == e.shape:  # fast path: the common case costs one lookup
                continue
            if name.endswith(IGNORED_TENSOR_SUFFIXES):
                continue
            if name in scales:
                base = expected.get(name[: -len(FP8_SCALE_SUFFIX)]) or optional.get(name[: -len(FP8_SCALE_SUFFIX)])
                if base is None or len(base) != 2 or fp8_block is None:
                    self.fail(cat, f"{shard}: tensor {name} scales a tensor that is not a 2-D weight of {arch}",
                              shard=shard, tensor=name)
                    continue
                want = (math.ceil(base[0] / fp8_block[0]), math.ceil(base[1] / fp8_block[1]))
            else:
                want = expected.get(name) or optional.get(name)
                if want is None:
                    self.fail(cat, f"{shard}: tensor {name} {list(e.shape)} is not a tensor of {arch} as "
                                   f"{CONFIG_NAME} describes it (vLLM may refuse to load it)",
                              shard=shard, tensor=name, value=list(e.shape))
                    continue
            if e.shape != tuple(want):
                self.fail(cat, f"{shard}: tensor {name} has shape {list(e.shape)}, {CONFIG_NAME} implies {list(want)}",
                          shard=shard, tensor=name, value=list(e.shape), limit=list(want))
        mtp = sum(1 for n in optional if n in self.located)
        notes = []
        if mtp:
            notes.append(f"plus {mtp} multi-token-prediction tensors")
        if scales:
            notes.append(f"plus {len(scales)} FP8 block scales")
        if unverifiable:
            notes.append(f"{unverifiable} tensors of missing/unreadable shards not verifiable")
        extra = f" ({'; '.join(notes)})" if notes else ""
        self.ok(cat, f"all {len(expected)} tensors of {arch} are present with the shapes {CONFIG_NAME} implies{extra}",
                value=len(expected), limit=len(expected), unit="tensors")

    def _param_count(self, config: dict[str, Any], archs: Any, expected: dict[str, tuple[int, ...]],
                     optional: dict[str, tuple[int, ...]], actual: list[tuple[str, TensorEntry]],
                     scales: set[str]) -> None:
        cat = "weights.param_count"
        if self.missing or self.unreadable:
            self.skip(cat, f"not checked: {len(self.missing | self.unreadable)} shards missing or unreadable, the count would be partial")
            return
        with_mtp = any(n in self.located for n in optional)
        limit = int(archs.parameter_count(config, include_mtp=with_mtp))
        value = sum(e.numel for _, e in actual if e.name not in scales and not e.name.endswith(IGNORED_TENSOR_SUFFIXES))
        what = f"{CONFIG_NAME} implies {limit:,}" + (" (with MTP layers)" if with_mtp else "")
        if value != limit:
            diff = value - limit
            rel = f"{diff / limit:+.3%}" if limit else "n/a"
            self.fail(cat, f"checkpoint holds {value:,} parameters, {what}: {diff:+,} ({rel})",
                      value=value, limit=limit, unit="params")
            return
        self.ok(cat, f"checkpoint holds {value:,} parameters = {what}", value=value, limit=limit, unit="params",
                evidence={"billions": round(value / 1e9, 3)})

    # ----------------------------------------------------------------- manifest

    def _manifest(self) -> None:
        cat = "weights.manifest"
        path = self.dir / self.manifest_name
        if not self.verify_manifest:
            self.skip(cat, "not checked: manifest verification turned off")
            return
        if not path.exists():
            self.skip(cat, f"not checked: no {self.manifest_name} in {self.dir} "
                           f"(create one with `day0 weights manifest {self.dir}` from a trusted copy)")
            return
        try:
            files = manifest_mod.load(path)
        except ManifestError as exc:
            self.fail(cat, str(exc))
            return
        required = [s for s in self.shards] + [n for n in (INDEX_NAME, CONFIG_NAME) if (self.dir / n).is_file()]
        result = manifest_mod.verify(self.dir, files, required, manifest_name=self.manifest_name,
                                     workers=self.workers, progress=self.progress)
        for name, message in result.problems:
            self.fail(cat, message, shard=name)
        rate = result.bytes_hashed / 1e6 / result.seconds if result.seconds > 0 else 0.0
        self.ok(cat, f"{len(result.checked)} files ({_human(result.bytes_hashed)}) match {self.manifest_name} "
                     f"(sha256, {rate:,.0f} MB/s with {self.workers} workers)",
                value=len(result.checked), limit=len(files), unit="files",
                evidence={"bytes_hashed": result.bytes_hashed, "seconds": round(result.seconds, 3),
                          "mb_per_s": round(rate, 1), "workers": self.workers})


def _pos_int(x: Any) -> bool:
    return type(x) is int and x > 0


def _config_dtype(config: dict[str, Any]) -> str | None:
    """The dtype config.json declares (``torch_dtype``, or ``dtype`` in newer transformers)."""
    for key in ("torch_dtype", "dtype"):
        value = config.get(key)
        if isinstance(value, str) and value:
            return value.removeprefix("torch.")
    text = config.get("text_config")
    if isinstance(text, dict):
        return _config_dtype(text)
    return None


