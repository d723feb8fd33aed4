"""The agents stage's rules on strings: the strict parse and its finding kinds, a reply judged as a
structured output or a tool call, the share and truncation checks, streamed deltas assembled, and
the chat-template comparison on the embedded tokenizer (a template one character off fails,
naming the conversation and both tokens)."""

import json

import pytest

from day0.config.tiny import TinySpec
from day0.model.tiny import CHAT_TEMPLATE, cached_model
from day0.stages.agents import corpus, judge
from day0.stages.agents.chat import Call, ChatError, Reply, _Assembly
from day0.stages.agents.outcomes import (
    Outcome,
    no_call_check,
    share_check,
    structured_outcome,
    tool_outcome,
    truncation_check,
)
from day0.stages.agents.stage import _differs
from day0.stages.agents.template import (
    Rendered,
    Template,
    first_difference,
    reference_ids,
    reference_template,
    template_check,
)

WEATHER = corpus.tools(True)[0]["function"]["parameters"]
DECLARED = {t["function"]["name"]: t["function"]["parameters"] for t in corpus.tools(True)}


def test_a_raw_control_character_is_named_by_code_point_and_offset():
    value, finding = judge.strict_json('{"city":"Os\x13lo"}')
    assert value is None and finding.kind == judge.CONTROL_CHARACTER
    assert finding.evidence == {"char": "U+0013", "offset": 11}
    assert "U+0013 at offset 11" in finding.detail
    assert judge.strict_json('{"city":"Os\\u0013lo"}') == ({"city": "Os\x13lo"}, None)  # escaped: valid


@pytest.mark.parametrize("text", ['{"a": NaN}', '{"a": Infinity}', '{"a": 1', "[1,]"])
def test_what_a_strict_parser_refuses_is_invalid_json(text):
    value, finding = judge.strict_json(text)
    assert value is None and finding.kind == judge.INVALID_JSON


def test_a_schema_violation_names_the_path():
    finding = judge.judge_json('{"city": "Oslo", "days": 9}', WEATHER)
    assert finding.kind == judge.SCHEMA and finding.detail.startswith("at days: 9 is greater than the maximum")
    assert judge.judge_json('{"city": "Oslo", "days": 2}', WEATHER) is None
    assert judge.judge_json("true", WEATHER).kind == judge.SCHEMA  # what vLLM returned without strict


def test_a_lost_call_says_why_when_its_json_holds_a_control_character():
    lost = judge.why_no_call('<tool_call>\n{"name": "get_weather", "arguments": {"city": "a\x1d", "days": 2}}')
    assert lost.kind == judge.CONTROL_CHARACTER and "U+001D" in lost.detail
    assert judge.why_no_call("plain words").kind == judge.NO_CALL
    assert judge.why_no_call(None).kind == judge.NO_CALL


@pytest.mark.parametrize("reply, wanted, kind", [
    (Reply(calls=[Call("get_weather", '{"city": "Oslo", "days": 2}')], finish_reason="tool_calls"), "get_weather", None),
    (Reply(calls=[Call("add", '{"a": 1, "b": 2}')], finish_reason="stop"), "get_weather", judge.WRONG_TOOL),
    (Reply(calls=[Call("rm_rf", "{}")], finish_reason="stop"), None, judge.WRONG_TOOL),
    (Reply(calls=[Call("get_weather", "true")], finish_reason="stop"), None, judge.SCHEMA),
    (Reply(calls=[Call("get_weather", '{"city": "O\x0bslo", "days": 2}')], finish_reason="stop"), None,
     judge.CONTROL_CHARACTER),
    (Reply(content="no call here", finish_reason="stop"), None, judge.NO_CALL),
    (ChatError("http://x/v1/chat/completions: HTTP 400: requires --tool-call-parser"), None, judge.HTTP_ERROR),
])
def test_a_tool_reply_is_judged_like_k2vv(reply, wanted, kind):
    out = tool_outcome("s", reply, DECLARED, wanted)
    assert (out.finding.kind if out.finding else None) == kind
    assert not out.truncated


def test_an_answer_the_reasoning_parser_took_whole_says_so():
    """Measured with deepseek_r1 on the random model: the JSON went to `reasoning`, content ''."""
    out = structured_outcome("s", Reply(content="", reasoning='{"ok": true}', finish_reason="stop"),
                             corpus.SCHEMAS["flags"])
    assert out.finding.kind == judge.IN_REASONING and "12 characters" in out.finding.detail
    call = tool_outcome("s", Reply(content=None, reasoning="<tool_call>{}", finish_reason="stop"), DECLARED, None)
    assert call.finding.kind == judge.IN_REASONING


