"""Shard headers against ``config.json``: the tensors the config implies, in the dtype it declares.

* ``weights.config``: config.json is readable and names an architecture day0 knows;
* ``weights.dtypes``: every tensor is in the declared dtype (FP8 block scales in F32, FP8
  block-quantized weights in F8_E4M3, a few tensors in F32 by design);
* ``weights.shapes``: every tensor the architecture needs is present with the implied shape,
  and nothing else is;
* ``weights.param_count``: the checkpoint holds exactly the parameters the config implies.

Quantized checkpoints other than block-wise FP8 are skipped: day0's expected tensors describe the
unquantized model.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from typing import Any, Mapping, Sequence

from day0.core.inputs import InputError, path_problem
from day0.model.jsonfile import MAX_CONFIG_BYTES, read_json
from day0.model.safetensors_header import TensorEntry
from day0.stages.weights.findings import CONFIG_NAME, AuditRun

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

_LATER = ("weights.dtypes", "weights.shapes", "weights.param_count")

Shapes = dict[str, tuple[int, ...]]
Located = list[tuple[str, TensorEntry]]  # (shard, entry): every copy of every well-formed tensor


def check_against_config(a: AuditRun) -> None:
    config = read_config(a)
    if config is None:
        for cat in _LATER:
            a.skip(cat, f"not checked: {CONFIG_NAME} unusable")
        return
    from day0.model import arch_tensors, archs  # lazy: the audit's file checks must work even if these break

    try:
        archs.check_types(config)
        arch, arch_error = _architecture(a, config, archs)
    except archs.ConfigError as exc:  # a wrong type or an absurd value: shapes cannot be judged
        arch, arch_error = None, f"{CONFIG_NAME}: {exc.key}: {exc.problem}"
        a.fail("weights.config", arch_error)
    dtype = config_dtype(config) or "no torch_dtype"
    quant = config.get("quantization_config")
    qnote = f", quantized ({quant.get('quant_method')})" if isinstance(quant, dict) else ""
    layers = config.get("num_hidden_layers")
    lnote = f"{layers} layers" if layers is not None else "no num_hidden_layers"
    problem = model_class_problem(config, a.architectures)
    if problem:
        a.fail("weights.config", f"{CONFIG_NAME}: {problem}")
    else:
        a.ok("weights.config", f"{CONFIG_NAME}: {arch or 'architecture unknown to day0'}, {lnote}, {dtype}{qnote}")
    if not a.headers:
        for cat in _LATER:
            a.skip(cat, "not checked: no readable shard header")
        return
    fp8_block: tuple[int, int] | None = None
    if isinstance(quant, dict):
        fp8_block = _fp8_block(quant)
        if fp8_block is None:
            msg = (f"not checked: quantized checkpoint (quant_method={quant.get('quant_method')!r}); day0's "
                   "expected tensors describe the unquantized model")
            for cat in _LATER:
                a.skip(cat, msg)
            return
    expected, optional = _expected_tensors(a, config, archs, arch_tensors, arch, arch_error)
    # every copy of every tensor: a duplicate is judged (and counted) like any other tensor
    actual: Located = [
        (shard, entry) for shard, header in a.headers.items() for entry in header.tensors.values()
        if entry.valid  # a malformed entry is already a shard_layout failure
    ]
    if not actual:
        for cat in _LATER:
            a.skip(cat, "not checked: no well-formed tensor entry in any readable header")
        return
    scales = fp8_scales(a.located, fp8_block)
    check_dtypes(a, config, actual, scales, fp8_block)
    if expected is not None:
        check_shapes(a, arch or "", expected, optional, actual, scales, fp8_block)
        check_param_count(a, config, arch_tensors, optional, actual, scales)


def read_config(a: AuditRun) -> dict[str, Any] | None:
    """config.json as a dict, or None after one ``weights.config`` failure saying why not."""
    path = a.dir / CONFIG_NAME
    if path_problem(path) == "does not exist":
        a.fail("weights.config", f"{CONFIG_NAME} is missing from {a.dir}: dtypes, shapes and parameter count cannot be checked")
        return None
    try:
        config = read_json(path, limit=MAX_CONFIG_BYTES, label=CONFIG_NAME, what="a config.json", unique_keys=True)
    except InputError as exc:  # a FIFO, a symlink loop, 50 MB, not UTF-8 or JSON, a key twice...
        a.fail("weights.config", str(exc))
        return None
    if not isinstance(config, dict):
        a.fail("weights.config", f"{CONFIG_NAME}: top level is a {type(config).__name__}, not an object")
        return None
    return config


def overridden_architectures(engine_args: Mapping[str, Any]) -> tuple[str, ...]:
    """``engine.args.hf_overrides.architectures`` (a table, or the JSON text ``--hf-overrides`` takes)."""
    overrides = engine_args.get("hf_overrides")
    if isinstance(overrides, str):
        try:
            overrides = json.loads(overrides)
        except ValueError:
            return ()
    archs = overrides.get("architectures") if isinstance(overrides, Mapping) else None
    archs = [archs] if isinstance(archs, str) else archs
    return tuple(a for a in archs if isinstance(a, str) and a) if isinstance(archs, list) else ()


def model_class_problem(config: dict[str, Any], overridden: Sequence[str] = ()) -> str:
    """Why vLLM would not build a generative model class from this config.json ("" when it would).

    Without ``architectures`` vLLM (``transformers_utils.config.get_config``) takes ``model_type``'s
    base class from transformers' MODEL_MAPPING (``llama`` -> ``LlamaModel``: no LM head, a pooling
    model), and without either it has no class at all; ``overridden`` is the engine's
    ``hf_overrides.architectures``, which vLLM puts over the file's. A model day0 merely does not
    know is another matter (its shapes are skipped, the rest still judged)."""
    if config.get("architectures") or overridden:
        return ""
    model_type = config.get("model_type")
    if not model_type:
        return "neither 'architectures' nor 'model_type' is set: vLLM cannot tell which model class to load"
    return (f"no 'architectures': vLLM would load model_type {str(model_type)[:64]!r} as transformers' base "
            "class for it (no LM head: a pooling model, not one that generates); name the class here or in "
            "engine.args.hf_overrides.architectures")


def _architecture(a: AuditRun, config: dict[str, Any], archs: Any) -> tuple[str | None, str]:
    """(architecture or None, why not): an unknown model skips shapes; a malformed one also fails."""
    try:
        return archs.architecture(config), ""
    except ValueError as exc:  # not a model day0 knows: shapes are skipped, dtypes still checked
        return None, str(exc)
    except (TypeError, KeyError, IndexError, AttributeError) as exc:
        arch_error = f"{CONFIG_NAME}: 'architectures' is malformed ({exc})"
        a.fail("weights.config", arch_error)
        return None, arch_error


def _fp8_block(quant: dict[str, Any]) -> tuple[int, int] | None:
    """The [out, in] block of a block-wise FP8 checkpoint; None for any other quantization."""
    method = quant.get("quant_method")
    block = quant.get("weight_block_size")
    if method == "fp8" and isinstance(block, list) and len(block) == 2 and all(_pos_int(b) for b in block):
        return (int(block[0]), int(block[1]))
    return None


# With tie_word_embeddings the head is the embedding: vLLM's loader skips an lm_head.weight in the
# checkpoint (AutoWeightsLoader's aliased parameters), and merge tools often write one anyway.
TIED_HEAD = "lm_head.weight"


def _expected_tensors(a: AuditRun, config: dict[str, Any], archs: Any, arch_tensors: Any, arch: str | None,
                      arch_error: str) -> tuple[Shapes | None, Shapes]:
    """(tensors the config implies or None, the optional ones: MTP tensors, a tied head's copy); skips
    what cannot be judged."""
    expected: Shapes | None = None
    optional: Shapes = {}
    if arch is not None:
        try:
            arch_tensors.check_config(config)
            if not _within_named(a, config, archs):
                return None, {}
            expected = arch_tensors.expected_tensors(config)
            if TIED_HEAD not in expected:  # tied: the head is the embedding, and vLLM skips a copy of it
                optional[TIED_HEAD] = expected["model.embed_tokens.weight"]
            if archs.num_mtp_layers(config):
                optional |= {k: v for k, v in arch_tensors.expected_tensors(config, include_mtp=True).items()
                             if k not in expected}
        except (ValueError, TypeError, KeyError) as exc:  # a key missing or of the wrong type
            msg = str(exc)
            a.fail("weights.config", msg if msg.startswith(CONFIG_NAME) else f"{CONFIG_NAME}: {msg}")
            for cat in ("weights.shapes", "weights.param_count"):
                a.skip(cat, f"not checked: {CONFIG_NAME} does not describe the model fully")
    else:
        for cat in ("weights.shapes", "weights.param_count"):
            a.skip(cat, f"not checked: {arch_error}")
    return expected, optional


_LAYER_NAME = re.compile(r"^model\.layers\.(\d{1,9})\.")
_EXPERT_NAME = re.compile(r"\.experts\.(\d{1,9})\.")


def _within_named(a: AuditRun, config: dict[str, Any], archs: Any) -> bool:
    """Whether config.json's layer and expert counts stay within what the checkpoint's tensors name.

    Why before listing the expected tensors: ``num_hidden_layers: 1000000000`` would list billions
    of tensors before any comparison. The checkpoint bounds the count instead: up to twice the
    layers (or experts) its tensor names reach, plus a few, the missing tensors are listed one by
    one; beyond that it is one finding, and shapes and parameter count are not listed. False: a
    finding or skip was recorded.
    """
    names = set(a.located) | set(a.weight_map or ())
    layers = max((int(m.group(1)) + 1 for m in map(_LAYER_NAME.match, names) if m), default=0)
    experts = max((int(m.group(1)) + 1 for m in map(_EXPERT_NAME.search, names) if m), default=0)
    wanted = [("num_hidden_layers", archs.num_layers(config), layers, "layers", "model.layers.N")]
    if archs.routed_experts(config):
        key = next(k for k in ("num_local_experts", "num_experts", "n_routed_experts") if config.get(k))
        wanted.append((key, archs.routed_experts(config), experts, "experts", "experts.N"))
    for key, want, named, what, pattern in wanted:
        if want <= 2 * named + 8:
            continue
        if a.weight_map is None and (a.unreadable or a.missing):  # unread shards may name the rest
            for cat in ("weights.shapes", "weights.param_count"):
                a.skip(cat, f"not checked: {CONFIG_NAME} {key} is {want}, the readable shards name {named} {what}")
            return False
        a.fail("weights.shapes", f"{CONFIG_NAME}: {key} is {want}, but the checkpoint's tensor names ({pattern}) "
                                 f"reach only {named} {what}", value=named, limit=want, unit=what)
        a.skip("weights.param_count", f"not checked: {CONFIG_NAME} {key} does not match the checkpoint")
        return False
    return True


def fp8_scales(present: dict[str, list[str]], block: tuple[int, int] | None) -> set[str]:
    """Names of FP8 block-scale tensors (``W.weight_scale_inv`` next to a ``W.weight``)."""
    if block is None:
        return set()
    return {n for n in present if n.endswith(FP8_SCALE_SUFFIX) and n[: -len(FP8_SCALE_SUFFIX)] in present}


# --------------------------------------------------------------------------- dtypes, shapes, count


def check_dtypes(a: AuditRun, config: dict[str, Any], actual: Located, scales: set[str],
                 fp8_block: tuple[int, int] | None) -> None:
    cat = "weights.dtypes"
    declared = config_dtype(config)
    want = TORCH_DTYPES.get(str(declared)) if declared else None
    if declared and want is None:
        a.fail(cat, f"{CONFIG_NAME}: torch_dtype {declared!r} is not a floating dtype vLLM serves")
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
        a.fail(cat, f"{shard}: tensor {name} is {e.dtype}, expected {' or '.join(allowed)} ({why})",
               shard=shard, tensor=name, value=e.dtype, limit=allowed[0])
    counts = Counter(e.dtype for _, e in actual)
    mix = ", ".join(f"{n} {d}" for d, n in counts.most_common())
    note = f" with FP8 blocks {list(fp8_block)}" if fp8_block else ""
    a.ok(cat, f"all {ok} tensors are {want} as {source}{note} ({mix})",
         value=ok, unit="tensors", evidence={"dtype_counts": dict(counts)})


def check_shapes(a: AuditRun, arch: str, expected: Shapes, optional: Shapes, actual: Located,
                 scales: set[str], fp8_block: tuple[int, int] | None) -> None:
    cat = "weights.shapes"
    unverifiable = _absent_tensors(a, arch, expected)
    for shard, e in actual:
        name = e.name
        if expected.get(name) == e.shape:  # fast path: the common case costs one lookup
            continue
        if name.endswith(IGNORED_TENSOR_SUFFIXES):
            continue
        if name in scales:
            base = expected.get(name[: -len(FP8_SCALE_SUFFIX)]) or optional.get(name[: -len(FP8_SCALE_SUFFIX)])
            if base is None or len(base) != 2 or fp8_block is None:
                a.fail(cat, f"{shard}: tensor {name} scales a tensor that is not a 2-D weight of {arch}",
                       shard=shard, tensor=name)
                continue
            want = (math.ceil(base[0] / fp8_block[0]), math.ceil(base[1] / fp8_block[1]))
        else:
            want = expected.get(name) or optional.get(name)
            if want is None:
                a.fail(cat, f"{shard}: tensor {name} {list(e.shape)} is not a tensor of {arch} as "
                            f"{CONFIG_NAME} describes it (vLLM may refuse to load it)",
                       shard=shard, tensor=name, value=list(e.shape))
                continue
        if e.shape != tuple(want):
            a.fail(cat, f"{shard}: tensor {name} has shape {list(e.shape)}, {CONFIG_NAME} implies {list(want)}",
                   shard=shard, tensor=name, value=list(e.shape), limit=list(want))
    mtp = sum(1 for n in optional if n in a.located and n != TIED_HEAD)
    notes = []
    if mtp:
        notes.append(f"plus {mtp} multi-token-prediction tensors")
    if TIED_HEAD in optional and TIED_HEAD in a.located:
        notes.append(f"plus {TIED_HEAD}, a copy of the tied embedding that vLLM does not load")
    if scales:
        notes.append(f"plus {len(scales)} FP8 block scales")
    if unverifiable:
        notes.append(f"{unverifiable} tensors of missing/unreadable shards not verifiable")
    extra = f" ({'; '.join(notes)})" if notes else ""
    a.ok(cat, f"all {len(expected)} tensors of {arch} are present with the shapes {CONFIG_NAME} implies{extra}",
         value=len(expected), limit=len(expected), unit="tensors")


def _absent_tensors(a: AuditRun, arch: str, expected: Shapes) -> int:
    """Fail each needed tensor no header holds; returns how many could not be verified."""
    unverifiable = 0
    for name, shape in expected.items():
        if name in a.located:
            continue
        indexed = a.weight_map.get(name) if a.weight_map is not None else None
        if indexed is not None and indexed not in a.headers:
            unverifiable += 1  # its shard is missing/unreadable: reported once, per shard
            continue
        if a.missing or a.unreadable:
            if a.weight_map is None:
                unverifiable += 1
                continue
        where = f" (the index names {indexed})" if indexed else ""
        a.fail("weights.shapes",
               f"tensor {name} {list(shape)}, which {arch} needs per {CONFIG_NAME}, is in no shard{where}",
               tensor=name, limit=list(shape))
    return unverifiable


def check_param_count(a: AuditRun, config: dict[str, Any], arch_tensors: Any, optional: Shapes, actual: Located,
                      scales: set[str]) -> None:
    cat = "weights.param_count"
    if a.missing or a.unreadable:
        a.skip(cat, f"not checked: {len(a.missing | a.unreadable)} shards missing or unreadable, the count would be partial")
        return
    with_mtp = any(n in a.located for n in optional if n != TIED_HEAD)
    limit = int(arch_tensors.parameter_count(config, include_mtp=with_mtp))
    skipped = {TIED_HEAD} if TIED_HEAD in optional else set()  # the tied head's copy: not a parameter vLLM holds
    value = sum(e.numel for _, e in actual
                if e.name not in scales and e.name not in skipped and not e.name.endswith(IGNORED_TENSOR_SUFFIXES))
    what = f"{CONFIG_NAME} implies {limit:,}" + (" (with MTP layers)" if with_mtp else "")
    if value != limit:
        diff = value - limit
        rel = f"{diff / limit:+.3%}" if limit else "n/a"
        a.fail(cat, f"checkpoint holds {value:,} parameters, {what}: {diff:+,} ({rel})",
               value=value, limit=limit, unit="params")
        return
    a.ok(cat, f"checkpoint holds {value:,} parameters = {what}", value=value, limit=limit, unit="params",
         evidence={"billions": round(value / 1e9, 3)})


def _pos_int(x: Any) -> bool:
    return type(x) is int and x > 0


def config_dtype(config: dict[str, Any]) -> str | None:
    """The dtype config.json declares (``torch_dtype``, or ``dtype`` in newer transformers)."""
    for key in ("torch_dtype", "dtype"):
        value = config.get(key)
        if isinstance(value, str) and value:
            return value.removeprefix("torch.")
    text = config.get("text_config")
    if isinstance(text, dict):
        return config_dtype(text)
    return None
