"""Stream parsing: the SSE parser (any byte split, line ending, comments, multi-line data parse
the same) and the per-message token accounting (real vLLM chunks, generated streams, bad events)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from day0.client import sse
from day0.client.loadgen import SSEEvent, SSEParser, TokenAccountant, _Failed
from day0.client.stream import max_output_tokens

# field values: any text without line breaks (surrogates cannot be UTF-8 encoded)
line_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"), max_size=30)

event_st = st.fixed_dictionaries({
    "data": st.lists(line_text, max_size=4),
    "event": st.one_of(st.none(), line_text.filter(lambda s: s != "")),
    "comments": st.lists(line_text, max_size=2),
})


def serialize(events: list[dict], eol: str) -> bytes:
    out = []
    for ev in events:
        for c in ev["comments"]:
            out.append(":" + c + eol)
        if ev["event"] is not None:
            out.append("event: " + ev["event"] + eol)
        for d in ev["data"]:
            out.append("data: " + d + eol)
        out.append(eol)
    return "".join(out).encode("utf-8")


def expected(events: list[dict]) -> list[tuple[str, str]]:
    return [("\n".join(ev["data"]), ev["event"] or "message") for ev in events if ev["data"]]


def feed_split(payload: bytes, cuts: list[int]) -> list[SSEEvent]:
    p = SSEParser()
    out: list[SSEEvent] = []
    prev = 0
    for c in sorted(set(cuts)) + [len(payload)]:
        out.extend(p.feed(payload[prev:c]))
        prev = c
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(event_st, max_size=6), st.sampled_from(["\n", "\r\n", "\r"]), st.data())
def test_any_split_gives_the_events(events, eol, data):
    payload = serialize(events, eol)
    cuts = data.draw(st.lists(st.integers(0, len(payload)), max_size=12))
    got = feed_split(payload, cuts)
    assert [(e.data, e.event) for e in got] == expected(events)


@settings(max_examples=100, deadline=None)
@given(st.lists(event_st, min_size=1, max_size=4), st.sampled_from(["\n", "\r\n"]))
def test_byte_at_a_time_equals_whole(events, eol):
    payload = serialize(events, eol)
    whole = SSEParser().feed(payload)
    p = SSEParser()
    single = [e for i in range(len(payload)) for e in p.feed(payload[i:i + 1])]
    assert [(e.data, e.event) for e in single] == [(e.data, e.event) for e in whole]


@settings(max_examples=100, deadline=None)
@given(st.lists(event_st, min_size=1, max_size=5), st.sampled_from(["\n", "\r\n"]), st.booleans())
def test_one_event_per_chunk_equals_whole(events, eol, bom):
    """A server writes each event as its own chunk (the timed path's commonest call): that gives
    exactly what the same bytes give fed at once, ids included."""
    chunks = [serialize([ev], eol) for ev in events]
    if bom:
        chunks[0] = b"\xef\xbb\xbf" + chunks[0]
    p = SSEParser()
    one_by_one = [e for c in chunks for e in p.feed(c)]
    whole = SSEParser().feed(b"".join(chunks))
    assert [(e.data, e.event, e.id) for e in one_by_one] == [(e.data, e.event, e.id) for e in whole]
    assert [(e.data, e.event) for e in one_by_one] == expected(events)


@given(line_text.filter(lambda s: s != ""))
def test_unterminated_event_is_not_dispatched_and_is_pending(text):
    p = SSEParser()
    assert p.feed(("data: " + text + "\n").encode()) == []  # no blank line yet: a cut stream
    assert p.pending


def test_data_field_rules():
    p = SSEParser()
    evs = p.feed(b"data:no-space\n\ndata:  two spaces\n\ndata\n\nid: 7\ndata: {\"a\": 1}\n\n: ping\n\n")
    assert [e.data for e in evs] == ["no-space", " two spaces", "", '{"a": 1}']
    assert evs[-1].id == "7"


def test_utf8_split_inside_a_character():
    payload = "data: héllo ✓\n\n".encode("utf-8")
    cut = payload.index("✓".encode()) + 1  # in the middle of the 3-byte sequence
    p = SSEParser()
    assert p.feed(payload[:cut]) == []
    assert [e.data for e in p.feed(payload[cut:])] == ["héllo ✓"]


def test_bom_and_crlf_split_across_reads():
    p = SSEParser()
    out = p.feed(b"\xef\xbb")
    out += p.feed(b"\xbfdata: x\r")
    out += p.feed(b"\n\r")
    out += p.feed(b"\ndata: y\r\n\r\n")
    assert [e.data for e in out] == ["x", "y"]


# ----------------------------------------------------------------------------- token accounting

# A real vLLM 0.32 chat stream (tiny byte-level model, continuous usage): the role chunk, then a
# token whose text is half a UTF-8 character (empty content), then two visible tokens, then usage.
VLLM_CHAT = [
    '{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant",'
    '"content":""},"logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":3,"total_tokens":3,"completion_tokens":0}}',
    '{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":""},'
    '"logprobs":null,"finish_reason":null,"token_ids":null}],"usage":{"prompt_tokens":3,"total_tokens":4,"completion_tokens":1}}',
    '{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"\\u0786"},'
    '"logprobs":null,"finish_reason":null,"token_ids":null}],"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2}}',
    '{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"ry"},'
    '"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null}],"usage":{"prompt_tokens":3,'
    '"total_tokens":6,"completion_tokens":3}}',
    '{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":3,'
    '"total_tokens":6,"completion_tokens":3}}',
]


def test_real_vllm_chat_stream_counts_the_empty_text_token_and_not_the_role():
    a = TokenAccountant()
    assert [a.tokens_in(d) for d in VLLM_CHAT] == [0, 1, 1, 1, 0]
    assert (a.final_tokens, a.prompt_tokens, a.weakest) == (3, 3, 1)


def test_without_usage_the_empty_text_token_still_counts_and_is_marked():
    """Without per-chunk usage the empty-text chunk is still a token (vLLM bench counts it so): the
    first token is never missed; the role chunk still is no token."""
    a = TokenAccountant()
    stripped = [json.dumps({k: v for k, v in json.loads(d).items() if k != "usage"}) for d in VLLM_CHAT[:4]]
    assert [a.tokens_in(d) for d in stripped] == [0, 1, 1, 1]
    assert a.weakest == 2 and a.final_tokens is None


@pytest.mark.parametrize("choice, tokens", [
    ({"index": 0, "text": ""}, 1),  # completions: half a UTF-8 character
    ({"index": 0, "text": "", "finish_reason": "length"}, 1),
    ({"index": 0, "delta": {"content": ""}}, 1),
    ({"index": 0, "delta": {"role": "assistant", "content": ""}}, 0),  # the role announcement
    ({"index": 0, "delta": {}, "finish_reason": "stop"}, 0),  # OpenAI's closing chunk: no text field
    ({"index": 0, "text": None, "finish_reason": "stop"}, 0),
    ({"index": 0, "delta": {"tool_calls": [{"index": 0}]}}, 1),
])
def test_a_text_field_is_a_token_even_empty(choice, tokens):
    assert TokenAccountant().tokens_in(json.dumps({"choices": [choice]})) == tokens


@st.composite
def token_messages(draw):
    n = draw(st.integers(1, 20))
    counts = draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
    texts = draw(st.lists(st.sampled_from(["", "a", "tok tok", "\u00e9"]), min_size=n, max_size=n))
    return counts, texts


@given(token_messages(), st.sampled_from(["completions", "chat"]))
def test_accounting_recovers_the_tokens_of_every_message(msgs, endpoint):
    counts, texts = msgs

    def choice(text, extra):
        base = {"index": 0, "text": text} if endpoint == "completions" else {"index": 0, "delta": {"content": text}}
        return {**base, **extra}

    cont, ids, plain = TokenAccountant(), TokenAccountant(), TokenAccountant()
    cum = 0
    for k, text in zip(counts, texts):
        cum += k
        assert cont.tokens_in(json.dumps({"choices": [choice(text, {})], "usage": {"completion_tokens": cum}})) == k
        assert ids.tokens_in(json.dumps({"choices": [choice(text, {"token_ids": list(range(k))})]})) == k
        assert plain.tokens_in(json.dumps({"choices": [choice(text, {})]})) == 1  # one per message, empty or not
    assert cont.tokens_in(json.dumps({"choices": [], "usage": {"completion_tokens": cum, "prompt_tokens": 5}})) == 0
    assert cont.final_tokens == cum and cont.prompt_tokens == 5
    assert (cont.weakest, ids.weakest, plain.weakest) == (1, 0, 2)


def _delta(content: str | None, **extra) -> dict:
    return {"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None, **extra}]}


# Streams whose messages carry their tokens by different evidence, each with the tokens every message
# holds. Until 2026-12: a usage's growth was measured from the previous usage alone, so the tokens
# text (or token-id) messages had carried since were counted again where the next usage came.
MIXED = {
    # llama.cpp (b6097, 2025-08): one-token deltas without usage, then the closing `delta: {}` with
    # finish_reason and the usage, no `choices: []` chunk: the closing chunk was 3 tokens more
    "llama_cpp_closing_usage": ([
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None}]},
        _delta("a"), _delta("b"), _delta("c"),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
         "usage": {"completion_tokens": 3, "prompt_tokens": 5, "total_tokens": 8}},
    ], [0, 1, 1, 1, 0]),
    # the closing choice with empty content, finish_reason and usage (DeepSeek's API streams it so)
    "closing_empty_content_with_usage": ([
        _delta("a"), _delta("b"), {"choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "stop"}],
                                   "usage": {"completion_tokens": 2, "prompt_tokens": 5}},
    ], [1, 1, 0]),
    # usage on every other chunk (a server that batches its usage reports)
    "usage_every_other": ([
        {"choices": [{"text": "a"}]}, {"choices": [{"text": "b"}], "usage": {"completion_tokens": 2}},
        {"choices": [{"text": "c"}]}, {"choices": [{"text": "d"}], "usage": {"completion_tokens": 4}},
    ], [1, 1, 1, 1]),
    # token ids on one message, usage on the next
    "token_ids_then_usage": ([
        {"choices": [{"text": "ab", "token_ids": [1, 2]}]}, {"choices": [{"text": "c"}], "usage": {"completion_tokens": 3}},
    ], [2, 1]),
    # a text message that held two tokens (held-back UTF-8 bytes): the next usage makes up the total
    "usage_after_a_two_token_text": ([
        {"choices": [{"text": "\u00e9"}]}, {"choices": [{"text": "x"}], "usage": {"completion_tokens": 3}},
    ], [1, 2]),
}


@pytest.mark.parametrize("events, truth", MIXED.values(), ids=MIXED.keys())
def test_a_token_is_counted_once_whatever_evidence_carries_it(events, truth):
    a = TokenAccountant(max_tokens=8)
    assert [a.tokens_in(json.dumps(e)) for e in events] == truth
    a.tokens_in(json.dumps({"choices": [], "usage": {"completion_tokens": sum(truth)}}))
    assert a.final_tokens == sum(truth)


@st.composite
def mixed_messages(draw):
    """(evidence, tokens) per message: token ids, cumulative usage (with or without token ids beside
    it) or one token of text; a text message holds exactly one token, so every count is exact."""
    n = draw(st.integers(1, 12))
    kinds = draw(st.lists(st.sampled_from(["ids", "ids+usage", "usage", "text"]), min_size=n, max_size=n))
    return [(kind, 1 if kind == "text" else draw(st.integers(1, 4))) for kind in kinds]


@given(mixed_messages(), st.booleans())
def test_any_mix_of_evidence_counts_each_messages_own_tokens(msgs, closing_usage):
    a, cum, got = TokenAccountant(), 0, []
    for kind, k in msgs:
        cum += k
        choice: dict = {"index": 0, "text": "t"}
        if kind.startswith("ids"):
            choice["token_ids"] = list(range(k))
        event = {"choices": [choice], **({"usage": {"completion_tokens": cum}} if "usage" in kind else {})}
        got.append(a.tokens_in(json.dumps(event)))
    assert got == [k for _, k in msgs]
    if closing_usage:  # a closing chunk holding no token, with the usage (older llama.cpp)
        closing = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": {"completion_tokens": cum}}
        assert a.tokens_in(json.dumps(closing)) == 0


def test_a_usage_behind_what_was_counted_is_a_disagreement_in_a_stream_of_one_choice():
    """A mixed stream's usage could fall short of the tokens its text messages had already been given
    (five one-token messages, usage 3): the clamp kept the count right but nothing flagged that the
    per-message figures were not usage's tokens. With n > 1, vLLM's usage on a choice's chunk is that
    choice's own: ids of two choices adding up past one choice's usage are no disagreement."""
    a = TokenAccountant(max_tokens=8)
    for usage in (1, None, 1, None, 3):
        a.tokens_in(json.dumps({"choices": [{"text": "t"}], **({"usage": {"completion_tokens": usage}} if usage else {})}))
    assert (a.counted, a.total(), a.usage_behind()) == (3, 3, True)  # the second usage of 1 came after 2 were counted
    exact = TokenAccountant(max_tokens=8)
    for cum in (1, 2, 3):
        exact.tokens_in(json.dumps({"choices": [{"text": "t"}], "usage": {"completion_tokens": cum}}))
    assert (exact.total(), exact.usage_behind()) == (3, False)
    two = TokenAccountant(max_tokens=8)
    for own in (1, 2):
        for index in (0, 1):
            two.tokens_in(json.dumps({"choices": [{"index": index, "text": "t", "token_ids": [7]}],
                                      "usage": {"completion_tokens": own}}))
    assert (two.counted, two.total(), two.usage_behind()) == (4, None, False)  # no usage-only chunk: messages
    two.tokens_in(json.dumps({"choices": [], "usage": {"completion_tokens": 4}}))
    assert two.total() == 4


def test_with_several_choices_each_chunks_usage_is_its_own_choices():
    """vLLM's continuous usage with n = 2: each choice's chunks carry that choice's own count. Growth
    was measured from every choice's tokens together, so each chunk of the second choice carried
    none: 2 of 4 tokens, and every such request flagged count_mismatch."""
    a = TokenAccountant(max_tokens=8)
    got = [a.tokens_in(json.dumps({"choices": [{"index": index, "text": "t"}], "usage": {"completion_tokens": own}}))
           for own in (1, 2) for index in (0, 1)]
    a.tokens_in(json.dumps({"choices": [], "usage": {"completion_tokens": 4}}))
    assert (got, a.counted, a.total(), a.usage_behind()) == ([1, 1, 1, 1], 4, 4, False)


def test_a_choice_index_is_a_choice_of_the_request_and_usage_of_all_choices_is_bounded():
    """Counted per choice index, a server sending a new index on every chunk, each with usage 64,
    added 64 tokens a chunk: 128,000 for max_tokens 64 (and a per-token ITL list as long), the
    request still ok. Usage's growth over all choices is bounded as each evidence is; an index that
    is not a whole number below MAX_CHOICES is the request's malformed event, not another choice."""
    from day0.client.stream import MAX_CHOICES

    a = TokenAccountant(max_tokens=64)
    with pytest.raises(_Failed, match="usage.completion_tokens of all choices 128 is past"):
        for i in range(2000):
            a.tokens_in(json.dumps({"choices": [{"index": i, "text": "a"}], "usage": {"completion_tokens": 64}}))
    for bad in ("0", True, 0.0, -1, MAX_CHOICES, [0]):  # MAX_CHOICES: vLLM's own n cap, 16,384
        with pytest.raises(_Failed, match="is not a choice of the request"):
            TokenAccountant().tokens_in(json.dumps({"choices": [{"index": bad, "text": "a"}]}))
    same = TokenAccountant()
    assert [same.tokens_in(json.dumps({"choices": [{"index": i, "text": "a"}], "usage": {"completion_tokens": k}}))
            for k, i in enumerate((0, None, 0, None), start=1)] == [1, 1, 1, 1]  # null is the first choice


def test_one_closing_empty_message_a_choice_is_let_past_the_bound_not_five_thousand():
    """The closing empty message's exemption (a server without usage that streams max_tokens tokens,
    then an empty closing message) had no count: 5,000 of them were 5,000 tokens for max_tokens 64."""
    closing = json.dumps({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
    a = TokenAccountant(max_tokens=2)
    for _ in range(2):
        a.tokens_in(json.dumps({"choices": [{"index": 0, "text": "x"}]}))
    a.tokens_in(closing)  # the first: let past (it may hold no token), at no cost to the budget
    with pytest.raises(_Failed, match="messages counted as tokens 3 is past"):
        a.tokens_in(closing)
    # n = 2, each choice closed right after its own last token: choice 0's closing message cost choice
    # 1's last token its place (refused, "5 is past the request's max_tokens 4", before)
    two = TokenAccountant(max_tokens=4)
    two.choices = 2
    for index, text, finish in ((0, "a", None), (1, "a", None), (0, "b", None), (0, "", "length"), (1, "b", None),
                                (1, "", "length")):
        two.tokens_in(json.dumps({"choices": [{"index": index, "delta": {"content": text}, "finish_reason": finish}]}))
    assert two.closed == {0, 1}
    with pytest.raises(_Failed, match="choice index '2' is not a choice of the request"):
        two.tokens_in(closing.replace('"index": 0', '"index": 2'))  # an index past n: no third exemption


def test_a_role_chunk_with_usage_of_no_token_leaves_the_source_to_the_token_ids():
    """Chat with return_token_ids and continuous usage: the role chunk's usage of 0 went down the usage
    path and the source read continuous_usage, where completions said token_ids."""
    a = TokenAccountant()
    a.tokens_in(json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
                            "usage": {"completion_tokens": 0}}))
    for k in (1, 2):
        a.tokens_in(json.dumps({"choices": [{"index": 0, "delta": {"content": "x"}, "token_ids": [7]}],
                                "usage": {"completion_tokens": k}}))
    assert a.weakest == 0


def test_an_echoed_prompt_before_token_ids_is_not_past_max_tokens():
    """vLLM's chat echo (extra_body echo) sends the last message as content without token ids, then
    max_tokens ids: each kind of evidence is bounded on its own, so the echo is no malformed event
    (a bound on their sum refused it), and the count's disagreement is flagged by the final usage."""
    a = TokenAccountant(max_tokens=4)
    a.tokens_in(json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "the prompt"}}]}))
    assert [a.tokens_in(json.dumps({"choices": [{"index": 0, "delta": {"content": "x"}, "token_ids": [7]}]}))
            for _ in range(4)] == [1, 1, 1, 1]
    a.tokens_in(json.dumps({"choices": [], "usage": {"completion_tokens": 4}}))
    assert a.total() == 4


