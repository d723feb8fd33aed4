"""The heat-map chart kind (``{"kind": "heatmap", ...}`` in ``evidence["charts"]``): parsing with
errors that name the key, bounded input, the drawing (cells, values, marked and missing cells, the
colour scale), determinism, the report end to end, and its texts measured in Chromium."""

from __future__ import annotations

import copy
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from day0.core.record import Check
from day0.results import charts
from day0.results.chartbox import MAX_HEATMAP, heat_color
from day0.results.report import render
from tests.support import host
from tests.support import run_factory as rf

SVG = "{http://www.w3.org/2000/svg}"
NODES = ["node0", "node1", "node2", "node3"]
LINKS = {
    "kind": "heatmap", "title": "Point-to-point bandwidth, MB/s (row sends, column receives)",
    "x_label": "receiver", "y_label": "sender", "rows": NODES, "cols": NODES,
    "values": [[None, 610.2, 2.4, 600.0], [605.1, None, 2.3, 598.0], [2.5, 2.4, None, 2.4], [601.0, 603.0, 2.2, None]],
    "unit": "MB/s", "marked": [[0, 2], [1, 2], [2, 0], [2, 1], [2, 3], [3, 2]],
}


def spec(**over) -> dict:
    s = copy.deepcopy(LINKS)
    s.update(over)
    return s


def draw(raw: dict) -> ET.Element:
    return ET.fromstring(charts.render_spec(charts.parse_spec(raw, "collectives.links evidence.charts[0]")))


def group(root: ET.Element, cls: str) -> ET.Element:
    found = [g for g in root.iter(f"{SVG}g") if g.get("class") == cls]
    assert len(found) == 1, cls
    return found[0]


def texts(root: ET.Element) -> list[str]:
    return [t.text or "" for t in root.iter(f"{SVG}text")]


def square(n: int, names: str = "node{}") -> dict:
    rows = [names.format(i) for i in range(n)]
    vals = [[None if i == j else (2.0 + i + j if 2 in (i, j) else 600.0 + 3 * i + j) for j in range(n)] for i in range(n)]
    marked = [[i, j] for i in range(n) for j in range(n) if i != j and 2 in (i, j)]
    return spec(rows=rows, cols=rows, values=vals, marked=marked)


# --------------------------------------------------------------------------- parsing

W = "collectives.links evidence.charts[0]"


@pytest.mark.parametrize("over, message", [
    ({"values": [[1.0, 2.0, 3.0, 4.0]] * 3}, r"\.values: expected 4 rows \(one per name in rows\), got 3"),
    ({"values": [[1.0, 2.0, 3.0, 4.0]] * 3 + [[1.0, 2.0]]}, r"\.values\[3\]: expected 4 values \(one per name in cols\), got 2"),
    ({"values": "lots"}, r"\.values: expected 4 rows .*got str"),
    ({"values": [[None, 1, 1, 1], [1, None, 1, 1], [1, "x", None, 1], [1, 1, 1, None]]}, r"\.values\[2\]\[1\]: 'x' is not a number"),
    ({"values": [[None, 1, 1, 1], [1, None, float("nan"), 1], [1, 1, None, 1], [1, 1, 1, None]]}, r"\.values\[1\]\[2\]: nan is not"),
    ({"values": [[None, 1, 1, 1], [1, None, 1, 1], [1, 1, None, float("inf")], [1, 1, 1, None]]}, r"\.values\[2\]\[3\]: inf is not"),
    ({"values": [[None, True, 1, 1], [1, None, 1, 1], [1, 1, None, 1], [1, 1, 1, None]]}, r"\.values\[0\]\[1\]: True is not"),
    ({"rows": "node0"}, r"\.rows: expected a non-empty list of names"),
    ({"cols": []}, r"\.cols: expected a non-empty list of names"),
    ({"rows": ["a", 3, "c", "d"]}, r"\.rows\[1\]: 3 is not a name"),
    ({"marked": [[0, 4]]}, r"\.marked\[0\]: expected \[row, col\] within 4 x 4, got \[0, 4\]"),
    ({"marked": [["0", 1]]}, r"\.marked\[0\]: expected \[row, col\]"),
    ({"marked": {"0": 1}}, r"\.marked: expected a list of \[row, col\] pairs"),
])
def test_a_malformed_heatmap_names_its_key(over: dict, message: str) -> None:
    with pytest.raises(charts.ChartError, match="^" + __import__("re").escape(W) + message):
        charts.parse_spec(spec(**over), W)


