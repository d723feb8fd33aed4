"""NCCL_DEBUG and nccl-tests parsers, on samples written from the formats NCCL and nccl-tests print.

Renderers below follow the printf formats of nccl-tests (src/common.cu, src/util.cu) and NCCL
(transport/p2p.cc, shm.cc, net.cc, graph/search.cc, init.cc), so property tests can round-trip
arbitrary sweeps and topologies through text.
"""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from day0.stages.collectives import CollectivesSection, import_nccl_tests, result_checks
from day0.stages.collectives.busbw import algbw_gbps, busbw_gbps
from day0.stages.collectives.nccl_debug import parse_nccl_debug
from day0.stages.collectives.nccl_tests import (
    NcclParseError,
    parse_nccl_tests_json,
    parse_nccl_tests_text,
    read_nccl_tests,
)
from day0.stages.collectives.transport import TransportTopology, transport_checks

# --------------------------------------------------------------------------- nccl-tests renderers


def float_str(value: float, width: int) -> str:
    """nccl-tests' getFloatStr (util.cu)."""
    power, val = 0, 1
    while value >= val:
        power += 1
        val *= 10
    if power < width - 2:
        return f"{value:{width}.2f}"
    if power < width - 1:
        return f"{value:{width}.1f}"
    if power < width + 1:
        return f"{value:{width}.0f}"
    return f"{value:{width}.1e}"


def old_time_str(us: float) -> str:
    """Older common.cu: %7.0f / %7.1f / %7.2f by magnitude."""
    if us >= 10000.0:
        return f"{us:7.0f}"
    if us >= 100.0:
        return f"{us:7.1f}"
    return f"{us:7.2f}"


DEVICES = "\n".join(
    f"#  Rank {r:2d} Group  0 Pid {41230 + r:6d} on {'dgx-a' if r < 4 else 'dgx-b':>10} device {r % 4:2d} [0000:{0x18 + r:02x}:00] NVIDIA H100 80GB HBM3"
    for r in range(8)
)


def render_text(op_prog: str, rows: list[dict], *, n: int = 8, layout: str = "wrong", starting: bool = True,
                oob: int = 0, avg: float = 0.0, per_iter: bool = False, validation: bool = True) -> str:
    """One nccl-tests program's stdout. rows: size,count,type,redop,root,t_oop,t_ip,w_oop,w_ip."""
    out = []
    if starting and layout == "wrong":
        out.append("# nccl-tests version 2.17.6 nccl-headers=22703 nccl-library=22703")
        out.append(f"# Collective test starting: {op_prog}")
    out.append("# nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 "
               f"agg iters: 1 validation: {int(validation)} graph: 0")
    out.append("#")
    out.append("# Using devices")
    out.append(DEVICES)
    out.append("#")
    if layout == "wrong" and not per_iter:
        out.append(f"# {'':>10}  {'':>12}  {'':>8}  {'':>6}  {'':>6}           out-of-place                       in-place          ")
        out.append(f"# {'size':>10}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}  {'time':>7}  {'algbw':>6}  {'busbw':>6}  {'#wrong':>6}  {'time':>7}  {'algbw':>6}  {'busbw':>6}  {'#wrong':>6} ")
        out.append(f"# {'(B)':>10}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}  {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}  {'':>6}  {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}  {'':>6} ")
    elif layout == "wrong":
        names = ["size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99", "i_cv%",
                 "time", "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99", "i_cv%"]
        out.append("#                                            out-of-place (+ per-iteration)                                in-place (+ per-iteration)")
        out.append("# " + "  ".join(f"{x:>7}" for x in names))
    else:  # older layout: no root column, "error" instead of "#wrong"
        out.append(f"# {'':>10}  {'':>12}  {'':>6}  {'':>6}           out-of-place                       in-place          ")
        out.append(f"# {'size':>10}  {'count':>12}  {'type':>6}  {'redop':>6}  {'time':>7}  {'algbw':>6}  {'busbw':>6}  {'error':>5}  {'time':>7}  {'algbw':>6}  {'busbw':>6}  {'error':>5}")
        out.append(f"# {'(B)':>10}  {'(elements)':>12}  {'':>6}  {'':>6}  {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}  {'':>5}  {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}  {'':>5}")
    op = op_prog.replace("_perf", "").replace("alltoall", "all_to_all")
    for r in rows:
        if layout == "wrong":
            line = f"{r['size']:12d}  {r['count']:12d}  {r['type']:>8}  {r['redop']:>6}  {r['root']:6d}"
        else:
            line = f"{r['size']:12d}  {r['count']:12d}  {r['type']:>6}  {r['redop']:>6}"
        for side in ("oop", "ip"):
            t = r[f"t_{side}"]
            alg = algbw_gbps(r["size"], t / 1e6)
            bus = busbw_gbps(op, r["size"], t / 1e6, n)
            if layout == "wrong":
                wrong = f"{r[f'w_{side}']:6g}" if validation else "   N/A"
                line += f"  {float_str(t, 7)}  {float_str(alg, 6)}  {float_str(bus, 6)}  {wrong}"
                if per_iter:
                    line += f"  {float_str(t * 0.9, 7)}  {float_str(t * 1.3, 7)}  {float_str(t * 1.2, 7)}  {float_str(4.5, 7)}"
            else:
                line += f"  {old_time_str(t)}  {alg:6.2f}  {bus:6.2f}  {r[f'w_{side}']:5.0e}"
        out.append(line)
    out.append(f"# {'Out of bounds values':<20} : {oob} {'FAILED' if oob else 'OK'}")
    out.append(f"# {'Avg bus bandwidth':<20} : {avg:g} ")
    out.append("#")
    if layout == "wrong" and starting:
        out.append(f"# Collective test concluded: {op_prog}")
    return "\n".join(out) + "\n"


