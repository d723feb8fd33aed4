"""The transformers reference and how an engine's greedy answer is held against it: near-ties
reported and allowed, any other divergence named (prompt, position, both tokens, both logprobs)."""

import json
import math
import re
from types import SimpleNamespace

import pytest

from day0.engine.handle import Completion
from day0.engine.http_api import _token_id
from day0.model.reference import RefSequence, compare_tokens, from_completion, host_reference_unavailable
from day0.stages.weights.golden import golden_file_check, judge


def _ref(tokens, tops):
    """A reference whose step i puts ``tops[i]`` (id -> logprob) first to last."""
    seq = RefSequence("p", [1, 2], list(tokens), [], [], [])
    for tok, top in zip(tokens, tops):
        ranked = sorted(top.items(), key=lambda kv: -kv[1])
        seq.logprobs.append(top[tok])
        seq.top_ids.append([t for t, _ in ranked])
        seq.top_logprobs.append([v for _, v in ranked])
    return seq


def test_from_completion_orders_candidates_and_keeps_the_chosen_logprob():
    seq = from_completion("p", [1, 2], [7, 8], [{8: -2.0, 7: -0.5}, {8: -0.1, 9: -3.0}], device="vllm/http",
                          dtype="float32")
    assert seq.top_ids == [[7, 8], [8, 9]] and seq.logprobs == [-0.5, -0.1]
    assert seq.logprob_of(1, 9) == -3.0 and seq.logprob_of(1, 5) is None
    with pytest.raises(ValueError, match="1 logprob steps for 2 tokens"):
        from_completion("p", [1], [7, 8], [{7: 0.0}], device="d", dtype="f")


def test_a_first_difference_within_the_margin_is_a_near_tie_and_beyond_it_a_divergence():
    ref = _ref([5, 6], [{5: -0.1, 6: -2.0}, {6: -0.70, 9: -0.705}])
    tie = from_completion("p", [1, 2], [5, 9], [{5: -0.1, 6: -2.0}, {9: -0.699, 6: -0.702}], device="e", dtype="f")
    assert compare_tokens(ref, tie, 0.01).status == "near_tie"
    far = from_completion("p", [1, 2], [5, 9], [{5: -0.1, 6: -2.0}, {9: -0.2, 6: -3.0}], device="e", dtype="f")
    c = compare_tokens(ref, far, 0.01)
    assert (c.status, c.position, c.token_a, c.token_b, c.logprob_a, c.logprob_b) == ("diverged", 1, 6, 9, -0.70, -0.2)


def test_a_side_that_did_not_pick_its_own_best_is_no_near_tie():
    """The engine's pick sits 4.99 nats below the reference's pick in its own distribution: the two
    did not tie, the engine did not decode greedily. A signed gap of -4.99 once passed as a tie."""
    ref = _ref([5, 6], [{5: -0.1, 6: -2.0}, {6: -0.70, 9: -0.705}])
    engine = from_completion("p", [1, 2], [5, 9], [{5: -0.1, 6: -2.0}, {9: -5.0, 6: -0.01}], device="e", dtype="f")
    c = compare_tokens(ref, engine, 0.01)
    assert c.status == "diverged" and c.gap_b == pytest.approx(-4.99), c.message


def test_a_logprob_that_is_not_a_number_is_a_divergence_where_it_is():
    """A NaN compared as no difference at all: the same tokens with NaN logprobs matched, and a NaN
    at the first position turned the drift limit off for the whole prompt."""
    ref = _ref([5, 6, 7], [{5: -0.1}, {6: -0.1}, {7: -0.1}])
    broken = from_completion("p", [1, 2], [5, 6, 7], [{5: float("nan")}, {6: -2.0}, {7: -2.0}], device="e", dtype="f")
    for drift in (None, 0.01):
        c = compare_tokens(ref, broken, 0.01, drift_limit=drift)
        assert (c.status, c.position) == ("diverged", 0), c.message
        assert "logprob not a finite number at generated position 0" in c.message


