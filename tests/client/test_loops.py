"""The load generator's event loop (day0.client.loops): uvloop where installed, asyncio on request,
and a send never leaves before its schedule on either (uvloop's timers wake up to ~1.5 ms early)."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from day0.client.loadgen import sleep_until
from day0.client.loops import loop_factory, loop_name, run

uvloop = pytest.importorskip("uvloop")  # vLLM's server depends on it: installed wherever day0's tests run


def test_auto_is_uvloop_where_installed_and_asyncio_is_asyncio() -> None:
    for kind, expected in (("auto", "uvloop"), ("uvloop", "uvloop"), ("asyncio", "asyncio")):
        loop = loop_factory(kind)()  # type: ignore[arg-type]
        try:
            assert loop_name(loop) == expected, kind
        finally:
            loop.close()
    assert run(asyncio.sleep(0, result=7), "asyncio") == 7


def test_an_unknown_loop_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="event loop: expected one of auto, uvloop, asyncio, got 'trio'"):
        loop_factory("trio")  # type: ignore[arg-type]


async def _wakes(precise: bool, n: int, seed: int) -> list[float]:
    """How late (s, negative: early) sleep_until returned for ``n`` random deadlines 0.2-4 ms away."""
    rng = random.Random(seed)
    late = []
    for _ in range(n):
        target = time.perf_counter() + rng.uniform(0.0002, 0.004)
        await sleep_until(target, precise)
        late.append(time.perf_counter() - target)
    return late


@pytest.mark.parametrize("kind", ["uvloop", "asyncio"])
@pytest.mark.parametrize("precise", [True, False])
def test_sleep_until_never_wakes_before_its_deadline(kind: str, precise: bool) -> None:
    late = run(_wakes(precise, 300, seed=1), kind)  # type: ignore[arg-type]
    assert min(late) >= 0.0, f"{kind}: woke {-min(late) * 1e3:.3f} ms early"


def test_a_bare_uvloop_timer_does_wake_early() -> None:
    """Why sleep_until spins in both modes: the same deadlines with a bare asyncio.sleep on uvloop.
    Should uvloop's timers stop waking early, this fails and the spin's reason can be dropped."""
    async def bare() -> list[float]:
        rng, late = random.Random(2), []
        for _ in range(300):
            target = time.perf_counter() + rng.uniform(0.0002, 0.004)
            await asyncio.sleep(target - time.perf_counter())
            late.append(time.perf_counter() - target)
        return late

    assert min(run(bare(), "uvloop")) < 0.0