def sweep_rows(op: str, n: int = 8, sizes=(8, 1024, 1 << 20, 134217728), wrong=(0, 0)):
    rows = []
    for s in sizes:
        split = op in ("all_gather", "reduce_scatter", "all_to_all")
        count = s // 4 // (n if split else 1)
        t = 30.0 + s / 2e5  # a plausible latency + bandwidth curve (us)
        rows.append(dict(size=s, count=count, type="float", redop="sum" if "reduce" in op else "none",
                         root=0 if op == "broadcast" else -1, t_oop=t, t_ip=t * 1.01, w_oop=wrong[0], w_ip=wrong[1]))
    return rows


# --------------------------------------------------------------------------- nccl-tests: text


def test_current_layout_parses_rows_footers_devices():
    text = render_text("all_reduce_perf", sweep_rows("all_reduce"), oob=0, avg=103.514)
    [run] = parse_nccl_tests_text(text)
    assert run.op == "all_reduce" and run.program == "all_reduce_perf"
    assert run.world_size == 8 and run.hosts == ["dgx-a"] * 4 + ["dgx-b"] * 4
    assert len(run.rows) == 8  # 4 sizes x (out-of-place, in-place)
    big = [r for r in run.rows if r.size_bytes == 134217728]
    assert {r.mode for r in big} == {"out_of_place", "in_place"}
    oop = next(r for r in big if r.mode == "out_of_place")
    assert oop.count == 33554432 and oop.dtype == "float" and oop.redop == "sum" and oop.root is None
    assert oop.busbw_gbps == pytest.approx(busbw_gbps("all_reduce", 134217728, oop.time_us / 1e6, 8), rel=2e-3)
    assert oop.wrong == 0
    assert run.out_of_bounds == 0 and run.out_of_bounds_ok is True
    assert run.avg_busbw_gbps == pytest.approx(103.514)


def test_older_error_layout_without_root_column(tmp_path):
    text = render_text("all_gather_perf", sweep_rows("all_gather"), layout="error", starting=False, oob=0, avg=88.1)
    path = tmp_path / "all_gather_perf.log"
    path.write_text(text)
    [run] = read_nccl_tests(path)
    assert run.op == "all_gather" and run.layout == "error"  # op from the file name: old output never says
    assert all(r.wrong is None and r.max_error == 0.0 for r in run.rows)
    assert [r.count for r in run.rows[::2]] == [0, 32, 32768, 4194304]
    result = import_nccl_tests(path)
    checks = {c.id: c for c in result_checks(result, None)}
    assert checks["collectives.all_gather.correct"].status == "pass"  # judged by the out-of-bounds footer


def test_per_iteration_layout_and_timestamps_do_not_shift_columns():
    text = render_text("reduce_scatter_perf", sweep_rows("reduce_scatter"), per_iter=True)
    [run] = parse_nccl_tests_text(text)
    r = next(r for r in run.rows if r.size_bytes == 1 << 20 and r.mode == "in_place")
    assert r.per_iter is not None and r.per_iter["i_cv%"] == pytest.approx(4.5)
    assert r.wrong == 0
    assert r.time_us == pytest.approx((30.0 + (1 << 20) / 2e5) * 1.01, abs=0.01)


