"""The reasoning parser: reasoning and content split where the template's think tags say, whole and
streamed, and ``max_tokens`` reached inside the reasoning handled (finish ``length``, no content).

The truth is the raw text of the same request: the server's own rendering of the conversation
(``/tokenize``) sent to ``/v1/completions`` with the same seed, sampling and logit bias gives the
tokens the chat request generated, unparsed. Split at the first end tag (a start tag, where the
model wrote one, dropped), that is what the parser must return. Half the requests forbid the end
tag (logit bias -100: the output is cut inside the reasoning), half favour it (+4: most close it
and go on with content), so both paths are exercised on any model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from day0.client.stream import same_text
from day0.core.record import Check
from day0.stages.agents.chat import Reply

CHECK = "agents.reasoning"
TITLE = "Reasoning parser: reasoning and content split as the template intends, streamed and not"
FORBID, FAVOUR = -100, 4
# Finding kinds of this check
SPLIT, LEAK, STREAMED = "reasoning_split", "reasoning_leak", "stream_mismatch"


@dataclass(frozen=True)
class Markers:
    start: str = "<think>"
    end: str = "</think>"

    def split(self, raw: str) -> tuple[str | None, str | None]:
        """(reasoning, content) as a think-tag template means them; None for an empty part."""
        head, tag, tail = raw.partition(self.start)
        text = tail if tag else head
        reasoning, end, content = text.partition(self.end)
        return (reasoning or None), (content or None) if end else None


@dataclass(frozen=True)
class Sample:
    """One request answered three ways: raw (completions), parsed whole, parsed streamed."""

    label: str
    cut: bool  # the end tag was forbidden: the output must end inside the reasoning
    raw: str
    raw_finish: str | None
    whole: Reply
    streamed: Reply


def _norm(text: str | None) -> str | None:
    return text or None


def judge(sample: Sample, markers: Markers) -> tuple[str, str] | None:
    """(finding kind, one line) when the parser's answer is not the raw text's split."""
    want = markers.split(sample.raw)
    got = (_norm(sample.whole.reasoning), _norm(sample.whole.content))
    # With the end tag forbidden the output ends inside the reasoning: at max_tokens, or where the
    # model itself stopped (EOS), which the raw twin shows; either way no content.
    finish = sample.raw_finish if sample.raw_finish == "stop" else "length"
    if sample.cut and (sample.whole.finish_reason != finish or got[1] is not None):
        return LEAK, (f"{sample.label}: cut inside the reasoning (end tag forbidden): finish "
                      f"{sample.whole.finish_reason!r}, content {got[1]!r:.60} (expected {finish} and no content)")
    if got != want:
        return SPLIT, (f"{sample.label}: parsed reasoning {got[0]!r:.50} / content {got[1]!r:.50}; the raw "
                       f"output {sample.raw!r:.80} splits as {want[0]!r:.50} / {want[1]!r:.50}")
    streamed = (_norm(sample.streamed.reasoning), _norm(sample.streamed.content))
    if not (same_text(streamed[0], got[0]) and same_text(streamed[1], got[1])):
        return STREAMED, (f"{sample.label}: streamed reasoning {streamed[0]!r:.50} / content {streamed[1]!r:.50} vs "
                          f"whole {got[0]!r:.50} / {got[1]!r:.50}")
    return None


def reasoning_check(samples: Sequence[Sample], markers: Markers, parser: str) -> Check:
    bad = [(s, f) for s in samples if (f := judge(s, markers))]
    closed = sum(markers.end in s.raw for s in samples)
    evidence: dict[str, Any] = {"parser": parser, "markers": [markers.start, markers.end], "requests": len(samples),
                                "cut_inside_reasoning": sum(s.cut for s in samples), "closed_reasoning": closed,
                                "findings": sorted({k for _, (k, _) in bad}),
                                "failures": [why for _, (_, why) in bad[:5]]}
    head = (f"{len(samples) - len(bad)} of {len(samples)} replies split as the raw output says, streamed and not "
            f"({evidence['cut_inside_reasoning']} cut inside the reasoning, {closed} closed it); "
            f"reasoning_parser={parser}")
    return Check(CHECK, TITLE, "fail" if bad else "pass", value=len(samples) - len(bad), limit=len(samples),
                 unit="replies", direction="higher_is_better", source="http", evidence=evidence,
                 message=head + (f"; {bad[0][1][1]}" if bad else ""))