def _engine(answers):
    """An in-process-shaped engine whose greedy answers come from ``answers`` (prompt -> Completion)."""
    profile = SimpleNamespace(engine=SimpleNamespace(args={"dtype": "float32"}))
    return SimpleNamespace(view="scheduler", profile=profile, llm=object(),
                           greedy=lambda prompts, n, logprobs=0: [answers[p] for p in prompts])


def test_judge_fails_naming_prompt_position_tokens_and_logprobs_and_passes_on_equal_tokens():
    ref = _ref([5, 6], [{5: -0.1, 6: -2.0}, {6: -0.5, 9: -1.5}])
    same = Completion("", [5, 6], 2, [{5: -0.1, 6: -2.0}, {6: -0.5, 9: -1.5}], [1, 2])
    ok = judge(_engine({"p": same}), [ref], "ref", margin=0.01, top_k=2, evidence={}, max_tokens=2)
    assert (ok.id, ok.status, ok.value) == ("weights.golden_tokens", "pass", 0)
    assert ok.message.startswith("1 match, 0 near-tie, 0 diverged of 1 prompts")
    wrong = Completion("", [5, 9], 2, [{5: -0.1, 6: -2.0}, {9: -0.3, 6: -2.5}], [1, 2])
    bad = judge(_engine({"p": wrong}), [ref], "ref", margin=0.01, top_k=2, evidence={}, max_tokens=2)
    assert (bad.status, bad.value) == ("fail", 1)
    assert "'p': diverged at generated position 1" in bad.message
    assert "token 6 (logprob -0.5) vs 9 (logprob -0.3)" in bad.message


def test_a_tokenizer_mismatch_is_a_divergence():
    ref = _ref([5], [{5: -0.1, 6: -2.0}])
    other = Completion("", [5], 1, [{5: -0.1, 6: -2.0}], [1, 3])
    check = judge(_engine({"p": other}), [ref], "ref", margin=0.01, top_k=2, evidence={}, max_tokens=1)
    assert check.status == "fail" and "prompt token ids differ" in check.message


def test_a_golden_file_with_reference_sequences_is_judged_with_near_ties(tmp_path):
    ref = _ref([5], [{5: -0.1000, 6: -0.1005}])  # within the float32 margin (1e-3 nats)
    golden = tmp_path / "golden.json"
    golden.write_text(json.dumps({"model": "m", "max_tokens": 1, "top_k": 2, "reference": "transformers",
                                  "prompts": [{"prompt": "p", "token_ids": [5], "sequence": ref.to_dict()}]}))
    tied = Completion("", [6], 1, [{6: -0.1001, 5: -0.1004}], [1, 2])
    check = golden_file_check(_engine({"p": tied}), str(golden))
    assert check is not None and (check.status, check.evidence["near_tie"]) == ("pass", 1)
    assert "near-tie: 'p': near-tie at generated position 0" in check.message
    tokens_only = tmp_path / "old.json"
    tokens_only.write_text(json.dumps({"model": "m", "max_tokens": 1, "prompts": [{"prompt": "p", "token_ids": [5]}]}))
    assert golden_file_check(_engine({"p": tied}), str(tokens_only)) is None  # judged exactly, as before


@pytest.mark.parametrize("edit, named", [
    (lambda d: d.update(tokens="abc"), "tokens: expected a list of ints"),
    (lambda d: d.update(top_logprobs=[[None, 1.0]]), "top_logprobs: expected a list of lists of floats"),
    (lambda d: d.pop("logprobs"), "missing logprobs"),
    (lambda d: d.update(top_ids=[]), "tokens, logprobs, top_ids and top_logprobs differ in length (1, 1, 0, 1)"),
])
def test_a_golden_files_malformed_sequence_is_one_line_naming_the_field(tmp_path, edit, named):
    """A hand-edited ``sequence`` was a TypeError mid-judgement; it is now a golden file refused
    before any engine is asked, naming the prompt and the field."""
    from day0.engine.loaded import read_golden

    seq = _ref([5], [{5: -0.1, 6: -2.0}]).to_dict()
    edit(seq)
    golden = tmp_path / "golden.json"
    golden.write_text(json.dumps({"model": "m", "max_tokens": 1, "top_k": 2,
                                  "prompts": [{"prompt": "p", "token_ids": [5], "sequence": seq}]}))
    with pytest.raises(ValueError) as err:
        read_golden(golden)
    assert str(err.value).startswith(f"{golden}: not a day0 golden file (ValueError: prompts[0].sequence: {named}")