def test_wrong_elements_and_failed_footer_fail_the_correct_check(tmp_path):
    text = render_text("all_reduce_perf", sweep_rows("all_reduce", wrong=(0, 17)), oob=17)
    path = tmp_path / "out.txt"
    path.write_text(text)
    result = import_nccl_tests(path)
    assert result.ops["all_reduce"].out_of_bounds == 17
    checks = {c.id: c for c in result_checks(result, None)}
    c = checks["collectives.all_reduce.correct"]
    assert c.status == "fail" and c.value == 17 * 4
    assert "wrong elements" in c.message


def test_validation_off_is_a_skip_not_a_pass(tmp_path):
    path = tmp_path / "o.txt"
    path.write_text(render_text("all_reduce_perf", sweep_rows("all_reduce"), validation=False))
    checks = {c.id: c for c in result_checks(import_nccl_tests(path), None)}
    assert checks["collectives.all_reduce.correct"].status == "skip"
    assert "validation" in checks["collectives.all_reduce.correct"].message


def test_concatenated_programs_give_one_result_with_each_op(tmp_path):
    text = render_text("all_reduce_perf", sweep_rows("all_reduce")) + render_text("alltoall_perf", sweep_rows("all_to_all"))
    path = tmp_path / "nccl.log"
    path.write_text(text)
    result = import_nccl_tests(path)
    assert list(result.ops) == ["all_reduce", "all_to_all"]
    assert result.world_size == 8 and result.nnodes == 2


def test_busbw_check_against_expectations(tmp_path):
    path = tmp_path / "o.txt"
    path.write_text(render_text("all_reduce_perf", sweep_rows("all_reduce")))
    result = import_nccl_tests(path)
    big = max(r.busbw_gbps for r in result.rows if r.size_bytes == 134217728)
    ok = CollectivesSection(expected_busbw={"inter_node": {"all_reduce": big / 0.8 * 0.99}}, pass_fraction=0.8)
    bad = CollectivesSection(expected_busbw={"inter_node": {"all_reduce": big / 0.8 * 1.01}}, pass_fraction=0.8)
    c_ok = {c.id: c for c in result_checks(result, ok)}["collectives.all_reduce.busbw"]
    c_bad = {c.id: c for c in result_checks(result, bad)}["collectives.all_reduce.busbw"]
    assert c_ok.status == "pass" and c_bad.status == "fail"
    assert c_bad.evidence["scope"] == "inter_node"  # two hosts in the device list
    chart = c_bad.evidence["charts"][0]
    assert chart["x_log"] and {s["name"] for s in chart["series"]} == {"out_of_place", "in_place"}
    assert chart["reference"][0]["y"] == pytest.approx(big / 0.8 * 1.01)


def test_garbage_is_a_one_line_error_naming_the_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello\nworld\n")
    with pytest.raises(NcclParseError, match=str(path)):
        read_nccl_tests(path)
    bad_json = tmp_path / "x.json"
    bad_json.write_text("{\"results\": [{\"size\": \"big\"}]}")
    with pytest.raises(NcclParseError, match="results\\[0\\]"):
        read_nccl_tests(bad_json, op="all_reduce")
    unknown = tmp_path / "mystery.txt"
    unknown.write_text(render_text("all_reduce_perf", sweep_rows("all_reduce"), layout="error", starting=False))
    with pytest.raises(NcclParseError, match="pass --op"):
        read_nccl_tests(unknown)


# --------------------------------------------------------------------------- nccl-tests: -J JSON

# Written the way util.cu writes it: no whitespace, bools as strings, root as "%6i", doubles "%lf".
JSON_SAMPLE = (
    '{"version":2,"start_time":"2026-11-30 10:00:00","args":["./build/all_reduce_perf","-b","8","-e","128M","-f","2",'
    '"-g","1","-J","ar.json"],"env":["NCCL_DEBUG=WARN"],"nccl_version":22703,"config":{"nthreads":1,"ngpus":1,'
    '"minimum_bytes":8,"maximum_bytes":134217728,"step_factor":2,"warmup_iters":5,"iterations":20,'
    '"aggregated_iterations":1,"validation":1,"graph":0,"blocking_collectives":"false","per_iter_timing":"false",'
    '"parallel_init":"false","devices":[{"rank":0,"group":0,"pid":41230,"hostname":"dgx-a","device":0,'
    '"device_hex":"0000:18:00","device_info":"NVIDIA H100 80GB HBM3"},{"rank":1,"group":0,"pid":41231,'
    '"hostname":"dgx-a","device":1,"device_hex":"0000:2a:00","device_info":"NVIDIA H100 80GB HBM3"}]},'
    '"results":[{"size":8,"count":2,"type":"float","redop":"sum","root":"    -1","out_of_place":{"time":19.530000,'
    '"alg_bw":0.000410,"bus_bw":0.000410,"nwrong":0.000000},"in_place":{"time":19.100000,"alg_bw":0.000419,'
    '"bus_bw":0.000419,"nwrong":0.000000},"actual_iterations":20,"experiment_name":"all_reduce_perf"},'
    '{"size":134217728,"count":33554432,"type":"float","redop":"sum","root":"    -1","out_of_place":{"time":353.200000,'
    '"alg_bw":380.004915,"bus_bw":380.004915,"nwrong":0.000000},"in_place":{"time":352.900000,"alg_bw":380.327938,'
    '"bus_bw":380.327938,"nwrong":null},"actual_iterations":20,"experiment_name":"all_reduce_perf"}],'
    '"out_of_bounds":{"count":0,"okay":"true"},"average_bus_bandwidth":{"bandwidth":190.002000,"okay":"unchecked"},'
    '"errors":[],"end_time":"2026-11-30 10:00:05"}'
)


