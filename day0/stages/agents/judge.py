"""One output judged the way an agent's client reads it: a strict JSON parser, then the schema.

A grammar that lets a raw control character into a JSON string (RFC 8259 section 7 requires
U+0000-U+001F escaped) yields text a lenient reader accepts and a strict one refuses, so the
parse here is strict (Python's ``json`` with ``strict=True``, NaN and Infinity refused too) and a
refusal is classified: the finding kind (the unit a profile's waiver names), where, and what.
Kept free of HTTP so every rule is testable on a string.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import jsonschema

# Finding kinds: what a failed output shows. A waiver in [report] waivers names one of these.
CONTROL_CHARACTER = "control_character"  # a raw U+0000-U+001F inside a JSON string
INVALID_JSON = "invalid_json"            # anything else a strict parser refuses
SCHEMA = "schema"                        # parses, but its schema refuses it
NO_CALL = "no_call"                      # a tool call was required and none came back
WRONG_TOOL = "wrong_tool"                # a call naming a tool not declared, or not the one named
UNEXPECTED_CALL = "unexpected_call"      # tool_choice "none", yet a call
STREAM_MISMATCH = "stream_mismatch"      # streamed deltas assemble to something else
HTTP_ERROR = "http_error"                # the server refused or failed the request
IN_REASONING = "in_reasoning"            # no content: the reasoning parser took the whole output
FINDINGS = (CONTROL_CHARACTER, INVALID_JSON, SCHEMA, NO_CALL, WRONG_TOOL, UNEXPECTED_CALL, STREAM_MISMATCH,
            HTTP_ERROR, IN_REASONING)

_JSON_OBJECT = re.compile(r"\{.*\}", re.DOTALL)


@dataclass(frozen=True)
class Finding:
    """Why one output failed: the kind, and one line naming the sample and what is wrong."""

    kind: str
    detail: str
    evidence: dict[str, Any] = field(default_factory=dict)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (RFC 8259)")


def strict_json(text: str) -> tuple[Any, Finding | None]:
    """(value, None), or (None, the finding): a control character named by code point and offset."""
    try:
        return json.loads(text, strict=True, parse_constant=_refuse_constant), None
    except json.JSONDecodeError as exc:
        if exc.msg.startswith("Invalid control character") and exc.pos < len(text):
            ch = text[exc.pos]
            return None, Finding(CONTROL_CHARACTER,
                                 f"raw control character U+{ord(ch):04X} at offset {exc.pos} inside a JSON "
                                 f"string (RFC 8259 requires it escaped): {_around(text, exc.pos)}",
                                 {"char": f"U+{ord(ch):04X}", "offset": exc.pos})
        return None, Finding(INVALID_JSON, f"not JSON: {exc.msg} at offset {exc.pos}: {_around(text, exc.pos)}",
                             {"offset": exc.pos})
    except ValueError as exc:
        return None, Finding(INVALID_JSON, f"not JSON: {exc}")


def against_schema(value: Any, schema: dict[str, Any]) -> Finding | None:
    """The most relevant violation (jsonschema's best match), with the path into the value."""
    validator = jsonschema.Draft202012Validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "(root)"
    return Finding(SCHEMA, f"at {where}: {error.message[:160]}", {"path": where})


def judge_json(text: str, schema: dict[str, Any]) -> Finding | None:
    """None when ``text`` parses strictly and its schema accepts it."""
    value, finding = strict_json(text)
    return finding or against_schema(value, schema)


def why_no_call(content: str | None) -> Finding:
    """A required call that did not come back: when the text holds an object a strict parser
    refuses (a tool parser swallows that and returns the raw text as content), say why."""
    match = _JSON_OBJECT.search(content or "")
    if match:
        _, finding = strict_json(match.group(0))
        if finding is not None and finding.kind == CONTROL_CHARACTER:
            return Finding(CONTROL_CHARACTER, f"no parsed call: the call's JSON has a {finding.detail}",
                           finding.evidence)
    return Finding(NO_CALL, f"no tool call in the answer (content {_clip(content)})")


def in_reasoning(content: str | None, reasoning: str | None) -> Finding | None:
    """An answer whose text is all in ``reasoning``: a reasoning parser took it (the model never
    closed its reasoning), and a client reading ``content`` gets nothing."""
    if content or not reasoning:
        return None
    return Finding(IN_REASONING, f"no content: the whole output ({len(reasoning)} characters) is in `reasoning`; "
                                 f"the reasoning parser took it (the model never closed its reasoning): "
                                 f"{_clip(reasoning)}")


def _around(text: str, pos: int, width: int = 24) -> str:
    return repr(text[max(0, pos - width): pos + width])


def _clip(text: str | None, n: int = 60) -> str:
    if text is None:
        return "None"
    return repr(text if len(text) <= n else text[:n] + "...")
