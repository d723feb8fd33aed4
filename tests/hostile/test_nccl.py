"""Hostile inputs, the collectives part: nccl-tests outputs and NCCL_DEBUG=INFO logs.

Every case runs ``day0 collectives import|transport`` (or the stage's own reader) as a user would,
under the corpus's time and memory bounds (tests/support/hostile.py). An unusable file is exit 2 and one
stderr line naming it (and its line and column, or key, where one applies) and the problem; a file
that is odd but still judgeable is judged, and never to a pass it did not earn.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from day0.stages.collectives.busbw import bus_factor
from tests.support import hostile

# --------------------------------------------------------------------------- nccl-tests text, as printed


def rank_lines(n: int, hosts: list[str] | None = None, pid_per_rank: bool = True) -> list[str]:
    hosts = hosts or ["dgx-a"] * n
    return [f"#  Rank {r:2d} Group  0 Pid {41230 + (r if pid_per_rank else 0):6d} on {hosts[r]:>10} device {r % 8:2d} "
            f"[0000:{0x18 + r % 200:02x}:00] NVIDIA H100 80GB HBM3" for r in range(n)]


def row(size: int, t: float, op: str = "all_reduce", n: int = 8, *, wrong: tuple[int, int] = (0, 0),
        fields: dict[int, str] | None = None) -> str:
    """One result row as common.cu prints it; ``fields`` replaces tokens by index (0 = size)."""
    split = op in ("all_gather", "reduce_scatter", "all_to_all")
    redop = "sum" if "reduce" in op else "none"
    toks = [str(size), str(size // 4 // (n if split else 1)), "float", redop, "-1"]
    for side, tt in ((0, t), (1, t * 1.01)):
        alg = size / tt / 1e3
        toks += [f"{tt:.2f}", f"{alg:.2f}", f"{alg * bus_factor(op, n):.2f}", str(wrong[side])]
    for i, tok in (fields or {}).items():
        toks[i] = tok
    return "  ".join(f"{x:>10}" for x in toks)


SIZES = ((1024, 30.01), (1 << 20, 35.24), (1 << 27, 701.09))  # 128 MiB all_reduce on 8: busbw 335.02


def nccl_tests(prog: str | None = "all_reduce_perf", *, op: str = "all_reduce", n: int = 8, ngpus: int = 1,
               rows: list[str] | None = None, ranks: list[str] | None = None, footer: bool = True,
               oob: int = 0, header: bool = True) -> str:
    """One program's stdout: version and program lines, nThread line, devices, table, footer."""
    out = []
    if prog:
        out += ["# nccl-tests version 2.17.6 nccl-headers=22703 nccl-library=22703",
                f"# Collective test starting: {prog}"]
    if header:
        out.append(f"# nThread 1 nGpus {ngpus} minBytes 1024 maxBytes 134217728 step: 2(factor) warmup iters: 5 "
                   "iters: 20 agg iters: 1 validation: 1 graph: 0")
    out += ["#", "# Using devices", *(rank_lines(n) if ranks is None else ranks), "#",
            "#                                                              out-of-place                       in-place",
            "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   "
            "busbw  #wrong",
            "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  "
            "(GB/s)"]
    out += rows if rows is not None else [row(s, t, op, n) for s, t in SIZES]
    if footer:
        out += [f"# Out of bounds values : {oob} {'FAILED' if oob else 'OK'}", "# Avg bus bandwidth    : 112.1 ", "#"]
        if prog:
            out.append(f"# Collective test concluded: {prog}")
    return "\n".join(out) + "\n"


def line_of(text: str, needle: str) -> int:
    """The 1-based line number of the first line holding ``needle`` (what a refusal must name)."""
    return next(i for i, ln in enumerate(text.splitlines(), 1) if needle in ln)


def col_of(line: str, index: int) -> int:
    """The 1-based column where whitespace-separated field ``index`` of ``line`` starts."""
    pos = 0
    for i, tok in enumerate(line.split()):
        pos = line.index(tok, pos)
        if i == index:
            return pos + 1
        pos += len(tok)
    raise IndexError(index)


def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return p


def judged(tmp_path: Path, path: Path, *args: str) -> tuple[hostile.Outcome, dict[str, dict], dict]:
    """Import a usable file: the outcome, its checks by id, and the converted result."""
    out = hostile.day0("collectives", "import", path, "--json", tmp_path / "checks.json", "--out",
                       tmp_path / "result.json", *args)
    assert out.code in (0, 1), out.explain()
    assert "Traceback" not in out.stderr and not out.lines, out.explain()
    checks = {c["id"]: c for c in json.loads((tmp_path / "checks.json").read_text())}
    return out, checks, json.loads((tmp_path / "result.json").read_text())


def import_(path: Path | str, *args: str | Path) -> hostile.Outcome:
    return hostile.day0("collectives", "import", path, *args)