def test_json_v2_parses_like_the_text(tmp_path):
    path = tmp_path / "ar.json"
    path.write_text(JSON_SAMPLE)
    [run] = read_nccl_tests(path)
    assert run.op == "all_reduce" and run.layout == "json" and run.world_size == 2 and run.hosts == ["dgx-a", "dgx-a"]
    assert len(run.rows) == 4
    big = [r for r in run.rows if r.size_bytes == 134217728]
    assert big[0].busbw_gbps == pytest.approx(380.004915) and big[0].wrong == 0
    assert big[1].wrong is None  # "nwrong": null: not validated on that side
    assert run.out_of_bounds == 0 and run.out_of_bounds_ok is True and run.avg_busbw_gbps == pytest.approx(190.002)
    result = import_nccl_tests(path)
    assert result.nnodes == 1
    checks = {c.id: c for c in result_checks(result, {"intra_node": {"all_reduce": 370.0}})}
    assert checks["collectives.all_reduce.busbw"].status == "pass"  # 380.3 >= 0.8 x 370
    assert checks["collectives.all_reduce.correct"].status == "pass"


def test_json_errors_become_a_fault(tmp_path):
    data = json.loads(JSON_SAMPLE)
    data["errors"] = ["NCCL failure common.cu:1042 'unhandled system error'"]
    path = tmp_path / "e.json"
    path.write_text(json.dumps(data))
    result = import_nccl_tests(path)
    assert result.fault is not None and "unhandled system error" in result.fault.message
    checks = {c.id: c for c in result_checks(result, None)}
    assert checks["collectives.ranks"].status == "fail"


row_st = st.fixed_dictionaries({
    "size": st.integers(min_value=8, max_value=1 << 34),
    "t_oop": st.floats(min_value=1.0, max_value=5e6, allow_nan=False),
    "t_ip": st.floats(min_value=1.0, max_value=5e6, allow_nan=False),
    "w_oop": st.integers(min_value=0, max_value=10**6),
    "w_ip": st.integers(min_value=0, max_value=10**6),
})


