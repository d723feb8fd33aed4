"""The static weights audit against real safetensors checkpoints, whole and broken.

Every broken checkpoint is built by ``ckpt_factory`` from files the ``safetensors`` library wrote,
then broken the way real copies break; each test asserts the failure names the shard and tensor.
The header validator is also checked against ``safetensors`` itself on arbitrary mutated headers.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from day0.core.record import Check
from day0.model import arch_tensors
from day0.model.safetensors_header import DTYPE_BITS, HeaderError, read_header, validate_entries
from day0.stages.weights import CATEGORIES, audit, write_manifest
from day0.stages.weights.manifest import MANIFEST_NAME, sha256_file
from tests.support import ckpt_factory as cf


def by_id(checks: list[Check]) -> dict[str, list[Check]]:
    out: dict[str, list[Check]] = {}
    for c in checks:
        out.setdefault(c.id, []).append(c)
    return out


def failures(checks: list[Check], cid: str) -> list[Check]:
    return [c for c in checks if c.id == cid and c.status == "fail"]


def assert_clean_except(checks: list[Check], *broken: str) -> None:
    """Categories not named are untouched by the fault: a single pass or skip each."""
    grouped = by_id(checks)
    assert set(grouped) == set(CATEGORIES), set(grouped) ^ set(CATEGORIES)
    for cid, cs in grouped.items():
        if cid in broken:
            assert cs and all(c.status == "fail" for c in cs), (cid, [c.message for c in cs])
        else:
            assert len(cs) == 1 and cs[0].status in ("pass", "skip"), (cid, [c.message for c in cs])
    for c in checks:
        assert "\n" not in c.message and c.message


@pytest.fixture
def ckpt(tmp_path: Path) -> cf.Ckpt:
    return cf.make_checkpoint(tmp_path / "model")


# --------------------------------------------------------------------------- whole checkpoints


def test_whole_llama_checkpoint_passes_every_category(ckpt: cf.Ckpt) -> None:
    checks = audit(ckpt.dir)
    assert_clean_except(checks)
    grouped = by_id(checks)
    assert grouped["weights.manifest"][0].status == "skip"  # no manifest written
    for cid in CATEGORIES[:-1]:
        assert grouped[cid][0].status == "pass", grouped[cid][0].message
    count = grouped["weights.param_count"][0]
    assert count.value == count.limit == sum(math.prod(s) for s in ckpt.shapes.values())


def test_factory_layout_agrees_with_archs(ckpt: cf.Ckpt) -> None:
    """The hand-written Llama/Mixtral tensor lists and day0.model.archs describe the same checkpoint."""
    assert arch_tensors.expected_tensors(ckpt.config) == cf.llama_tensors(ckpt.config)
    mix = cf.mixtral_config()
    assert arch_tensors.expected_tensors(mix) == cf.llama_tensors(mix)


def test_a_tied_checkpoint_that_ships_its_head_anyway_passes_and_a_wrong_head_does_not(tmp_path: Path) -> None:
    """With tie_word_embeddings vLLM skips lm_head.weight (AutoWeightsLoader's aliased parameters);
    merge tools write it anyway. Present or not it is no failure, nor a parameter vLLM holds; of
    another shape it is still wrong."""
    cfg = cf.llama_config(tie_word_embeddings=True)
    shapes = {**cf.llama_tensors(cfg), "lm_head.weight": (cfg["vocab_size"], cfg["hidden_size"])}
    ck = cf.make_checkpoint(tmp_path / "m", config=cfg, tensors=shapes)
    checks = audit(ck.dir)
    assert_clean_except(checks)
    grouped = by_id(checks)
    assert "a copy of the tied embedding that vLLM does not load" in grouped["weights.shapes"][0].message
    count = grouped["weights.param_count"][0]
    assert count.value == count.limit == sum(math.prod(s) for n, s in shapes.items() if n != "lm_head.weight")
    cf.reshape_tensor(ck, "lm_head.weight", (cfg["vocab_size"] - 1, cfg["hidden_size"]))
    assert "lm_head.weight has shape [127, 64]" in failures(audit(ck.dir), "weights.shapes")[0].message


def test_single_file_checkpoint_is_audited(tmp_path: Path) -> None:
    ck = cf.make_checkpoint(tmp_path / "m", num_shards=1)
    assert ck.shards == ["model.safetensors"] and not (ck.dir / cf.INDEX_NAME).exists()
    checks = audit(ck.dir)
    assert_clean_except(checks)
    grouped = by_id(checks)
    assert "single-file" in grouped["weights.index"][0].message
    assert grouped["weights.shapes"][0].status == "pass"
    cf.truncate_shard(ck, 0, 10)
    assert "model.safetensors: header says" in failures(audit(ck.dir), "weights.shard_size")[0].message


def test_mixtral_checkpoint_passes_and_a_missing_expert_is_named(tmp_path: Path) -> None:
    ck = cf.make_checkpoint(tmp_path / "m", config=cf.mixtral_config())
    assert_clean_except(audit(ck.dir))
    gone = "model.layers.1.block_sparse_moe.experts.3.w2.weight"
    shard = cf.drop_tensor(ck, gone)
    checks = audit(ck.dir)
    placement = failures(checks, "weights.tensor_placement")
    assert len(placement) == 1 and shard in placement[0].message and gone in placement[0].message
    shapes = failures(checks, "weights.shapes")
    assert len(shapes) == 1 and gone in shapes[0].message
    assert failures(checks, "weights.param_count")


def test_fp8_block_checkpoint_with_mtp_layer_passes(tmp_path: Path) -> None:
    cfg = cf.deepseek_fp8_config()
    shapes = arch_tensors.expected_tensors(cfg, include_mtp=True)  # the published layout ships the MTP layer
    ck = cf.make_fp8_checkpoint(tmp_path / "m", shapes, cfg)
    checks = audit(ck.dir)
    assert_clean_except(checks)
    grouped = by_id(checks)
    assert "FP8 block scales" in grouped["weights.shapes"][0].message
    assert grouped["weights.param_count"][0].limit == arch_tensors.parameter_count(cfg, include_mtp=True)


def test_fp8_scale_of_wrong_shape_and_unscaled_fp8_weight_fail(tmp_path: Path) -> None:
    cfg = cf.deepseek_fp8_config()
    ck = cf.make_fp8_checkpoint(tmp_path / "m", arch_tensors.expected_tensors(cfg), cfg)
    scale = "model.layers.0.self_attn.o_proj.weight_scale_inv"
    cf.reshape_tensor(ck, scale, (1, 1))
    weight = "model.layers.1.mlp.experts.2.down_proj.weight"
    shard = ck.shard_of(weight + "_scale_inv")
    cf._rewrite(ck, shard, lambda d: d.pop(weight + "_scale_inv"))
    ck.weight_map.pop(weight + "_scale_inv")
    cf._write_json(ck.dir / cf.INDEX_NAME, {"weight_map": ck.weight_map})
    checks = audit(ck.dir)
    [bad_shape] = failures(checks, "weights.shapes")
    assert scale in bad_shape.message and "[1, 1]" in bad_shape.message
    [bad_dtype] = failures(checks, "weights.dtypes")
    assert weight in bad_dtype.message and "F8_E4M3" in bad_dtype.message


# --------------------------------------------------------------------------- the bad inputs


def test_missing_shard(ckpt: cf.Ckpt) -> None:
    gone = cf.remove_shard(ckpt, 1)
    checks = audit(ckpt.dir)
    assert_clean_except(checks, "weights.shards_present")
    [c] = failures(checks, "weights.shards_present")
    assert c.message.startswith(gone) and f"for {len(ckpt.tensors_in(gone))} tensors" in c.message
    grouped = by_id(checks)
    assert grouped["weights.param_count"][0].status == "skip"  # a partial count would mislead
    assert "not verifiable" in grouped["weights.shapes"][0].message


def test_truncated_shard(ckpt: cf.Ckpt) -> None:
    name, before, after = cf.truncate_shard(ckpt, 1, nbytes=100)
    checks = audit(ckpt.dir)
    assert_clean_except(checks, "weights.shard_size")
    [c] = failures(checks, "weights.shard_size")
    assert c.message.startswith(f"{name}: header says {before} bytes, file has {after}")
    assert "truncated" in c.message and (c.value, c.limit) == (after, before)
    header = cf.header_of(ckpt.path(1))
    header.pop("__metadata__", None)
    last = max(header, key=lambda n: header[n]["data_offsets"][1])
    assert last in c.message  # the tensor that lost its tail is named


def test_padded_shard(ckpt: cf.Ckpt) -> None:
    name, before, after = cf.pad_shard(ckpt, 2, nbytes=64)
    checks = audit(ckpt.dir)
    assert_clean_except(checks, "weights.shard_size")
    [c] = failures(checks, "weights.shard_size")
    assert c.message.startswith(f"{name}: header says {before} bytes, file has {after}")
    assert "padded: 64 bytes" in c.message


def test_tensor_listed_in_index_but_absent_from_its_shard(ckpt: cf.Ckpt) -> None:
    tensor = "model.layers.1.mlp.up_proj.weight"
    shard = cf.drop_tensor(ckpt, tensor)
    checks = audit(ckpt.dir)
    assert_clean_except(checks, "weights.tensor_placement", "weights.shapes", "weights.param_count",
                        "weights.total_size")
    [c] = failures(checks, "weights.tensor_placement")
    assert c.message.startswith(f"{shard}: tensor {tensor} is listed in the index") and c.evidence["tensor"] == tensor


def test_tensor_in_two_shards(ckpt: cf.Ckpt) -> None:
    tensor = "model.norm.weight"
    other = cf.duplicate_tensor(ckpt, tensor, into=0)
    checks = audit(ckpt.dir)
    [c] = failures(checks, "weights.tensor_placement")
    assert tensor in c.message and other in c.message and ckpt.shard_of(tensor) in c.message
    assert c.value == 2
    assert_clean_except(checks, "weights.tensor_placement", "weights.param_count", "weights.total_size")


@pytest.mark.parametrize("link", ["hard", "symbolic"])
def test_a_shard_that_is_the_same_file_as_another_is_named_and_read_once(
        ckpt: cf.Ckpt, link: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two index names for one file load every tensor twice; a folder of links to one huge
    header must not multiply the audit's time and memory either."""
    from day0.stages.weights import headers

    first, second = ckpt.shards[0], ckpt.shards[1]
    ckpt.path(1).unlink()
    if link == "hard":
        ckpt.path(1).hardlink_to(ckpt.path(0))
    else:
        ckpt.path(1).symlink_to(ckpt.path(0).name)
    parsed: list[str] = []
    real_parse = headers.parse_header
    monkeypatch.setattr(headers, "parse_header", lambda raw, size, label: parsed.append(label) or real_parse(raw, size, label))
    checks = audit(ckpt.dir)
    [c] = failures(checks, "weights.shard_header")
    assert c.message == (f"{second}: the same file as {first} (a hard link or symlink to it): "
                         "vLLM would load its tensors twice") and c.evidence["shard"] == second
    assert sorted(parsed) == sorted(s for s in ckpt.shards if s != second)


def test_headers_past_the_audits_budget_are_not_read_and_say_so(ckpt: cf.Ckpt, monkeypatch: pytest.MonkeyPatch) -> None:
    from day0.stages.weights import headers

    first_header_bytes = struct.unpack("<Q", ckpt.path(0).read_bytes()[:8])[0]
    monkeypatch.setattr(headers, "MAX_TOTAL_HEADER_BYTES", first_header_bytes + 1)  # the first fits; past the second, no more
    checks = audit(ckpt.dir)
    refused = failures(checks, "weights.shard_header")
    assert [c.evidence["shard"] for c in refused] == ckpt.shards[2:]
    assert all("not read: the shards before it hold" in c.message and "more than day0 audits" in c.message
               for c in refused)
    assert by_id(checks)["weights.total_size"][0].status == "skip"


def test_orphan_shard(ckpt: cf.Ckpt) -> None:
    orphan = cf.add_orphan_shard(ckpt)
    checks = audit(ckpt.dir)
    assert_clean_except(checks, "weights.orphan_shards")
    [c] = failures(checks, "weights.orphan_shards")
    assert c.message.startswith(orphan) and c.evidence["shard"] == orphan


def test_wrong_dtype(ckpt: cf.Ckpt) -> None:
    tensor = "model.layers.0.self_attn.k_proj.weight"
    shard = cf.retype_tensor(ckpt, tensor, torch.float16)
    checks = audit(ckpt.dir)
    assert_clean_except(checks, "weights.dtypes")  # F16 is as wide as BF16: sizes still agree
    [c] = failures(checks, "weights.dtypes")
    assert c.message.startswith(f"{shard}: tensor {tensor} is F16, expected BF16")
    assert (c.value, c.limit) == ("F16", "BF16")


def test_wrong_shape(ckpt: cf.Ckpt) -> None:
    tensor = "model.layers.2.self_attn.v_proj.weight"
    shard = cf.reshape_tensor(ckpt, tensor, (16, 64))
    checks = audit(ckpt.dir)
    assert_clean_except(checks, "weights.shapes", "weights.param_count", "weights.total_size")
    [c] = failures(checks, "weights.shapes")
    assert c.message == f"{shard}: tensor {tensor} has shape [16, 64], config.json implies [32, 64]"


def test_index_that_is_not_json_still_audits_the_shards(ckpt: cf.Ckpt) -> None:
    cf.corrupt_index(ckpt)
    cf.truncate_shard(ckpt, 0, 8)
    checks = audit(ckpt.dir)
    [c] = failures(checks, "weights.index")
    assert c.message.startswith(f"{cf.INDEX_NAME}: not JSON (") and "line 1" in c.message
    grouped = by_id(checks)
    assert grouped["weights.shards_present"][0].status == "skip"
    assert failures(checks, "weights.shard_size")  # shards found on disk were still read


def test_config_missing(ckpt: cf.Ckpt) -> None:
    cf.remove_config(ckpt)
    checks = audit(ckpt.dir)
    assert_clean_except(checks, "weights.config")
    [c] = failures(checks, "weights.config")
    assert c.message.startswith("config.json is missing from")
    grouped = by_id(checks)
    for cid in ("weights.dtypes", "weights.shapes", "weights.param_count"):
        assert grouped[cid][0].status == "skip"


def test_config_that_is_not_json_or_not_an_object(ckpt: cf.Ckpt) -> None:
    (ckpt.dir / "config.json").write_text('{"architectures": ["LlamaForCausalLM"],,}')
    [c] = failures(audit(ckpt.dir), "weights.config")
    assert c.message.startswith("config.json: not JSON (") and "line 1" in c.message
    (ckpt.dir / "config.json").write_text("[1, 2]")
    [c] = failures(audit(ckpt.dir), "weights.config")
    assert c.message == "config.json: top level is a list, not an object"


def test_config_that_names_no_model_fails_and_never_prints_none(ckpt: cf.Ckpt) -> None:
    """``{}`` once passed as "architecture unknown to day0, None layers": vLLM could not load it."""
    (ckpt.dir / "config.json").write_text("{}")
    checks = audit(ckpt.dir)
    [c] = failures(checks, "weights.config")
    assert c.message == ("config.json: neither 'architectures' nor 'model_type' is set: vLLM cannot tell "
                         "which model class to load")
    assert "None" not in " ".join(ch.message for ch in checks)
    cf.write_config(ckpt, architectures=["GPT2LMHeadModel"], num_hidden_layers=None)
    [ok] = by_id(audit(ckpt.dir))["weights.config"]
    assert ok.status == "pass" and "no num_hidden_layers" in ok.message


def test_a_config_without_architectures_is_a_base_model_to_vllm_unless_the_engine_names_one(ckpt: cf.Ckpt) -> None:
    """vLLM maps a bare model_type to transformers' base class (llama -> LlamaModel: no LM head, a
    pooling model), so a checkpoint day0 would judge as a causal LM is not what vLLM serves; the
    engine's hf_overrides.architectures puts that right, as it does for vLLM."""
    from day0.stages.weights.against_config import overridden_architectures

    cf.write_config(ckpt, architectures=None)  # model_type stays
    [c] = failures(audit(ckpt.dir), "weights.config")
    assert "no 'architectures': vLLM would load model_type 'llama' as transformers' base class" in c.message
    for args in ({"hf_overrides": {"architectures": ["LlamaForCausalLM"]}},
                 {"hf_overrides": '{"architectures": ["LlamaForCausalLM"]}'}):
        named = overridden_architectures(args)
        assert named == ("LlamaForCausalLM",)
        assert not failures(audit(ckpt.dir, architectures=named), "weights.config")
    assert overridden_architectures({"hf_overrides": "not json"}) == () == overridden_architectures({})


def test_config_with_wrong_layer_count_fails_shapes_and_count(ckpt: cf.Ckpt) -> None:
    cf.write_config(ckpt, num_hidden_layers=4)
    checks = audit(ckpt.dir)
    missing = failures(checks, "weights.shapes")
    assert len(missing) == 9 and all("model.layers.3." in c.message and "in no shard" in c.message for c in missing)
    [count] = failures(checks, "weights.param_count")
    assert count.value < count.limit


def test_config_unknown_architecture_and_missing_key(ckpt: cf.Ckpt) -> None:
    cf.write_config(ckpt, architectures=["GPT2LMHeadModel"])
    grouped = by_id(audit(ckpt.dir))
    assert grouped["weights.shapes"][0].status == "skip" and "GPT2LMHeadModel" in grouped["weights.shapes"][0].message
    assert grouped["weights.dtypes"][0].status == "pass"  # the dtype is still checkable
    cf.write_config(ckpt, architectures=["LlamaForCausalLM"], hidden_size=None)
    [c] = failures(audit(ckpt.dir), "weights.config")
    assert "hidden_size" in c.message


def test_header_not_json_and_absurd_header_length(ckpt: cf.Ckpt) -> None:
    cf.write_raw_shard(ckpt.path(0), b'{"model.embed_tokens.weight": {"dtype": "BF16", ', data_len=16)
    cf.write_raw_shard(ckpt.path(2), b"{}", length_field=2**63)
    checks = audit(ckpt.dir)
    msgs = sorted(c.message for c in failures(checks, "weights.shard_header"))
    assert len(msgs) == 2
    assert msgs[0].startswith(f"{ckpt.shards[0]}: header is not JSON (")
    assert msgs[1].startswith(f"{ckpt.shards[2]}: header length field says {2**63} bytes")


def test_overlapping_offsets_and_hole_are_named(ckpt: cf.Ckpt) -> None:
    path = ckpt.path(1)
    names = [n for n in cf.header_of(path) if n != "__metadata__"]
    a, b = sorted(names, key=lambda n: cf.header_of(path)[n]["data_offsets"])[:2]

    def overlap(h: dict) -> None:
        h[b]["data_offsets"] = [h[b]["data_offsets"][0] - 2, h[b]["data_offsets"][1] - 2]

    cf.rewrite_header(path, overlap)
    checks = audit(ckpt.dir)
    layout = [c.message for c in failures(checks, "weights.shard_layout")]
    assert any(f"tensor {b}" in m and f"overlaps {a}" in m for m in layout), layout
    assert any("bytes" in m and "belong to no tensor" in m for m in layout), layout  # the 2 bytes b left behind


def test_every_problem_is_reported_not_just_the_first(ckpt: cf.Ckpt) -> None:
    cf.retype_tensor(ckpt, "model.layers.1.input_layernorm.weight")
    cf.retype_tensor(ckpt, "model.layers.2.input_layernorm.weight")
    cf.truncate_shard(ckpt, 0, 4)
    cf.pad_shard(ckpt, 2, 8)
    cf.add_orphan_shard(ckpt, "a.safetensors")
    cf.add_orphan_shard(ckpt, "b.safetensors")
    checks = audit(ckpt.dir)
    assert len(failures(checks, "weights.shard_size")) == 2
    assert len(failures(checks, "weights.orphan_shards")) == 2
    assert len(failures(checks, "weights.dtypes")) == 2


def test_failures_beyond_the_cap_are_folded_into_one_check_listing_them(ckpt: cf.Ckpt) -> None:
    cf.write_config(ckpt, num_hidden_layers=5)  # 18 tensors missing
    checks = audit(ckpt.dir, max_checks_per_category=5)
    shapes = failures(checks, "weights.shapes")
    assert len(shapes) == 6
    assert shapes[-1].value == 18 and len(shapes[-1].evidence["table"]["rows"]) == 13


def test_threaded_header_reads_give_the_same_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The thread pool used on slow (network) file systems must not change any result."""
    from day0.stages.weights import headers

    ck = cf.make_checkpoint(tmp_path / "m", num_shards=12)
    cf.truncate_shard(ck, 9, 3)
    cf.drop_tensor(ck, ck.tensors_in(11)[0])

    def summary(checks: list[Check]) -> list[tuple[str, str, str]]:
        return [(c.id, c.status, c.message) for c in checks]

    sequential = summary(audit(ck.dir, workers=4))
    monkeypatch.setattr(headers, "_SLOW_READ_S", -1.0)  # every read counts as slow: the pool reads
    assert summary(audit(ck.dir, workers=4)) == sequential
    assert sum(s == "fail" for _, s, _ in sequential) >= 2


def test_not_a_directory_and_empty_directory(tmp_path: Path) -> None:
    checks = audit(tmp_path / "nope")
    assert failures(checks, "weights.index")[0].message.endswith("does not exist")
    assert {c.status for c in checks if c.id != "weights.index"} == {"skip"}
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "pytorch_model.bin").write_bytes(b"x")
    [c] = failures(audit(tmp_path / "empty"), "weights.index")
    assert "no *.safetensors" in c.message and "pytorch_model.bin" in c.message


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(junk=st.binary(max_size=300), which=st.integers(0, 2))
def test_audit_never_raises_on_garbage_shards(tmp_path_factory: pytest.TempPathFactory, junk: bytes, which: int) -> None:
    ck = cf.make_checkpoint(tmp_path_factory.mktemp("g"), num_shards=3)
    ck.path(which).write_bytes(junk)
    checks = audit(ck.dir)
    assert set(by_id(checks)) == set(CATEGORIES)
    assert any(c.failed for c in checks)
    named = [c for c in checks if c.failed and ck.shards[which] in c.message]
    assert named, [c.message for c in checks if c.failed]


# --------------------------------------------------------------------------- manifest


def test_manifest_round_trip_and_each_kind_of_mismatch(ckpt: cf.Ckpt) -> None:
    path = write_manifest(ckpt.dir, workers=2)
    assert path.name == MANIFEST_NAME
    doc = json.loads(path.read_text())
    shard0 = ckpt.shards[0]
    assert doc["files"][shard0]["sha256"] == hashlib.sha256(ckpt.path(0).read_bytes()).hexdigest()
    assert set(doc["files"]) == set(ckpt.shards) | {cf.INDEX_NAME, "config.json"}
    [ok] = by_id(audit(ckpt.dir))["weights.manifest"]
    assert ok.status == "pass" and ok.value == 5

    # same size, one byte flipped inside tensor data: only the hash can see it
    raw = bytearray(ckpt.path(1).read_bytes())
    raw[-1] ^= 0xFF
    ckpt.path(1).write_bytes(bytes(raw))
    checks = audit(ckpt.dir)
    assert_clean_except(checks, "weights.manifest")
    [c] = failures(checks, "weights.manifest")
    assert c.message.startswith(f"{ckpt.shards[1]}: sha256 ") and "differs" in c.message

    cf.pad_shard(ckpt, 2, 8)
    msgs = [c.message for c in failures(audit(ckpt.dir), "weights.manifest")]
    assert any(m.startswith(f"{ckpt.shards[2]}: ") and "bytes on disk" in m for m in msgs)

    assert by_id(audit(ckpt.dir, verify_manifest=False))["weights.manifest"][0].status == "skip"
    path.write_text("{oops")
    [bad] = failures(audit(ckpt.dir), "weights.manifest")
    assert bad.message.startswith(f"{MANIFEST_NAME}: not JSON")


def test_manifest_reports_shards_it_does_not_list(ckpt: cf.Ckpt) -> None:
    path = write_manifest(ckpt.dir)
    doc = json.loads(path.read_text())
    del doc["files"][ckpt.shards[2]]
    path.write_text(json.dumps(doc))
    [c] = failures(audit(ckpt.dir), "weights.manifest")
    assert c.message.startswith(f"{ckpt.shards[2]}: not listed in {MANIFEST_NAME}")


def test_hashing_progress_callback_and_worker_counts_agree(tmp_path: Path) -> None:
    ck = cf.make_checkpoint(tmp_path / "m", num_shards=3)
    seen: list[tuple[int, int]] = []
    write_manifest(ck.dir, workers=1, progress=lambda done, total: seen.append((done, total)))
    one = json.loads((ck.dir / MANIFEST_NAME).read_text())["files"]
    write_manifest(ck.dir, workers=4)
    four = json.loads((ck.dir / MANIFEST_NAME).read_text())["files"]
    assert {k: v["sha256"] for k, v in one.items()} == {k: v["sha256"] for k, v in four.items()}
    total = sum(v["size"] for v in one.values())
    assert seen and seen[-1] == (total, total) and all(a <= b for (a, _), (b, _) in zip(seen, seen[1:]))


@given(data=st.binary(max_size=5000), chunk=st.integers(1, 700))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_streamed_sha256_matches_one_shot(tmp_path: Path, data: bytes, chunk: int) -> None:
    p = tmp_path / "f.bin"
    p.write_bytes(data)
    assert sha256_file(p, chunk_bytes=chunk) == hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------- header validator (property-based)

DTYPES = sorted(DTYPE_BITS)

tensor_spec = st.tuples(st.sampled_from(DTYPES), st.lists(st.integers(0, 5), min_size=0, max_size=3))


def _layout(specs: list[tuple[str, list[int]]]) -> tuple[dict, int]:
    """A contiguous header for ``specs`` (what a correct writer produces) and its data length."""
    header, offset = {}, 0
    for i, (dtype, shape) in enumerate(specs):
        n = math.prod(shape) * DTYPE_BITS[dtype] // 8
        header[f"t{i}"] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    return header, offset


def _whole_bytes(specs: list[tuple[str, list[int]]]) -> bool:
    return all(math.prod(s) * DTYPE_BITS[d] % 8 == 0 for d, s in specs)


@given(specs=st.lists(tensor_spec, max_size=8))
@settings(max_examples=150, deadline=None)
def test_correct_layouts_are_accepted(specs: list[tuple[str, list[int]]]) -> None:
    header, data_len = _layout(specs)
    tensors, problems = validate_entries(header, data_len)
    if _whole_bytes(specs):
        assert problems == [] and set(tensors) == set(header)
    else:  # sub-byte dtypes with an odd element count cannot be stored: always flagged, by name
        bad = {f"t{i}" for i, (d, s) in enumerate(specs) if math.prod(s) * DTYPE_BITS[d] % 8}
        assert {p.tensor for p in problems} >= bad


mutation = st.one_of(
    st.tuples(st.just("shift"), st.integers(0, 7), st.integers(-3, 3)),
    st.tuples(st.just("end"), st.integers(0, 7), st.integers(-3, 3)),
    st.tuples(st.just("dim"), st.integers(0, 7), st.integers(0, 6)),
    st.tuples(st.just("dtype"), st.integers(0, 7), st.sampled_from(DTYPES)),
    st.tuples(st.just("data_len"), st.integers(0, 0), st.integers(-5, 5)),
    st.tuples(st.just("swap"), st.integers(0, 7), st.integers(0, 7)),
)


@given(specs=st.lists(tensor_spec, min_size=1, max_size=6), mutations=st.lists(mutation, max_size=3))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_validator_agrees_with_safetensors_on_mutated_headers(
    tmp_path_factory: pytest.TempPathFactory, specs: list, mutations: list
) -> None:
    """safetensors refuses a file exactly when the audit finds a problem in it."""
    header, data_len = _layout(specs)
    names = list(header)
    for kind, i, arg in mutations:
        t = header[names[i % len(names)]]
        if kind == "shift":
            t["data_offsets"] = [max(0, t["data_offsets"][0] + arg), max(0, t["data_offsets"][1] + arg)]
        elif kind == "end":
            t["data_offsets"][1] = max(t["data_offsets"][0], t["data_offsets"][1] + arg)
        elif kind == "dim":
            t["shape"] = (t["shape"] or [1])[:-1] + [arg]
        elif kind == "dtype":
            t["dtype"] = arg
        elif kind == "data_len":
            data_len = max(0, data_len + arg)
        elif kind == "swap":
            u = header[names[arg % len(names)]]
            t["data_offsets"], u["data_offsets"] = u["data_offsets"], t["data_offsets"]
    path = tmp_path_factory.mktemp("h") / "x.safetensors"
    cf.write_raw_shard(path, header, data_len)
    try:
        with safe_open(str(path), framework="np") as fh:
            library_view = {k: (fh.get_slice(k).get_dtype(), fh.get_slice(k).get_shape()) for k in fh.keys()}
        library_ok = True
    except Exception:
        library_ok = False
    ours = read_header(path)
    assert (not ours.problems) == library_ok, [p.message for p in ours.problems]
    for p in ours.problems:
        assert "\n" not in p.message and p.message.startswith("x.safetensors: ")
    if library_ok:
        assert {k: (e.dtype, list(e.shape)) for k, e in ours.tensors.items()} == library_view
        assert ours.declared_size == path.stat().st_size


@given(length=st.integers(0, 2**64 - 1), size=st.integers(0, 64))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_length_field_gives_a_result_or_a_one_line_error(
    tmp_path_factory: pytest.TempPathFactory, length: int, size: int
) -> None:
    path = tmp_path_factory.mktemp("l") / "y.safetensors"
    path.write_bytes(struct.pack("<Q", length) + b"{}" + b" " * size)
    try:
        h = read_header(path)
    except HeaderError as exc:
        assert str(exc).startswith("y.safetensors: ") and "\n" not in str(exc)
    else:
        assert h.header_len == length <= size + 2


def test_quantized_checkpoint_other_than_block_fp8_skips_the_config_comparisons(ckpt: cf.Ckpt) -> None:
    cf.write_config(ckpt, quantization_config={"quant_method": "gptq", "bits": 4})
    grouped = by_id(audit(ckpt.dir))
    for cid in ("weights.dtypes", "weights.shapes", "weights.param_count"):
        assert grouped[cid][0].status == "skip" and "gptq" in grouped[cid][0].message
    assert grouped["weights.shard_layout"][0].status == "pass"  # the file checks still ran


def test_progress_bar_goes_to_stderr(ckpt: cf.Ckpt, capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from day0.core import progress

    monkeypatch.setattr(progress, "_tty", lambda stream: True)  # a bar only on a terminal (day0.core.progress)
    write_manifest(ckpt.dir, progress=True)
    audit(ckpt.dir, progress=True)
    out, err = capsys.readouterr()
    assert out == "" and "sha256" in err


def test_a_bug_in_the_audit_becomes_an_error_check_not_an_exception(ckpt: cf.Ckpt, monkeypatch: pytest.MonkeyPatch) -> None:
    from day0.stages.weights import index

    def boom(run: object) -> None:
        raise RuntimeError("placement exploded")

    monkeypatch.setattr(index, "check_placement", boom)
    checks = audit(ckpt.dir)
    [err] = [c for c in checks if c.id == "weights.audit"]
    assert err.status == "error" and "placement exploded" in err.message and "Traceback" in err.evidence["log_excerpt"]
    grouped = by_id(checks)
    assert grouped["weights.shard_layout"][0].status == "pass"  # what ran before the bug is kept