@pytest.mark.parametrize("data, kind", [
    ('{"choices": [{"text": "x"', "malformed_event"),
    ('[1, 2]', "malformed_event"),
    ('{"choices": ["not an object"]}', "malformed_event"),
    ('{"choices": [{"text": "x"}], "usage": {"completion_tokens": "many"}}', "malformed_event"),
    ('{"error": {"message": "engine dead", "code": 500}}', "server_error"),
    ("[" * 100_000, "malformed_event"),  # json.loads raises RecursionError, no ValueError
    ('{"choices": [{"text": "x"}], "usage": {"completion_tokens": Infinity}}', "malformed_event"),
    ('{"choices": [], "usage": {"completion_tokens": 1e999}}', "malformed_event"),  # int(inf): OverflowError
    ('{"choices": [], "usage": {"completion_tokens": NaN}}', "malformed_event"),
    ('{"choices": [], "usage": {"completion_tokens": -3}}', "malformed_event"),
    ('{"choices": [], "usage": {"completion_tokens": 2.5}}', "malformed_event"),
    ('{"choices": [], "usage": {"completion_tokens": "4"}}', "malformed_event"),
    ('{"choices": [], "usage": {"completion_tokens": 4, "prompt_tokens": -Infinity}}', "malformed_event"),
    # a whole number JSON allows but no float holds: once "int too large to convert to float" in the
    # phase's token throughput, which ended `day0 latency` and lost every result
    ('{"choices": [], "usage": {"completion_tokens": 4, "prompt_tokens": 1' + "0" * 400 + '}}', "malformed_event"),
    ('{"choices": [], "usage": {"completion_tokens": 9007199254740993}}', "malformed_event"),  # 2**53 + 1
    ('{"choices": [], "usage": {"completion_tokens": 1e300}}', "malformed_event"),  # a whole float, as large
])
def test_bad_events_fail_the_request(data, kind):
    with pytest.raises(_Failed) as exc:
        TokenAccountant().tokens_in(data)
    assert exc.value.kind == kind


