"""Does the server's tool parser read the call syntax its chat template writes?

A parser that does not match the template (``--tool-call-parser`` naming another family, a
template update that changed the call tags) leaves every call a model makes as plain text, and
nothing on the request side shows it: a model follows its template, the parser looks for
something else. The template renders a known assistant call (the ``tool_result`` conversation's),
and vLLM's own parser class, the one the profile names, must give the same call back.
"""

from __future__ import annotations

import json
from typing import Any

from day0.core.record import Check
from day0.stages.agents.corpus import Conversation
from day0.stages.agents.template import Template

CHECK = "agents.tool_parser"
TITLE = "Tool parser reads the call syntax the chat template writes"


def rendered_call(tokenizer: Any, conv: Conversation, template: Template) -> str:
    """The template's text for the conversation's first assistant turn with a call: the rendering
    through that turn minus the rendering up to its generation prompt."""
    msgs = conv.hf_messages()
    turn = next(i for i, m in enumerate(msgs) if m.get("tool_calls"))
    tools = list(conv.tools) or None
    head = tokenizer.apply_chat_template(msgs[:turn], tools=tools, chat_template=template.text,
                                         add_generation_prompt=True, tokenize=False)
    full = tokenizer.apply_chat_template(msgs[: turn + 1], tools=tools, chat_template=template.text,
                                         add_generation_prompt=False, tokenize=False)
    if not full.startswith(head):
        raise ValueError("the template renders the turns before the call differently once the call follows")
    return full[len(head):]


def parser_check(parser_name: Any, tokenizer: Any, conv: Conversation, template: Template) -> Check:
    if not isinstance(parser_name, str) or not parser_name:
        return Check(CHECK, TITLE, "skip", source="static",
                     message="engine.args.tool_call_parser is not set: the profile does not say which parser the "
                             "server runs (tool calls need one: vLLM answers 400 to tool_choice 'required')")
    try:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.tool_parsers import ToolParserManager
    except ImportError as exc:
        return Check(CHECK, TITLE, "skip", source="static", message=f"vLLM's tool parsers are not importable "
                                                                     f"here ({exc}): run where vLLM is installed")
    call = next(m for m in conv.messages if m.get("tool_calls"))["tool_calls"][0]["function"]
    want = (call["name"], json.loads(call["arguments"]))
    evidence: dict[str, Any] = {"parser": parser_name, "reference_template": template.source}
    try:
        text = rendered_call(tokenizer, conv, template)
        evidence["template_text"] = text
        parser = ToolParserManager.get_tool_parser(parser_name)(tokenizer)
        request = ChatCompletionRequest(model="day0", messages=list(conv.messages[:1]), tools=list(conv.tools))
        got = parser.extract_tool_calls(text, request)
        # arguments that are not JSON are the parser's finding too, not a traceback
        calls = [(c.function.name, json.loads(c.function.arguments)) for c in got.tool_calls] if got.tools_called else []
    except Exception as exc:  # a parser that cannot even be built for this tokenizer is the finding
        return Check(CHECK, TITLE, "fail", source="static", evidence={**evidence, "findings": ["parser_mismatch"]},
                     message=f"tool_call_parser={parser_name}: {type(exc).__name__}: {str(exc)[:200]}")
    evidence["parsed"] = [[n, a] for n, a in calls]
    if calls == [want]:
        return Check(CHECK, TITLE, "pass", value=1, limit=1, unit="calls", direction="higher_is_better",
                     source="static", evidence=evidence,
                     message=f"tool_call_parser={parser_name} reads the template's call {text[:80]!r} back as "
                             f"{want[0]}({json.dumps(want[1])})")
    return Check(CHECK, TITLE, "fail", value=0, limit=1, unit="calls", direction="higher_is_better", source="static",
                 evidence={**evidence, "findings": ["parser_mismatch"]},
                 message=f"tool_call_parser={parser_name} does not read the template's call syntax: {text[:80]!r} "
                         f"parsed as {calls or 'no call'}, expected {want[0]}({json.dumps(want[1])})")
