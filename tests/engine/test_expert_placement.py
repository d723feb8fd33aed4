"""The engine note's expert placement: what the layout implies, and what vLLM's EP ranks logged."""

from __future__ import annotations

import json
import os

from day0.engine.loaded import expert_placement

# vLLM 0.32's own line (fused_moe/expert_map_manager.py), as the EP preset's engine logged it
EP_LINE = ("(Worker_TP{r} pid=1) INFO 12-01 21:30:21 [expert_map_manager.py:249] [EP Rank {r}/3] Expert parallelism is "
           "enabled. Expert placement strategy: linear. Local/global number of experts: {n}/8. Experts local to global "
           "index map: ...\n")


def _model(tmp_path, **extra):
    d = tmp_path / "m"
    d.mkdir()
    config = {"architectures": ["Qwen3MoeForCausalLM"], "num_experts": 8, "num_experts_per_tok": 2,
              "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": 384, "moe_intermediate_size": 64, "intermediate_size": 512, **extra}
    (d / "config.json").write_text(json.dumps(config))
    return d


def test_tensor_parallel_slices_every_expert_on_every_rank(tmp_path):
    note = expert_placement(_model(tmp_path), {"tensor_parallel_size": 2}, [])
    assert note == {"routed_experts": 8, "experts_per_token": 2, "shared_experts": 0, "layout": "tensor_parallel",
                    "experts_per_rank": [8, 8], "expert_slice": "1/2"}


def test_expert_parallel_places_whole_experts_first_ranks_one_more_and_quotes_vllm(tmp_path):
    log = tmp_path / "engine.log"
    log.write_text("".join(EP_LINE.format(r=r, n=n) for r, n in ((0, 3), (1, 3), (2, 2))))
    note = expert_placement(_model(tmp_path), {"tensor_parallel_size": 3, "enable_expert_parallel": True}, [log])
    assert (note["layout"], note["ep_size"], note["experts_per_rank"]) == ("expert_parallel", 3, [3, 3, 2])
    assert note["vllm_says"] == ["EP rank 0/3: 3/8 experts", "EP rank 1/3: 3/8 experts", "EP rank 2/3: 2/8 experts"]


def test_a_dense_or_remote_model_has_no_note(tmp_path):
    dense = tmp_path / "dense"
    dense.mkdir()
    (dense / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert expert_placement(dense, {}, []) is None
    assert expert_placement(None, {}, []) is None


def test_a_model_day0_does_not_model_or_cannot_read_has_no_note_and_stops_nothing(tmp_path):
    """The note is taken once the engine is healthy: a Day-0 architecture day0 does not know yet
    (ConfigError) stopped an engine that served. A FIFO where config.json stands must not hang."""
    unknown = tmp_path / "new"
    unknown.mkdir()
    (unknown / "config.json").write_text(json.dumps({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3"}))
    assert expert_placement(unknown, {}, []) is None
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "config.json")
    assert expert_placement(fifo, {}, []) is None
    wrong = _model(tmp_path, num_experts="eight")
    assert expert_placement(wrong, {}, []) is None
