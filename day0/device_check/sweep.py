"""The device check's collectives step: the stage's own sweep on NCCL, and its real NCCL_DEBUG log.

One rank per visible GPU through :func:`day0.stages.collectives.run_local` (the launcher, the
ranks, CUDA-event timing and the result writer exactly as the stage runs them), with
``NCCL_DEBUG=INFO`` and ``NCCL_DEBUG_SUBSYS=INIT,GRAPH,ENV``. The raw log is kept as NCCL wrote it
and fed to :func:`~day0.stages.collectives.nccl_debug.parse_nccl_debug` and the transport checks:
``device.nccl_log`` fails when the parser misses what every NCCL prints (its version, the ranks),
which is how a format change shows up. The sweep's own folder (many small files per rank) lives
in the work folder; its result, the rank logs and the NCCL log are copied into the output folder.
"""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path
from typing import Any, Callable, Sequence

from day0.core.collective_ops import OPS
from day0.core.record import Check
from day0.device_check.runner import COLLECTIVES_FILE, NCCL_LOG_FILE, DeviceRun, Step, module_hint

#: A GPU sweep sized to finish in seconds on one node: 1 KiB to 256 MiB (x4), float32 (exact up to
#: 2^24 per element), every op in both modes where it has them (every op the registry sweeps, unless
#: "ops" is set here).
GPU_SWEEP: dict[str, Any] = {
    "backend": "nccl", "min_bytes": 1 << 10, "max_bytes": 256 << 20, "step_factor": 4, "dtype": "float32",
    "warmup_iters": 5, "iters": 20, "nccl_debug": True, "grace_s": 5,
}
NCCL_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,GRAPH,ENV"}
#: Per-rank logs copied into device-check.log are cut to their last this-many bytes.
RANK_LOG_TAIL = 256 << 10


def sweep_ids(op_ids: Callable[[str], Sequence[str]] | None = None) -> dict[str, str]:
    """Every check the step reports: the stage's own (ranks, per op correct/busbw, transport) and two
    of the device check's (the parser on the real log, the CUDA-event timer). ``op_ids`` is the
    stage's ``op_check_ids`` unless given (:func:`plain_op_ids` where the stage cannot be imported)."""
    if op_ids is None:
        from day0.stages.collectives.checks import op_check_ids as op_ids

    ids = {"collectives.ranks": "Every rank completed the sweep"}
    for op in _ops():
        cid_c, t_c, cid_b, t_b = op_ids(op)
        ids[cid_c], ids[cid_b] = t_c, t_b
    ids["collectives.transport.intra_node"] = "Intra-node transport matches the topology"
    ids["collectives.transport.inter_node"] = "Inter-node transport matches the topology"
    ids["device.nccl_log"] = "day0's parser reads the real NCCL_DEBUG=INFO log"
    ids["device.cuda_event_timing"] = "Per-iteration times are sane against the wall clock"
    return ids


def sweep_step(run: DeviceRun) -> None:
    """The sweep with timeouts cut to the budget left, then the stage's checks and the device check's two."""
    from day0.stages.collectives import CollectivesSection, result_checks, run_local

    world = _world()
    budget_left = max(30.0, run.remaining())
    settings = CollectivesSection.from_mapping({
        **GPU_SWEEP, "ops": _ops(), "world_size": world,
        "startup_timeout_s": round(min(180.0, budget_left), 1), "timeout_s": round(min(60.0, budget_left), 1),
    })
    scratch = run.state.work / "collectives"  # type: ignore[operator]
    env = {k: v for k, v in os.environ.items() if k != "NCCL_DEBUG_FILE"}  # the ranks write it under scratch
    env.update(NCCL_ENV)
    run.progress(f"collectives: {world} rank(s) on {settings.backend}, {settings.min_bytes} B to {settings.max_bytes} B "
                 f"x{settings.step_factor}, {settings.dtype}")
    try:
        result = run_local(settings, world, scratch, env=env)
    except BaseException:  # the hard stop above all: the work folder is removed next, so keep what it holds now
        with contextlib.suppress(Exception):
            _keep_sweep_files(run, scratch, None)
        raise
    text = _keep_sweep_files(run, scratch, result)
    run.facts["collectives"] = _facts(result)
    for check in result_checks(result, settings):
        run.record("collectives", check)
    for check in _transport(text, world, result.backend, run.opts.intra_node):
        run.record("collectives", check)
    nccl = nccl_log_check(text, world)
    run.facts["nccl"] = {"summary": nccl.message, **{k: v for k, v in nccl.evidence.items() if k != "excerpt"}}
    run.record("collectives", nccl)
    run.record("collectives", timing_check(result))


