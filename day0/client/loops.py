"""The event loop the load generator runs on: uvloop where it is installed, else asyncio's own.

Why it matters: a load generator is only as good as the latency of its event loop. The TTFT a
client reports is when its loop got round to the chunk, so every callback the loop spends on the
other streams is added to someone's first token; uvloop (libuv) does the same work in less time
per socket read and per callback (``benchmarks/bench_client_cpu.py``: 1.09-1.47x less client CPU
per streamed message in 10 pairs), so one process keeps up with more streams. vLLM's server runs
on it (uvicorn's standard extra, through fastapi[standard]), so it is installed wherever vLLM is;
without it (a client-only install) nothing changes but the ceiling.

One difference the timing relies on: uvloop's timers have millisecond resolution and may wake up
to a millisecond *early* (asyncio's epoll rounds up and wakes late), so ``sleep_until`` never
trusts a timer alone for a send instant.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Coroutine, Literal, TypeVar

T = TypeVar("T")
LoopKind = Literal["auto", "uvloop", "asyncio"]
LOOP_KINDS: tuple[str, ...] = ("auto", "uvloop", "asyncio")


def loop_factory(kind: LoopKind = "auto") -> Callable[[], asyncio.AbstractEventLoop]:
    """A new-loop function for ``kind``; ``auto`` is uvloop when importable. ``uvloop`` where it is
    not installed is a ValueError naming the fix, not a silent fallback."""
    if kind not in LOOP_KINDS:
        raise ValueError(f"event loop: expected one of {', '.join(LOOP_KINDS)}, got {kind!r}")
    if kind == "asyncio":
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError:
        if kind == "auto":
            return asyncio.new_event_loop
        raise ValueError("event loop 'uvloop': uvloop is not installed (pip install uvloop, or use 'asyncio')") from None
    return uvloop.new_event_loop


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """``uvloop`` or ``asyncio``: which kind a factory made (what the tests hold ``auto`` to)."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def run(coro: Coroutine[Any, Any, T], kind: LoopKind = "auto") -> T:
    """``asyncio.run`` on the load generator's loop."""
    with asyncio.Runner(loop_factory=loop_factory(kind)) as runner:
        return runner.run(coro)
