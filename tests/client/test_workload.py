"""Synthetic workloads: exact lengths, ids inside the vocabulary, seeds, prefixes, arrivals."""

from __future__ import annotations

import json
import random
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from day0.client.workload import (
    Vocab,
    WorkloadError,
    WorkloadSpec,
    _id_sampler,
    arrival_offsets,
    as_text,
    build_requests,
    read_vocab,
)


class FixedDraw:
    """An rng stand-in whose randrange returns a chosen value, to enumerate the id mapping."""

    def __init__(self, x: int) -> None:
        self.x = x

    def randrange(self, n: int) -> int:
        assert 0 <= self.x < n
        return self.x


@given(st.integers(1, 300), st.data())
def test_id_mapping_is_a_bijection_onto_the_non_special_ids(size, data):
    specials = frozenset(data.draw(st.sets(st.integers(0, size + 5), max_size=size - 1)))
    vocab = Vocab(size, specials)
    draw = _id_sampler(vocab)
    usable = vocab.usable()
    got = [draw(FixedDraw(x)) for x in range(usable)]  # type: ignore[arg-type]
    assert got == sorted(set(range(size)) - specials)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 5000), st.integers(1, 64), st.integers(1, 64), st.integers(0, 2**32), st.data())
def test_lengths_exact_and_ids_in_vocab(size, n_in, n_out, seed, data):
    specials = frozenset(data.draw(st.sets(st.integers(0, size - 1), max_size=min(size - 1, 8))))
    reqs = build_requests(WorkloadSpec(n_in, n_out, seed=seed), Vocab(size, specials), 5)
    for r in reqs:
        assert isinstance(r.prompt, list)
        assert len(r.prompt) == r.input_len == n_in
        assert r.output_len == n_out
        assert all(0 <= t < size and t not in specials for t in r.prompt)


def test_seed_reproduces_and_streams_are_independent():
    spec = WorkloadSpec([8, 40], [4, 9], seed=7)
    a = build_requests(spec, 1000, 20)
    assert a == build_requests(spec, 1000, 20)
    assert a != build_requests(WorkloadSpec([8, 40], [4, 9], seed=8), 1000, 20)
    assert build_requests(spec, 1000, 20, stream="warmup") != a
    assert build_requests(spec, 1000, 30)[:20] == a  # asking for more keeps the first ones


def test_uniform_ranges_are_inclusive_and_used():
    reqs = build_requests(WorkloadSpec([3, 6], [1, 2], seed=1), 50, 400)
    assert {r.input_len for r in reqs} == {3, 4, 5, 6}
    assert {r.output_len for r in reqs} == {1, 2}


def test_shared_prefix_groups():
    spec = WorkloadSpec(40, 4, prefix_len=32, num_prefixes=3, seed=3)
    reqs = build_requests(spec, 30000, 9)
    prefixes = {r.prefix_group: tuple(r.prompt[:32]) for r in reqs}
    assert len(set(prefixes.values())) == 3
    for r in reqs:
        assert tuple(r.prompt[:32]) == prefixes[r.prefix_group] and len(r.prompt) == 40
    assert len({tuple(r.prompt[32:]) for r in reqs}) == 9  # unique suffixes
    warm = build_requests(spec, 30000, 3, stream="warmup")
    assert {tuple(r.prompt[:32]) for r in warm} <= set(prefixes.values())  # warm-up warms the same prefixes


@pytest.mark.parametrize("spec, key", [
    (WorkloadSpec(0, 4), "input_len"),
    (WorkloadSpec([9, 3], 4), "input_len"),
    (WorkloadSpec(8, "x"), "output_len"),  # type: ignore[arg-type]
    (WorkloadSpec(8, 4, prefix_len=8), "prefix_len"),
    (WorkloadSpec(8, 4, num_prefixes=0), "num_prefixes"),
])
def test_bad_specs_name_the_key(spec, key):
    with pytest.raises(WorkloadError, match=key):
        build_requests(spec, 100, 1)


def test_all_special_vocab_is_refused():
    with pytest.raises(WorkloadError, match="every id is special"):
        build_requests(WorkloadSpec(4, 4), Vocab(2, frozenset({0, 1})), 1)


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_arrivals_have_the_asked_rate_and_burstiness(burstiness):
    rate = 50.0
    t = arrival_offsets(20001, rate, burstiness, seed=11)
    gaps = [b - a for a, b in zip(t, t[1:])]
    assert t[0] == 0.0 and all(g >= 0 for g in gaps)
    assert statistics.fmean(gaps) == pytest.approx(1 / rate, rel=0.05)
    cv = statistics.pstdev(gaps) / statistics.fmean(gaps)
    assert cv == pytest.approx(1 / burstiness ** 0.5, rel=0.1)  # gamma shape k: CV = 1/sqrt(k)
    assert arrival_offsets(100, rate, burstiness, seed=11) == t[:100]