# --------------------------------------------------------------------------- item 1: which collective, how many ranks


def test_allreduce_in_the_file_name_is_all_reduce_on_the_header_s_eight_gpus(tmp_path):
    """Was: read as `reduce` (substring), on world size 2. No program line: the name tells, as a word."""
    p = write(tmp_path, "allreduce.log", nccl_tests(None, ngpus=8, ranks=rank_lines(8, pid_per_rank=False)))
    out, checks, result = judged(tmp_path, p)
    assert out.code == 0 and list(result["ops"]) == ["all_reduce"] and result["world_size"] == 8
    assert "collectives.reduce.busbw" not in checks and checks["collectives.all_reduce.busbw"]["value"] == 335.02


def test_ngpus_8_without_rank_lines_is_world_size_8(tmp_path):
    p = write(tmp_path, "allreduce.log", nccl_tests(None, ngpus=8, ranks=[]))
    _, _, result = judged(tmp_path, p)
    assert result["world_size"] == 8 and all(r["nranks"] == 8 for r in result["rows"])


def test_an_all_reduce_expectation_that_should_fail_fails(tmp_path):
    """Was: judged as reduce, for which nothing was expected: 'recorded only', a pass."""
    p = write(tmp_path, "allreduce.log", nccl_tests(None, ngpus=8, ranks=rank_lines(8, pid_per_rank=False)))
    out, checks, _ = judged(tmp_path, p, "--set", "expected_busbw={intra_node={all_reduce=500}}")
    assert out.code == 1 and checks["collectives.all_reduce.busbw"]["status"] == "fail"
    assert "misses" in checks["collectives.all_reduce.busbw"]["message"]


def test_op_wins_over_the_file_name(tmp_path):
    """Was: the file name was tried before --op. The same rows under a misleading name."""
    p = write(tmp_path, "broadcast_sweep.log", nccl_tests(None))
    out, checks, result = judged(tmp_path, p, "--op", "all_reduce")
    assert list(result["ops"]) == ["all_reduce"] and checks["collectives.all_reduce.correct"]["status"] == "pass"


def test_a_file_name_that_lies_is_caught_by_the_bus_factor(tmp_path):
    """Without --op the name says broadcast, but busbw = 1.75 x algbw is all_reduce on 8 ranks."""
    text = nccl_tests(None)
    p = write(tmp_path, "broadcast_sweep.log", text)
    line = text.splitlines()[line_of(text, "      1024") - 1]
    hostile.refused(import_(p), f"{p}:{line_of(text, '      1024')}:{col_of(line, 7)}",
                    problem=["broadcast", "bus factor", "pass --op"])


def test_header_of_one_collective_rows_of_another(tmp_path):
    text = nccl_tests("all_reduce_perf", rows=[row(s, t, "all_to_all") for s, t in SIZES])
    p = write(tmp_path, "out.txt", text)
    hostile.refused(import_(p), f"{p}:{line_of(text, '      1024')}:", problem=["all_reduce", "bus factor"])


def test_no_way_to_tell_the_collective_says_pass_op(tmp_path):
    p = write(tmp_path, "results.txt", nccl_tests(None))
    hostile.refused(import_(p), p, problem="pass --op")


def test_a_file_name_naming_two_collectives_is_refused(tmp_path):
    p = write(tmp_path, "allreduce_vs_allgather.log", nccl_tests(None))
    hostile.refused(import_(p), p, problem=["several collectives", "all_gather", "all_reduce"])


def test_an_unknown_op_names_itself(tmp_path):
    p = write(tmp_path, "out.txt", nccl_tests())
    hostile.refused(import_(p, "--op", "allreduce2"), p, problem=["--op", "allreduce2"])


def test_rank_lines_that_contradict_the_header(tmp_path):
    text = nccl_tests(ngpus=8, n=8, ranks=rank_lines(3))
    p = write(tmp_path, "out.txt", text)
    hostile.refused(import_(p), p, problem=["nThread x nGpus = 8", "3 rank lines"])


@pytest.mark.parametrize("ranks,problem", [
    (rank_lines(4) + rank_lines(4)[2:3], "rank 2 is listed twice"),
    (rank_lines(4)[:2] + rank_lines(4)[3:], "skip rank 2"),
], ids=["rank-twice", "rank-missing"])
def test_rank_lines_that_cannot_be_a_job(tmp_path, ranks, problem):
    p = write(tmp_path, "out.txt", nccl_tests(n=4, ranks=ranks))
    hostile.refused(import_(p), p, problem=problem)


def test_no_rank_count_anywhere_is_refused_not_defaulted(tmp_path):
    p = write(tmp_path, "out.txt", nccl_tests("broadcast_perf", op="broadcast", ranks=[], header=False))
    hostile.refused(import_(p), p, problem="cannot tell how many ranks")


