"""Stage 4b - agents: does the API layer agents talk to hold up?

The most visible Day-0 breakage is not in the kernels but in the layer above them: a tool parser
missing at launch, a template change breaking a parser, structured outputs a strict client
refuses. Completion benchmarks pass all of them. The stage renders a fixed set of conversations
through the server's ``/tokenize`` and compares the ids with transformers' ``apply_chat_template``
(:mod:`.template`), sends N ``json_schema`` requests and N tool-call requests (a named function
and ``required``) over ``/v1/chat/completions`` (:mod:`.chat`), and judges every output with a
strict JSON parser and ``jsonschema`` (:mod:`.judge`, :mod:`.outcomes`): the valid share is the
figure, truncations are counted apart, failures are named by kind so a known one can be waived
(``[report] waivers``) and shown as such. Streamed tool-call deltas must assemble to the whole
call; ``tool_choice='none'`` must never yield one. :mod:`.stage` runs it; one test each in
day0/suites/test_agents.py; docs/stages/agents.md.
"""

from day0.core.stages import Figure, Stage
from day0.stages.agents.chat import Call, ChatError, Reply, chat, chat_many, tokenize_chat
from day0.stages.agents.judge import FINDINGS, Finding, judge_json, strict_json
from day0.stages.agents.outcomes import Outcome, share_check, structured_outcome, tool_outcome
from day0.stages.agents.stage import Agents
from day0.stages.agents.template import Template, first_difference, reference_template

__all__ = [
    "FINDINGS", "Agents", "Call", "ChatError", "Finding", "Outcome", "Reply", "Template", "chat", "chat_many",
    "first_difference", "judge_json", "reference_template", "share_check", "strict_json", "structured_outcome",
    "tokenize_chat", "tool_outcome",
]


STAGE = Stage(
    name="agents", order=45, suite="day0.suites.test_agents", section="agents",
    title="Agents API",
    question="does the API agents use hold up: the chat template as transformers renders it, structured outputs "
             "a strict parser accepts, tool calls that parse and validate, streamed and not?",
    figures=(Figure("chat_template", "Chat template parity", ("agents.chat_template",), unit="conversations"),
             Figure("structured", "Structured outputs valid", ("agents.structured_outputs",), scale=100, unit="%"),
             Figure("tool_calls", "Tool-call schema accuracy", ("agents.tool_calls",), scale=100, unit="%")),
    required=("agents.chat_template", "agents.tool_parser", "agents.structured_outputs", "agents.tool_calls", "agents.tool_calls.none",
              "agents.tool_calls.streamed"),
)
