"""The embedded tiny model: deterministic, sharded like a real checkpoint, servable on CPU."""

import hashlib
import json

from safetensors import safe_open

from day0.config.profile import TinySpec
from day0.model.tiny import build, cached_model, spec_digest


def _digest(d):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def test_same_spec_gives_the_same_bytes(tmp_path):
    spec = TinySpec(num_hidden_layers=2, vocab_size=320)
    a, b = build(spec, tmp_path / "a"), build(spec, tmp_path / "b")
    assert _digest(a) == _digest(b)
    c = build(TinySpec(num_hidden_layers=2, vocab_size=320, seed=1), tmp_path / "c")
    assert _digest(a)["model-00001-of-00003.safetensors"] != _digest(c)["model-00001-of-00003.safetensors"]


def test_layout_is_a_sharded_llama_checkpoint(tmp_path):
    spec = TinySpec()
    d = build(spec, tmp_path / "m")
    index = json.loads((d / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) == spec.num_shards >= 3
    total = 0
    for shard in shards:
        with safe_open(str(d / shard), "pt") as f:
            for name in f.keys():
                assert index["weight_map"][name] == shard
                t = f.get_slice(name)
                n = 1
                for s in t.get_shape():
                    n *= s
                total += n * 4
    assert total == index["metadata"]["total_size"]
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["hidden_size"] // cfg["num_attention_heads"] == 64  # the CPU backend needs head_dim 64
    assert cfg["max_position_embeddings"] >= 32768


def test_tokenizer_ids_fit_the_model_vocab(tmp_path):
    from tokenizers import Tokenizer

    d = build(TinySpec(), tmp_path / "m")
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    cfg = json.loads((d / "config.json").read_text())
    assert tok.get_vocab_size() == cfg["vocab_size"]
    ids = tok.encode("The supernode serves tokens, ünïcode and all.").ids
    assert max(ids) < cfg["vocab_size"]
    assert tok.decode(ids) == "The supernode serves tokens, ünïcode and all."  # byte-level: lossless


def test_cache_is_keyed_by_spec_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("DAY0_CACHE_DIR", str(tmp_path))
    spec = TinySpec(num_hidden_layers=1, vocab_size=300)
    first = cached_model(spec)
    mtime = (first / "config.json").stat().st_mtime_ns
    assert first.name == f"tiny-{spec_digest(spec)}"
    assert cached_model(spec) == first and (first / "config.json").stat().st_mtime_ns == mtime
    assert cached_model(TinySpec(num_hidden_layers=2, vocab_size=300)) != first
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tiny-")]  # no staging left