def test_a_cut_reply_is_truncated_not_invalid():
    assert tool_outcome("s", Reply(content="<tool_call>{", finish_reason="length"), DECLARED, None).truncated
    out = structured_outcome("s", Reply(content='{"ok": tr', finish_reason="length"), corpus.SCHEMAS["flags"])
    assert out.truncated and out.finding is None


def test_the_share_check_counts_kinds_and_names_the_first_failure():
    bad = judge.Finding(judge.CONTROL_CHARACTER, "raw control character U+0013")
    outcomes = [Outcome("a"), Outcome("b", bad), Outcome("c", truncated=True), Outcome("d")]
    check = share_check("agents.x", "t", outcomes, 1.0, "outputs")
    assert check.status == "fail" and check.value == pytest.approx(2 / 3, abs=1e-4)
    assert check.evidence["findings"] == ["control_character"] and check.evidence["truncated"] == 1
    assert "2 of 3 outputs valid" in check.message and "first: b: raw control character U+0013" in check.message
    assert share_check("agents.x", "t", outcomes, 0.6, "outputs").status == "pass"
    assert share_check("agents.x", "t", [Outcome("c", truncated=True)], 1.0, "outputs").status == "error"
    cut = truncation_check("agents.x.truncated", "t", outcomes, 0.1, "outputs")
    assert cut.status == "fail" and cut.value == 0.25 and "c" in cut.message
    assert cut.evidence["truncated_requests"] == ["c"] and "samples" not in cut.evidence  # samples are numbers
    assert truncation_check("agents.x.truncated", "t", outcomes, 0.25, "outputs").status == "pass"


def test_tool_choice_none_fails_on_any_call():
    clean = [("a", Reply(content="words")), ("b", Reply(content=""))]
    assert no_call_check("agents.n", "t", clean).status == "pass"
    called = no_call_check("agents.n", "t", [*clean, ("c", Reply(calls=[Call("add", "{}")]))])
    assert called.status == "fail" and "first: c: add({})" in called.message
    assert no_call_check("agents.n", "t", [("a", ChatError("refused"))]).status == "error"