def test_too_many_rows_is_refused_in_one_line_before_the_values_are_read() -> None:
    class Boom(list):
        def __iter__(self):  # the values must not be looked at
            raise AssertionError("values iterated")

    n = MAX_HEATMAP + 1
    with pytest.raises(charts.ChartError) as err:
        charts.parse_spec(spec(rows=[f"n{i}" for i in range(n)], values=Boom()), W)
    assert str(err.value) == f"{W}.rows: {n} names; a heat map draws at most {MAX_HEATMAP}"
    with pytest.raises(charts.ChartError, match=r"\.cols: 100000 names"):
        charts.parse_spec(spec(cols=["x"] * 100_000), W)


def test_a_hostile_value_is_quoted_short() -> None:
    huge = ["x" * 1_000_000]
    vals = [[None, 1, 1, 1], [1, None, 1, 1], [1, huge, None, 1], [1, 1, 1, None]]
    with pytest.raises(charts.ChartError) as err:
        charts.parse_spec(spec(values=vals), W)
    assert len(str(err.value)) < 200


def test_other_kinds_still_parse_and_the_unknown_kind_lists_heatmap() -> None:
    assert charts.parse_spec({"kind": "bar", "series": [{"x": ["a"], "y": [1]}]}, "c").kind == "bar"
    with pytest.raises(charts.ChartError, match=r"^c\.kind: 'pie' is not one of .*'heatmap'"):
        charts.parse_spec({"kind": "pie"}, "c")


# --------------------------------------------------------------------------- drawing


def test_one_rect_per_cell_marked_cells_outlined_and_missing_cells_grey() -> None:
    root = draw(LINKS)
    cells = list(group(root, "heat-cells").iter(f"{SVG}rect"))
    assert len(cells) == 16
    assert [c.get("fill") for c in cells[::5]] == ["#d9d9d9"] * 4  # the diagonal has no measurement
    marks = group(root, "heat-marks")
    assert marks.get("stroke") == "#000" and float(marks.get("stroke-width")) >= 2
    assert len(list(marks.iter(f"{SVG}rect"))) == len(LINKS["marked"])
    shown = texts(root)
    assert shown.count("–") == 4
    assert {"610", "2.4", "605", "2.2"} <= set(shown)
    assert {"node0", "node3", "sender", "receiver"} <= set(shown)
    assert "MB/s, log" in shown  # 610 / 2.2 > 100
    assert "log colour scale" in root.find(f"{SVG}desc").text


def test_slow_cells_are_warm_and_fast_cells_cool() -> None:
    cells = list(group(draw(LINKS), "heat-cells").iter(f"{SVG}rect"))
    slow, fast = cells[2].get("fill"), cells[1].get("fill")  # 2.4 and 610.2 MB/s
    r_slow, b_slow = int(slow[1:3], 16), int(slow[5:7], 16)
    r_fast, b_fast = int(fast[1:3], 16), int(fast[5:7], 16)
    assert r_slow > b_slow and b_fast > r_fast
    assert heat_color(0.0) == "#d73027" and heat_color(1.0) == "#4575b4"


def test_the_scale_is_linear_within_100x_and_log_beyond() -> None:
    within = spec(values=[[None, 600, 10, 600], [600, None, 10, 600], [10, 10, None, 10], [600, 600, 10, None]])
    assert "linear colour scale" in draw(within).find(f"{SVG}desc").text
    assert "MB/s" in texts(draw(within)) and "MB/s, log" not in texts(draw(within))
    beyond = spec(values=[[None, 600, 5, 600], [600, None, 5, 600], [5, 5, None, 5], [600, 600, 5, None]])
    assert "log colour scale" in draw(beyond).find(f"{SVG}desc").text
    zero = spec(values=[[None, 600, 0, 600], [600, None, 5, 600], [5, 5, None, 5], [600, 600, 5, None]])
    assert "log colour scale 5 to 600" in draw(zero).find(f"{SVG}desc").text  # a dead link takes the low end


def test_all_missing_and_all_equal_still_draw() -> None:
    empty = draw(spec(values=[[None] * 4 for _ in range(4)], marked=[]))
    assert texts(empty).count("–") == 16 and "no values" in empty.find(f"{SVG}desc").text
    flat = draw(spec(values=[[5.0] * 4 for _ in range(4)], marked=[]))
    assert len(list(group(flat, "heat-cells").iter(f"{SVG}rect"))) == 16