@pytest.mark.parametrize("burstiness", [0.5, 1.0, float("inf")])
def test_vllm_arrivals_wait_one_gap_and_end_at_n_over_rate(burstiness):
    """vLLM's get_request: n gaps (the first request waits one), rescaled so the last lands at n/rate;
    day0's immediate: the first at t=0, n-1 gaps, no rescale."""
    rate, n = 40.0, 200
    v = arrival_offsets(n, rate, burstiness, seed=5, first="vllm")
    i = arrival_offsets(n, rate, burstiness, seed=5)
    assert len(v) == len(i) == n and v == sorted(v)
    assert v[-1] == pytest.approx(n / rate, rel=1e-12) and v[0] > 0.0
    assert i[0] == 0.0
    if burstiness == float("inf"):  # evenly spaced: vLLM's first gap is 1/rate, ours starts at 0
        assert v[0] == pytest.approx(1 / rate) and i[1] == pytest.approx(1 / rate)
    else:  # random gaps: without the rescale the last lands where the draws put it
        assert i[-1] != pytest.approx(n / rate, rel=1e-9)
    # the same draws, one more of them, then one scale: the gaps keep their proportions
    raw = arrival_offsets(n + 1, rate, burstiness, seed=5)[1:]
    assert [x / raw[-1] for x in raw] == pytest.approx([x / v[-1] for x in v], rel=1e-9)


@pytest.mark.parametrize("burstiness", [0.5, 1.0, 4.0])
def test_an_exact_schedule_offers_exactly_its_rate_and_keeps_its_bursts(burstiness):
    """A search point's schedule: the last of n requests at (n-1)/rate on every seed, the gaps in
    the raw draw's proportions. Unscaled, 60 Poisson gaps realise a rate that is a draw."""
    rate, n = 12.0, 60
    realised = []
    for seed in range(40):
        raw = arrival_offsets(n, rate, burstiness, seed=seed)
        exact = arrival_offsets(n, rate, burstiness, seed=seed, exact=True)
        assert exact[0] == 0.0 and exact[-1] == pytest.approx((n - 1) / rate, rel=1e-12)
        assert [x / exact[-1] for x in exact] == pytest.approx([x / raw[-1] for x in raw], rel=1e-9)
        realised.append((n - 1) / raw[-1])
    assert max(realised) / min(realised) > 1.2  # what the rescale takes out of a search's answer
    assert arrival_offsets(n, rate, burstiness, seed=3, first="vllm", exact=True) == \
        arrival_offsets(n, rate, burstiness, seed=3, first="vllm")  # vLLM's convention is exact already
    assert arrival_offsets(1, rate, burstiness, seed=3, exact=True) == [0.0]


def test_each_named_stream_draws_its_own_schedule_and_the_unnamed_one_is_the_seeds_own():
    """A sweep's steps and a search's points share a seed and name their streams: the same name gives
    the same schedule run after run, another name other gaps (not the same ones rescaled, which put
    one burst at the same request of every point); the measured phase's unnamed stream stays the
    seed's own draw."""
    def proportions(t: list[float]) -> list[float]:
        return [(b - a) / t[-1] for a, b in zip(t, t[1:])]

    rate, n = 30.0, 200
    one, again = (arrival_offsets(n, rate, 1.0, 7, exact=True, stream="search1") for _ in range(2))
    other = arrival_offsets(n, rate * 1.05, 1.0, 7, exact=True, stream="search2")
    seeds_own = arrival_offsets(n, rate, 1.0, 7, exact=True)
    assert one == again
    assert proportions(other) != pytest.approx(proportions(one), rel=1e-3)
    assert proportions(seeds_own) != pytest.approx(proportions(one), rel=1e-3)
    rng = random.Random("7:arrivals")  # the key every earlier run's measured phase used
    t, raw = 0.0, [0.0]
    for _ in range(n - 1):
        t += rng.gammavariate(1.0, 1.0 / rate)
        raw.append(t)
    assert arrival_offsets(n, rate, 1.0, 7) == raw


def test_an_unknown_arrivals_convention_is_refused():
    with pytest.raises(WorkloadError, match="arrivals: expected one of immediate, vllm"):
        arrival_offsets(3, 1.0, 1.0, 0, first="later")
    assert arrival_offsets(4, float("inf"), 1.0, 0, first="vllm") == [0.0] * 4


def test_infinite_rate_sends_everything_at_once():
    assert arrival_offsets(5, float("inf"), 1.0, 0) == [0.0] * 5
    with pytest.raises(WorkloadError, match="request_rate"):
        arrival_offsets(5, 0.0, 1.0, 0)