@given(rows=st.lists(row_st, min_size=1, max_size=12), op=st.sampled_from(["all_reduce", "all_gather", "broadcast", "sendrecv"]))
@settings(max_examples=60, deadline=None)
def test_text_round_trip(rows, op):
    full = [dict(r, count=r["size"] // 4, type="float", redop="sum", root=-1) for r in rows]
    [run] = parse_nccl_tests_text(render_text(f"{op}_perf", full))
    assert len(run.rows) == 2 * len(full)
    for src, (oop, ip) in zip(full, zip(run.rows[::2], run.rows[1::2])):
        assert (oop.size_bytes, oop.count, oop.mode, ip.mode) == (src["size"], src["count"], "out_of_place", "in_place")
        assert oop.wrong == src["w_oop"] and ip.wrong == src["w_ip"]
        for parsed, t in ((oop, src["t_oop"]), (ip, src["t_ip"])):
            # %7s with 2 decimals, or 3 significant digits in exponent form for huge times
            assert parsed.time_us == pytest.approx(t, rel=0.06, abs=0.006)


@given(rows=st.lists(row_st, min_size=1, max_size=12))
@settings(max_examples=40, deadline=None)
def test_json_round_trip_is_exact(rows):
    results = []
    for r in rows:
        side = lambda t, w: {"time": t, "alg_bw": algbw_gbps(r["size"], t / 1e6),  # noqa: E731
                             "bus_bw": busbw_gbps("all_reduce", r["size"], t / 1e6, 4), "nwrong": float(w)}
        results.append({"size": r["size"], "count": r["size"] // 4, "type": "float", "redop": "sum", "root": "    -1",
                        "out_of_place": side(r["t_oop"], r["w_oop"]), "in_place": side(r["t_ip"], r["w_ip"]),
                        "actual_iterations": 20, "experiment_name": "all_reduce_perf"})
    doc = {"version": 2, "config": {"nthreads": 1, "ngpus": 4}, "results": results}
    run = parse_nccl_tests_json(json.loads(json.dumps(doc)))
    assert [(r.size_bytes, r.mode, r.time_us, r.wrong) for r in run.rows] == [
        (x["size"], m, x[m]["time"], int(x[m]["nwrong"])) for x in results for m in ("out_of_place", "in_place")
    ]


# --------------------------------------------------------------------------- NCCL_DEBUG logs


def nccl_log(nodes: int, gpus: int, intra: str, inter: str, *, channels: int = 2, overrides=None,
             seed: int = 0, pattern_type: str = "NVL", only_node: int | None = None) -> tuple[str, list[tuple]]:
    """Interleaved NCCL_DEBUG=INFO output of every rank; returns (text, [(src, dst, via)])."""
    overrides = overrides or {}
    n = nodes * gpus
    host = lambda r: f"gpu-node{r // gpus:02d}"  # noqa: E731
    pid = lambda r: 31000 + r  # noqa: E731
    pre = lambda r, tid=0: f"{host(r)}:{pid(r)}:{pid(r) + 50 + tid} [{r % gpus}] NCCL INFO "  # noqa: E731
    lines: list[tuple[int, str]] = []
    conns = []
    for r in range(n):
        lines.append((r, pre(r, -50) + "NCCL version 2.21.5+cuda12.4"))
        lines.append((r, pre(r) + f"comm 0x55d4c{r:03x}0 rank {r} nRanks {n} nNodes {nodes} localRanks {gpus} localRank {r % gpus} MNNVL 0"))
        lines.append((r, pre(r) + f"Pattern 4, crossNic 0, nChannels {channels}, bw 40.000000/{'20.000000' if nodes > 1 else '40.000000'}, type {pattern_type}/PIX, sameChannels 1"))
        for c in range(channels):
            lines.append((r, pre(r) + f"Channel {c:02d}/{channels:02d} :" + "".join(f" {x:4d}" for x in range(n))))
        lines.append((r, pre(r) + "Trees" + "".join(f" [{c}] {(r + 1) % n if r + 1 < n else -1}/-1/-1->{r}->{r - 1 if r else -1}" for c in range(channels))))
        for c in range(channels):
            nxt = (r + 1) % n
            if nxt == r:
                continue
            same = nxt // gpus == r // gpus
            via = overrides.get((c, r), intra if same else inter)
            conns.append((r, nxt, via, same))
            if via.startswith("NET/"):
                lines.append((r, pre(r) + f"Channel {c:02d}/0 : {r}[{r % gpus}] -> {nxt}[{nxt % gpus}] [send] via {via}"))
                lines.append((nxt, pre(nxt) + f"Channel {c:02d}/0 : {r}[{r % gpus}] -> {nxt}[{nxt % gpus}] [receive] via {via}"))
            else:
                lines.append((r, pre(r) + f"Channel {c:02d}/0 : {r}[{r % gpus}] -> {nxt}[{nxt % gpus}] via {via}"))
        lines.append((r, pre(r) + "Connected all rings"))
        lines.append((r, pre(r, -50) + f"ncclCommInitRank comm 0x55d4c{r:03x}0 rank {r} nranks {n} cudaDev {r % gpus} nvmlDev {r % gpus} busId {0x18000 + r * 0x1000:x} commId 0x7d3f2a1c - Init COMPLETE"))
    random.Random(seed).shuffle(lines)  # processes interleave their output
    if only_node is not None:
        lines = [(r, t) for r, t in lines if r // gpus == only_node]
    return "\n".join(t for _, t in lines) + "\n", conns


def status(checks, cid):
    return {c.id: c for c in checks}[cid].status


def test_healthy_two_node_nvlink_ib():
    text, _ = nccl_log(2, 4, "P2P/CUMEM/read", "NET/IB/0/GDRDMA")
    log = parse_nccl_debug(text)
    assert log.nranks == 8 and log.nnodes == 2 and log.rings[0] == list(range(8))
    assert {t["rank"] for t in log.trees} == set(range(8))
    assert log.patterns[0].type_intra == "NVL" and log.versions[0] == "2.21.5+cuda12.4"
    checks = transport_checks(text, {"intra_node": "nvlink", "inter_node": "infiniband", "nodes": 2, "devices_per_node": 4})
    assert [c.status for c in checks] == ["pass", "pass"]
    assert "P2P/CUMEM" in checks[0].value and "NET/IB" in checks[1].value


def test_intra_node_shm_fails_nvlink_and_names_the_line():
    text, _ = nccl_log(1, 4, "P2P/CUMEM/read", "NET/IB/0", overrides={(1, 2): "SHM/direct/direct"})
    checks = transport_checks(text, TransportTopology("nvlink", "none", 1, 4))
    intra = checks[0]
    assert intra.status == "fail"
    assert "2->3 used SHM/direct/direct" in intra.message
    assert "Channel 01/0 : 2[2] -> 3[3] via SHM/direct/direct" in intra.evidence["log_excerpt"]
    assert checks[1].status == "skip"  # one node: no inter-node connections


def test_sockets_between_nodes_fail_infiniband_but_pass_ethernet():
    text, _ = nccl_log(2, 2, "P2P/CUMEM", "NET/Socket/0")
    assert status(transport_checks(text, {"intra_node": "nvlink", "inter_node": "infiniband"}), "collectives.transport.inter_node") == "fail"
    assert status(transport_checks(text, {"intra_node": "nvlink", "inter_node": "ethernet"}), "collectives.transport.inter_node") == "pass"


def test_pcie_path_type_fails_an_nvlink_promise_even_with_p2p():
    text, _ = nccl_log(1, 4, "P2P/IPC/read", "NET/IB/0", pattern_type="PHB")
    c = transport_checks(text, {"intra_node": "nvlink", "inter_node": "none"})[0]
    assert c.status == "fail" and "PHB" in c.message
    assert transport_checks(text, {"intra_node": "pcie", "inter_node": "none"})[0].status == "pass"


def test_one_node_log_places_the_other_nodes_ranks():
    text, _ = nccl_log(2, 4, "P2P/CUMEM/read", "NET/IB/0/GDRDMA", only_node=0)
    checks = transport_checks(text, {"intra_node": "nvlink", "inter_node": "infiniband", "devices_per_node": 4})
    assert [c.status for c in checks] == ["pass", "pass"]
    text_sock, _ = nccl_log(2, 4, "P2P/CUMEM/read", "NET/Socket/0", only_node=1)
    assert status(transport_checks(text_sock, {"intra_node": "nvlink", "inter_node": "infiniband"}),
                  "collectives.transport.inter_node") == "fail"


def test_older_nccl_line_formats():
    text = "\n".join([
        "old-a:100:100 [0] NCCL INFO Ring 00 : 0 1",
        "old-a:100:110 [0] NCCL INFO Ring 00 : 0 -> 1 via P2P/IPC",
        "old-a:101:111 [1] NCCL INFO Ring 00 : 1 -> 0 via P2P/IPC",
        "mid-a:200:210 [0] NCCL INFO Channel 00 : 0[1b000] -> 1[1c000] via P2P/direct pointer",
        "mid-a:200:210 [1] NCCL INFO Channel 01 : 1[1c000] -> 2[1b000] [send] via NET/IB/0/GDRDMA",
        "mid-b:300:310 [0] NCCL INFO Channel 01 : 1[1c000] -> 2[1b000] [receive] via NET/IB/0/GDRDMA",
        "new-a:400:410 [0] NCCL INFO Channel 02/1 : 0[0] -> 3[3] [send] via NET/IB/1(2)/GDRDMA/Shared",
    ])
    log = parse_nccl_debug(text)
    assert [c.transport for c in log.connections] == ["P2P", "P2P", "P2P", "NET", "NET", "NET"]
    assert log.connections[2].src_dev == "1b000" and log.connections[2].via == "P2P/direct pointer"
    assert log.connections[4].side == "receive" and log.connections[4].logger_rank == 2
    assert log.connections[5].net == "IB" and log.connections[5].conn_index == 1
    assert log.rings[0] == [0, 1]


def test_no_log_is_an_error_and_gloo_is_a_skip():
    checks = transport_checks("just some text\n", {"intra_node": "nvlink", "inter_node": "infiniband"})
    assert [c.status for c in checks] == ["error", "error"] and "NCCL_DEBUG=INFO" in checks[0].message
    assert [c.status for c in transport_checks("", {"intra_node": "shm"}, backend="gloo")] == ["skip", "skip"]


def test_bad_topology_value_names_the_key():
    with pytest.raises(ValueError, match="topology.inter_node"):
        TransportTopology("nvlink", "carrier-pigeon")


INTRA = ["P2P/CUMEM/read", "P2P/IPC", "P2P/direct pointer/read", "SHM/direct/direct", "NET/Socket/0", "NET/IB/0"]
INTER = ["NET/IB/0/GDRDMA", "NET/IB/3(11)/GDRDMA/Shared", "NET/Socket/1", "NET/AWS Libfabric/0/GDRDMA"]


@given(
    nodes=st.integers(1, 3), gpus=st.integers(1, 4), intra=st.sampled_from(INTRA), inter=st.sampled_from(INTER),
    bad=st.lists(st.tuples(st.integers(0, 1), st.integers(0, 11), st.sampled_from(INTRA + INTER)), max_size=3),
    seed=st.integers(0, 1000), expect_intra=st.sampled_from(["nvlink", "pcie", "shm"]),
    expect_inter=st.sampled_from(["infiniband", "efa", "ethernet"]),
)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_transport_verdict_matches_the_rule(nodes, gpus, intra, inter, bad, seed, expect_intra, expect_inter):
    assume(nodes * gpus >= 2)
    text, conns = nccl_log(nodes, gpus, intra, inter, overrides={(c, r): v for c, r, v in bad}, seed=seed)
    checks = {c.id: c for c in transport_checks(
        text, {"intra_node": expect_intra, "inter_node": expect_inter, "nodes": nodes, "devices_per_node": gpus})}
    ok_intra = {"nvlink": ("P2P",), "pcie": ("P2P",), "shm": ("P2P", "SHM")}[expect_intra]
    ok_inter = {"infiniband": ("NET/IB",), "efa": ("NET/AWS Libfabric",), "ethernet": ("",)}[expect_inter]
    intra_conns = [v for _, _, v, same in conns if same]
    inter_conns = [v for _, _, v, same in conns if not same]
    want_intra = "skip" if not intra_conns else ("pass" if all(v.startswith(ok_intra) for v in intra_conns) else "fail")
    want_inter = "skip" if not inter_conns else ("pass" if all(v.startswith(ok_inter) for v in inter_conns) else "fail")
    assert checks["collectives.transport.intra_node"].status == want_intra
    assert checks["collectives.transport.inter_node"].status == want_inter


# --------------------------------------------------------------------------- which collective, how many ranks, hostile text


@pytest.mark.parametrize("name,op", [
    ("all_reduce_perf.log", "all_reduce"), ("allreduce.txt", "all_reduce"), ("nccl-all-reduce-8gpu.out", "all_reduce"),
    ("reduce_perf.log", "reduce"), ("reduce_scatter_perf.log", "reduce_scatter"), ("ReduceScatter.txt", "reduce_scatter"),
    ("all_gather_perf.json", "all_gather"), ("h100_alltoall_2node.log", "all_to_all"), ("sendrecv.log", "sendrecv"),
    ("broadcast.log", "broadcast"), ("bcast_8.log", "broadcast"), ("reducer.log", None), ("preduce.log", None),
    ("results.txt", None),
])
def test_the_file_name_names_a_collective_only_as_a_whole_word(name, op):
    from day0.stages.collectives.nccl_format import op_from_name

    assert op_from_name(name) == op


def test_several_processes_without_rank_lines_take_the_rank_count_from_the_bandwidths():
    """nGpus 1 per process, 8 MPI processes, the device list cut out: busbw = 1.75 x algbw says 8."""
    text = render_text("all_reduce_perf", sweep_rows("all_reduce"))
    text = "\n".join(ln for ln in text.splitlines() if "Rank " not in ln)
    [run] = parse_nccl_tests_text(text)
    assert run.world_size == 8


def test_timestamps_after_the_in_place_columns_are_two_fields():
    text = render_text("all_reduce_perf", sweep_rows("all_reduce"))
    lines = text.splitlines()
    out = []
    for ln in lines:
        if ln.startswith("#") and "size" in ln and "busbw" in ln:
            ln += "            timestamp"
        elif ln[:12].strip().isdigit():
            ln += "  2026-11-30 10:00:00"
        out.append(ln)
    [run] = parse_nccl_tests_text("\n".join(out))
    assert len(run.rows) == 8 and run.rows[-1].wrong == 0


def test_a_connection_on_many_channels_is_kept_once_with_its_count():
    text = "\n".join(f"h:1:2 [0] NCCL INFO Channel {c:02d}/0 : 0[0] -> 1[1] via P2P/CUMEM/read" for c in range(32))
    log = parse_nccl_debug(text)
    [conn] = log.connections
    assert conn.count == 32 and conn.channel_list == list(range(32)) and conn.line_no == 1
    checks = transport_checks(text, {"intra_node": "nvlink", "inter_node": "none"})
    assert checks[0].status == "pass" and "32 intra-node connections" in checks[0].message


_MUTATIONS = ["nan", "-1", "inf", "", "#", "N/A", "1e999", "0", "9" * 40, "Rank", "size", "time", "busbw", "é"]


@given(edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6), st.sampled_from(_MUTATIONS + ["DEL", "CUT", "DUP"])),
                      min_size=1, max_size=4))
