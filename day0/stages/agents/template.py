"""Chat-template parity: the token ids the server renders for a conversation against transformers'
``apply_chat_template`` with the checkpoint's own tokenizer files.

A template that drifts (a Hugging Face update, a ``--chat-template`` nobody declared, a field the
server renames before rendering) changes every prompt an agent sends while every completion
benchmark still passes. A difference names the conversation and the first differing token, its id
and text on both sides.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from day0.core.inputs import InputError, read_text
from day0.core.record import Check
from day0.stages.agents.corpus import Conversation

CHECK = "agents.chat_template"


@dataclass(frozen=True)
class Template:
    """The template the reference renders with: None means the tokenizer's own."""

    text: str | None
    source: str  # where it came from, for the check's message


# vLLM's ``load_chat_template``: a value that names no file and holds none of these is a path that
# failed to open (an error), not a template
JINJA_CHARS = "{}\n"
MAX_TEMPLATE_BYTES = 1 << 20  # published chat templates are a few kB


def reference_template(declared: str | None, engine_template: Any) -> Template:
    """``agents.chat_template`` when set, else the engine's ``chat_template`` arg, else the
    tokenizer's. Either is read as vLLM's ``--chat-template`` reads it: a file when one is there,
    else one of vLLM's bundled templates by name, else the text itself if it holds Jinja; a value
    that looks like a path and opens nothing is an InputError naming the key, never a template
    whose text is a file name (the check would then fail on a typo, blaming the server)."""
    for value, where in ((declared, "agents.chat_template"), (engine_template, "engine.args.chat_template")):
        if isinstance(value, str) and value:
            # vLLM opens the engine's value as given; day0's own key may start with ~
            path = Path(value).expanduser() if where.startswith("agents.") else Path(value)
            if os.path.lexists(path):
                return Template(_read(path, where), f"{where} ({path})")
            if any(c in value for c in JINJA_CHARS):
                return Template(value, f"{where} (inline)")
            bundled = _bundled(value)
            if bundled is None:  # vLLM may serve a template of that name: day0 cannot read it here
                raise InputError(f"{where}: {value!r} is no file here, and vLLM is not installed beside day0 to read "
                                 "its bundled template of that name; point agents.chat_template at the file")
            if bundled.is_file():
                return Template(_read(bundled, where), f"{where} (vLLM's {bundled.name})")
            raise InputError(f"{where}: {value!r} looks like a file path (no '{{', '}}' or newline), but there is no "
                             "such file nor a template of that name bundled with vLLM")
    return Template(None, "the tokenizer's own (tokenizer_config.json)")


def _read(path: Path, where: str) -> str:
    return read_text(path, "chat template", cap=MAX_TEMPLATE_BYTES, label=f"{where}: {path}")


def _bundled(name: str) -> Path | None:
    """Where vLLM keeps the templates ``--chat-template NAME`` finds; None without vLLM here."""
    try:
        from vllm.transformers_utils.chat_templates.registry import CHAT_TEMPLATES_DIR
    except ImportError:
        return None
    return Path(CHAT_TEMPLATES_DIR) / name


@dataclass(frozen=True)
class Rendered:
    conversation: str
    server: list[int] | None
    reference: list[int]
    error: str | None = None


def reference_ids(tokenizer: Any, conv: Conversation, template: Template) -> list[int]:
    out = tokenizer.apply_chat_template(conv.hf_messages(), tools=list(conv.tools) or None,
                                        chat_template=template.text, add_generation_prompt=True, tokenize=True,
                                        return_dict=False)
    return [int(t) for t in (out["input_ids"] if isinstance(out, dict) else out)]


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _side(tokenizer: Any, ids: Sequence[int], i: int) -> str:
    if i >= len(ids):
        return "(ends)"
    return f"{ids[i]} {tokenizer.decode([ids[i]])!r}"


def describe(tokenizer: Any, r: Rendered) -> str:
    """One line: the conversation, the position, both tokens, and the text leading up to it."""
    if r.server is None:
        return f"{r.conversation}: the server did not render it: {r.error}"
    i = first_difference(r.server, r.reference)
    before = tokenizer.decode(r.reference[max(0, (i or 0) - 8): i or 0])
    return (f"{r.conversation}: token {i} differs: server {_side(tokenizer, r.server, i or 0)} vs reference "
            f"{_side(tokenizer, r.reference, i or 0)} after {before!r} ({len(r.server)} vs {len(r.reference)} tokens)")


def template_check(tokenizer: Any, rendered: Sequence[Rendered], template: Template) -> Check:
    same = [r for r in rendered if r.server is not None and r.server == r.reference]
    differ = [r for r in rendered if r not in same]
    evidence = {"reference_template": template.source, "conversations": {
        r.conversation: ("equal" if r in same else describe(tokenizer, r)) for r in rendered}}
    title = "Chat template: server rendering equals transformers' apply_chat_template"
    if differ:
        status = "error" if all(r.server is None for r in differ) else "fail"
        first = next((r for r in differ if r.server is not None), differ[0])
        return Check(CHECK, title, status, value=len(same), limit=len(rendered), unit="conversations",
                     direction="higher_is_better", evidence=evidence, source="http",
                     message=f"{len(differ)} of {len(rendered)} conversations render differently; "
                             f"{describe(tokenizer, first)}; reference template: {template.source}")
    return Check(CHECK, title, "pass", value=len(same), limit=len(rendered), unit="conversations",
                 direction="higher_is_better", evidence=evidence, source="http",
                 message=f"{len(same)} conversations (system prompt, turns, tools, a tool result, reasoning) "
                         f"render to the same token ids; reference template: {template.source}")