def test_programs_on_different_ranks_in_one_file(tmp_path):
    text = nccl_tests() + nccl_tests("all_gather_perf", op="all_gather", n=4, ranks=rank_lines(4, ["dgx-b"] * 4),
                                     rows=[row(s, t, "all_gather", 4) for s, t in SIZES])
    p = write(tmp_path, "out.txt", text)
    hostile.refused(import_(p), p, problem="different ranks")


# --------------------------------------------------------------------------- item 2: truncated, impossible figures


def test_a_table_cut_mid_row_is_refused_at_that_row(tmp_path):
    cut = row(1 << 27, 701.09)[:75]
    text = nccl_tests(rows=[row(s, t) for s, t in SIZES[:2]] + [cut], footer=False)
    p = write(tmp_path, "all_reduce_perf.log", text.rstrip("\n"))
    hostile.refused(import_(p), f"{p}:{line_of(text, cut)}:", problem=["fields", "cut short"])


def test_a_table_cut_between_rows_is_refused_at_the_last_row(tmp_path):
    text = nccl_tests(rows=[row(s, t) for s, t in SIZES[:2]], footer=False)
    p = write(tmp_path, "all_reduce_perf.log", text)
    hostile.refused(import_(p), f"{p}:{line_of(text, str(1 << 20))}", problem=["Avg bus bandwidth", "cut off"])


@pytest.mark.parametrize("index,token,problem", [
    (7, "-335.02", "busbw -335.02 is negative"),
    (7, "nan", "busbw nan is not a finite number"),
    (6, "inf", "algbw inf is not a finite number"),
    (5, "-701.09", "time -701.09 is negative"),
    (8, "-3", "#wrong -3 is negative"),
    (10, "fast", "algbw 'fast' is not a number"),
], ids=["negative-busbw", "nan-busbw", "inf-algbw", "negative-time", "negative-wrong", "word-algbw"])
def test_an_impossible_figure_is_refused_at_its_column(tmp_path, index, token, problem):
    bad = row(1 << 27, 701.09, fields={index: token})
    text = nccl_tests(rows=[row(s, t) for s, t in SIZES[:2]] + [bad])
    p = write(tmp_path, "out.txt", text)
    hostile.refused(import_(p), f"{p}:{line_of(text, bad)}:{col_of(bad, index)}", problem=problem)


def test_wrong_elements_are_a_fail_never_dropped(tmp_path):
    text = nccl_tests(rows=[row(s, t) for s, t in SIZES[:2]] + [row(1 << 27, 701.09, wrong=(0, 5))], oob=5)
    out, checks, _ = judged(tmp_path, write(tmp_path, "all_reduce_perf.log", text))
    c = checks["collectives.all_reduce.correct"]
    assert out.code == 1 and c["status"] == "fail" and c["value"] == 5 and "wrong elements" in c["message"]


def test_a_failed_footer_with_clean_rows_is_a_fail(tmp_path):
    out, checks, _ = judged(tmp_path, write(tmp_path, "o.txt", nccl_tests(oob=12)))
    c = checks["collectives.all_reduce.correct"]
    assert out.code == 1 and c["status"] == "fail" and "12 out-of-bounds" in c["message"]


def test_a_failure_mid_table_is_recorded_as_a_failure_not_a_cut(tmp_path):
    text = nccl_tests(rows=[row(1024, 30.01), "dgx-a: Test NCCL failure common.cu:1006 'unhandled cuda error'"],
                      footer=False)
    out, checks, _ = judged(tmp_path, write(tmp_path, "o.txt", text))
    assert out.code == 1 and checks["collectives.ranks"]["status"] == "fail"
    assert {checks[k]["status"] for k in ("collectives.all_reduce.correct", "collectives.all_reduce.busbw")} == {"error"}


# --------------------------------------------------------------------------- item 3: the file itself


def test_empty_file(tmp_path):
    p = write(tmp_path, "all_reduce_perf.log", b"")
    hostile.refused(import_(p), p, problem="empty file")


def test_blank_lines_only(tmp_path):
    p = write(tmp_path, "all_reduce_perf.log", "\n  \n\t\n" * 100)
    hostile.refused(import_(p), p, problem="blank")


def test_binary_garbage(tmp_path):
    p = write(tmp_path, "all_reduce_perf.log", b"\x7fELF\x02\x01\x01" + bytes(range(256)) * 64)
    hostile.refused(import_(p), f"{p}:1:8", problem="binary")


def test_non_utf8_bytes_name_line_and_column(tmp_path):
    text = nccl_tests().encode().replace(b"on      dgx-a device  3", b"on      dgx-\xe9 device  3")
    p = write(tmp_path, "all_reduce_perf.log", text)
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if b"\xe9" in ln)
    hostile.refused(import_(p), f"{p}:{line}:", problem=["UTF-8", "0xe9"])