@settings(max_examples=150, deadline=None)
def test_any_edit_of_an_output_is_read_or_refused_in_one_line(edits):
    """Never another exception: an edit either leaves a readable table or is an InputError naming the line."""
    from day0.stages.collectives.inputs import InputError

    lines = render_text("all_reduce_perf", sweep_rows("all_reduce")).splitlines()
    for where, which, what in edits:
        k = where % len(lines)
        if what == "DEL":
            del lines[k]
        elif what == "CUT":
            lines[k] = lines[k][: which % (len(lines[k]) + 1)]
        elif what == "DUP":
            lines.insert(k, lines[which % len(lines)])
        elif lines[k].split():
            toks = lines[k].split()
            toks[which % len(toks)] = what
            lines[k] = "  ".join(toks)
        if not lines:
            return
    try:
        runs = parse_nccl_tests_text("\n".join(lines))
    except InputError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("<text>")
        return
    for run in runs:
        assert all(r.busbw_gbps is not None and r.busbw_gbps >= 0 for r in run.rows)


@given(key=st.sampled_from(["size", "count", "root", "out_of_place", "in_place", "type"]),
       value=st.sampled_from([None, [], {}, "nan", -1, 1e308, True, "x", [1], {"a": 1}, "  -1"]))
@settings(max_examples=80, deadline=None)
def test_any_value_in_a_json_result_is_read_or_refused_naming_its_key(key, value):
    from day0.stages.collectives.inputs import InputError

    data = json.loads(JSON_SAMPLE)
    data["results"][1][key] = value
    try:
        parse_nccl_tests_json(data)
    except InputError as exc:
        assert "results[1]" in str(exc) or "bus factor" in str(exc)


