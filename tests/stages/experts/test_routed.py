"""vLLM's ``routed_experts`` field decoded: the encoding vLLM's own server writes
(``vllm.utils.serial_utils.numpy2base64``, a base64 ``.npy``), counted per MoE layer by hand."""

from __future__ import annotations

import base64
import io
import struct

import pytest

from day0.stages.experts import LayerLoad, RoutedError, count, decode, moe_layers, read_npy
from day0.stages.experts.routed import count_all

np = pytest.importorskip("numpy")

# 3 tokens, 3 layers (layer 0 dense: never written, zeros), top-2, 4 experts
IDS = [[[0, 0], [1, 2], [3, 2]],
       [[0, 0], [1, 3], [2, 0]],
       [[0, 0], [2, 1], [3, 1]]]


def vllm_b64(array) -> str:
    """The string vLLM's server puts in ``choices[i].routed_experts``."""
    try:
        from vllm.utils.serial_utils import numpy2base64
    except ImportError:  # the same bytes: np.save into a buffer, base64
        buf = io.BytesIO()
        np.save(buf, array, allow_pickle=False)
        return base64.b64encode(buf.getvalue()).decode("ascii")
    return numpy2base64(array)


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "int32", "int64"])
def test_vllms_encoding_decodes_to_the_same_array(dtype):
    arr = np.array(IDS, dtype=dtype)
    r = decode(vllm_b64(arr))
    assert (r.tokens, r.layers, r.top_k) == (3, 3, 2)
    assert list(r.flat) == arr.reshape(-1).tolist()
    assert sorted(r.layer_ids(1)) == sorted([1, 2, 1, 3, 2, 1])


def test_counts_per_moe_layer_by_hand():
    r = decode(vllm_b64(np.array(IDS, dtype="uint8")))
    got = count(r, 4, moe_layers=[1, 2])
    assert got == {1: LayerLoad(1, (0, 3, 2, 1), 3), 2: LayerLoad(2, (1, 1, 2, 2), 3)}
    # without the layer list, the dense layer (every row [0, 0]) is recognised and left out
    assert count(r, 4) == got


def test_two_requests_sum():
    one = vllm_b64(np.array(IDS, dtype="uint8"))
    total = count_all([one, one], 4, [1, 2])
    assert total[1] == LayerLoad(1, (0, 6, 4, 2), 6)


def test_an_expert_out_of_range_and_a_layer_out_of_range_are_named():
    r = decode(vllm_b64(np.array(IDS, dtype="uint8")))
    with pytest.raises(RoutedError, match="layer 2 names expert 3, outside 0..2"):
        count(r, 3, [2])
    with pytest.raises(RoutedError, match="MoE layer 7 is outside the array's 3 layers"):
        count(r, 4, [7])


def test_what_is_not_vllms_array_is_refused():
    with pytest.raises(RoutedError, match="not base64"):
        decode("not base64!")
    with pytest.raises(RoutedError, match="no .x93NUMPY magic"):
        decode(base64.b64encode(b"hello world").decode())
    with pytest.raises(RoutedError, match=r"expected a C-ordered \(tokens, layers, top_k\) array, got shape \(3, 2\)"):
        decode(vllm_b64(np.zeros((3, 2), dtype="uint8")))
    with pytest.raises(RoutedError, match="Fortran order"):
        decode(vllm_b64(np.asfortranarray(np.zeros((2, 3, 2), dtype="uint16"))))
    with pytest.raises(RoutedError, match="dtype '<f4' is not a little-endian integer"):
        decode(vllm_b64(np.zeros((1, 1, 1), dtype="float32")))
    with pytest.raises(RoutedError, match="expected a base64 string"):
        decode(None)  # type: ignore[arg-type]


def test_a_truncated_array_is_refused():
    buf = io.BytesIO()
    np.save(buf, np.array(IDS, dtype="int32"))
    with pytest.raises(RoutedError, match="data bytes for shape"):
        read_npy(buf.getvalue()[:-4])


def _npy(header: bytes, body: bytes = b"", version: int = 1) -> bytes:
    size = struct.pack("<H", len(header)) if version == 1 else struct.pack("<I", len(header))
    return b"\x93NUMPY" + bytes([version, 0]) + size + header + body


@pytest.mark.parametrize("raw, named", [
    # numpy reads at most 10,000 header bytes; a 2 MB list in one took ~1 GB to parse (the hunt)
    (_npy(b"{'descr': '<u1', 'fortran_order': False, 'shape': (1, 1, 1), 'x': [" + b"0," * 20_000 + b"]}", version=2),
     "over the 10,000 numpy reads"),
    (_npy(b"-" * 9_000 + b"1"), "unreadable .npy header"),  # nests past Python's recursion limit
    (_npy(b"{'descr': '<u1', 'fortran_order': False, 'shape': (2, 3, 0)}"), "routes nothing"),
    (_npy(b"{'descr': '<u1', 'fortran_order': False, 'shape': (2, 0, 2)}"), "routes nothing"),
], ids=["header-of-2MB", "deep-unary-minus", "top_k-0", "layers-0"])
def test_a_hostile_npy_header_is_one_routed_error_in_bounded_memory(raw, named):
    with pytest.raises(RoutedError, match=named):
        read_npy(raw)


def test_moe_layers_from_tensor_names():
    names = ["model.layers.0.mlp.gate_proj.weight",  # dense first layer
             "model.layers.1.mlp.experts.0.up_proj.weight", "model.layers.1.mlp.shared_experts.up_proj.weight",
             "model.layers.2.mlp.shared_expert.up_proj.weight",  # shared only: not routed
             "model.layers.3.block_sparse_moe.experts.7.w1.weight"]
    assert moe_layers(names) == [1, 3]


def test_moe_layers_of_the_tiny_deepseek_v3_skip_its_dense_first_layer():
    from day0.config.profile import load_profile
    from day0.model import arch_tensors
    from day0.model.config import model_config

    config, _ = model_config(load_profile("cpu-deepseek-v3"))
    assert moe_layers(arch_tensors.expected_tensors(config)) == [1, 2]  # first_k_dense_replace = 1 of 3 layers