def test_a_directory(tmp_path):
    hostile.refused(import_(tmp_path), tmp_path, problem="directory")


def test_a_fifo_does_not_hang(tmp_path):
    fifo = tmp_path / "all_reduce_perf.log"
    os.mkfifo(fifo)
    hostile.refused(import_(fifo), fifo, problem="FIFO")


def test_a_character_device_is_not_read(tmp_path):
    hostile.refused(import_("/dev/zero", "--op", "all_reduce"), "/dev/zero", problem="character device")


def test_a_symlink_loop_says_so(tmp_path):
    loop = tmp_path / "all_reduce_perf.log"
    loop.symlink_to(loop)
    hostile.refused(import_(loop), loop, problem="symlink loop")


def test_a_dangling_symlink_and_a_missing_file(tmp_path):
    link = tmp_path / "link.log"
    link.symlink_to(tmp_path / "gone.log")
    hostile.refused(import_(link), link, problem="dangling symlink")
    hostile.refused(import_(tmp_path / "never.log"), tmp_path / "never.log", problem="does not exist")


def test_permission_denied(tmp_path):
    p = write(tmp_path, "all_reduce_perf.log", nccl_tests())
    p.chmod(0)
    if os.geteuid() != 0:
        out = import_(p)
    else:  # root reads anything: drop to nobody, as an unprivileged user runs it (setpriv: util-linux)
        out = hostile.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
                           "day0.cli", "collectives", "import", str(p)])
    hostile.refused(out, p, problem="permission denied")


def test_a_huge_file_is_refused_without_reading_it(tmp_path):
    p = tmp_path / "all_reduce_perf.log"
    with p.open("wb") as f:
        f.truncate(300 << 20)  # sparse: 300 MiB claimed, nothing on disk
    hostile.refused(import_(p), p, problem=["300 MiB", "256 MiB"])


def test_ten_megabytes_without_a_newline(tmp_path):
    p = write(tmp_path, "all_reduce_perf.log", b"# " + b"x" * (10 << 20))
    hostile.refused(import_(p), f"{p}:1", problem="longer than")


def test_a_file_name_that_would_forge_terminal_lines(tmp_path):
    p = write(tmp_path, "all_reduce\n\x1b[2Jperf.log", b"")
    hostile.refused(import_(p), "all_reduce\\x0a\\x1b[2Jperf.log", problem="empty file")


def test_an_out_path_that_is_a_directory(tmp_path):
    p = write(tmp_path, "all_reduce_perf.log", nccl_tests())
    hostile.refused(import_(p, "--out", tmp_path), tmp_path, problem="is a directory")
    assert not list(tmp_path.parent.glob(f".{tmp_path.name}*.tmp"))  # no half-written file left beside it


def test_a_settings_fifo_does_not_hang(tmp_path):
    p = write(tmp_path, "all_reduce_perf.log", nccl_tests())
    fifo = tmp_path / "site.toml"
    os.mkfifo(fifo)
    hostile.refused(import_(p, "--settings", fifo), fifo, problem="FIFO")


@pytest.mark.parametrize("settings", [
    "[collectives]\nexpected_busbw = " + "[" * 900 + "]" * 900 + "\n",  # past the TOML parser's recursion
    "[collectives]\nexpected_busbw = " + "{a = " * 400 + "1" + "}" * 400 + "\n",
    "[collectives]\nmin_bytes = " + "9" * 5000 + "\n",  # more digits than int() converts
], ids=["arrays", "inline-tables", "digits"])
def test_a_settings_file_nested_or_numbered_past_the_parser_is_one_line(tmp_path, settings):
    """A RecursionError traceback (exit 1) before, as the profile reader had long refused it."""
    p = write(tmp_path, "all_reduce_perf.log", nccl_tests())
    site = tmp_path / "site.toml"
    site.write_text(settings)
    hostile.refused(import_(p, "--settings", site), site, problem="TOML")


@pytest.mark.parametrize("value", ["[" * 5000 + "]" * 5000, "9" * 5000], ids=["nested", "digits"])
def test_a_set_value_past_the_parser_is_one_line_naming_the_set(tmp_path, value):
    p = write(tmp_path, "all_reduce_perf.log", nccl_tests())
    hostile.refused(import_(p, "--set", f"x={value}"), "--set 'x=", problem="not usable TOML")


def test_a_set_value_nested_past_what_a_profile_may_is_refused(tmp_path):
    """Under the parser's recursion limit but past what a profile may nest: the profile's own
    check, which the --set values and a JSON --settings file skipped (the review)."""
    p = write(tmp_path, "all_reduce_perf.log", nccl_tests())
    hostile.refused(import_(p, "--set", "x=" + "[" * 100 + "]" * 100), "--set", problem="nested deeper")


