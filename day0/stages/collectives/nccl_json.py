"""nccl-tests' ``-J`` JSON file (file version 2, written by ``src/util.cu``), held to the same
rules as the text: every figure a finite number >= 0, ``nwrong`` a whole count or null, the run
finished (its ``average_bus_bandwidth`` written) unless nccl-tests recorded why not. A refusal
names the file and the key (``results[3].in_place.bus_bw``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

from day0.stages.collectives.nccl_format import NcclParseError, NcclTestsRow, NcclTestsRun, finish_run, resolve_op

#: util.cu prints doubles with "%lf": six decimals, so that is the rounding a figure carries.
_JSON_ULP = 1e-6


def _figure(where: str, key: str, v: Any, *, whole: bool = False, null: bool = False) -> float | None:
    """A number as nccl-tests writes one (NaN as the string "nan"), or a refusal naming the key."""
    if v is None and null:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise NcclParseError(where, f"{key}: {v!r} is not a number")
    try:
        f = float(v)
    except ValueError:
        raise NcclParseError(where, f"{key}: {v!r} is not a number") from None
    if not math.isfinite(f):
        raise NcclParseError(where, f"{key}: {v!r} is not a finite number")
    if f < 0:
        raise NcclParseError(where, f"{key}: {v!r} is negative")
    if whole and f != int(f):
        raise NcclParseError(where, f"{key}: {v!r} is not a whole number")
    return f


def _program(data: Mapping[str, Any], results: list[Any]) -> str | None:
    for r in results:
        if isinstance(r, Mapping) and r.get("experiment_name"):
            return str(r["experiment_name"])
    args = data.get("args")
    if isinstance(args, list) and args and isinstance(args[0], str) and args[0].strip():
        return Path(args[0]).name
    return None


def _devices(run: NcclTestsRun, devices: Any, where: str) -> None:
    if not isinstance(devices, list) or not devices:
        return
    seen: dict[int, str] = {}
    for i, d in enumerate(devices):
        if not isinstance(d, Mapping):
            raise NcclParseError(where, f"config.devices[{i}] is not an object")
        rank = d.get("rank", i)
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise NcclParseError(where, f"config.devices[{i}].rank: {rank!r} is not a rank")
        if rank in seen:
            raise NcclParseError(where, f"config.devices[{i}]: rank {rank} is listed twice")
        seen[rank] = str(d.get("hostname", ""))
    if sorted(seen) != list(range(len(seen))):
        raise NcclParseError(where, f"config.devices: ranks {sorted(seen)[:8]}... are not 0..{len(seen) - 1}")
    run.world_size = len(seen)
    run.hosts = [seen[r] for r in range(len(seen))]
    run.groups = len({str(d.get("group", 0)) for d in devices})


def _side_row(where: str, i: int, mode: str, r: Mapping[str, Any], common: dict[str, Any]) -> NcclTestsRow | None:
    side = r.get(mode)
    if side is None:
        return None  # nccl-tests writes null for a side it did not run
    key = f"results[{i}].{mode}"
    if not isinstance(side, Mapping):
        raise NcclParseError(where, f"{key} is not an object")
    time_key = "time" if "time" in side else "cpu_time"
    fig = {k: _figure(where, f"{key}.{k}", side.get(k)) for k in (time_key, "alg_bw", "bus_bw")}
    nw = _figure(where, f"{key}.nwrong", side.get("nwrong"), whole=True, null=True)
    per = r.get(f"{mode}_per_iter")
    per_iter = None
    if isinstance(per, Mapping):
        per_iter = {k: float(_figure(where, f"{key}_per_iter.{k}", v) or 0.0) for k, v in per.items()
                    if k.endswith("_us") and not isinstance(v, list)}
    return NcclTestsRow(**common, mode=mode, time_us=fig[time_key], algbw_gbps=fig["alg_bw"],
                        busbw_gbps=fig["bus_bw"], wrong=None if nw is None else int(nw), per_iter=per_iter or None,
                        key=f"{key}.bus_bw", ulp=(_JSON_ULP, _JSON_ULP))


def _rows(run: NcclTestsRun, results: list[Any], where: str) -> None:
    for i, r in enumerate(results):
        if not isinstance(r, Mapping):
            raise NcclParseError(where, f"results[{i}] is not an object")
        if "size" not in r or "count" not in r:
            raise NcclParseError(where, f"results[{i}] lacks an integer size/count")
        size = _figure(where, f"results[{i}].size", r["size"], whole=True)
        count = _figure(where, f"results[{i}].count", r["count"], whole=True)
        root_s = str(r.get("root", "")).strip()
        root = int(root_s) if root_s.lstrip("-").isdigit() and int(root_s) >= 0 else None
        common = dict(size_bytes=int(size or 0), count=int(count or 0), dtype=str(r.get("type", "")),
                      redop=str(r.get("redop", "")), root=root)
        for mode in ("out_of_place", "in_place"):
            row = _side_row(where, i, mode, r, common)
            if row is not None:
                run.rows.append(row)


def parse_nccl_tests_json(data: Mapping[str, Any], *, path: Path | None = None, op: str | None = None) -> NcclTestsRun:
    """Parse the ``-J`` JSON of nccl-tests (file version 2: config, results, out_of_bounds, ...)."""
    where = str(path) if path else "<json>"
    if not isinstance(data, Mapping) or "results" not in data:
        raise NcclParseError(where, "not an nccl-tests JSON file (no 'results' key)")
    results = data.get("results") or []
    if not isinstance(results, list):
        raise NcclParseError(where, "'results' is not a list")
    op_name, source = resolve_op(op, _program(data, results), path, where)
    run = NcclTestsRun(op=op_name, program=_program(data, results), layout="json", op_source=source)
    config = data.get("config") or {}
    if not isinstance(config, Mapping):
        raise NcclParseError(where, "'config' is not an object")
    run.config = {k: v for k, v in config.items() if k != "devices"}
    _devices(run, config.get("devices") or data.get("devices"), where)
    _rows(run, results, where)
    errors = data.get("errors") or []
    run.errors = [str(e)[:300] for e in (errors if isinstance(errors, list) else [errors]) if str(e).strip()]
    oob = data.get("out_of_bounds")
    if isinstance(oob, Mapping):
        run.out_of_bounds = int(_figure(where, "out_of_bounds.count", oob.get("count", 0), whole=True) or 0)
        run.out_of_bounds_ok = str(oob.get("okay", "")).lower() == "true"
    avg = data.get("average_bus_bandwidth")
    if isinstance(avg, Mapping):
        run.avg_busbw_gbps = _figure(where, "average_bus_bandwidth.bandwidth", avg.get("bandwidth"))
        run.complete = True
    finish_run(run, where)
    return run