def test_the_same_spec_draws_the_same_svg() -> None:
    a = charts.render_spec(charts.parse_spec(spec(), W))
    b = charts.render_spec(charts.parse_spec(spec(marked=list(reversed(LINKS["marked"]))), W))
    assert a == b


def test_names_are_escaped() -> None:
    evil = ['<script>alert(1)</script>', 'a&b', '"q"', "n3"]
    svg = charts.render_spec(charts.parse_spec(spec(rows=evil, cols=evil, title="<b>t</b>", unit="<u>"), W))
    assert "<script>" not in svg and "<b>" not in svg and "<u>" not in svg
    ET.fromstring(svg)


def test_the_largest_heatmap_draws_and_fits() -> None:
    n = MAX_HEATMAP
    names = [f"host-{i:02d}.example.internal" * 5 for i in range(n)]
    raw = spec(rows=names, cols=names, values=[[float(i * n + j) for j in range(n)] for i in range(n)],
               marked=[[i, (i + 1) % n] for i in range(n)])
    root = draw(raw)  # how fast is a benchmark's question, not a fixed number of seconds to assert
    assert len(list(group(root, "heat-cells").iter(f"{SVG}rect"))) == n * n
    width, height = (float(v) for v in root.get("viewBox").split()[2:])
    assert width == charts.WIDTH and height <= 2 * charts.HEIGHT


@pytest.mark.parametrize("n", [4, 8, 16, 64])
def test_estimated_text_boxes_do_not_overlap_or_leave_the_chart(n: int) -> None:
    from day0.results.chartbox import Canvas, overlaps

    seen: list[Canvas] = []
    real = Canvas.svg

    def keep(self, desc):
        seen.append(self)
        return real(self, desc)

    Canvas.svg = keep
    try:
        draw(square(n, "gpu-node-{:03d}.cluster"))
    finally:
        Canvas.svg = real
    (c,) = seen
    assert all(0 <= b[0] and 0 <= b[1] and b[2] <= charts.WIDTH and b[3] <= c.height for b in c.boxes)
    assert not [(a, b) for k, a in enumerate(c.boxes) for b in c.boxes[k + 1:] if overlaps(a, b)]


# --------------------------------------------------------------------------- the report


def links_record():
    links = Check(id="collectives.links", title="Point-to-point bandwidth between every pair of nodes",
                  status="fail", message="node2 links are 250x slower", evidence={"charts": [LINKS, square(8)]})
    return rf.make_record({"weights": rf.weights_checks(), "collectives": [*rf.collectives_checks(), links],
                           "latency": rf.latency_checks(n=200)}, run_id="run-links")


def test_a_heatmap_in_evidence_is_drawn_in_the_report(tmp_path: Path) -> None:
    page = render(rf.write(links_record(), tmp_path / "run"), tmp_path / "report.html").read_text(encoding="utf-8")
    assert page.count('class="heat-cells"') == 2
    assert "heat map, 4 x 4 cells, 4 without a value, 6 marked" in page
    assert "heat map, 8 x 8 cells" in page


def test_a_malformed_heatmap_leaves_one_line_in_the_report(tmp_path: Path) -> None:
    rec = links_record()
    bad = spec(values=[[None, 1, 1, 1], [1, None, 1, 1], [1, "x", None, 1], [1, 1, 1, None]])
    rec.stages[1].checks[-1].evidence["charts"] = [bad]
    page = render(rf.write(rec, tmp_path / "run"), tmp_path / "report.html").read_text(encoding="utf-8")
    assert "collectives.links evidence.charts[0].values[2][1]: &#39;x&#39; is not a number" in page


@pytest.mark.host("browser")
def test_heatmap_text_does_not_overlap_in_chromium(tmp_path: Path) -> None:
    from tests.results.test_report_browser import measure_page

    browser = host.chromium()
    rec = links_record()
    rec.stages[1].checks[-1].evidence["charts"] = [LINKS, square(8, "gpu-node-{:03d}.cluster"), square(16), square(64)]
    page = render(rf.write(rec, tmp_path / "run"), tmp_path / "report.html")
    got = measure_page(browser, page, tmp_path / "probe")
    assert got["charts"] >= 4
    assert got["overlaps"] == [] and got["outside"] == []