# --------------------------------------------------------------------------- the table's shape


def test_header_without_in_place_columns(tmp_path):
    text = nccl_tests().replace("  #wrong     time   algbw   busbw  #wrong", "  #wrong")
    p = write(tmp_path, "out.txt", text)
    hostile.refused(import_(p), f"{p}:{line_of(text, '#wrong')}", problem="time column")


def test_a_row_without_its_in_place_columns(tmp_path):
    short = "  ".join(row(1 << 27, 701.09).split()[:9])
    text = nccl_tests(rows=[row(s, t) for s, t in SIZES[:2]] + [short])
    p = write(tmp_path, "out.txt", text)
    hostile.refused(import_(p), f"{p}:{line_of(text, short)}:", problem="9 fields")


def test_a_row_before_any_header(tmp_path):
    text = row(1024, 30.01) + "\n" + nccl_tests()
    p = write(tmp_path, "out.txt", text)
    hostile.refused(import_(p), f"{p}:1", problem="before any column header")


def test_a_row_after_the_footer(tmp_path):
    extra = row(1 << 28, 900.0)
    text = nccl_tests() + extra + "\n"
    p = write(tmp_path, "out.txt", text)
    hostile.refused(import_(p), f"{p}:{line_of(text, extra)}", problem="after the table")


def test_concluded_by_another_program(tmp_path):
    text = nccl_tests().replace("concluded: all_reduce_perf", "concluded: all_gather_perf")
    p = write(tmp_path, "out.txt", text)
    hostile.refused(import_(p), f"{p}:{line_of(text, 'concluded')}", problem="all_gather_perf")


def test_a_repeated_row_counts_once_with_the_slower_figures(tmp_path):
    """-N repeats the sweep: odd, judgeable. A faster copy of the big row must not lift the verdict."""
    rows = [row(s, t) for s, t in SIZES] + [row(1 << 27, 400.0)]  # the copy: busbw 587 would pass
    out, checks, result = judged(tmp_path, write(tmp_path, "o.txt", nccl_tests(rows=rows)),
                                 "--set", "expected_busbw={intra_node={all_reduce=500}}")
    assert out.code == 1 and checks["collectives.all_reduce.busbw"]["value"] == 335.02
    assert len([r for r in result["rows"] if r["size_bytes"] == 1 << 27]) == 2  # one per mode


def test_rows_out_of_order_are_judged_at_the_largest_size(tmp_path):
    rows = [row(1 << 27, 701.09), row(1024, 30.01), row(1 << 20, 35.24)]
    out, checks, result = judged(tmp_path, write(tmp_path, "o.txt", nccl_tests(rows=rows)),
                                 "--set", "expected_busbw={intra_node={all_reduce=500}}")
    assert out.code == 1 and checks["collectives.all_reduce.busbw"]["status"] == "fail"
    assert [r["size_bytes"] for r in result["rows"]] == sorted(r["size_bytes"] for r in result["rows"])


def test_in_place_only_rows_are_not_read_as_out_of_place(tmp_path):
    rows = [" ".join(row(s, t).split()[:5]) + " " * 34 + " ".join(row(s, t).split()[9:]) for s, t in SIZES]
    _, _, result = judged(tmp_path, write(tmp_path, "o.txt", nccl_tests(rows=rows)))
    assert {r["mode"] for r in result["rows"]} == {"in_place"}


# --------------------------------------------------------------------------- -J JSON

JSON_DOC = {
    "version": 2, "args": ["./build/all_reduce_perf", "-g", "2", "-J", "ar.json"],
    "config": {"nthreads": 1, "ngpus": 2, "validation": 1,
               "devices": [{"rank": r, "group": 0, "pid": 1, "hostname": "dgx-a", "device": r} for r in range(2)]},
    "results": [{"size": 134217728, "count": 33554432, "type": "float", "redop": "sum", "root": "    -1",
                 "out_of_place": {"time": 353.2, "alg_bw": 380.004915, "bus_bw": 380.004915, "nwrong": 0.0},
                 "in_place": {"time": 352.9, "alg_bw": 380.327938, "bus_bw": 380.327938, "nwrong": 0.0},
                 "actual_iterations": 20, "experiment_name": ""}],
    "out_of_bounds": {"count": 0, "okay": "true"}, "average_bus_bandwidth": {"bandwidth": 380.1, "okay": "unchecked"},
    "errors": [],
}


def json_doc(**changes) -> str:
    doc = json.loads(json.dumps(JSON_DOC))
    for path, value in changes.items():
        node = doc
        *parents, last = path.split("__")
        for k in parents:
            node = node[int(k)] if isinstance(node, list) else node[k]
        if value is None:
            del node[last]
        else:
            node[last] = value
    return json.dumps(doc)