def test_token_id_keys_of_the_completions_api():
    assert _token_id("token_id:42") == 42 and _token_id("7") == 7


def test_the_reference_is_refused_for_quantized_missing_or_too_large_checkpoints(tmp_path, monkeypatch):
    import day0.model.reference as reference

    assert host_reference_unavailable(None) == "the model is not a local directory"
    assert host_reference_unavailable(tmp_path) == f"{tmp_path / 'config.json'}: config.json not found"
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "awq"}}))
    assert "quantized (awq)" in host_reference_unavailable(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 1000)
    monkeypatch.setattr(reference, "_available_bytes", lambda: 2999)
    assert "needs ~0.0 GiB" in host_reference_unavailable(tmp_path)  # 1000 B x 2 (bf16 -> f32) x 1.5
    monkeypatch.setattr(reference, "_available_bytes", lambda: 3001)
    assert host_reference_unavailable(tmp_path) is None


def test_score_tokens_matches_greedy_reference_on_the_tiny_model(tmp_path):
    from day0.config.profile import TinySpec
    from day0.model.reference import greedy_reference, score_tokens
    from day0.model.tiny import build

    d = build(TinySpec(), tmp_path / "m")
    ref = greedy_reference(d, ["The supernode serves"], 4, top_k=3)[0]
    scores = score_tokens(d, ref.prompt_ids + ref.tokens[:-1], top_k=3)
    n = len(ref.prompt_ids)
    # position n-1 onwards predicts the generated tokens: teacher forcing agrees with greedy decoding
    assert scores.top1[n - 1:] == ref.tokens[:3] and len(scores.actual[n - 1:]) == 3
    assert all(math.isclose(a, b, abs_tol=1e-4) for a, b in zip(scores.actual[n - 1:], ref.logprobs[:3]))


