"""The black-box view: vLLM's own per-request record of the experts each token was routed to.

A server started with ``--enable-return-routed-experts`` (vLLM >= 0.32, Model Runner V2) answers a
non-streamed completion with ``choices[i].routed_experts``: a base64 ``.npy`` array of shape
``(tokens - 1, num_hidden_layers, top_k)``, prompt tokens first (from the request's
``routed_experts_prompt_start``, 0 by default), the last sampled token left out since it was never
forwarded (``vllm/entrypoints/openai/completion/protocol.py``). Dense layers are in the array too,
their rows never written, so the counts keep only the MoE layers.

The ``.npy`` reader is a few lines of ``struct`` rather than numpy: day0 does not depend on numpy,
and a black-box check is one someone runs from a laptop against an external deployment.
"""

from __future__ import annotations

import array
import ast
import base64
import binascii
import re
import struct
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from day0.stages.experts.load import LayerLoad, merge

NPY_MAGIC = b"\x93NUMPY"
# The dtypes vLLM writes (uint8 up to 256 experts, uint16 beyond; int32 from its device buffer).
DTYPES = {"|u1": "B", "<u1": "B", "|i1": "b", "<u2": "H", "<i2": "h", "<u4": "I", "<i4": "i", "<i8": "q", "<u8": "Q"}
MAX_NPY_HEADER = 10_000  # numpy's own bound (np.load's max_header_size): its writer pads to 64 bytes
MAX_ROUTED_BYTES = 256 << 20  # one response's array; far beyond 1M tokens x 61 layers x top-8 in uint8


class RoutedError(ValueError):
    """A ``routed_experts`` value that is not the array vLLM documents; says what is wrong with it."""


@dataclass(frozen=True)
class Routed:
    """One request's routing: ``ids[t][l]`` would be token t's top-k at layer l, kept flat (C order)."""

    flat: Sequence[int]
    tokens: int
    layers: int
    top_k: int

    def layer_ids(self, layer: int) -> Iterable[int]:
        """Every expert id layer ``layer`` chose, over all tokens (top-k each)."""
        stride = self.layers * self.top_k
        for j in range(self.top_k):
            yield from self.flat[layer * self.top_k + j::stride]


def decode(b64: str) -> Routed:
    """vLLM's ``routed_experts`` string -> :class:`Routed`; :class:`RoutedError` on anything else."""
    if not isinstance(b64, str):
        raise RoutedError(f"routed_experts: expected a base64 string, got {type(b64).__name__}")
    if len(b64) > MAX_ROUTED_BYTES * 4 // 3 + 4:
        raise RoutedError(f"routed_experts: {len(b64)} characters, over the {MAX_ROUTED_BYTES >> 20} MiB bound")
    try:
        raw = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise RoutedError(f"routed_experts: not base64 ({exc})") from None
    return read_npy(raw)


def read_npy(raw: bytes) -> Routed:
    """A 3-D, C-ordered, little-endian integer ``.npy`` (format versions 1-3)."""
    if not raw.startswith(NPY_MAGIC) or len(raw) < 10:
        raise RoutedError("routed_experts: not a .npy array (no \\x93NUMPY magic)")
    major = raw[6]
    if major == 1:
        (hlen,), start = struct.unpack("<H", raw[8:10]), 10
    elif major in (2, 3):
        (hlen,), start = struct.unpack("<I", raw[8:12]), 12
    else:
        raise RoutedError(f"routed_experts: .npy format version {major} is not one of 1, 2, 3")
    if hlen > MAX_NPY_HEADER:
        raise RoutedError(f"routed_experts: a .npy header of {hlen:,} bytes, over the {MAX_NPY_HEADER:,} numpy reads")
    header = _header(raw[start:start + hlen])
    code = DTYPES.get(header["descr"])
    if code is None:
        raise RoutedError(f"routed_experts: dtype {header['descr']!r} is not a little-endian integer type")
    shape = header["shape"]
    if header["fortran_order"] or len(shape) != 3:
        raise RoutedError(f"routed_experts: expected a C-ordered (tokens, layers, top_k) array, got shape {shape}"
                          f"{' in Fortran order' if header['fortran_order'] else ''}")
    tokens, layers, top_k = shape
    if not layers or not top_k:
        raise RoutedError(f"routed_experts: shape {shape} routes nothing (no layer or no expert a token)")
    body = memoryview(raw)[start + hlen:]
    size = struct.calcsize(code)
    if len(body) != tokens * layers * top_k * size:
        raise RoutedError(f"routed_experts: {len(body)} data bytes for shape {shape} of {size}-byte items")
    flat = array.array(code)
    flat.frombytes(body)
    if sys.byteorder == "big" and size > 1:
        flat.byteswap()
    return Routed(flat.tolist(), tokens, layers, top_k)


def _header(text: bytes) -> dict[str, Any]:
    try:
        header = ast.literal_eval(text.decode("latin-1").strip())
    except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):  # `-` x 10,000 nests that deep
        raise RoutedError("routed_experts: unreadable .npy header") from None
    ok = (isinstance(header, dict) and isinstance(header.get("descr"), str)
          and isinstance(header.get("fortran_order"), bool) and isinstance(header.get("shape"), tuple)
          and all(isinstance(n, int) and n >= 0 for n in header["shape"]))
    if not ok:
        raise RoutedError(f"routed_experts: .npy header {text[:120]!r} lacks descr, fortran_order or shape")
    return header


def count(routed: Routed, num_experts: int, moe_layers: Sequence[int] | None = None) -> dict[int, LayerLoad]:
    """Assignments per expert for each MoE layer of one request. ``moe_layers`` None: the layers that
    routed anything, i.e. any token whose top-k ids are not all the same (a router picks distinct
    experts; an unwritten dense-layer row is all zeros)."""
    layers = range(routed.layers) if moe_layers is None else moe_layers
    out: dict[int, LayerLoad] = {}
    for layer in layers:
        if not 0 <= layer < routed.layers:
            raise RoutedError(f"routed_experts: MoE layer {layer} is outside the array's {routed.layers} layers")
        if moe_layers is None and not _routed(routed, layer):
            continue
        ids = Counter(routed.layer_ids(layer))
        bad = [e for e in ids if not 0 <= e < num_experts]
        if bad:
            raise RoutedError(f"routed_experts: layer {layer} names expert {bad[0]}, outside 0..{num_experts - 1}")
        out[layer] = LayerLoad.of(layer, [ids.get(e, 0) for e in range(num_experts)], routed.tokens, num_experts)
    return out


def _routed(routed: Routed, layer: int) -> bool:
    k, stride = routed.top_k, routed.layers * routed.top_k
    if k < 2:
        return any(routed.flat[layer::stride])
    return any(len(set(routed.flat[t * stride + layer * k: t * stride + layer * k + k])) > 1
               for t in range(routed.tokens))


def count_all(values: Iterable[str], num_experts: int, moe_layers: Sequence[int] | None = None) -> dict[int, LayerLoad]:
    """Every request's ``routed_experts``, decoded and summed."""
    return merge([count(decode(v), num_experts, moe_layers) for v in values])


LAYER_OF = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def moe_layers(tensor_names: Iterable[str]) -> list[int]:
    """The decoder layers holding routed experts, from a checkpoint's tensor names
    (``model.layers.<i>.mlp.experts.<e>.*``; shared experts are ``shared_expert(s)``, not routed)."""
    found = set()
    for name in tensor_names:
        if ".experts." in name:
            m = LAYER_OF.search(name)
            if m:
                found.add(int(m.group(1)))
    return sorted(found)
