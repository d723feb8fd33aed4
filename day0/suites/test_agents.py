"""Stage 4b - agents: the API layer agents talk to. The chat template as transformers renders it,
structured outputs and tool calls judged by a strict parser and their schemas, streamed tool calls
against whole ones, tool_choice='none' (docs/stages/agents.md)."""

import pytest

from day0.engine import local_model_dir
from day0.stages import agents

pytestmark = [pytest.mark.day0, pytest.mark.agents]


@pytest.fixture
def stage(day0_context):
    ctx = day0_context
    return agents.Agents(ctx.endpoint, ctx.profile, ctx.section, local_model_dir(ctx.profile), ctx.progress)


def test_chat_template(stage, day0_checks):
    """A system prompt, several turns, tool definitions, a tool call with its result and a reasoning
    turn render to the same token ids on the server (/tokenize) as with apply_chat_template."""
    day0_checks.add(stage.chat_template())


def test_tool_parser(stage, day0_checks):
    """The parser the profile names (vLLM's own class) reads the call the chat template writes."""
    day0_checks.add(stage.tool_parser())


def test_structured_outputs(stage, day0_checks):
    """N json_schema requests over nested objects, enums, bounded strings and integers, arrays: every
    finished output parses strictly and validates; cut ones are counted apart."""
    day0_checks.extend(stage.structured())


def test_tool_calls(stage, day0_checks):
    """N requests with tool_choice naming a function, and 'required': every call parses, names a
    declared tool (the named one) and its arguments validate (schema accuracy)."""
    day0_checks.extend(stage.tool_calls())


def test_tool_calls_streamed(stage, day0_checks):
    """The same tool-call request streamed and whole: the deltas assemble to the same call."""
    day0_checks.add(stage.streamed())


def test_tool_choice_none(stage, day0_checks):
    """tool_choice='none' with tools declared never yields a call."""
    day0_checks.add(stage.tool_choice_none())


def test_tool_choice_auto(stage, day0_checks):
    """tool_choice='auto': how often the model calls, and how many of those calls parse (reported)."""
    day0_checks.add(stage.tool_choice_auto())


def test_reasoning_parser(stage, day0_checks):
    """Where the profile sets a reasoning parser: reasoning and content split where the raw output's
    think tags say, streamed and not, and a reply cut inside the reasoning leaks no content."""
    day0_checks.add(stage.reasoning())
