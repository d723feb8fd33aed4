"""Two parity rules that need no server: a pair is compared as a client reads it (the text too),
and a prefix-caching pair whose hit nothing confirms is no pass. The answers are crafted."""

from __future__ import annotations

import asyncio

import pytest

from day0.config.parity import ParitySection
from day0.stages.parity import stage as parity_stage
from day0.stages.parity.answers import Answer
from day0.stages.parity.compare import Pair, compare_pair
from day0.stages.parity.features import features


def _answer(text: str, streamed: bool = False) -> Answer:
    return Answer("p", [5, 6], [{5: -0.1}, {6: -0.2}], "length", [1, 2], streamed=streamed, text=text)


def test_the_same_tokens_read_as_other_text_diverge_and_a_dropped_replacement_character_does_not():
    """The incremental detokenizer is streaming's own suspect: the same ids, garbled text, passed."""
    same = compare_pair(Pair(_answer(" hello world"), _answer(" hello world", True), ("whole", "streamed")), 1e-3, "f")
    assert same.status == "match"
    garbled = compare_pair(Pair(_answer(" hello world"), _answer(" hello wo\ufffdrld world", True),
                                ("whole", "streamed")), 1e-3, "f")
    assert garbled.status == "diverged" and "the same 2 tokens read" in garbled.message
    held_back = compare_pair(Pair(_answer(" caf\ufffd"), _answer(" caf", True), ("whole", "streamed")), 1e-3, "f")
    assert held_back.status == "match"  # bytes that never formed a character: not the API's contract
    reference = Answer("p", [5, 6], [{5: -0.1}, {6: -0.2}], "length", [1, 2])  # transformers': no server text
    assert compare_pair(Pair(_answer(" hello"), reference, ("vllm", "transformers")), 1e-3, "f").status == "match"


def test_a_prefix_cache_pair_whose_hit_nothing_confirms_is_an_error(monkeypatch):
    """No cached-token count in usage and no /metrics: two misses would match as well."""
    async def ask_one(session, endpoint, ask, stream=False):
        return Answer(ask.prompt, [1, 2, 3], [{1: -0.1}, {2: -0.2}, {3: -0.3}], "length", list(range(220)),
                      usage={"prompt_tokens": 220, "completion_tokens": 3})

    async def no_metrics(session, endpoint):
        return None

    monkeypatch.setattr(parity_stage, "ask_one", ask_one)
    monkeypatch.setattr(parity_stage, "metrics_text", no_metrics)
    run = parity_stage.Parity.__new__(parity_stage.Parity)
    run.section, run.nonce, run.salting, run.margin, run.dtype, run.endpoint = ParitySection(), "ab", True, 1e-3, "f", None
    run.features = {f.name: f for f in features({})}
    check = asyncio.run(run.prefix_caching(None))
    assert check.status == "error", check.message
    assert "the repeat's cache hit cannot be confirmed" in check.message


@pytest.mark.parametrize("text", [" a", ""])
def test_an_answer_keeps_the_text_of_every_choice_it_was_given(text):
    from day0.stages.parity.answers import _take_choice

    answer = Answer("p")
    assert answer.text is None
    _take_choice(answer, {"token_ids": [1], "text": text})
    _take_choice(answer, {"token_ids": [2], "text": " b"})
    assert answer.text == text + " b" and answer.tokens == [1, 2]