def test_streamed_tool_call_fragments_assemble_per_index():
    asm = _Assembly()
    for choice in ({"delta": {"role": "assistant"}},
                   {"delta": {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "add", "arguments": ""}}]}},
                   {"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"a": 1, '}}]}},
                   {"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"b": 2}'}}]}},
                   {"delta": {}, "finish_reason": "tool_calls"}):
        asm.add(choice)
    streamed = asm.done()
    assert streamed.calls == [Call("add", '{"a": 1, "b": 2}')] and streamed.finish_reason == "tool_calls"
    whole = Reply(calls=[Call("add", '{"a":1,"b":2}')], finish_reason="tool_calls")
    assert _differs(whole, streamed) is None  # the same JSON value
    assert _differs(Reply(calls=[Call("add", '{"a": 1, "b": 3}')]), streamed)[0] == judge.STREAM_MISMATCH
    # what a client reads differently, though Python's == or the calls alone agreed
    for other, said in ((Reply(calls=[Call("add", '{"a": true, "b": 2}')], finish_reason="tool_calls"), "arguments"),
                        (Reply(calls=[Call("add", '{"a": 1.0, "b": 2}')], finish_reason="tool_calls"), "arguments"),
                        (Reply(calls=whole.calls, finish_reason="stop"), "finish_reason 'stop' whole"),
                        (Reply(content="<tool_call>{", calls=whole.calls, finish_reason="tool_calls"), "content")):
        kind, why = _differs(other, streamed)
        assert kind == judge.STREAM_MISMATCH and said in why, why
    kind, why = _differs(Reply(content="x"), streamed)
    assert kind == judge.STREAM_MISMATCH and why.startswith("calls [] whole vs ['add'] streamed")
    # the whole reply's parser refused the call's JSON, the streaming one passed its text on
    lost = Reply(content='<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2, "c": "\x1d"}}</tool_call>')
    kind, why = _differs(lost, streamed)
    assert kind == judge.CONTROL_CHARACTER and "U+001D" in why


def test_a_name_streamed_in_fragments_is_joined_as_the_sdk_joins_it():
    """OpenAI's SDK joins every string field of a tool-call delta; keeping the first fragment hid a
    server that repeats the name in each delta (an SDK client reads 'addadd')."""
    asm = _Assembly()
    for choice in ({"delta": {"tool_calls": [{"index": 0, "function": {"name": "ad", "arguments": "{}"}}]}},
                   {"delta": {"tool_calls": [{"index": 0, "function": {"name": "d"}}]}, "finish_reason": "tool_calls"}):
        asm.add(choice)
    assert asm.done().calls == [Call("add", "{}")]
    twice = _Assembly()
    for _ in range(2):
        twice.add({"delta": {"tool_calls": [{"index": 0, "function": {"name": "add", "arguments": ""}}]}})
    assert twice.done().calls[0].name == "addadd"


def test_hf_messages_follow_the_transformers_convention():
    conv = next(c for c in corpus.conversations() if c.name == "tool_result")
    msgs = conv.hf_messages()
    assert msgs[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo", "days": 2}
    assert isinstance(conv.messages[1]["tool_calls"][0]["function"]["arguments"], str)  # the request is untouched
    reasoning = next(c for c in corpus.conversations() if c.name == "reasoning_turn").hf_messages()
    assert reasoning[1]["reasoning_content"] == "Two and two make four." and "reasoning" not in reasoning[1]


def test_the_reference_template_is_the_declared_one(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages }}")
    assert reference_template(str(path), None).text == "{{ messages }}"
    assert reference_template(None, "{% for m in messages %}{% endfor %}").source.startswith(
        "engine.args.chat_template (inline)")
    assert reference_template(None, None).text is None


def test_a_template_path_is_read_as_vllm_reads_it_and_a_typo_is_named(tmp_path):
    """Before, a path that opened nothing (a typo, a folder) became the template's text, and the
    check failed blaming the server. vLLM's rule: a value without '{', '}' or a newline that opens
    no file is one of vLLM's bundled templates, else an error."""
    from day0.core.inputs import InputError

    missing = str(tmp_path / "tool_chat.jinja")
    with pytest.raises(InputError, match=r"^agents.chat_template: '.*tool_chat.jinja' looks like a file path"):
        reference_template(missing, None)
    with pytest.raises(InputError, match=r"^engine.args.chat_template: .*: is a directory"):
        reference_template(None, str(tmp_path))
    (tmp_path / "latin1.jinja").write_bytes(b"{{ caf\xe9 }}")
    with pytest.raises(InputError, match="not UTF-8"):
        reference_template(str(tmp_path / "latin1.jinja"), None)
    bundled = reference_template(None, "template_chatml.jinja")  # vLLM's own, by name
    assert bundled.source == "engine.args.chat_template (vLLM's template_chatml.jinja)" and "im_start" in bundled.text


def test_a_bundled_template_name_without_vllm_beside_day0_is_could_not_measure(monkeypatch):
    """vLLM is not one of day0's dependencies (a remote engine): a name vLLM may serve from its own
    templates is not called a typo, it is said that day0 cannot read it here."""
    import sys

    from day0.core.inputs import InputError

    monkeypatch.setitem(sys.modules, "vllm.transformers_utils.chat_templates.registry", None)
    with pytest.raises(InputError, match="vLLM is not installed beside day0 to read its bundled template"):
        reference_template(None, "template_chatml.jinja")


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(cached_model(TinySpec())))


def test_every_conversation_renders_through_each_section_of_the_tiny_template(tokenizer):
    text = {c.name: tokenizer.decode(reference_ids(tokenizer, c, Template(None, "own"))) for c in corpus.conversations()}
    assert "<tools>" in text["tool_definitions"] and '"name": "get_weather"' in text["tool_definitions"]
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}' in text["tool_result"]
    assert "<tool_response>" in text["tool_result"] and "<think>Two and two" in text["reasoning_turn"]
    assert all(t.endswith("<|assistant|>") for t in text.values())


