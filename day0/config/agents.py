"""The profile's ``[agents]`` table: how the agents stage exercises the API layer agents talk to
(chat template, structured outputs, tool calls) and the limits it holds them to
(docs/stages/agents.md; the figures in docs/metrics.md, "Agents API").

Requests are sampled with a per-request seed, so N requests are N different outputs and a rerun
is the same run; every output is judged by a strict parser and ``jsonschema``.
"""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from day0.config.section import Section


class AgentsSection(Section):
    """Sizes and limits of the agents stage."""

    structured_requests: int = Field(30, ge=0, le=10_000, description="json_schema requests, spread over "
                                                                      "the schemas (0: not measured)")
    tool_requests: int = Field(24, ge=0, le=10_000, description="tool-call requests, half tool_choice naming "
                                                                "a function, half 'required' (0: not measured)")
    stream_pairs: int = Field(3, ge=0, le=100, description="tool-call requests sent streamed and not: "
                                                           "the deltas must assemble to the same call")
    none_requests: int = Field(3, ge=0, le=100, description="tool_choice='none' requests: never a call")
    auto_requests: int = Field(3, ge=0, le=1000, description="tool_choice='auto': the share of calls that "
                                                             "parse is reported, not judged")
    max_tokens: int = Field(128, ge=8, le=8192, description="per request: room for the longest schema's "
                                                           "output (a cut one is reported as truncated)")
    temperature: float = Field(1.0, ge=0, le=2, description="sampled, seeded per request (greedy would "
                                                            "send the same output N times)")
    seed: int = Field(0, ge=0)
    concurrency: int = Field(8, ge=1, le=1024, description="requests in flight at once")
    # OpenAI's per-tool strict: the engine pins the arguments to the schema (vLLM's structural tags).
    # false measures the model's own schema accuracy (Moonshot's K2 Vendor Verifier); a random-weight
    # model scores ~0 there, so the embedded target keeps true.
    strict_tools: bool = True
    min_valid_share: float = Field(1.0, ge=0, le=1, description="structured outputs: valid / answered")
    min_schema_accuracy: float = Field(1.0, ge=0, le=1, description="tool calls: valid calls / answered")
    max_truncated_share: float = Field(0.1, ge=0, le=1, description="outputs cut by max_tokens, of all sent")
    # Where engine.args.reasoning_parser is set: requests whose split is checked against the raw output
    reasoning_requests: int = Field(4, ge=0, le=1000)
    reasoning_max_tokens: int = Field(24, ge=2, le=8192, description="per reasoning request (half are cut "
                                                                      "inside the reasoning on purpose)")
    reasoning_markers: tuple[str, str] = ("<think>", "</think>")  # the template's think tags: start, end
    # The template the reference renders with: None = the served one as the profile declares it
    # (engine.args.chat_template, else the tokenizer's own); a path or inline Jinja text otherwise.
    chat_template: Optional[str] = None
    timeout_s: float = Field(120.0, gt=0, description="for all of one check's requests")