def test_a_huge_prompt_count_is_named_and_the_largest_count_is_kept():
    """No max_tokens bounds a prompt count: its own ceiling (2**53, exact in a double) does."""
    with pytest.raises(_Failed) as exc:
        TokenAccountant(max_tokens=4).tokens_in('{"choices": [], "usage": {"prompt_tokens": 1' + "0" * 400 + '}}')
    assert exc.value.reason.startswith("usage.prompt_tokens is '1000"), exc.value.reason
    a = TokenAccountant()
    a.tokens_in(json.dumps({"choices": [], "usage": {"completion_tokens": 2**53, "prompt_tokens": 2**53}}))
    assert (a.final_tokens, a.prompt_tokens) == (2**53, 2**53)


def test_a_whole_float_count_is_a_count():
    a = TokenAccountant()
    assert a.tokens_in('{"choices": [], "usage": {"completion_tokens": 4.0, "prompt_tokens": 3}}') == 0
    assert (a.final_tokens, a.prompt_tokens) == (4, 3) and isinstance(a.final_tokens, int)


@pytest.mark.parametrize(("events", "reason"), [
    # continuous usage 1..4, then a final usage of 400: throughput 100x, TPOT 100x too low
    ([{"choices": [{"text": "a"}], "usage": {"completion_tokens": k}} for k in (1, 2, 3, 4)]
     + [{"choices": [], "usage": {"completion_tokens": 400}}], "usage.completion_tokens 400"),
    # one message's usage jumps to 10**9: a per-token ITL list of 10**9 values
    ([{"choices": [{"text": "a"}], "usage": {"completion_tokens": 1}},
      {"choices": [{"text": "a"}], "usage": {"completion_tokens": 10**9}}], "usage.completion_tokens 1000000000"),
    ([{"choices": [{"text": "a", "token_ids": [1, 2, 3]}]}, {"choices": [{"text": "b", "token_ids": [4, 5]}]}],
     "token ids 5"),
    # no usage, no token ids: a server ignoring max_tokens passed with one token a message, 400 of them
    ([{"choices": [{"text": "a"}]}] * 400, "messages counted as tokens 5"),
    ([{"choices": [{"index": 0, "delta": {"content": ""}}]}] * 5, "messages counted as tokens 5"),
], ids=["final_usage", "usage_jump", "token_ids", "text_messages", "empty_chat_deltas"])
def test_a_count_past_the_requests_max_tokens_is_malformed(events, reason):
    a = TokenAccountant(max_tokens=4)
    with pytest.raises(_Failed) as exc:
        for e in events:
            a.tokens_in(json.dumps(e))
    assert exc.value.kind == "malformed_event"
    assert exc.value.reason == f"{reason} is past the request's max_tokens 4"