def corrupted_copy(src, dst):
    """One attention matrix changed (a column of layer 0's o_proj scaled by -8): every header,
    shape and dtype as before, so the static audit (without the manifest) stays green."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("day0-manifest.json"))
    name = "model.layers.0.self_attn.o_proj.weight"
    shard = dst / json.loads((dst / "model.safetensors.index.json").read_text())["weight_map"][name]
    tensors = load_file(str(shard))
    tensors[name][:, 0] *= -8.0
    save_file(tensors, str(shard), metadata={"format": "pt"})
    return dst


@pytest.mark.engine
def test_an_engine_serving_a_corrupted_copy_fails_the_golden_tokens_naming_the_position(tmp_path):
    """Live: vLLM serves a corrupted copy of the tiny model. Against a golden file recorded by
    transformers from the trusted copy the check fails at the first divergent position; against
    transformers on the very bytes it serves (the default-target path) it passes."""
    from day0.config.profile import load_profile
    from day0.engine import ServerEngine
    from day0.engine.loaded import write_reference_golden
    from day0.model.tiny import cached_model
    from day0.stages.weights import audit, golden_tokens_check

    base = load_profile("cpu-tiny")
    trusted = cached_model(base.model.tiny)
    bad = corrupted_copy(trusted, tmp_path / "corrupted")
    assert [c for c in audit(bad, verify_manifest=False) if c.status not in ("pass", "skip")] == []
    golden = write_reference_golden(trusted, tmp_path / "golden.json", model="day0-tiny")
    profile = base.model_copy(update={"model": base.model.model_copy(update={"source": "path", "path": str(bad)})})
    engine = ServerEngine(profile, tmp_path, print, name="corrupted")
    engine.start()
    try:
        against_trusted = golden_tokens_check(lambda: engine, str(golden), bad)
        against_itself = golden_tokens_check(lambda: engine, None, bad)
    finally:
        engine.stop()
    print(against_trusted.message, against_itself.message, sep="\n")
    assert against_trusted.status == "fail" and against_trusted.value >= 3  # transformers on both: 4 of 4
    # a corrupted tensor moves the logprobs before it flips a token: either is named at its position
    assert "; first divergence: '" in against_trusted.message
    assert re.search(r"(diverged|logprobs drifted) at generated position \d+", against_trusted.message)
    assert "logprob " in against_trusted.message
    assert (against_itself.status, against_itself.value) == ("pass", 0)
    assert against_itself.evidence["reference"] == "transformers"


def test_equal_tokens_from_logprobs_further_apart_than_the_drift_limit_diverge_at_the_largest_move():
    ref = _ref([5, 6, 7], [{5: -0.1, 6: -2.0}, {6: -0.5, 9: -1.5}, {7: -0.2, 9: -3.0}])
    moved = from_completion("p", [1, 2], [5, 6, 7], [{5: -0.1, 6: -2.0}, {6: -0.516, 9: -1.5}, {7: -0.205, 9: -3.0}],
                            device="e", dtype="f")
    assert compare_tokens(ref, moved, 0.01).status == "match"  # without a drift limit: the tokens agree
    c = compare_tokens(ref, moved, 0.01, drift_limit=0.01)
    assert (c.status, c.position, c.token_a, c.token_b) == ("diverged", 1, 6, 6)
    assert "logprobs drifted at generated position 1" in c.message and "0.016" in c.message
    close = from_completion("p", [1, 2], [5, 6, 7], [{5: -0.1, 6: -2.0}, {6: -0.505, 9: -1.5}, {7: -0.2, 9: -3.0}],
                            device="e", dtype="f")
    assert compare_tokens(ref, close, 0.01, drift_limit=0.01).status == "match"


def test_a_golden_file_that_is_a_fifo_or_too_large_is_one_line_not_a_hang(tmp_path, monkeypatch):
    """``weights.golden`` is the user's path: it is read as any input file is, capped."""
    import os

    import day0.engine.loaded as loaded

    fifo = tmp_path / "golden.fifo"
    os.mkfifo(fifo)
    with pytest.raises(ValueError) as err:
        loaded.read_golden(fifo)
    assert str(err.value).startswith(str(fifo)) and "FIFO" in str(err.value)
    big = tmp_path / "golden.json"
    big.write_text(json.dumps({"model": "m", "max_tokens": 1, "prompts": [{"prompt": "p", "token_ids": [1]}]}))
    assert loaded.read_golden(big)["max_tokens"] == 1
    monkeypatch.setattr(loaded, "MAX_GOLDEN_BYTES", 16)
    with pytest.raises(ValueError) as err:
        loaded.read_golden(big)
    assert str(err.value).startswith(str(big)) and "golden file" in str(err.value)
    with pytest.raises(ValueError, match="golden file not found"):
        loaded.read_golden(tmp_path / "absent.json")


def test_a_config_that_is_a_fifo_makes_the_reference_unavailable_without_waiting(tmp_path):
    import os

    os.mkfifo(tmp_path / "config.json")
    why = host_reference_unavailable(tmp_path)
    assert why.startswith(f"{tmp_path / 'config.json'}: is a FIFO") and why.count(str(tmp_path)) == 1


@pytest.mark.parametrize("config, named", [
    ("[]", "config.json: top level is list, not an object"),
    ('{"quantization_config": "fp8"}', "the checkpoint is quantized (fp8)"),
    ("{}", "model.safetensors: cannot be read (No such file or directory)"),
], ids=["a-list", "quantization-a-string", "dangling-shard"])
def test_a_broken_checkpoint_makes_the_reference_unavailable_naming_why_not_a_traceback(tmp_path, config, named):
    """Parity, risks and the weights golden check ask this first; an AttributeError or a
    FileNotFoundError here lost what those stages had already measured (a hunt)."""
    (tmp_path / "config.json").write_text(config)
    (tmp_path / "model.safetensors").symlink_to(tmp_path / "gone")  # an HF cache whose blob was deleted
    assert named in host_reference_unavailable(tmp_path)