def _keep_sweep_files(run: DeviceRun, scratch: Path, result: Any) -> str:
    """The NCCL log, rank 0's result and the rank logs' tails, copied from the sweep's folder into the
    output folder; ``result`` None: the sweep was cut off, so the logs are read from where the ranks
    write them. Returns the NCCL log's text."""
    from day0.stages.collectives import CollectivesResult, nccl_log_text

    logs = result if result is not None else CollectivesResult(
        nccl_logs=sorted(str(p) for p in scratch.glob("nccl-debug.*.log")))
    text = nccl_log_text(logs) or _nccl_lines_of_rank_logs(scratch)
    run.write_file(NCCL_LOG_FILE, text)
    if (scratch / "collectives.json").is_file():
        run.write_file(COLLECTIVES_FILE, (scratch / "collectives.json").read_text(encoding="utf-8"))
    _keep_rank_logs(run, scratch, result)
    return text


def _ops() -> list[str]:
    """The ops the step sweeps: GPU_SWEEP's "ops" where set, else every op the registry runs."""
    return list(GPU_SWEEP.get("ops") or OPS.runnable())


def _nccl_lines_of_rank_logs(scratch: Path) -> str:
    """NCCL prints to the ranks' stderr when it cannot open NCCL_DEBUG_FILE: the same lines, from there."""
    ranks = scratch / "ranks"
    paths = sorted(ranks.glob("rank*.log")) if ranks.is_dir() else []
    lines = [ln for p in paths for ln in p.read_text(encoding="utf-8", errors="replace").splitlines()
             if " NCCL " in ln]
    return "\n".join(lines) + ("\n" if lines else "")


def _facts(result: Any) -> dict[str, Any]:
    """What the closing note quotes: who ran, how long, and each op's figures at its largest size."""
    largest: dict[str, Any] = {}
    for r in result.rows:
        key = f"{r.op}/{r.mode}"
        if key not in largest or r.size_bytes > largest[key]["size_bytes"]:
            largest[key] = {"size_bytes": r.size_bytes, "time_us": r.time_us, "p50_us": r.p50_us,
                            "algbw_gbps": r.algbw_gbps, "busbw_gbps": r.busbw_gbps, "wrong": r.wrong}
    return {"backend": result.backend, "world_size": result.world_size, "versions": result.versions,
            "duration_s": result.duration_s, "complete": result.complete,
            "fault": result.fault.message if result.fault else None, "points": len(result.rows),
            "largest": largest}


def _world() -> int:
    """One rank per visible GPU."""
    import torch

    return int(torch.cuda.device_count())


def _keep_rank_logs(run: DeviceRun, scratch: Path, result: Any) -> None:
    """The sweep table and each rank's own log (the tail) go into device-check.log."""
    from day0.stages.collectives.cli import format_table

    if result is not None:
        run.log("\n" + format_table(result) + "\n")
    ranks = scratch / "ranks"
    for path in sorted(ranks.glob("*.log")) if ranks.is_dir() else []:
        data = path.read_bytes()[-RANK_LOG_TAIL:].decode("utf-8", errors="replace")
        run.log(f"\n===== {path.name} (last {RANK_LOG_TAIL} bytes at most) =====\n{data}\n")


def _transport(text: str, world: int, backend: str, intra_node: str) -> list[Check]:
    """The stage's transport checks on this node; one rank opens no channel, so there is nothing to hold
    to the topology (a skip saying so, where the stage would call the missing lines an error)."""
    from day0.stages.collectives import transport_checks
    from day0.stages.collectives.nccl_debug import parse_nccl_debug
    from day0.stages.collectives.transport import TransportTopology

    topology = TransportTopology(intra_node=intra_node, inter_node="none", nodes=1, devices_per_node=max(1, world))
    checks = transport_checks(text, topology, backend=backend or "nccl")
    if world == 1 and not parse_nccl_debug(text).connections:
        why = "one rank: NCCL opens no channel connection to a peer, so no transport to verify (needs 2+ GPUs)"
        for c in checks:
            if c.status == "error":
                c.status, c.message = "skip", why
    return checks


def nccl_log_check(text: str, world: int) -> Check:
    """The parser on a real log: it must find the NCCL version and the communicator's size, which every
    NCCL since 2.7 prints at INFO; what else it found (rings, trees, patterns, links) is the evidence."""
    from day0.stages.collectives.nccl_debug import parse_nccl_debug

    cid, title = "device.nccl_log", "day0's parser reads the real NCCL_DEBUG=INFO log"
    lines = text.count("\n")
    if "NCCL INFO" not in text:
        return Check(id=cid, title=title, status="error", message=(
            f"no NCCL INFO line in the ranks' logs ({lines} lines): NCCL_DEBUG_FILE was not written; see "
            "device-check.log for the ranks' output"), source="nccl_debug")
    log = parse_nccl_debug(text)
    found = log.to_dict()
    versions = sorted(set(log.versions))
    links = sorted({c.via for c in log.connections})
    missing = [what for what, ok in (("the NCCL version", bool(versions)),
                                     (f"nranks {world}", log.nranks == world)) if not ok]
    summary = (f"NCCL {', '.join(versions) or '?'}; nranks {log.nranks}; {len(log.rings)} ring channel(s), "
               f"{len(log.trees)} tree entries, {len(log.patterns)} pattern(s), {len(log.connections)} connection(s)"
               + (f" via {', '.join(links[:6])}" if links else ""))
    evidence = {"nccl": found, "links": links, "lines": lines,
                "excerpt": "\n".join(ln for ln in text.splitlines() if _interesting(ln))[:20000]}
    if missing:
        return Check(id=cid, title=title, status="fail", value=summary, message=(
            f"the parser missed {' and '.join(missing)} in {lines} lines of real NCCL output ({summary}): the "
            "format changed; fix day0/stages/collectives/nccl_debug.py against nccl-debug.log"),
            evidence=evidence, source="nccl_debug")
    return Check(id=cid, title=title, status="pass", value=summary, message=summary, evidence=evidence,
                 source="nccl_debug")


