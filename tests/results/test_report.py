"""Rendering run records into the HTML report: content, escaping, self-containment, templates,
charts from the evidence conventions, the terminal summary and the report CLI."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from day0.core.record import RecordError, measured
from day0.results import charts
from day0.results.report import ReportError, add_cli, fmt_value, publish, render, summary_lines
from day0.results.signoff import parse_report, sha256_hex
from tests.support import run_factory as rf

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    children: list[Node | str] = field(default_factory=list)

    def text(self) -> str:
        return " ".join(
            " ".join((c if isinstance(c, str) else c.text()).split()) for c in self.children
        ).strip()

    def iter(self):
        yield self
        for c in self.children:
            if isinstance(c, Node):
                yield from c.iter()

    def find_all(self, tag: str | None = None, cls: str | None = None, id: str | None = None) -> list[Node]:
        return [
            n for n in self.iter()
            if (tag is None or n.tag == tag)
            and (cls is None or cls in n.attrs.get("class", "").split())
            and (id is None or n.attrs.get("id") == id)
        ]

    def one(self, **kw) -> Node:
        found = self.find_all(**kw)
        assert len(found) == 1, f"expected one {kw}, found {len(found)}"
        return found[0]


class _Builder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#root", {})
        self.stack = [self.root]

    def handle_starttag(self, tag, attrs):
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data):
        self.stack[-1].children.append(data)


def dom(html: str) -> Node:
    b = _Builder()
    b.feed(html)
    b.close()
    return b.root


def rendered(tmp_path: Path, record, **kw) -> tuple[Path, str, Node]:
    src = rf.write(record, tmp_path / "run")
    out = render(src, tmp_path / "report.html", **kw)
    html = out.read_text(encoding="utf-8")
    return out, html, dom(html)


def rows(table: Node) -> list[list[str]]:
    body = table.one(tag="tbody")
    return [[td.text() for td in tr.find_all("td")] for tr in body.find_all("tr")]


# --------------------------------------------------------------------------- content per verdict


@pytest.mark.parametrize("make", [rf.accepted, rf.rejected, rf.incomplete, rf.blocked_stages])
def test_report_shows_verdict_stages_and_every_check(tmp_path: Path, make) -> None:
    record = make()
    _, html, doc = rendered(tmp_path, record)
    assert doc.one(id="verdict").text() == record.verdict.upper()
    assert doc.one(id="verdict-reason").text() == " ".join(record.reason.split())
    stage_rows = rows(doc.one(tag="table", cls="stage-table"))
    assert len(stage_rows) == len(record.stages)
    for row, stage in zip(stage_rows, record.stages, strict=True):
        assert row[1] == stage.verdict
        counts = [sum(c.status == s for c in stage.checks) for s in ("pass", "fail", "error", "skip", "blocked")]
        assert [int(x) for x in row[2:7]] == counts
        assert row[7] == (f"{stage.duration_s:.1f} s" if stage.duration_s is not None else "—")
    for stage in record.stages:
        section = doc.one(id=f"stage-{stage.name}")
        table_rows = rows(section.one(tag="table", cls="checks")) if stage.checks else []
        assert len(table_rows) == len(stage.checks)
        for r, c in zip(table_rows, stage.checks, strict=True):
            assert r[0].startswith(c.id)
            assert r[1] == c.status
            assert r[2] == fmt_value(c.value)
            assert (c.limit is None and r[3] == "—") or r[3].endswith(fmt_value(c.limit))
            assert r[4] == c.unit
            assert r[5].startswith(" ".join(c.message.split()))


def test_rejected_report_lists_failure_with_log_excerpt_escaped(tmp_path: Path) -> None:
    record = rf.rejected()
    _, html, doc = rendered(tmp_path, record)
    failed = [c for c in record.checks() if c.failed]
    items = doc.one(id="failures").find_all("li")
    assert [li.find_all("code")[0].text() for li in items] == [c.id for c in failed]
    detail = doc.one(id="check-latency.ttft_p99")
    log = detail.one(tag="details", cls="log")
    assert "open" in log.attrs
    assert "WARNING queue saturated" in log.one(tag="pre").text()
    # The hostile message is shown as text, never as markup.
    assert rf.HOSTILE not in html
    assert "&lt;script&gt;alert(" in html
    assert not doc.find_all("b") and not [s for s in doc.find_all("script") if s.attrs.get("type") != "application/json"]


def test_environment_profile_and_notes_are_shown(tmp_path: Path) -> None:
    record = rf.accepted()
    _, html, doc = rendered(tmp_path, record)
    facts = {tr.find_all("th")[0].text(): tr.find_all("td")[0].text() for tr in doc.one(tag="table", cls="facts").find_all("tr")}
    env = record.environment
    assert facts["Host"] == env["host"]
    assert facts["vLLM"] == env["vllm"] and facts["torch"] == env["torch"] and facts["Python"] == env["python"]
    assert facts["Git commit"] == env["git_commit"]
    assert facts["Model"] == record.profile["model"]["served_model_name"]
    assert facts["Profile"] == record.profile["name"]
    assert "interconnect=loopback" in facts["Topology"]
    assert env["devices"][0]["name"] in facts["Devices"]
    profile = doc.one(id="profile")
    summaries = [s.text() for s in profile.find_all("summary")]
    assert summaries[0].startswith("[engine]")  # engine arguments first, even before profile scalars
    assert "open" in profile.find_all("details")[0].attrs
    engine_rows = {tr.find_all("th")[0].text(): tr.find_all("td")[0].text() for tr in profile.find_all("tr")}
    assert engine_rows["args.dtype"] == "float32" and engine_rows["args.block_size"] == "32"
    notes = doc.one(id="notes").text()
    assert "engine_startup_s" in notes and "31.5" in notes


def test_report_is_self_contained(tmp_path: Path) -> None:
    _, html, doc = rendered(tmp_path, rf.accepted())
    for n in doc.iter():
        for attr in ("src", "href", "action", "srcset", "data", "poster", "formaction"):
            v = n.attrs.get(attr)
            if v is not None and n.attrs.get("id") == "baseline-link":  # navigation to a sibling run's page
                assert n.tag == "a" and v.startswith("../") and v.endswith("/report.html")
            elif v is not None:
                assert v.startswith(("#", "data:")), f"<{n.tag} {attr}={v!r}> needs the network or the disk"
    assert all(ln.attrs.get("rel") == "icon" and ln.attrs["href"].startswith("data:") for ln in doc.find_all("link"))
    assert all(s.attrs.get("type") == "application/json" for s in doc.find_all("script"))
    csp = [m for m in doc.find_all("meta") if m.attrs.get("http-equiv") == "Content-Security-Policy"]
    assert csp and "default-src 'none'" in csp[0].attrs["content"]
    assert "@import" not in html and "url(" not in html.split("</style>")[0]


def test_embedded_run_record_is_byte_exact(tmp_path: Path) -> None:
    record = rf.rejected()
    out, html, doc = rendered(tmp_path, record)
    run_bytes = (tmp_path / "run" / "run.json").read_bytes()
    parsed = parse_report(out)
    assert parsed.run_bytes == run_bytes
    assert parsed.signoff["run_sha256"] == sha256_hex(run_bytes) == doc.one(id="run-sha256").text()
    assert parsed.signoff["verdict"] == record.verdict


def test_charts_come_from_evidence_conventions(tmp_path: Path) -> None:
    record = rf.accepted()
    _, _, doc = rendered(tmp_path, record)
    for c in record.checks():
        expected = (2 if "samples" in c.evidence else 0) + len(c.evidence.get("charts", []))
        if expected:
            art = doc.one(tag="details", id=f"check-{c.id}")
            svgs = art.find_all("svg", cls="chart")
            assert len(svgs) == expected, c.id
            titles = [s.one(tag="title").text() for s in svgs]
            for spec in c.evidence.get("charts", []):
                assert spec["title"] in titles
    busbw = doc.one(tag="details", id="check-collectives.all_reduce_busbw")
    svg = busbw.one(tag="svg")
    assert "expected 5 GB/s" in svg.text()  # the expected line is labelled
    assert {"1K", "1M", "1G"} & {t.text() for t in svg.find_all("text")}  # byte sizes on a log axis


def test_huge_sample_sets_are_downsampled_but_stats_use_all(tmp_path: Path) -> None:
    record = rf.huge(n_samples=100_000, n_stages=5, kv_points=2_000)
    out, html, doc = rendered(tmp_path, record)
    check = next(c for c in record.checks() if c.id == "latency.ttft_p99")
    xs = check.evidence["samples"]
    art = doc.one(tag="details", id="check-latency.ttft_p99")
    stats = dict(zip([th.text() for th in art.one(tag="table", cls="stats").find_all("th")],
                     [td.text() for td in art.one(tag="table", cls="stats").find_all("td")]))
    assert stats["count"] == "100,000"
    assert stats["p99"] == fmt_value(float(np.percentile(xs, 99)))
    assert stats["max"] == fmt_value(max(xs))
    cdf = art.find_all("svg", cls="chart")[0]
    n_points = len(cdf.one(tag="polyline").attrs["points"].split())
    assert 100 < n_points <= 500
    kv = doc.one(tag="details", id="check-kvcache.fragmentation_max")
    assert all(len(p.attrs["points"].split()) <= 800 for p in kv.find_all("polyline"))  # 2,000 drawn as <= 800
    assert len(doc.find_all("section", cls="stage")) == 5
    assert out.stat().st_size < (tmp_path / "run" / "run.json").stat().st_size


def test_bad_chart_spec_is_named_and_the_rest_renders(tmp_path: Path) -> None:
    record = rf.accepted()
    bad = measured("latency.odd", "Odd evidence", 1.0, 2.0, unit="ms", direction="lower_is_better",
                   evidence={"charts": [{"kind": "line", "title": "t", "series": [{"name": "s", "x": [1, 2], "y": [1, "x"]}]}],
                             "samples": "not a list", "table": {"columns": ["a"]}})
    record.stage("latency").checks.append(bad)
    _, html, doc = rendered(tmp_path, record)
    problems = [p.text() for p in doc.find_all("p", cls="chart-problem")]
    assert any("latency.odd evidence.charts[0].series[0].y[1]: 'x' is not a number" in p for p in problems)
    assert any("latency.odd evidence.samples: expected a list of numbers" in p for p in problems)
    assert any("latency.odd evidence.table" in p for p in problems)
    assert doc.one(id="verdict").text() == "ACCEPTED"


# --------------------------------------------------------------------------- templates and sign-off inputs


def test_site_template_overrides_blocks(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "report.html.j2").write_text(
        '{% extends "day0/report.html.j2" %}'
        '{% block header %}<div id="site-banner">ACME {{ verdict_label }}</div>{{ super() }}{% endblock %}'
        "{% block environment %}{% endblock %}",
        encoding="utf-8",
    )
    out, html, doc = rendered(tmp_path, rf.accepted(), template_dir=site)
    assert doc.one(id="site-banner").text() == "ACME ACCEPTED"
    assert doc.one(id="verdict").text() == "ACCEPTED"
    assert not doc.find_all(id="environment")
    assert parse_report(out).run_bytes == (tmp_path / "run" / "run.json").read_bytes()


def test_site_template_that_drops_the_record_is_refused(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "base.html.j2").write_text("<html><body>{% block content %}{% endblock %}</body></html>", encoding="utf-8")
    with pytest.raises(ReportError, match="lost a sign-off element"):
        rendered(tmp_path, rf.accepted(), template_dir=site)
    assert not (tmp_path / "report.html").exists()


def test_autoescape_applies_to_site_templates(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "report.html.j2").write_text(
        '{% extends "day0/report.html.j2" %}{% block notes %}<p id="r">{{ reason }}</p>{% endblock %}', encoding="utf-8"
    )
    _, html, doc = rendered(tmp_path, rf.rejected(), template_dir=site)
    assert "<script>alert" not in html and doc.one(id="r").text().endswith("<b>bold</b>")


def test_signatories_from_profile_or_options(tmp_path: Path) -> None:
    _, _, doc = rendered(tmp_path, rf.accepted())
    table = doc.one(tag="table", cls="signatories")
    assert rows(table) == [["Ada Lovelace", "Infra lead"], ["Grace Hopper", "SRE"]]
    out = render(tmp_path / "run" / "run.json", tmp_path / "r2.html", signatories=["Alan Turing, QA"])
    assert rows(dom(out.read_text()).one(tag="table", cls="signatories")) == [["Alan Turing", "QA"]]
    with pytest.raises(ReportError, match=r"signatory\[0\].*Name, Role"):
        render(tmp_path / "run" / "run.json", tmp_path / "r3.html", signatories=["nobody"])
    record = rf.accepted()
    record.profile["report"] = {"signatories": [{"name": "x"}]}
    with pytest.raises(ReportError, match=r"profile report.signatories\[0\]"):
        rendered(tmp_path / "bad", record)


def test_missing_or_broken_record_gives_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(RecordError, match="run record not found"):
        render(tmp_path / "nope.json", tmp_path / "r.html")
    bad = tmp_path / "run.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(RecordError, match=str(bad)):
        render(bad, tmp_path / "r.html")


# --------------------------------------------------------------------------- summary and CLI


def test_summary_lines_name_verdict_failures_and_paths(tmp_path: Path) -> None:
    record = rf.rejected()
    paths = publish(rf.write(record, tmp_path / "run"))
    lines = summary_lines(record, paths)
    # the headline block (metric, value, limit, status) comes first, like vLLM bench's result block
    assert lines[0].split() == ["metric", "value", "limit", "status"]
    assert any(ln.startswith("TTFT p99") and ln.endswith("FAIL") for ln in lines)
    verdict = next(i for i, ln in enumerate(lines) if ln.startswith("day0 verdict:"))
    assert verdict > 1 and lines[verdict] == f"day0 verdict: REJECTED: {record.reason}"
    failed = [c.id for c in record.checks() if c.failed]
    assert [ln for ln in lines if "FAIL" in ln and any(f in ln for f in failed)]
    for p in paths.values():
        assert any(ln.endswith(str(p)) for ln in lines) and Path(p).exists()
    blocked = summary_lines(rf.blocked_stages(), [tmp_path / "report.html"])
    assert any("5 checks blocked" in ln for ln in blocked) and blocked[-1].endswith("report.html")


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="day0")
    add_cli(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_report_writes_html_and_junit(tmp_path: Path, capsys) -> None:
    src = rf.write(rf.incomplete(), tmp_path / "run")
    assert _cli(["report", str(src.parent), "--signatory", "Ada Lovelace, Infra lead"]) == 0
    out = capsys.readouterr().out
    assert "day0 verdict: INCOMPLETE" in out
    assert (tmp_path / "run" / "report.html").exists() and (tmp_path / "run" / "junit.xml").exists()
    assert _cli(["report", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run record not found" in err


# --------------------------------------------------------------------------- formulas (property-based)


finite = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False, allow_infinity=False)


@given(st.lists(finite, min_size=1, max_size=300), st.floats(min_value=0, max_value=100))
def test_percentile_matches_numpy(xs: list[float], q: float) -> None:
    got = charts.percentile(sorted(xs), q)
    assert math.isclose(got, float(np.percentile(xs, q)), rel_tol=1e-9, abs_tol=1e-6)


@given(st.lists(finite, min_size=1, max_size=5000))
@settings(max_examples=60)
def test_cdf_points_are_bounded_monotone_and_keep_the_tail(xs: list[float]) -> None:
    s = sorted(xs)
    pts = charts.cdf_points(s, max_points=200)
    assert len(pts) <= 200 + 2 * 8 + 1
    assert pts[-1] == (s[-1], 1.0) and pts[0][0] == s[0]
    assert all(a[0] <= b[0] and a[1] < b[1] for a, b in zip(pts, pts[1:]))


@given(st.lists(st.tuples(finite, finite), min_size=1, max_size=3000), st.integers(min_value=4, max_value=400))
@settings(max_examples=60)
def test_downsample_keeps_extremes_and_order(pairs, max_points: int) -> None:
    pairs.sort()
    x, y = [p[0] for p in pairs], [p[1] for p in pairs]
    dx, dy = charts.downsample(x, y, max_points)
    assert len(dx) <= max_points if len(x) > max_points else dx == x
    assert max(dy) == max(y) and min(dy) == min(y)
    assert dx == sorted(dx)


@given(finite, finite)
def test_nice_ticks_cover_the_range(a: float, b: float) -> None:
    lo, hi = min(a, b), max(a, b)
    ticks = charts.nice_ticks(lo, hi)
    assert ticks == sorted(ticks) and len(ticks) <= 15
    tol = 1e-6 * (hi - lo) + 1e-9 * max(abs(lo), abs(hi), 1.0)  # ticks may round within a hair of the data
    assert ticks[0] <= lo + tol and ticks[-1] >= hi - tol


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | finite | st.text(max_size=50),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=20,
)


@given(json_values)
def test_fmt_value_is_total_and_bounded(v) -> None:
    text = fmt_value(v)
    assert isinstance(text, str) and len(text) <= 200
    if not isinstance(v, str):
        assert "\n" not in text  # structured values are one line in a cell


@given(st.lists(st.floats(min_value=1, max_value=2**34), min_size=1, max_size=40), st.booleans())
@settings(max_examples=40)
def test_line_chart_svg_is_well_formed(ys: list[float], log: bool) -> None:
    import xml.etree.ElementTree as ET

    spec = charts.parse_spec(
        {"kind": "line", "title": "t <&>", "x_log": log,
         "series": [{"name": "a", "x": [2**i for i in range(len(ys))], "y": ys}],
         "reference": [{"y": ys[0], "label": "ref & <x>"}]},
        "spec",
    )
    root = ET.fromstring(charts.render_spec(spec))
    assert root.tag.endswith("svg")
    for el in root.iter():
        for k in ("x", "y", "x1", "x2", "y1", "y2", "cx", "cy"):
            if k in el.attrib:
                assert math.isfinite(float(el.attrib[k]))


def test_parse_spec_names_the_key() -> None:
    with pytest.raises(charts.ChartError, match=r"^c\.kind: 'pie'"):
        charts.parse_spec({"kind": "pie", "series": []}, "c")
    with pytest.raises(charts.ChartError, match=r"^c\.series\[0\]: x has 2 values but y has 1"):
        charts.parse_spec({"series": [{"x": [1, 2], "y": [1]}]}, "c")
    with pytest.raises(charts.ChartError, match=r"^c\.reference\[0\]\.y"):
        charts.parse_spec({"series": [{"y": [1]}], "reference": [{"y": "high"}]}, "c")


any_float = st.floats(allow_nan=False, allow_infinity=False)


@given(st.lists(st.tuples(any_float, any_float), min_size=1, max_size=30), st.sampled_from(charts.KINDS), st.booleans())
@settings(max_examples=80)
def test_any_finite_data_draws_or_names_the_problem(points, kind: str, log: bool) -> None:
    """Extreme values (subnormals, near float max) must never crash a report."""
    import xml.etree.ElementTree as ET

    spec = {"kind": kind, "title": "t", "x_log": log,
            "series": [{"name": "s", "x": [p[0] for p in points], "y": [p[1] for p in points]}]}
    try:
        svg = charts.render_spec(charts.parse_spec(spec, "spec"))
    except charts.ChartError:
        return
    assert "inf" not in svg and "nan" not in svg
    ET.fromstring(svg)


@given(st.lists(any_float, min_size=1, max_size=50), st.one_of(st.none(), any_float))
@settings(max_examples=60)
def test_any_samples_draw_or_name_the_problem(xs: list[float], limit: float | None) -> None:
    xs = sorted(xs)
    for draw in (charts.cdf_chart, charts.percentile_chart):
        try:
            svg = draw(xs, "ms", "t", limit)
        except charts.ChartError:
            continue
        assert "inf" not in svg and "nan" not in svg


def test_declared_items_are_apart_from_measured_ones(tmp_path: Path) -> None:
    from day0.core.record import Check

    measured_check = Check(id="risks.isolation.cache_salt", title="salted tenants share no cache", status="pass",
                           value=0, limit=0, message="tenant B got 0 cached tokens")
    declared_check = Check(id="risks.isolation.network", title="network isolation", status="skip",
                           message="declared, not measured: per-tenant VLANs", evidence={"declared": True})
    _, html, _ = rendered(tmp_path, rf.make_record({"risks": [measured_check, declared_check]}))
    measured_part, declared_part = html.split("Declared, not measured: a person confirms these at sign-off")
    assert "risks.isolation.cache_salt" in measured_part.split('id="stage-risks"')[1]
    assert "risks.isolation.network" in declared_part.split("</table>")[0]
    assert "risks.isolation.network" not in measured_part.split('id="stage-risks"')[1].split("</table>")[0]


# --------------------------------------------------------------------------- the first screen


def test_first_screen_shows_verdict_line_answer_headlines_and_what_was_not_verified(tmp_path: Path) -> None:
    from tests.results.test_summary import full_record

    record = full_record(required=["collectives.transport.*"])
    record.profile["report"]["signatories"] = ["Ada Lovelace, Infra lead"]
    _, html, doc = rendered(tmp_path, record)
    assert doc.one(id="verdict").text() == "INCOMPLETE"  # a required check was skipped
    assert doc.one(id="verdict-line").text() == "INCOMPLETE, 2 checks not verified"
    assert "required check not verified: collectives.transport.inter_node" in doc.one(id="verdict-reason").text()
    adapt = doc.one(id="adaptation").text()
    assert "Needs several devices on one node" in adapt and "TP=2 x PP=1" in adapt
    head = {r.find_all("th")[0].text(): [td.text() for td in r.find_all("td")]
            for r in doc.one(id="headline").one(tag="tbody").find_all("tr")}
    assert list(head)[:3] == ["Worst busbw vs expected", "TTFT p99", "TPOT p99"] and len(head) == 10  # stage order
    assert head["TTFT p99"][:3] == ["300 ms", "≤ 2,000 ms", "pass"]
    assert head["Worst busbw vs expected"][0] == "200 GB/s" and "all_gather" in head["Worst busbw vs expected"][3]
    assert head["Cost per 1M output tokens"][2] == "absent"
    items = doc.one(id="not-verified").find_all("li")
    assert [li.find_all("code")[0].text() for li in items] == ["collectives.transport.inter_node", "weights.manifest"]
    assert "required" in items[0].text() and "required" not in items[1].text() and "one node" in items[0].text()
    assert "Awaiting 1 signature: Ada Lovelace (Infra lead)" in doc.one(id="signoff-state").text()
    assert "INCOMPLETE, 2 checks not verified: required check not verified" in doc.one(id="signoff").text()
    assert not doc.find_all(tag="svg", cls="spark")  # no history beside the run: no trends


def test_long_check_tables_and_evidence_start_collapsed_failures_open(tmp_path: Path) -> None:
    record = rf.rejected()
    record.stages[0].checks += [rf.measured(f"weights.extra{i}", "extra", 1, 1) for i in range(12)]
    _, html, doc = rendered(tmp_path, record)
    weights = doc.one(id="stage-weights")
    wrap = weights.one(tag="details", cls="checks-wrap")
    assert "open" not in wrap.attrs and wrap.one(tag="table", cls="checks")
    assert not doc.one(id="stage-latency").find_all(tag="details", cls="checks-wrap")  # short, and failed
    assert "open" in doc.one(tag="details", id="check-latency.ttft_p99").attrs
    assert "open" not in doc.one(tag="details", id="check-latency.tpot_p99").attrs
    assert "@media print" in html


def _regression_record(run_id: str = "run-now"):
    from day0.core.record import Check

    record = rf.accepted()
    record.run_id = run_id
    base = Check(id="regression.baseline", title="No regression", status="pass", value=0, limit=0,
                 unit="regressions", message="no regression against run-1",
                 evidence={"baseline": {"label": "latest-accepted", "run_ids": ["run-0", "run-1"]}})
    from day0.core.record import StageRecord

    record.stages.append(StageRecord("regression", "pass", [base]))
    return record


def test_regression_section_links_to_the_baseline_and_trends_mark_it(tmp_path: Path) -> None:
    from day0.results import history

    out = tmp_path / "reports"
    for i in range(2):
        rec = rf.accepted()
        rec.run_id = f"run-{i}"
        history.store(rf.write(rec, out / rec.run_id), history.folder_for(history.history_root(rec.profile, out), rec))
    record = _regression_record()
    page = render(rf.write(record, out / record.run_id), out / record.run_id / "report.html")
    doc = dom(page.read_text(encoding="utf-8"))
    link = doc.one(id="baseline-link")
    assert link.attrs["href"] == "../run-1/report.html"
    assert (page.parent / link.attrs["href"]).resolve() == (out / "run-1" / "report.html").resolve()
    sparks = doc.one(id="headline").find_all(tag="svg", cls="spark")
    assert len(sparks) == 3  # TTFT, TPOT, output throughput: the figures rf records hold
    assert all(len(s.find_all(tag="circle", cls="baseline")) == 1 for s in sparks)
    assert "Last 3 runs" in doc.one(id="headline").text()


def test_cli_report_works_out_the_first_screen_once_and_names_a_long_glob(tmp_path: Path, capsys, monkeypatch) -> None:
    """The page and the terminal lines share one summary (it ran twice, each time matching every glob)."""
    from day0.results import summary as S

    src = rf.write(rf.rejected(), tmp_path / "run")
    calls = []
    real = S.summarize
    monkeypatch.setattr(S, "summarize", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert _cli(["report", str(src.parent)]) == 0 and len(calls) == 1
    from day0.core.stages import Figure, StageInfo

    rec = rf.rejected()
    rec.stages[0].info = StageInfo(rec.stages[0].name, "T", "?", (Figure("k", "L", ("latency." + "x" * 300,)),),
                                   origin="mysite")
    src = rf.write(rec, tmp_path / "long")
    capsys.readouterr()
    assert _cli(["report", str(src.parent)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"day0: {src}: stages[0].figures[0].check_ids[0]: check pattern ")


def test_evidence_tables_are_capped_in_columns_too(tmp_path: Path) -> None:
    """500 rows of 8,000 columns made a 40 MB page (1 GB to render): columns are capped like rows,
    and a regression table whose rows hold one cell no longer stops the report."""
    from day0.core.record import Check
    from day0.results.textview import MAX_TABLE_COLS

    record = _regression_record()
    wide = {"columns": [f"c{i}" for i in range(100)], "rows": [[0] * 120] * 510}  # a row may outrun the header
    record.stages[0].checks.append(Check(id="weights.wide", title="wide", status="pass", evidence={"table": wide}))
    record.stages[-1].checks[0].evidence["table"] = {"columns": ["check", "kind"], "rows": [["only one cell"]]}
    _, html, doc = rendered(tmp_path, record)
    table = doc.one(tag="details", id="check-weights.wide").one(tag="table", cls="evidence-table")
    assert len(table.find_all(tag="th")) == MAX_TABLE_COLS
    assert {len(tr.find_all(tag="td")) for tr in table.find_all(tag="tr")} == {0, MAX_TABLE_COLS}
    assert "10 more rows and 70 more columns in run.json." in html
    assert "only one cell" in doc.one(id="regression").text()


def test_samples_that_are_not_numbers_are_named_and_still_shown(tmp_path: Path) -> None:
    """The agents stage kept request names under ``samples`` (the report's key for numbers): every
    demo report said "Chart not drawn" and the names showed nowhere. The stage now writes
    ``truncated_requests``; a ``samples`` list the report cannot draw is still shown as recorded."""
    from day0.core.record import Check

    record = rf.accepted()
    odd = Check(id="latency.names", title="names", status="pass", value=0.0,
                evidence={"sent": 3, "samples": ["tool_choice set_alarm #22 (seed 10022)"]})
    record.stage("latency").checks.append(odd)
    _, _, doc = rendered(tmp_path, record)
    box = doc.one(tag="details", id="check-latency.names")
    assert "evidence.samples[0]: 'tool_choice set_alarm #22 (seed 10022)' is not a number" in \
        box.one(tag="p", cls="chart-problem").text()
    other = next(d for d in box.find_all(tag="details")[1:] if d.one(tag="summary").text() == "Other evidence").text()
    assert '"sent": 3' in other and "set_alarm #22" in other


def _frame_and_bars(svg: str) -> tuple[tuple[float, float], list[tuple[float, float]]]:
    import re

    rects = [(float(y), float(h)) for y, h in re.findall(r'<rect x="[-\d.]+" y="([-\d.]+)" width="[-\d.]+" '
                                                           r'height="([-\d.]+)"', svg)]
    (top, height), bars = rects[0], rects[1:]  # the plot's frame comes first
    return (top, top + height), bars


def test_negative_bars_hang_from_zero_inside_the_plot() -> None:
    """All-negative bars were drawn from above the plot (0 was not on the axis), over the title,
    with their lengths reversed: -7 looked shorter than -5."""
    spec = {"kind": "bar", "title": "change vs baseline (%)", "series": [{"x": ["ttft", "tpot"], "y": [-5, -7]}]}
    for svg, values in ((charts.render_spec(charts.parse_spec(spec, "w")), [-5, -7]),
                        (charts.percentile_chart([-3.0, -2.5, -2.0, -1.0], "ms", "offsets"), None)):
        (top, bottom), bars = _frame_and_bars(svg)
        assert bars and all(top <= y and y + h <= bottom + 0.1 for y, h in bars)
        assert len({y for y, _ in bars}) == 1  # every bar starts at the zero line
        if values:
            assert bars[1][1] > bars[0][1] > 0  # -7 is longer than -5


def test_a_long_legend_is_cut_to_three_rows_and_counts_the_rest() -> None:
    """32 series once pushed the plot off the chart (height -1); 12 limits of a capacity chart left it a third."""
    import re

    from day0.results.chartbox import HEIGHT, M_BOTTOM, M_TOP, MAX_LEGEND_ROWS, ROW

    spec = {"title": "busbw per rank", "series": [{"name": f"rank {i} busbw GB/s on node-a", "x": [1, 2, 4],
                                                   "y": [i, i + 1, i + 2]} for i in range(32)]}
    svg = charts.render_spec(charts.parse_spec(spec, "w"))
    (top, bottom), _ = _frame_and_bars(svg)
    assert top == M_TOP + ROW * MAX_LEGEND_ROWS and bottom == HEIGHT - M_BOTTOM
    shown = len(re.findall(r">rank \d+ busbw", svg))
    more = re.findall(r">\+(\d+) more<", svg)
    assert more and shown + int(more[0]) == 32


def test_cli_report_never_writes_over_the_record_or_its_event_log(tmp_path: Path, capsys, monkeypatch) -> None:
    """`day0 report ow --junit ow/run.json` exited 0 with run.json turned into XML."""
    src = rf.write(rf.incomplete(), tmp_path / "run")
    before = src.read_bytes()
    (tmp_path / "run" / "events.jsonl").write_text("{}\n")
    (tmp_path / "link.json").symlink_to(src)
    for argv in (["--junit", str(src)], ["--out", str(tmp_path / "link.json")], ["--junit", "run/events.jsonl"],
                 ["--out", str(tmp_path / "r.html"), "--junit", str(tmp_path / "r.html")]):
        capsys.readouterr()
        monkeypatch.chdir(tmp_path)
        assert _cli(["report", "run", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and ("not overwritten" in err or "are one file" in err), err
        assert src.read_bytes() == before and (tmp_path / "run" / "events.jsonl").read_text() == "{}\n"
    assert not (tmp_path / "r.html").exists()
    with pytest.raises(ReportError, match="report output is the run record rendered"):
        render(src, src)
    named_junit = src.rename(src.parent / "junit.xml")  # a record named junit.xml, published beside itself
    with pytest.raises(ReportError, match="junit output is the run record rendered"):
        publish(named_junit)
    assert named_junit.read_bytes() == before


def test_samples_near_a_floats_limit_keep_the_checks_other_evidence(tmp_path: Path) -> None:
    """A sum of samples past 1.8e308 raised in math.fsum, and the catch around the whole check
    dropped its table and its log excerpt with it: each part of the evidence now fails alone."""
    from day0.core.record import Check

    record = rf.accepted()
    ev = {"samples": [1.5e308, 1.6e308], "log_excerpt": "ENGINE LOG: CUDA error", "table": {"columns": ["a"],
                                                                                             "rows": [["kept"]]}}
    record.stage("latency").checks.append(Check(id="latency.huge", title="huge", status="pass", value=1.0, evidence=ev))
    _, html, doc = rendered(tmp_path, record)
    box = doc.one(tag="details", id="check-latency.huge")
    stats = dict(zip([th.text() for th in box.one(tag="table", cls="stats").find_all(tag="th")],
                     [td.text() for td in box.one(tag="table", cls="stats").find_all(tag="td")]))
    assert stats["mean"] == "1.550e+308" and stats["count"] == "2"
    assert "kept" in box.one(tag="table", cls="evidence-table").text() and "ENGINE LOG: CUDA error" in box.text()
    assert "latency.huge evidence.samples: values up to 1.6e+308 are too large to draw" in box.text()
    assert charts.sample_stats([1.5e308, 1.6e308])["mean"] == pytest.approx(1.55e308)


def test_stage_lines_count_each_stages_checks_by_status():
    """The terminal's day0 section, one line a stage (the plugin's hook only writes them)."""
    from day0.results.report import stage_lines

    record = rf.rejected()
    lines = stage_lines(record)
    assert len(lines) == len(record.stages)
    for line, stage in zip(lines, record.stages):
        counts = {s: sum(c.status == s for c in stage.checks) for s in {c.status for c in stage.checks}}
        assert line.split()[:2] == [stage.name, stage.verdict]
        assert line.endswith("(" + (", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no checks") + ")")