@pytest.mark.parametrize("changes,key,problem", [
    ({"results__0__in_place__bus_bw": "nan"}, "results[0].in_place.bus_bw", "not a finite number"),
    ({"results__0__out_of_place__nwrong": -1.0}, "results[0].out_of_place.nwrong", "negative"),
    ({"results__0__size": -8}, "results[0].size", "negative"),
    ({"average_bus_bandwidth": None}, "average_bus_bandwidth", "did not finish"),
], ids=["json-nan-busbw", "json-negative-nwrong", "json-negative-size", "json-unfinished"])
def test_json_figures_are_held_to_the_text_s_rules(tmp_path, changes, key, problem):
    p = write(tmp_path, "ar.json", json_doc(**changes))
    hostile.refused(import_(p), p, key, problem=problem)


def test_json_cut_short(tmp_path):
    p = write(tmp_path, "ar.json", json_doc()[:300])
    hostile.refused(import_(p), p, problem=["not JSON", "line 1, column"])


def test_json_nested_a_million_deep(tmp_path):
    p = write(tmp_path, "ar.json", "{" + '"results": ' + "[" * 1_000_000)
    hostile.refused(import_(p), p, problem="JSON")


def test_json_with_a_key_twice(tmp_path):
    """Two bus_bw keys in one object: readers disagree on which counts, so none is taken."""
    text = json_doc().replace('"bus_bw": 380.004915', '"bus_bw": 1.0, "bus_bw": 380.004915', 1)
    p = write(tmp_path, "ar.json", text)
    hostile.refused(import_(p), p, problem="duplicate key 'bus_bw'")


def test_json_integer_of_ten_thousand_digits(tmp_path):
    p = write(tmp_path, "ar.json", json_doc().replace('"size": 134217728', '"size": ' + "9" * 10_000, 1))
    hostile.refused(import_(p), p, problem=["results[0].size", "10000 digits"])


def test_json_usable_is_judged(tmp_path):
    out, checks, result = judged(tmp_path, write(tmp_path, "ar.json", json_doc()))
    assert out.code == 0 and result["world_size"] == 2 and checks["collectives.all_reduce.correct"]["status"] == "pass"


# --------------------------------------------------------------------------- NCCL_DEBUG=INFO logs