def _interesting(line: str) -> bool:
    keys = ("NCCL version", "nRanks", "nranks", "Channel", "Trees", "Pattern", "via", "Using network", "NVLS",
            "Init COMPLETE", "WARN")
    return any(k in line for k in keys)


def timing_check(result: Any) -> Check:
    """The per-iteration timer (CUDA events on NCCL) against the wall clock around the same loop.

    A time is never negative or NaN, some point must take measurable time (one rank's in-place
    reductions are no-ops, so a zero alone is no fault), and the iterations' times cannot add up to
    more than the wall time of the loop that contains them: a unit slip (ms read as s) shows there.
    """
    cid, title = "device.cuda_event_timing", "Per-iteration times are sane against the wall clock"
    rows = list(result.rows)
    if not rows:
        return Check(id=cid, title=title, status="error", message="the sweep produced no row to time",
                     source="torch.cuda")
    timer = "CUDA events" if result.backend == "nccl" else f"perf_counter ({result.backend})"
    # Each iteration's time is the max over ranks, the loop's the max over ranks of their own loops:
    # ranks slowed at different iterations (a busy CPU box) add up to at most world_size loops. A
    # unit slip is a factor of 1000, far past that.
    bound = max(1.5, float(result.world_size or 1))
    problems = []
    for r in rows:
        times = list(r.times_us or [])
        where = f"{r.op} {r.mode} {r.size_bytes} B"
        if not times or r.time_us is None or not math.isfinite(r.time_us) or r.time_us <= 0:
            problems.append(f"{where}: wall {r.time_us} us, {len(times)} per-iteration times")
        elif any(not math.isfinite(t) or t < 0 for t in times):
            problems.append(f"{where}: a per-iteration time is negative or not finite ({min(times)} us)")
        elif sum(times) > bound * len(times) * r.time_us + 100.0:
            problems.append(f"{where}: iterations add up to {sum(times):.1f} us, more than the loop's wall "
                            f"time {len(times) * r.time_us:.1f} us (a unit slip?)")
    medians = [sorted(r.times_us)[len(r.times_us) // 2] for r in rows if r.times_us]
    if not any(m > 0 for m in medians):
        problems.append(f"every per-iteration median is 0 us: {timer} measured nothing")
    evidence = {"rows": len(rows), "timer": timer, "problems": problems[:50],
                "largest_median_us": max(medians, default=None)}
    if problems:
        return Check(id=cid, title=title, status="fail", value=len(problems), limit=0, unit="points",
                     evidence=evidence, source="torch.cuda",
                     message=f"{len(problems)} of {len(rows)} sweep points: {problems[0]}")
    return Check(id=cid, title=title, status="pass", value=0, limit=0, unit="points", evidence=evidence,
                 source="torch.cuda", message=(f"{len(rows)} sweep points timed by {timer}, each within the wall "
                                               f"clock; medians up to {max(medians):.1f} us"))


def plain_op_ids(op: str) -> tuple[str, str, str, str]:
    """The stage's ``op_check_ids`` for a plain op, spelled here without importing the stage (which
    needs pydantic), so a run that cannot import it still declares the same check ids (a test holds
    the two equal)."""
    return (f"collectives.{op}.correct", f"{op}: exact results", f"collectives.{op}.busbw",
            f"{op}: bus bandwidth at large messages")


def sweep_steps() -> list[Step]:
    """Imports the stage (pydantic) only when the step list is made, so a module that is missing or
    refuses to import (pydantic's SystemError on a pydantic-core mismatch) is the step's error, and
    its checks are the same ids as always, each an error naming the cause."""
    try:
        ids = sweep_ids()
    except Exception as exc:  # noqa: BLE001 - whatever the import raised, the run must still end with a record
        ids = sweep_ids(plain_op_ids)
        reason = f"{type(exc).__name__}: {exc}{module_hint(exc)}"

        def broken(run: DeviceRun) -> None:
            raise RuntimeError(f"the collectives stage cannot be imported here ({reason})")

        return [Step("collectives", "collectives", ids, broken, needs_cuda=True)]
    return [Step("collectives", "collectives", ids, sweep_step, needs_cuda=True, needs=("work",))]
