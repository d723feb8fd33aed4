"""Fault diagnosis: which rank caused a failed run, and which ranks only saw the failure."""

from __future__ import annotations

import re
import signal
from typing import Iterable

from day0.stages.collectives.result import Fault, RankState
from day0.stages.collectives.settings import human_bytes

_PEER_ERROR = re.compile(
    r"closed by peer|reset by peer|connection reset|broken pipe|timed out|timeout|watchdog|aborted|"
    r"connection refused|EOF|peer|remote process exited|socket", re.IGNORECASE,
)


def clean_error(text: str) -> str:
    """Drop build paths like "[/__w/pytorch/.../pair.cc:537]" and boilerplate from backend errors."""
    text = re.sub(r"\[/[^\]]*\.(?:cc|cpp|h|hpp|cu):\d+\]\s*", "", text)
    text = re.sub(r"\s*This is typically caused by.*$", "", text)
    return text.strip()


def diagnose(states: list[RankState], timeout_s: float) -> Fault | None:
    """Name the rank(s) that caused a failed run; peers that only saw the failure are victims.

    Order of blame: a rank killed by a signal the harness did not send; a rank that exited
    non-zero without a report or with an error that is not about its peers; a rank whose
    heartbeat stopped (frozen); a rank still running after its peers gave up; else all ranks
    that timed out.
    """
    if all(s.returncode == 0 for s in states):
        return None
    multi = len({s.host for s in states if s.host}) > 1

    def who(s: RankState) -> str:
        """"rank 1", or "rank 1 on node1" when the ranks span nodes."""
        return f"rank {s.rank}" + (f" on {s.host}" if multi and s.host else "")

    def where(s: RankState) -> str:
        st = s.step or {}
        if st.get("phase") == "sweep":
            return f" during {st.get('op')} {st.get('mode')} {human_bytes(int(st.get('size', 0)))}"
        if st.get("phase"):
            return f" during {st.get('phase')}" + (f" of {st['op']}" if st.get("op") else "")
        return ""

    died = [s for s in states if s.returncode is not None and s.returncode < 0 and not s.killed_by_harness
            and not (s.error and _PEER_ERROR.search(s.error))]
    silent = [s for s in states if s.returncode is not None and s.returncode > 0 and not s.error]
    own_err = [s for s in states if s.returncode is not None and s.returncode > 0 and s.error
               and not _PEER_ERROR.search(s.error)]
    frozen = [s for s in states if (s.returncode is None or s.killed_by_harness) and s.heartbeat_age_s is not None
              and s.heartbeat_age_s > min(timeout_s, 10.0)]
    # Alive = still running when the harness stopped the run (the harness then killed it).
    alive = [s for s in states if s.returncode is None or s.killed_by_harness]
    failed = [s for s in states if s.returncode not in (None, 0) and not s.killed_by_harness]

    def names(xs: Iterable[RankState]) -> str:
        return ",".join(str(s.rank) for s in xs)

    def victims(culprits: list[RankState]) -> str:
        rest = [s for s in failed + alive if s not in culprits]
        if not rest:
            return ""
        err = next((s.error for s in rest if s.error), "")
        return f"; ranks {names(rest)} failed after it" + (f" ({err[:160]})" if err else "")

    if died:
        d = died[0]
        sig = _signame(-d.returncode)
        msg = f"{who(d)} died ({sig}){where(d)}" + victims(died)
        return Fault("died", [s.rank for s in died], msg, states)
    if silent:
        d = silent[0]
        msg = f"{who(d)} exited with code {d.returncode} without reporting an error{where(d)}" + victims(silent)
        return Fault("died", [s.rank for s in silent], msg, states)
    if own_err:
        d = own_err[0]
        msg = f"{who(d)} failed{where(d)}: {d.error[:200]}" + victims(own_err)
        return Fault("error", [s.rank for s in own_err], msg, states)
    if frozen:
        d = frozen[0]
        msg = f"{who(d)} hung{where(d)}: no heartbeat for {d.heartbeat_age_s:.0f} s" + victims(frozen)
        return Fault("hung", [s.rank for s in frozen], msg, states)
    if alive and failed:
        d = alive[0]
        msg = f"{who(d)} hung{where(d)}: still running after its peers timed out" + victims(alive)
        return Fault("hung", [s.rank for s in alive], msg, states)
    if alive:
        msg = f"ranks {names(alive)} made no progress within the run's time limit" + (where(alive[0]))
        return Fault("timeout", [s.rank for s in alive], msg, states)
    d = failed[0]
    msg = f"ranks {names(failed)} failed{where(d)}: {(d.error or '')[:200]}"
    return Fault("timeout" if d.error and "time" in d.error.lower() else "error", [s.rank for s in failed], msg, states)


def _signame(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"
