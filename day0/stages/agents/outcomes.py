"""Replies judged one by one (:mod:`.judge`) and folded into a share check: the valid share of the
answered outputs against its limit, truncations counted apart in their own check, every failure
kind counted and the first few named (schema or tool, sample, seed, what is wrong).

``evidence["findings"]`` lists the failure kinds a check saw; a profile's waiver
(``[report] waivers``) names one, and covers the check only when it is the only kind there.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

from day0.core.record import Check
from day0.stages.agents.chat import ChatError, Reply
from day0.stages.agents.judge import (
    HTTP_ERROR,
    NO_CALL,
    UNEXPECTED_CALL,
    WRONG_TOOL,
    Finding,
    in_reasoning,
    judge_json,
    why_no_call,
)

SHOWN = 5  # failures named in a check's evidence


@dataclass(frozen=True)
class Outcome:
    """One request's verdict: ``finding`` None and not ``truncated`` is a valid output."""

    sample: str  # "person #3 (seed 3)": which request, so a rerun can replay it
    finding: Finding | None = None
    truncated: bool = False


def structured_outcome(sample: str, reply: Reply | ChatError, schema: dict[str, Any]) -> Outcome:
    if isinstance(reply, ChatError):
        return Outcome(sample, Finding(HTTP_ERROR, str(reply)))
    if reply.finish_reason == "length":
        return Outcome(sample, truncated=True)
    return Outcome(sample, in_reasoning(reply.content, reply.reasoning) or judge_json(reply.content or "", schema))


def tool_outcome(sample: str, reply: Reply | ChatError, declared: dict[str, dict[str, Any]],
                 wanted: str | None) -> Outcome:
    """A call must come back, name a declared tool (the named one when ``tool_choice`` names one)
    and carry arguments a strict parser reads and the tool's parameter schema accepts."""
    if isinstance(reply, ChatError):
        return Outcome(sample, Finding(HTTP_ERROR, str(reply)))
    if reply.finish_reason == "length":
        return Outcome(sample, truncated=True)
    if not reply.calls:
        return Outcome(sample, in_reasoning(reply.content, reply.reasoning) or why_no_call(reply.content))
    for call in reply.calls:
        if call.name not in declared or (wanted is not None and call.name != wanted):
            want = f"{wanted!r}" if wanted else f"one of {sorted(declared)}"
            return Outcome(sample, Finding(WRONG_TOOL, f"a call to {call.name!r}, expected {want}"))
        finding = judge_json(call.arguments, declared[call.name])
        if finding is not None:
            return Outcome(sample, Finding(finding.kind, f"{call.name} arguments: {finding.detail}", finding.evidence))
    return Outcome(sample)


def share_check(check_id: str, title: str, outcomes: Sequence[Outcome], limit: float, what: str) -> Check:
    """The valid share of the outputs that finished (truncations are :func:`truncation_check`'s)."""
    answered = [o for o in outcomes if not o.truncated]
    failed = [o for o in answered if o.finding is not None]
    kinds = Counter(o.finding.kind for o in failed if o.finding)
    evidence = {"sent": len(outcomes), "answered": len(answered), "valid": len(answered) - len(failed),
                "truncated": len(outcomes) - len(answered), "by_kind": dict(sorted(kinds.items())),
                "findings": sorted(kinds), "failures": [f"{o.sample}: {o.finding.kind}: {o.finding.detail}"
                                                        for o in failed[:SHOWN] if o.finding]}
    if not answered:
        return Check(check_id, title, "error", unit="share", direction="higher_is_better", limit=limit,
                     evidence=evidence, source="http",
                     message=f"all {len(outcomes)} {what} were cut by max_tokens: nothing to judge "
                             "(raise agents.max_tokens)")
    share = (len(answered) - len(failed)) / len(answered)
    ok = share >= limit
    head = f"{len(answered) - len(failed)} of {len(answered)} {what} valid ({share:.1%}, limit {limit:.0%})"
    if failed and failed[0].finding:
        first = failed[0]
        head += (f"; {', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))}; first: {first.sample}: "
                 f"{first.finding.detail}")
    return Check(check_id, title, "pass" if ok else "fail", value=round(share, 4), limit=limit, unit="share",
                 direction="higher_is_better", evidence=evidence, source="http", message=head)


def truncation_check(check_id: str, title: str, outcomes: Sequence[Outcome], limit: float, what: str) -> Check:
    cut = [o for o in outcomes if o.truncated]
    share = len(cut) / len(outcomes) if outcomes else 0.0
    names = ", ".join(o.sample for o in cut[:SHOWN])
    return Check(check_id, title, "pass" if share <= limit else "fail", value=round(share, 4), limit=limit,
                 unit="share", direction="lower_is_better", source="http",
                 evidence={"sent": len(outcomes), "truncated": len(cut),  # "samples" is the report's: numbers only
                           "truncated_requests": [o.sample for o in cut[:SHOWN]]},
                 message=f"{len(cut)} of {len(outcomes)} {what} cut by max_tokens (finish_reason length)"
                         + (f": {names}" if cut else "") + f"; limit {limit:.0%}")


def no_call_check(check_id: str, title: str, samples: Sequence[tuple[str, Reply | ChatError]]) -> Check:
    """tool_choice="none": any call at all fails; a failed request is an error (nothing measured)."""
    errors = [(s, r) for s, r in samples if isinstance(r, ChatError)]
    calls = [(s, r) for s, r in samples if isinstance(r, Reply) and r.calls]
    evidence = {"sent": len(samples), "with_calls": len(calls), "errors": [f"{s}: {r}" for s, r in errors[:SHOWN]]}
    if calls:
        s, r = calls[0]
        assert isinstance(r, Reply)
        return Check(check_id, title, "fail", value=len(calls), limit=0, unit="replies", direction="lower_is_better",
                     evidence={**evidence, "findings": [UNEXPECTED_CALL]}, source="http",
                     message=f"{len(calls)} of {len(samples)} replies to tool_choice='none' hold a call; "
                             f"first: {s}: {r.calls[0].name}({r.calls[0].arguments[:60]})")
    if errors:
        return Check(check_id, title, "error", evidence=evidence, source="http",
                     message=f"{len(errors)} of {len(samples)} requests failed: {errors[0][0]}: {errors[0][1]}")
    return Check(check_id, title, "pass", value=0, limit=0, unit="replies", direction="lower_is_better",
                 evidence=evidence, source="http",
                 message=f"{len(samples)} replies to tool_choice='none' with tools declared: no call")


def parsed_share(samples: Sequence[tuple[str, Reply | ChatError]], declared: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """tool_choice="auto": how often the model chose a call, and how many of those parse and validate."""
    replies = [(s, r) for s, r in samples if isinstance(r, Reply)]
    made = [(s, r) for s, r in replies if r.calls]
    valid = [s for s, r in made if tool_outcome(s, r, declared, None).finding is None]
    lost = [s for s, r in replies if not r.calls and why_no_call(r.content).kind != NO_CALL]
    return {"sent": len(samples), "answered": len(replies), "with_calls": len(made), "valid_calls": len(valid),
            "calls_lost_to_the_parser": len(lost)}
