"""What the agents stage sends: the conversations of the template comparison, the schemas of the
structured-output requests and the tools of the tool-call requests.

Each is small and bounded (strings by ``maxLength``, integers by range, arrays by ``maxItems``)
so a correct engine can always finish inside ``agents.max_tokens``: a cut output is then the
budget's fault and is reported apart, never counted as invalid.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Conversation:
    """One conversation in OpenAI's request form (what an agent sends)."""

    name: str
    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...] = ()

    def hf_messages(self) -> list[dict[str, Any]]:
        """The same conversation in transformers' chat-template convention: a tool call's
        ``arguments`` as a dict (OpenAI sends a JSON string; vLLM decodes it before rendering, as
        transformers documents), reasoning as ``reasoning_content`` (the field templates read)."""
        out = []
        for m in copy.deepcopy(list(self.messages)):
            if "reasoning" in m:
                m["reasoning_content"] = m.pop("reasoning")
            for call in m.get("tool_calls") or []:
                args = call["function"].get("arguments")
                call["function"]["arguments"] = json.loads(args) if args else {}
            out.append(m)
        return out


def _tool(name: str, description: str, properties: dict[str, Any], strict: bool) -> dict[str, Any]:
    params = {"type": "object", "properties": properties, "required": sorted(properties),
              "additionalProperties": False}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": params,
                                             **({"strict": True} if strict else {})}}


def tools(strict: bool) -> list[dict[str, Any]]:
    """Three tools with an object of required, bounded parameters each (K2VV's shape)."""
    return [
        _tool("get_weather", "Forecast for a city", {
            "city": {"type": "string", "minLength": 1, "maxLength": 12},
            "days": {"type": "integer", "minimum": 1, "maximum": 7}}, strict),
        _tool("add", "Sum of two integers", {
            "a": {"type": "integer", "minimum": -1000, "maximum": 1000},
            "b": {"type": "integer", "minimum": -1000, "maximum": 1000}}, strict),
        _tool("set_alarm", "An alarm at a time of day", {
            "time": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"},
            "label": {"enum": ["wake", "meeting", "tea"]}}, strict),
    ]


def _obj(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": sorted(properties), "additionalProperties": False}


# name -> JSON schema: nested objects, enums, bounded strings and integers, arrays, a pattern.
SCHEMAS: dict[str, dict[str, Any]] = {
    "person": _obj({"name": {"type": "string", "minLength": 1, "maxLength": 12},
                    "age": {"type": "integer", "minimum": 0, "maximum": 120},
                    "address": _obj({"city": {"type": "string", "maxLength": 10},
                                     "zip": {"type": "string", "pattern": "^[0-9]{5}$"}})}),
    "order": _obj({"status": {"enum": ["open", "shipped", "closed"]},
                   "items": {"type": "array", "minItems": 1, "maxItems": 2,
                             "items": _obj({"sku": {"type": "string", "maxLength": 6},
                                            "qty": {"type": "integer", "minimum": 1, "maximum": 9}})}}),
    "flags": _obj({"ok": {"type": "boolean"},
                   "level": {"type": "integer", "minimum": -5, "maximum": 5},
                   "tags": {"type": "array", "maxItems": 3, "items": {"enum": ["red", "green", "blue"]}}}),
    "reading": _obj({"sensor": {"type": "string", "maxLength": 8},
                     "value": {"type": "number", "minimum": -100, "maximum": 100},
                     "unit": {"enum": ["C", "F", "K"]}}),
}

ASKS = ("Describe it as JSON.", "Fill in the record.", "Answer with the object only.", "Give one example.")


def conversations(strict: bool = False) -> list[Conversation]:
    """The template comparison's set: a system prompt, several turns, tool definitions, a tool call
    with its result, a reasoning turn. Every template feature an agent's request reaches."""
    declared = tuple(tools(strict))
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Oslo", "days": 2})}}
    return [
        Conversation("system_prompt", ({"role": "system", "content": "You answer briefly."},
                                       {"role": "user", "content": "What is a supernode?"})),
        Conversation("multi_turn", ({"role": "user", "content": "Hi."},
                                    {"role": "assistant", "content": "Hello. How can I help?"},
                                    {"role": "user", "content": "Name a prime."})),
        Conversation("tool_definitions", ({"role": "system", "content": "Use a tool when one fits."},
                                          {"role": "user", "content": "Weather in Oslo for two days?"}), declared),
        Conversation("tool_result", ({"role": "user", "content": "Weather in Oslo for two days?"},
                                     {"role": "assistant", "content": None, "tool_calls": [call]},
                                     {"role": "tool", "tool_call_id": "call_1", "content": '{"high": 3, "low": -2}'},
                                     {"role": "user", "content": "And tomorrow?"}), declared),
        Conversation("reasoning_turn", ({"role": "user", "content": "What is 2 + 2?"},
                                        {"role": "assistant", "content": "4", "reasoning": "Two and two make four."},
                                        {"role": "user", "content": "And 3 + 3?"})),
    ]
