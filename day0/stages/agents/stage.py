"""The agents stage against the run's engine: the template comparison, then the structured-output
and tool-call requests, each family sent in one concurrent batch.

Every request is sampled with its own seed (``agents.seed`` + its index): N requests are N
different outputs, a rerun sends the same N, and a streamed twin of a request (same seed) must
come back as the same reply.
"""

from __future__ import annotations

import asyncio
import json
from functools import cached_property
from pathlib import Path
from typing import Any, Awaitable, Callable, TypeVar

import aiohttp

from day0.client.stream import same_text
from day0.config.agents import AgentsSection
from day0.config.profile import Profile
from day0.core.record import Check, measured
from day0.engine import Endpoint
from day0.stages.agents import corpus, reasoning, tool_parser
from day0.stages.agents.chat import (
    ChatError,
    Reply,
    chat,
    chat_many,
    complete_ids,
    token_id,
    tokenize_chat,
)
from day0.stages.agents.judge import CONTROL_CHARACTER, STREAM_MISMATCH, why_no_call
from day0.stages.agents.outcomes import (
    no_call_check,
    parsed_share,
    share_check,
    structured_outcome,
    tool_outcome,
    truncation_check,
)
from day0.stages.agents.template import Rendered, Template, reference_ids, reference_template, template_check

Progress = Callable[[str], None]
T = TypeVar("T")
# Seed offsets per request family (structured outputs start at 0), so no two requests share one.
TOOL_SEEDS, NONE_SEEDS, AUTO_SEEDS, REASONING_SEEDS = 10_000, 20_000, 30_000, 40_000