def test_counts_up_to_max_tokens_are_kept():
    a = TokenAccountant(max_tokens=4)
    got = [a.tokens_in(json.dumps({"choices": [{"text": "a"}], "usage": {"completion_tokens": k}})) for k in (2, 4)]
    a.tokens_in(json.dumps({"choices": [], "usage": {"completion_tokens": 4}}))
    assert got == [2, 2] and a.final_tokens == 4
    plain = TokenAccountant(max_tokens=4)
    assert [plain.tokens_in(json.dumps({"choices": [{"text": "a"}]})) for _ in range(4)] == [1, 1, 1, 1]
    assert plain.tokens_in(json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})) == 0
    # max_tokens tokens, then a closing message with empty text (completions and chat), then usage:
    # the closing one is counted by the rule, not held to the bound (a review of the bound's commit)
    for closing in ({"text": "", "finish_reason": "length"}, {"delta": {"content": ""}, "finish_reason": "length"}):
        closed = TokenAccountant(max_tokens=4)
        for _ in range(4):
            closed.tokens_in(json.dumps({"choices": [{"text": "x"}]}))
        assert closed.tokens_in(json.dumps({"choices": [{"index": 0, **closing}]})) == 1
        closed.tokens_in(json.dumps({"choices": [], "usage": {"completion_tokens": 4}}))
        assert closed.final_tokens == 4