def test_a_template_one_character_off_fails_naming_the_conversation_and_both_tokens(tokenizer):
    served = Template(CHAT_TEMPLATE.replace("<tool_response>", "<tool_responce>"), "served")
    own = Template(None, "the tokenizer's own")
    rendered = [Rendered(c.name, reference_ids(tokenizer, c, served), reference_ids(tokenizer, c, own))
                for c in corpus.conversations()]
    check = template_check(tokenizer, rendered, own)
    assert check.status == "fail" and check.value == 4 and check.limit == 5
    assert "1 of 5 conversations render differently; tool_result: token" in check.message
    assert "server" in check.message and "reference" in check.message
    i = first_difference(rendered[3].server, rendered[3].reference)
    assert f"token {i} differs" in check.message and check.evidence["conversations"]["system_prompt"] == "equal"
    ok = template_check(tokenizer, [Rendered(r.conversation, r.reference, r.reference) for r in rendered], own)
    assert ok.status == "pass" and ok.value == 5
    down = template_check(tokenizer, [Rendered("x", None, [1], "HTTP 404")], own)
    assert down.status == "error" and "HTTP 404" in down.message


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_the_structured_schemas_accept_a_well_formed_example():
    examples = {"person": {"name": "Ada", "age": 36, "address": {"city": "Oslo", "zip": "01234"}},
                "order": {"status": "open", "items": [{"sku": "A1", "qty": 2}]},
                "flags": {"ok": True, "level": -2, "tags": ["red"]},
                "reading": {"sensor": "t1", "value": 21.5, "unit": "C"}}
    assert set(examples) == set(corpus.SCHEMAS)
    for name, value in examples.items():
        assert judge.judge_json(json.dumps(value), corpus.SCHEMAS[name]) is None, name


def test_the_template_call_parses_back_with_hermes_and_a_mismatched_parser_fails(tokenizer):
    from day0.stages.agents.tool_parser import parser_check, rendered_call

    conv = next(c for c in corpus.conversations() if c.name == "tool_result")
    own = Template(None, "own")
    assert rendered_call(tokenizer, conv, own).startswith('<tool_call>{"name": "get_weather"')
    ok = parser_check("hermes", tokenizer, conv, own)
    assert ok.status == "pass" and ok.evidence["parsed"] == [["get_weather", {"city": "Oslo", "days": 2}]]
    bad = parser_check("pythonic", tokenizer, conv, own)
    assert bad.status == "fail" and bad.evidence["findings"] == ["parser_mismatch"]
    assert "tool_call_parser=pythonic does not read the template's call syntax" in bad.message
    assert parser_check(None, tokenizer, conv, own).status == "skip"


def test_the_raw_output_splits_at_the_first_end_tag():
    from day0.stages.agents.reasoning import Markers

    m = Markers()
    assert m.split("weigh it</think>four") == ("weigh it", "four")
    assert m.split("<think>weigh it</think>four</think>") == ("weigh it", "four</think>")
    assert m.split("still thinking") == ("still thinking", None)
    assert m.split("</think>") == (None, None)


@pytest.mark.parametrize("whole, streamed, cut, kind", [
    (Reply(reasoning="a b", finish_reason="length"), Reply(reasoning="a b"), True, None),
    (Reply(reasoning="a b", content="c", finish_reason="length"), Reply(reasoning="a b", content="c"), True,
     "reasoning_leak"),
    (Reply(reasoning="a b", finish_reason="stop"), Reply(reasoning="a b"), True, "reasoning_leak"),
    # the model stopped (EOS) inside the reasoning, as its raw twin did: not a leak
    (Reply(reasoning="a b", finish_reason="stop"), Reply(reasoning="a b"), "stop", None),
    (Reply(reasoning="a b", finish_reason="length"), Reply(reasoning="a b"), "stop", "reasoning_leak"),
    (Reply(reasoning="a b", content="c", finish_reason="stop"), Reply(reasoning="a b", content="c"), "stop",
     "reasoning_leak"),
    (Reply(reasoning="a", content="b", finish_reason="length"), Reply(reasoning="a", content="b"), False, None),
    (Reply(reasoning="a</think>b", finish_reason="length"), Reply(reasoning="a</think>b"), False, "reasoning_split"),
    (Reply(reasoning="a", content="b", finish_reason="length"), Reply(reasoning="ab"), False, "stream_mismatch"),
    # bytes that never formed a character: U+FFFD whole, held back streamed (measured on vLLM 0.32)
    (Reply(reasoning="a", content="b", finish_reason="length"), Reply(reasoning="a\ufffd", content="b"), False, None),
])
def test_a_reasoning_reply_is_held_to_the_raw_split(whole, streamed, cut, kind):
    from day0.stages.agents.reasoning import Markers, Sample, reasoning_check
    from day0.stages.agents.reasoning import judge as judge_reasoning

    raw_finish = cut if isinstance(cut, str) else "length"  # a string: the raw twin's finish, end tag forbidden
    cut = bool(cut)
    raw = "a b" if cut else "a</think>b"
    sample = Sample("reasoning #0", cut, raw, raw_finish, whole, streamed)
    found = judge_reasoning(sample, Markers())
    assert (found[0] if found else None) == kind
    check = reasoning_check([sample], Markers(), "deepseek_r1")
    assert check.status == ("fail" if kind else "pass") and check.evidence["findings"] == ([kind] if kind else [])