class Agents:
    """One run of the stage: the endpoint, the settings, the model's tokenizer files."""

    def __init__(self, endpoint: Endpoint, profile: Profile, section: AgentsSection, model_dir: Path | None,
                 progress: Progress) -> None:
        self.endpoint, self.profile, self.section, self.progress = endpoint, profile, section, progress
        self.model_dir = model_dir
        self.tools = corpus.tools(section.strict_tools)
        self.declared = {t["function"]["name"]: t["function"]["parameters"] for t in self.tools}

    def run(self, step: Callable[[aiohttp.ClientSession], Awaitable[T]]) -> T:
        """One check's requests in one client session; ChatError when they outlast ``agents.timeout_s``."""
        async def go() -> T:
            async with self.endpoint.session() as session:
                return await asyncio.wait_for(step(session), self.section.timeout_s)
        try:
            return asyncio.run(go())
        except TimeoutError:
            raise ChatError(f"no answer within agents.timeout_s = {self.section.timeout_s:g} s") from None

    def send_all(self, bodies: list[dict[str, Any]]) -> list[Reply | ChatError]:
        """Every body, ``agents.concurrency`` in flight, replies in the same order."""
        return self.run(lambda session: chat_many(session, self.endpoint, bodies, self.section.concurrency))

    @cached_property
    def template(self) -> Template:
        """What the reference renders with (the declared template, else the tokenizer's own)."""
        return reference_template(self.section.chat_template, self.profile.engine.args.get("chat_template"))

    @cached_property
    def tokenizer(self) -> Any:
        """The checkpoint's own tokenizer (``model_dir`` must be set)."""
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(self.model_dir))

    def sampling(self, index: int) -> dict[str, Any]:
        s = self.section
        return {"max_tokens": s.max_tokens, "temperature": s.temperature, "seed": s.seed + index}

    # -- chat template ------------------------------------------------------------------

    def chat_template(self) -> Check:
        if self.model_dir is None:
            return Check("agents.chat_template", "Chat template parity", "skip", source="http",
                         message="no local tokenizer files to render the reference with (model.path / model.source)")
        template, tokenizer = self.template, self.tokenizer
        convs = corpus.conversations(self.section.strict_tools)

        async def render(session: aiohttp.ClientSession) -> list[Rendered]:
            out = []
            for c in convs:
                ref = reference_ids(tokenizer, c, template)
                try:
                    out.append(Rendered(c.name, await tokenize_chat(session, self.endpoint, list(c.messages),
                                                                    list(c.tools) or None), ref))
                except ChatError as exc:
                    out.append(Rendered(c.name, None, ref, str(exc)))
            return out

        try:
            return template_check(tokenizer, self.run(render), template)
        except ChatError as exc:
            return _unmeasured("agents.chat_template", "Chat template parity", exc)

    def tool_parser(self) -> Check:
        """Static: vLLM's parser class, the one the profile names, on the template's own call text."""
        if self.model_dir is None:
            return Check(tool_parser.CHECK, tool_parser.TITLE, "skip", source="static",
                         message="no local tokenizer files to render the template's call with")
        conv = next(c for c in corpus.conversations(self.section.strict_tools) if c.name == "tool_result")
        return tool_parser.parser_check(self.profile.engine.args.get("tool_call_parser"), self.tokenizer, conv,
                                        self.template)

    # -- structured outputs -------------------------------------------------------------

    def structured_bodies(self) -> list[tuple[str, str, dict[str, Any]]]:
        names = list(corpus.SCHEMAS)
        out = []
        for i in range(self.section.structured_requests):
            name = names[i % len(names)]
            ask = corpus.ASKS[(i // len(names)) % len(corpus.ASKS)]
            body = {"messages": [{"role": "user", "content": f"{ask} ({name})"}], **self.sampling(i),
                    "response_format": {"type": "json_schema",
                                        "json_schema": {"name": name, "schema": corpus.SCHEMAS[name], "strict": True}}}
            out.append((f"schema {name} #{i} (seed {self.section.seed + i})", name, body))
        return out

    def structured(self) -> list[Check]:
        s = self.section
        if not s.structured_requests:
            return [_not_measured("agents.structured_outputs", "agents.structured_requests = 0")]
        bodies = self.structured_bodies()
        self.progress(f"agents: {len(bodies)} structured-output requests over {len(corpus.SCHEMAS)} schemas")
        try:
            replies = self.send_all([b for _, _, b in bodies])
        except ChatError as exc:
            return [_unmeasured("agents.structured_outputs", "Structured outputs", exc)]
        outcomes = [structured_outcome(label, r, corpus.SCHEMAS[name]) for (label, name, _), r in zip(bodies, replies)]
        return [share_check("agents.structured_outputs", "Structured outputs: strict JSON that validates against "
                            "its schema", outcomes, s.min_valid_share, "structured outputs"),
                truncation_check("agents.structured_outputs.truncated", "Structured outputs cut by max_tokens",
                                 outcomes, s.max_truncated_share, "structured outputs")]

    # -- tool calls ---------------------------------------------------------------------

    def tool_body(self, index: int, choice: Any, family: int = TOOL_SEEDS) -> dict[str, Any]:
        """``family`` keeps the seeds of the named/required, none and auto requests apart."""
        ask = ("Weather in Oslo for two days?", "Add 2 and 40.", "Wake me at 07:30.")[index % 3]
        return {"messages": [{"role": "user", "content": ask}], "tools": self.tools, "tool_choice": choice,
                "parallel_tool_calls": False, **self.sampling(family + index)}

    def tool_requests(self) -> list[tuple[str, str | None, dict[str, Any]]]:
        """Half name a function (each tool in turn), half say ``required``."""
        names = list(self.declared)
        out = []
        for i in range(self.section.tool_requests):
            if i % 2 == 0:
                wanted: str | None = names[(i // 2) % len(names)]
                choice: Any = {"type": "function", "function": {"name": wanted}}
                label = f"tool_choice {wanted} #{i}"
            else:
                wanted, choice, label = None, "required", f"tool_choice required #{i}"
            out.append((f"{label} (seed {self.section.seed + TOOL_SEEDS + i})", wanted, self.tool_body(i, choice)))
        return out

    def tool_calls(self) -> list[Check]:
        s = self.section
        if not s.tool_requests:
            return [_not_measured("agents.tool_calls", "agents.tool_requests = 0")]
        asks = self.tool_requests()
        self.progress(f"agents: {len(asks)} tool-call requests (named and required, {len(self.declared)} tools)")
        try:
            replies = self.send_all([b for _, _, b in asks])
        except ChatError as exc:
            return [_unmeasured("agents.tool_calls", "Tool calls", exc)]
        outcomes = [tool_outcome(label, r, self.declared, wanted) for (label, wanted, _), r in zip(asks, replies)]
        return [share_check("agents.tool_calls", "Tool calls: parse, name a declared tool, arguments validate "
                            "(schema accuracy)", outcomes, s.min_schema_accuracy, "tool calls"),
                truncation_check("agents.tool_calls.truncated", "Tool calls cut by max_tokens", outcomes,
                                 s.max_truncated_share, "tool-call replies")]

    def streamed(self) -> Check:
        """The same request streamed and whole (same seed): the deltas assemble to the same calls."""
        check_id, title = "agents.tool_calls.streamed", "Tool calls: streamed deltas assemble to the whole call"
        if not self.section.stream_pairs:
            return _not_measured(check_id, "agents.stream_pairs = 0")
        asks = self.tool_requests()[: self.section.stream_pairs] or [("tool_choice required", None,
                                                                      self.tool_body(0, "required"))]

        async def pairs(session: aiohttp.ClientSession) -> list[tuple[str, Reply, Reply]]:
            # Twins go together and pairs side by side (agents.concurrency requests in flight): twins
            # share every engine step, so a batch-dependent kernel cannot tell them apart, and one
            # pair at a time cost three times as long for the same question.
            room = asyncio.Semaphore(max(1, self.section.concurrency // 2))

            async def pair(label: str, body: dict[str, Any]) -> tuple[str, Reply, Reply]:
                async with room:
                    whole, streamed = await asyncio.gather(chat(session, self.endpoint, body),
                                                           chat(session, self.endpoint, body, stream=True))
                return label, whole, streamed

            return list(await asyncio.gather(*(pair(label, body) for label, _, body in asks)))

        try:
            got = self.run(pairs)
        except ChatError as exc:
            return Check(check_id, title, "error", source="http", message=str(exc))
        differ = [(label, *d) for label, whole, streamed in got if (d := _differs(whole, streamed))]
        message = (f"{len(got) - len(differ)} of {len(got)} streamed replies assemble to the whole reply"
                   + (f"; {differ[0][0]}: {differ[0][2]}" if differ else ""))
        return measured(check_id, title, len(differ), 0, unit="replies", direction="lower_is_better",
                        message=message, source="http",
                        evidence={"pairs": len(got), "differ": [f"{a}: {k}: {b}" for a, k, b in differ],
                                  "findings": sorted({k for _, k, _ in differ})})

    def tool_choice_none(self) -> Check:
        try:
            samples = self.tool_samples("none", self.section.none_requests, NONE_SEEDS)
        except ChatError as exc:
            return _unmeasured("agents.tool_calls.none", "Tool calls: tool_choice 'none'", exc)
        return no_call_check("agents.tool_calls.none", "Tool calls: tool_choice 'none' never yields a call", samples)

    def tool_choice_auto(self) -> Check:
        check_id, title = "agents.tool_calls.auto", "Tool calls: the model's own choice (auto), calls that parse"
        try:
            samples = self.tool_samples("auto", self.section.auto_requests, AUTO_SEEDS)
        except ChatError as exc:
            return _unmeasured(check_id, title, exc)
        counts = parsed_share(samples, self.declared)
        if counts["answered"] < counts["sent"]:
            first = next(r for _, r in samples if isinstance(r, ChatError))
            return Check(check_id, title, "error", evidence=counts, source="http", message=str(first))
        share = counts["valid_calls"] / counts["with_calls"] if counts["with_calls"] else None
        return Check(check_id, title, "pass", value=share, unit="share", direction="higher_is_better",
                     evidence=counts, source="http",
                     message=f"reported, not judged: the model called a tool in {counts['with_calls']} of "
                             f"{counts['sent']} replies, {counts['valid_calls']} of them valid"
                             + (f"; {counts['calls_lost_to_the_parser']} calls lost to the parser (text a strict "
                                "parser refuses)" if counts["calls_lost_to_the_parser"] else ""))

    def reasoning(self) -> Check:
        """Where the profile sets a reasoning parser: each request answered raw, whole and streamed."""
        parser = self.profile.engine.args.get("reasoning_parser")
        s = self.section
        if not parser:
            return Check(reasoning.CHECK, reasoning.TITLE, "skip", source="http",
                         message="not in force: engine.args.reasoning_parser is not set")
        if not s.reasoning_requests:
            return _not_measured(reasoning.CHECK, "agents.reasoning_requests = 0")
        markers = reasoning.Markers(*s.reasoning_markers)
        self.progress(f"agents: {s.reasoning_requests} reasoning requests, each raw, whole and streamed")

        async def answers(session: aiohttp.ClientSession) -> list[reasoning.Sample] | str:
            end = await token_id(session, self.endpoint, markers.end)
            if end is None:
                return f"{markers.end!r} is not one token in the served tokenizer: its bias cannot be set"
            out = []
            for i in range(s.reasoning_requests):  # one at a time: the raw twin must see the same batch
                cut = i % 2 == 0
                messages = [{"role": "user", "content": f"Think it through, then answer: question {i}."}]
                sampling = {"max_tokens": s.reasoning_max_tokens, "temperature": s.temperature,
                            "seed": s.seed + REASONING_SEEDS + i,
                            "logit_bias": {str(end): reasoning.FORBID if cut else reasoning.FAVOUR}}
                ids = await tokenize_chat(session, self.endpoint, messages, None)
                raw, finish = await complete_ids(session, self.endpoint, ids, sampling)
                body = {"messages": messages, **sampling}
                whole = await chat(session, self.endpoint, body)
                streamed = await chat(session, self.endpoint, body, stream=True)
                label = f"reasoning #{i} ({'end tag forbidden' if cut else 'end tag favoured'}, seed {sampling['seed']})"
                out.append(reasoning.Sample(label, cut, raw, finish, whole, streamed))
            return out

        try:
            got = self.run(answers)
        except ChatError as exc:
            return Check(reasoning.CHECK, reasoning.TITLE, "fail", source="http", message=str(exc),
                         evidence={"findings": ["http_error"]})
        if isinstance(got, str):
            return Check(reasoning.CHECK, reasoning.TITLE, "error", source="http", message=got)
        return reasoning.reasoning_check(got, markers, str(parser))

    def tool_samples(self, choice: str, count: int, family: int) -> list[tuple[str, Reply | ChatError]]:
        bodies = [(f"tool_choice {choice} #{i} (seed {self.section.seed + family + i})",
                   self.tool_body(i, choice, family)) for i in range(count)]
        replies = self.send_all([b for _, b in bodies])
        return [(label, r) for (label, _), r in zip(bodies, replies)]


def _same_arguments(a: str, b: str) -> bool:
    """The same JSON value, types included (how a client reads them: ``true`` is not ``1``, nor ``1``
    ``1.0``, though Python's == says so), or the same text when either is not JSON."""
    try:
        return json.dumps(json.loads(a), sort_keys=True) == json.dumps(json.loads(b), sort_keys=True)
    except ValueError:
        return a == b


def _differs(whole: Reply, streamed: Reply) -> tuple[str, str] | None:
    """(finding kind, one line) when the two replies differ. A call the whole reply's parser
    refused for a raw control character while the streaming parser passed its text through is
    that finding (the same output, parsed two ways), not a new one."""
    if [c.name for c in whole.calls] != [c.name for c in streamed.calls]:
        why = f"calls {[c.name for c in whole.calls]} whole vs {[c.name for c in streamed.calls]} streamed"
        lost = why_no_call(whole.content) if not whole.calls else why_no_call(streamed.content)
        if lost.kind == CONTROL_CHARACTER:
            return CONTROL_CHARACTER, f"{why}: one parser refused the call's JSON ({lost.detail})"
        return STREAM_MISMATCH, why
    for w, s in zip(whole.calls, streamed.calls):
        if not _same_arguments(w.arguments, s.arguments):
            return STREAM_MISMATCH, f"{w.name} arguments {w.arguments[:80]!r} whole vs {s.arguments[:80]!r} streamed"
    if not same_text(whole.content, streamed.content):  # beside calls too: a call's markup leaked into content
        return STREAM_MISMATCH, (f"content {(whole.content or '')[:60]!r} whole vs {(streamed.content or '')[:60]!r} "
                                 "streamed")
    if whole.finish_reason != streamed.finish_reason:  # a client loops on "tool_calls", stops on "stop"
        return STREAM_MISMATCH, f"finish_reason {whole.finish_reason!r} whole vs {streamed.finish_reason!r} streamed"
    return None


def _unmeasured(check_id: str, title: str, exc: ChatError) -> Check:
    """The requests as a whole got no answer (a timeout): nothing was measured."""
    return Check(check_id, title, "error", source="http", message=str(exc))


def _not_measured(check_id: str, why: str) -> Check:
    return Check(check_id, check_id, "skip", source="http", message=f"not measured: {why}")