def test_a_one_rank_run_skips_busbw_it_has_none_of_by_definition(tmp_path):
    """(n-1)/n is 0 at one rank: every such busbw read 0 GB/s and failed any expectation."""
    from dataclasses import replace

    path = tmp_path / "all_gather_perf.log"
    path.write_text(render_text("all_gather_perf", sweep_rows("all_gather"), layout="error", starting=False, oob=0,
                                avg=88.1))
    one = replace(import_nccl_tests(path), world_size=1)
    busbw = {c.id: c for c in result_checks(one, None)}["collectives.all_gather.busbw"]
    assert busbw.status == "skip" and "0 by definition" in busbw.message


def test_a_one_rank_broadcast_busbw_is_a_skip_not_an_impossible_pass():
    """broadcast's bus factor is 1, not (n-1)/n: at one rank NCCL's in-place broadcast is a no-op,
    and its 'busbw' (7146 GB/s on a 2-core CPU) must not be judged against any expectation."""
    from day0.stages.collectives.result import CollectivesResult, OpOutcome, SweepRow

    size = 256 << 20
    row = SweepRow("broadcast", "in_place", size, size // 4, "float32", 1, 37.6, 7146.4, 7146.4, 0, 3)
    one = CollectivesResult(backend="nccl", world_size=1, ops={"broadcast": OpOutcome("broadcast", "ok")},
                            rows=[row], complete=True)
    busbw = {c.id: c for c in result_checks(one, {"intra_node": {"broadcast": 100.0}})}["collectives.broadcast.busbw"]
    assert busbw.status == "skip" and "nothing crosses a link" in busbw.message, busbw.message
    two = CollectivesResult(backend="nccl", world_size=2, ops={"broadcast": OpOutcome("broadcast", "ok")},
                            rows=[SweepRow(**{**row.__dict__, "nranks": 2})], complete=True)
    judged = {c.id: c for c in result_checks(two, {"intra_node": {"broadcast": 100.0}})}["collectives.broadcast.busbw"]
    assert judged.status == "pass" and judged.value == 7146.4  # two ranks: judged as before