def test_read_vocab_from_a_real_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>", "<unk>"])
    tok.train_from_iterator(["hello world", "day zero latency check"] * 50, trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": tok.get_vocab_size(), "eos_token_id": 1}))
    v = read_vocab(tmp_path)
    assert v.size == tok.get_vocab_size()
    assert {tok.token_to_id(s) for s in ("<s>", "</s>", "<unk>")} <= v.special_ids
    reqs = build_requests(WorkloadSpec(16, 4), v, 10)
    for r in reqs:
        assert len(tok.decode(r.prompt, skip_special_tokens=False)) > 0  # the tokenizer accepts every id
        assert not set(r.prompt) & v.special_ids


def test_read_vocab_errors_name_the_file(tmp_path):
    with pytest.raises(WorkloadError, match="tokenizer.json: not found"):
        read_vocab(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{broken")
    with pytest.raises(WorkloadError, match="tokenizer.json: not JSON"):
        read_vocab(tmp_path)


@pytest.mark.parametrize(("tokenizer", "config", "message"), [
    (b"[]", None, "tokenizer.json: expected a JSON object, got list"),
    (b'{"model": {"vocab": {"a": 0}}, "added_tokens": [{"content": "<s>"}]}', None,
     "tokenizer.json: added_tokens[0].id: expected a token id (a whole number >= 0), got nothing"),
    (b'{"model": {"vocab": {"a": 0}}, "added_tokens": [{"id": "x"}]}', None,
     "tokenizer.json: added_tokens[0].id: expected a token id (a whole number >= 0), got 'x'"),
    (b'{"model": {"vocab": {"a": 0}}, "added_tokens": ["<s>"]}', None,
     "tokenizer.json: added_tokens[0]: expected an object, got str"),
    (b'{"model": {"vocab": {"a": 0}}, "added_tokens": {"id": 1}}', None,
     "tokenizer.json: added_tokens: expected a list, got dict"),
    (b'{"model": {"vocab": {"a": "7"}}}', None,
     "tokenizer.json: model.vocab['a']: expected a token id (a whole number >= 0), got '7'"),
    (b'{"model": {"vocab": 5}}', None, "tokenizer.json: model.vocab: expected an object or a list, got int"),
    (b'{"model": []}', None, "tokenizer.json: model: expected an object, got list"),
    (b'{"model": {"vocab": {"\xff": 0}}}', None, "tokenizer.json: not UTF-8 text (byte 0xff at offset 22)"),
    (b"[" * 100_000, None, "tokenizer.json: JSON nested too deeply"),
    (b'{"model": {"vocab": {"a": ' + b"9" * 5000 + b'}}}', None, "tokenizer.json: not usable JSON (Exceeds the limit"),
    (b'{"model": {"vocab": {"a": 0, "b": 1}}}', b"[]", "config.json: expected a JSON object, got list"),
    (b'{"model": {"vocab": {"a": 0, "b": 1}}}', b'{"text_config": 3}', "config.json: text_config: expected an object"),
], ids=["list", "no_id", "id_not_a_number", "entry_not_object", "added_not_list", "vocab_id_string", "vocab_int",
        "model_list", "not_utf8", "nested", "digits", "config_list", "text_config_int"])
def test_a_tokenizer_folder_of_the_wrong_shape_is_one_error_naming_file_and_key(tmp_path, tokenizer, config, message):
    (tmp_path / "tokenizer.json").write_bytes(tokenizer)
    if config is not None:
        (tmp_path / "config.json").write_bytes(config)
    with pytest.raises(WorkloadError) as exc:
        read_vocab(tmp_path)
    assert str(exc.value).startswith(f"{tmp_path}/{message}"), exc.value


@pytest.mark.parametrize("name", ["tokenizer.json", "config.json"])
def test_a_tokenizer_folder_holding_a_fifo_or_a_huge_file_is_refused_at_once(tmp_path, name):
    """Read before the server is tried: a FIFO hung the command, and a file of any size was read
    whole (300 MB held 667 MB); now each is one line naming the file, as every other reader's."""
    import os

    (tmp_path / "tokenizer.json").write_bytes(b'{"model": {"vocab": {"a": 0}}}')
    (tmp_path / name).unlink(missing_ok=True)
    os.mkfifo(tmp_path / name)
    with pytest.raises(WorkloadError, match=f"{name}: is a FIFO"):
        read_vocab(tmp_path)
    (tmp_path / name).unlink()
    with (tmp_path / name).open("wb") as fh:
        fh.truncate(300 << 20)  # sparse: claims 300 MiB, costs nothing
    with pytest.raises(WorkloadError, match=f"{name}: 300 MiB, over the 256 MiB"):
        read_vocab(tmp_path)


def test_chat_text_keeps_indices_and_lengths():
    reqs = build_requests(WorkloadSpec(12, 3), 500, 4)
    text = as_text(reqs)
    assert [r.index for r in text] == [0, 1, 2, 3]
    assert all(isinstance(r.prompt, str) and len(r.prompt.split()) == 12 for r in text)


def test_a_nonce_makes_every_run_fresh_and_keeps_the_seeds_lengths():
    """Two runs with one seed: without a nonce the prompts repeat token for token (a prefix cache
    serves the second); with one, the first tokens differ, and the lengths and the rest stay."""
    from day0.client.workload import NONCE_TOKENS

    spec = WorkloadSpec([40, 90], [4, 9], seed=3)
    plain = build_requests(spec, 1000, 12)
    assert plain == build_requests(spec, 1000, 12)
    one, two = (build_requests(WorkloadSpec([40, 90], [4, 9], seed=3, nonce=n), 1000, 12) for n in (1, 2))
    for p, a, b in zip(plain, one, two):
        assert (a.input_len, a.output_len) == (b.input_len, b.output_len) == (p.input_len, p.output_len)
        assert len(a.prompt) == len(b.prompt) == p.input_len
        assert a.prompt[:NONCE_TOKENS] != b.prompt[:NONCE_TOKENS]
        assert a.prompt[NONCE_TOKENS:] == b.prompt[NONCE_TOKENS:] == p.prompt[: p.input_len - NONCE_TOKENS]
        assert a.shared_len == 0  # nothing shared by design: the nonce alone is shorter than a block
    # short prompts keep one token of their own after the nonce
    tiny = build_requests(WorkloadSpec(3, 1, nonce=5), 1000, 4)
    assert all(len(r.prompt) == 3 and r.prompt[:2] == tiny[0].prompt[:2] for r in tiny)
    assert WorkloadSpec(3, 1, nonce=5).nonce_tokens() == 2 and WorkloadSpec(1, 1, nonce=5).nonce_tokens() == 0


def test_the_nonce_goes_before_the_shared_prefix_which_stays_shared_within_a_run():
    spec = dict(input_len=[60, 80], output_len=4, prefix_len=20, num_prefixes=2, seed=1)
    runs = [build_requests(WorkloadSpec(**spec, nonce=n), 1000, 8) for n in (11, 12)]
    for reqs in runs:
        k = WorkloadSpec(**spec, nonce=11).nonce_tokens()
        for r in reqs:
            assert r.shared_len == k + 20
            same_group = [o for o in reqs if o.prefix_group == r.prefix_group]
            assert all(o.prompt[: r.shared_len] == r.prompt[: r.shared_len] for o in same_group)
            other = [o for o in reqs if o.prefix_group != r.prefix_group]
            assert all(o.prompt[: r.shared_len] != r.prompt[: r.shared_len] for o in other)
    assert runs[0][0].prompt[:28] != runs[1][0].prompt[:28]  # fresh across runs
    assert runs[0][0].prompt[8:28] == runs[1][0].prompt[8:28]  # the prefix itself is the seed's


def test_shared_share_is_exact_from_the_requests():
    from day0.client.workload import shared_share

    reqs = build_requests(WorkloadSpec([50, 150], 2, prefix_len=10, seed=4, nonce=9), 1000, 30)
    expected = sum(18 for _ in reqs) / sum(r.input_len for r in reqs)
    assert shared_share(reqs) == pytest.approx(expected)
    assert shared_share(build_requests(WorkloadSpec([50, 150], 2, seed=4, nonce=9), 1000, 30)) == 0.0


def test_log_uniform_lengths_spread_over_every_decade():
    reqs = build_requests(WorkloadSpec([100, 100_000], 1, input_dist="log_uniform", seed=2), 50, 600)
    lens = [r.input_len for r in reqs]
    assert min(lens) >= 100 and max(lens) <= 100_000
    per_decade = [sum(1 for n in lens if lo <= n < lo * 10) for lo in (100, 1000, 10_000)]
    assert all(150 <= c <= 250 for c in per_decade), per_decade  # uniform would put ~90% in the top decade
    with pytest.raises(WorkloadError, match="input_dist"):
        WorkloadSpec(input_dist="zipf").validate()


def test_dataset_lengths_replace_both_lengths_and_are_drawn_by_the_seed():
    pairs = ((10, 4), (200, 50), (33, 7))
    a = build_requests(WorkloadSpec(lengths=pairs, seed=5), 1000, 40)
    assert {(r.input_len, r.output_len) for r in a} == set(pairs)
    assert all(len(r.prompt) == r.input_len for r in a)
    assert a == build_requests(WorkloadSpec(lengths=pairs, seed=5), 1000, 40)
    assert [r.input_len for r in a] != [r.input_len for r in build_requests(WorkloadSpec(lengths=pairs, seed=6),
                                                                               1000, 40)]
    with pytest.raises(WorkloadError, match="shortest dataset prompt"):
        WorkloadSpec(lengths=pairs, prefix_len=10).validate()
