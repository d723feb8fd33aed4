"""The parity stage's pure parts: which features are in force (and from where), speculative
acceptance from /metrics with vLLM's arithmetic, and a low acceptance failing by name."""

from day0.config.parity import ParitySection
from day0.config.profile import load_profile
from day0.stages.parity import acceptance, acceptance_checks, features
from tests.support.spec_counters import spec_counters

spec = spec_counters


def test_features_read_the_profile_and_vllm_defaults():
    found = {f.name: f for f in features(load_profile("cpu-tiny").engine.args)}
    assert found["prefix_caching"].in_force and found["prefix_caching"].source.startswith("profile:")
    assert found["speculative"].in_force is False
    assert found["chunked_prefill"].in_force and found["chunked_prefill"].source.startswith("vLLM default:")
    assert "past the chunk budget (2048 tokens, vLLM default on CPU: 2048 x 1 rank(s))" in \
        found["chunked_prefill"].compared_against
    assert found["graph_mode"].in_force is False  # enforce_eager = true
    max_len = load_profile("cpu-tiny").engine.args["max_model_len"]
    assert f"after a {int(max_len * 0.75)}-token prompt (3/4 of max_model_len = {max_len})" in \
        found["long_context"].compared_against and not found["long_context"].not_compared
    on = {f.name: f for f in features({"speculative_config": {"method": "ngram"}, "enable_prefix_caching": False,
                                       "max_num_batched_tokens": 512, "tensor_parallel_size": 2}, device="cuda")}
    assert on["speculative"].in_force and not on["prefix_caching"].in_force
    assert on["graph_mode"].in_force and "weights.golden_tokens" in on["graph_mode"].compared_against
    assert on["parallel_layout"].in_force and "weights.golden_tokens" in on["parallel_layout"].compared_against
    assert "(512 tokens, profile: max_num_batched_tokens = 512)" in on["chunked_prefill"].compared_against
    # no max_model_len: vLLM takes the model's, which may be far beyond a reference here
    assert on["long_context"].not_compared.startswith("not compared: engine.args.max_model_len is not set")
    assert features({}, device="cuda")[4].compared_against.endswith("(16384 tokens, vLLM default on GPUs: at "
                                                                     "most 16384) vs transformers")
    off = {f.name: f for f in features({"max_model_len": 8192}, long_context_tokens=0)}
    assert off["long_context"].not_compared == "not compared: parity.long_context_tokens = 0"
    spec_profile = load_profile("cpu-tiny-spec")
    assert spec_profile.engine.args["speculative_config"]["method"] == "ngram"
    assert spec_profile.parity.min_acceptance_rate == 0.2


def test_acceptance_is_vllms_arithmetic_over_the_window():
    before, after = spec(10, 30, 12, 6, 4, 2), spec(44, 132, 66, 30, 22, 14)
    acc = acceptance(before, after)
    assert (acc.drafts, acc.draft_tokens, acc.accepted) == (34, 102, 54)
    assert abs(acc.rate - 54 / 102) < 1e-12
    assert abs(acc.mean_length - (1 + 54 / 34)) < 1e-12
    assert acc.per_position_rate() == {0: 24 / 34, 1: 18 / 34, 2: 12 / 34}
    assert acceptance(None, "# nothing\n") is None


def test_good_acceptance_passes_and_low_acceptance_fails_naming_speculation():
    section = ParitySection(min_acceptance_rate=0.2, min_mean_acceptance_length=1.3)
    good = {c.id: c for c in acceptance_checks(spec(0, 0, 0, 0, 0, 0), spec(34, 102, 54, 24, 18, 12), section)}
    assert all(c.status == "pass" for c in good.values()), [c.message for c in good.values()]
    # acceptance collapsing after position 0 (vLLM #33497, #51009): most drafts rejected
    low = {c.id: c for c in acceptance_checks(spec(0, 0, 0, 0, 0, 0), spec(34, 102, 6, 6, 0, 0), section)}
    rate, length = low["parity.speculative.acceptance_rate"], low["parity.speculative.mean_acceptance_length"]
    assert rate.status == "fail" and rate.message.startswith("speculative decoding: acceptance rate 0.059")
    assert length.status == "fail" and "mean acceptance length 1.176" in length.message
    assert "per position 0: 0.18, 1: 0.00, 2: 0.00" in rate.message


def test_no_drafts_or_no_counters_is_an_error_not_a_pass():
    section = ParitySection()
    idle = acceptance_checks(spec(5, 15, 3, 1, 1, 1), spec(5, 15, 3, 1, 1, 1), section)
    assert {c.status for c in idle} == {"error"} and "no draft was proposed" in idle[0].message
    absent = acceptance_checks("# nothing\n", "# nothing\n", section)
    assert {c.status for c in absent} == {"error"} and "no vllm:spec_decode_* counters" in absent[0].message
    restarted = acceptance_checks(spec(50, 150, 30, 10, 10, 10), spec(5, 15, 3, 1, 1, 1), section)
    assert {c.status for c in restarted} == {"error"} and "went down" in restarted[0].message