@pytest.mark.parametrize(("payload", "bound"), [
    ({"max_tokens": 16}, 16),
    ({"max_completion_tokens": 16}, 16),
    ({"max_completion_tokens": 16, "max_tokens": 32}, 32),  # extra_body set both: the server may honour either
    ({"max_tokens": 16, "n": 3}, 48),  # usage counts every choice
    ({"max_tokens": None}, None),
    ({}, None),
])
def test_the_bound_is_the_bodys_own(payload, bound):
    assert max_output_tokens(payload) == bound


@pytest.mark.parametrize(("stream", "why"), [
    (b"data: " + b"x" * 4000, "a line of the event stream goes on past 1,024 bytes without an end"),
    (b"data: x\n" * 500, "an event of the stream holds data past 1,024 bytes"),  # lines, no blank line
], ids=["endless_line", "endless_event"])
def test_a_line_or_event_without_end_is_refused_at_the_cap(stream, why):
    p = SSEParser(max_bytes=1024)
    with pytest.raises(sse.SSEError, match=why):
        for i in range(0, len(stream), 100):
            p.feed(stream[i:i + 100])


def test_the_cap_is_the_modules_and_names_mib():
    p = SSEParser()
    with pytest.raises(sse.SSEError, match="past 16 MiB without an end"):
        p.feed(b"data: " + b"x" * (16 << 20))


def test_a_long_line_costs_its_length_not_its_square():
    """An unfinished line is not copied and rescanned at every read: 8 MiB in 16 KiB reads parses
    within a few times the cost of one read of it all (rescanning made it hundreds of times)."""
    import time

    line = b"data: " + b"x" * (8 << 20) + b"\n\n"
    pieces = [line[i:i + (16 << 10)] for i in range(0, len(line), 16 << 10)]

    def best(feeds: list[bytes]) -> float:
        times = []
        for _ in range(3):
            p, t = SSEParser(), time.perf_counter()
            got = [ev for f in feeds for ev in p.feed(f)]
            times.append(time.perf_counter() - t)
            assert len(got) == 1 and len(got[0].data) == 8 << 20
        return min(times)

    assert best(pieces) < 20 * best([line]) + 0.05