def nccl_log(nranks: int, gpus: int = 8, *, intra: str = "P2P/CUMEM/read", inter: str = "NET/IB/0/GDRDMA",
             version: str = "2.21.5+cuda12.4", overrides: dict[int, str] | None = None) -> str:
    """Every rank's init lines and its ring connection to the next rank (1 channel)."""
    out = []
    for r in range(nranks):
        host, pre = f"node{r // gpus:05d}", f"node{r // gpus:05d}:{1000 + r}:{2000 + r} [{r % gpus}] NCCL INFO "
        nxt = (r + 1) % nranks
        via = (overrides or {}).get(r, intra if nxt // gpus == r // gpus else inter)
        out += [pre + f"NCCL version {version}",
                pre + f"comm 0x7f{r:06x} rank {r} nRanks {nranks} nNodes {-(-nranks // gpus)} localRanks {gpus} "
                      f"localRank {r % gpus} MNNVL 0"]
        if via.startswith("NET/"):
            out += [pre + f"Channel 00/0 : {r}[{r % gpus}] -> {nxt}[{nxt % gpus}] [send] via {via}",
                    f"node{nxt // gpus:05d}:{1000 + nxt}:{2000 + nxt} [{nxt % gpus}] NCCL INFO Channel 00/0 : "
                    f"{r}[{r % gpus}] -> {nxt}[{nxt % gpus}] [receive] via {via}"]
        else:
            out.append(pre + f"Channel 00/0 : {r}[{r % gpus}] -> {nxt}[{nxt % gpus}] via {via}")
        del host
    return "\n".join(out) + "\n"


def transport(*logs: Path | str, json_out: Path | None = None) -> hostile.Outcome:
    args = ["collectives", "transport", *map(str, logs), "--intra-node", "nvlink", "--inter-node", "infiniband",
            "--devices-per-node", "8"]
    return hostile.day0(*args, *(["--json", str(json_out)] if json_out else []))


def test_a_log_of_ten_thousand_ranks_is_judged_in_bounds(tmp_path):
    """One rank's SHM link among 10,000 must still fail the NVLink promise."""
    p = write(tmp_path, "nccl.log", nccl_log(10_000, overrides={4242: "SHM/direct/direct"}))
    out = transport(p, json_out=tmp_path / "t.json")
    checks = {c["id"]: c for c in json.loads((tmp_path / "t.json").read_text())}
    assert out.code == 1 and not out.lines, out.explain()
    intra = checks["collectives.transport.intra_node"]
    assert intra["status"] == "fail" and "4242->4243 used SHM/direct/direct" in intra["message"]
    assert checks["collectives.transport.inter_node"]["status"] == "pass"


def test_contradicting_nccl_versions(tmp_path):
    text = nccl_log(8, 4) + nccl_log(8, 4, version="2.18.1+cuda12.2")
    p = write(tmp_path, "nccl.log", text)
    hostile.refused(transport(p), f"{p}:{line_of(text, '2.18.1')}", problem=["2.18.1", "contradicts", "2.21.5"])


def test_a_text_that_is_not_an_nccl_log(tmp_path):
    p = write(tmp_path, "nccl.log", "vLLM is starting\nall good\n")
    hostile.refused(transport(p), p, problem="not an NCCL_DEBUG=INFO log")


def test_an_nccl_log_without_connections_is_an_error_not_a_pass(tmp_path):
    text = "".join(ln + "\n" for ln in nccl_log(4, 4).splitlines() if "Channel" not in ln)
    out = transport(write(tmp_path, "nccl.log", text), json_out=tmp_path / "t.json")
    assert out.code == 1 and {c["status"] for c in json.loads((tmp_path / "t.json").read_text())} == {"error"}


def test_an_impossible_channel(tmp_path):
    text = nccl_log(4, 4).replace("Channel 00/0 : 2[2]", "Channel 99999/0 : 2[2]")
    p = write(tmp_path, "nccl.log", text)
    hostile.refused(transport(p), f"{p}:{line_of(text, 'Channel 99999')}", problem="channel 99999")


@pytest.mark.parametrize("kind", ["empty", "binary", "latin1", "long-line", "fifo", "loop", "directory"])
def test_an_unusable_log_file_next_to_a_good_one(tmp_path, kind):
    good = write(tmp_path, "node0.log", nccl_log(8, 8))
    bad = tmp_path / "node1.log"
    problem = {"empty": "empty file", "binary": "binary", "latin1": "UTF-8", "long-line": "longer than",
               "fifo": "FIFO", "loop": "symlink loop", "directory": "directory"}[kind]
    if kind == "fifo":
        os.mkfifo(bad)
    elif kind == "loop":
        bad.symlink_to(bad)
    elif kind == "directory":
        bad.mkdir()
    else:
        data = {"empty": b"", "binary": b"node1:1:1 [0] NCCL INFO \x00\x01\x02",
                "latin1": "node1:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB éth0\n".encode("latin-1"),
                "long-line": b"node1:1:1 [0] NCCL INFO " + b"0 " * (6 << 20)}[kind]
        bad.write_bytes(data)
    hostile.refused(transport(good, bad), bad, problem=problem)


def test_the_suite_s_unreadable_rank_log_is_an_error_check_not_a_hang(tmp_path):
    """The suite reads the logs a result lists (a results_file is the user's): a FIFO among them
    must make the transport checks an error naming it, not hang nor pass on the other logs."""
    fifo, good = tmp_path / "nccl-debug.b.2.log", write(tmp_path, "nccl-debug.a.1.log", nccl_log(8, 8))
    os.mkfifo(fifo)
    code = ("from day0.stages.collectives import CollectivesResult, nccl_log_text, transport_checks\n"
            f"r = CollectivesResult(backend='nccl', nccl_logs=[{str(good)!r}, {str(fifo)!r}])\n"
            "for c in transport_checks(nccl_log_text(r), {'intra_node': 'nvlink', 'inter_node': 'none'}):\n"
            "    print(c.status, c.message)\n")
    out = hostile.run([sys.executable, "-c", code])
    assert out.code == 0, out.explain()
    assert out.stdout.count("error the NCCL log cannot be judged") == 2 and f"{fifo}: is a FIFO" in out.stdout


def test_a_results_file_that_is_a_fifo(tmp_path):
    fifo = tmp_path / "collectives.json"
    os.mkfifo(fifo)
    code = ("import sys\nfrom day0.stages.collectives import load_result\n"
            f"try:\n    load_result({str(fifo)!r})\nexcept ValueError as e:\n    sys.exit(f'day0: {{e}}')\n")
    hostile.refused(hostile.run([sys.executable, "-c", code]), fifo, code=1, problem="FIFO")


def _comms_log(k: int, n: int) -> str:
    """One process: rank 0 of ``k`` communicators (2.27 init lines), then ``n`` connection lines 0 -> j."""
    out = []
    for i in range(k):
        head = (f"h:1:1 [0] NCCL INFO ncclCommInitRankConfig comm 0x{0x10000 + i:x} rank 0 nranks 2000000 cudaDev 0 "
                f"nvmlDev 0 busId 18000 commId 0x{i + 1:x}")
        out += [f"{head} - Init START",
                f"h:1:1 [0] NCCL INFO comm 0x{0x10000 + i:x} rank 0 nRanks 2000000 nNodes 2 localRanks 1 localRank 0 MNNVL 0",
                f"{head} - Init COMPLETE"]
    out += [f"h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> {j + 1}[0] [send] via NET/IB/0" for j in range(n)]
    return "\n".join(out) + "\n"


def _judge_seconds(text: str) -> float:
    """The fastest of 3 parses and judgements (a ratio of two such is what the tests compare, never seconds)."""
    import time

    from day0.stages.collectives.nccl_debug import NcclLogError, parse_nccl_debug
    from day0.stages.collectives.transport import log_checks

    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        try:
            log_checks(parse_nccl_debug(text), {"intra_node": "nvlink", "inter_node": "infiniband"})
        except NcclLogError:
            pass
        best = min(best, time.perf_counter() - t)
    return best


@pytest.mark.parametrize("k", ["cap", "past the cap"])
def test_many_communicators_of_one_process_cost_what_one_does(k):
    """A line is placed among the communicators its process is that rank of: with every one of them
    a candidate the time grew as communicators x lines (5,000 x 10,000: 35 s, for what one takes 0.1 s)."""
    from day0.stages.collectives import nccl_comms
    from day0.stages.collectives.nccl_debug import NcclLogError, parse_nccl_debug

    cap = getattr(nccl_comms, "MAX_COMMS_PER_RANK", 64)  # (the ratio is what fails before the cap existed)
    many = cap if k == "cap" else 300
    text, one = _comms_log(many, 6000), _comms_log(1, 6000)
    if k != "cap":
        with pytest.raises(NcclLogError, match=rf"<log>:{3 * cap + 1}: more than "
                                               rf"{cap} communicators in which process h:1 is rank 0"):
            parse_nccl_debug(text)
    assert _judge_seconds(text) < 3 * _judge_seconds(one)


@pytest.mark.parametrize("what", ["comm", "commId", "parent"])
def test_an_address_longer_than_64_bits_is_refused_at_its_line(what):
    """%p and 0x%llx print at most 16 hex digits: longer ones were kept whole per communicator (+450 MiB)."""
    from day0.stages.collectives.nccl_debug import NcclLogError, parse_nccl_debug

    long = "0x" + "f" * 4000
    ids = {"comm": (long, "0x1", "0x2"), "commId": ("0x3", long, "0x2"), "parent": ("0x3", "0x1", long)}[what]
    text = ("h:1:1 [0] NCCL INFO ncclCommInitRankConfig comm 0x2 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 18000 "
            "commId 0x9 - Init COMPLETE\n"
            f"h:1:1 [0] NCCL INFO ncclCommSplit comm {ids[0]} rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 18000 parent "
            f"{ids[2]} color 0 key 0 commId {ids[1]} - Init COMPLETE\n")
    with pytest.raises(NcclLogError, match=rf"<log>:2: {what} 0xfff+\.\.\. has more than 16 hex digits"):
        parse_nccl_debug(text)


def test_trees_lines_naming_a_million_ranks_of_one_process_are_refused():
    """A Trees line names its printer's rank (``->me->``), one per communicator; a million of them from one
    process were kept as a million (process, rank) keys (+428 MiB, the old parser +148)."""
    from day0.stages.collectives import nccl_comms
    from day0.stages.collectives.nccl_debug import NcclLogError, parse_nccl_debug

    items = " ".join(f"[0] -1/-1/-1->{i}->-1" for i in range(2 * nccl_comms.MAX_COMMS_PER_PROCESS))
    with pytest.raises(NcclLogError, match=r"<log>:2: Trees lines of h:1 name more than"):
        parse_nccl_debug(f"h:1:1 [0] NCCL INFO Trees [0] -1/-1/-1->0->-1\nh:1:1 [0] NCCL INFO Trees {items}\n")


def test_a_pid_of_5000_digits_is_not_a_crash(tmp_path):
    """int() of more than 4,300 digits raises ValueError: it left transport_checks, and the CLI named no line."""
    from day0.stages.collectives.transport import transport_checks

    good = "".join(f"h:{100 + r}:{100 + r} [{r}] NCCL INFO Channel 00/0 : {r}[{r}] -> {1 - r}[{1 - r}] via P2P/CUMEM/read\n"
                   for r in range(2))
    bad = good + f"h:{'9' * 5000}:1 [0] NCCL INFO Channel 00/0 : 0[0] -> {'7' * 5000}[1] via NET/IB/0\n"
    checks = transport_checks(bad, {"intra_node": "nvlink"})
    assert checks[0].status == "pass", checks[0].message
    out = hostile.day0("collectives", "transport", write(tmp_path, "digits.log", bad), "--intra-node", "nvlink")
    assert out.code == 0 and "Exceeds the limit" not in out.stdout + out.stderr, out.explain()
