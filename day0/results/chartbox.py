"""Where each text of a chart goes, so that no label covers another or leaves its chart.

SVG text does not flow: a label drawn at a point stays there even when a title, a legend or
another label already holds the spot (the memory-plan chart's legend once sat on its title, and
"limit 0.04 GB/s" ran into the axis). The canvas therefore keeps the box of every text it
draws, estimated from the font's advance widths (DejaVu Sans, what system-ui resolves to on a
bare Linux, is the widest common choice, so the estimate errs wide), and a movable label takes
the first of its candidate spots that is free and inside the chart. The browser test
(tests/results/test_report_browser.py) checks the result with getBBox() in real Chromium.

Also here, below ``day0.results.charts`` so that both can use them without an import cycle: the
number helpers (ticks, short number text, ChartError) and the heat-map kind (parse and draw).
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

WIDTH, HEIGHT = 640, 300
M_LEFT, M_RIGHT, M_TOP, M_BOTTOM = 64, 20, 30, 46
FONT = 11
TITLE_FONT = 13
ROW = 15  # one line of legend
MAX_LEGEND_ROWS = 3  # rows of their own under the title; the rest are counted
ASCENT, DESCENT = 0.95, 0.26  # of the font size, as getBBox() reports a text's height

_NARROW = set("iljtfrI1.,:;|!'()[]{} ")
_WIDE = set("mwMW@%&")

Box = tuple[float, float, float, float]  # x0, y0, x1, y1


def _t(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


def text_width(s: str, size: float = FONT, bold: bool = False) -> float:
    """Estimated advance width in user units; rounded up so a box is never smaller than drawn."""
    em = 0.0
    for ch in s:
        if ch == "…":  # a full em in DejaVu Sans: what shorten() ends with
            em += 1.0
        elif ch in _NARROW:
            em += 0.36
        elif ch in _WIDE:
            em += 0.95
        elif ch.isupper():
            em += 0.74
        else:
            em += 0.64
    return em * size * (1.1 if bold else 1.0) + 1.0


def text_box(x: float, y: float, s: str, anchor: str = "middle", size: float = FONT, bold: bool = False) -> Box:
    w = text_width(s, size, bold)
    x0 = x - w / 2 if anchor == "middle" else x - w if anchor == "end" else x
    return (x0, y - ASCENT * size, x0 + w, y + DESCENT * size)


def overlaps(a: Box, b: Box, tol: float = 0.5) -> bool:
    return min(a[2], b[2]) - max(a[0], b[0]) > tol and min(a[3], b[3]) - max(a[1], b[1]) > tol


def shorten(s: str, width: float, size: float = FONT, bold: bool = False) -> str:
    """``s`` cut with an ellipsis to fit ``width`` (the full text stays in the chart's <title>)."""
    s = s[: int(width / (0.36 * size)) + 2]  # no more characters than the narrowest could fit: bounded work
    if text_width(s, size, bold) <= width:
        return s
    while s and text_width(s + "…", size, bold) > width:
        s = s[:-1]
    return s + "…"


# --------------------------------------------------------------------------- numbers


class ChartError(ValueError):
    """A chart spec that cannot be drawn; the message names the evidence key at fault."""


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def nice_ticks(lo: float, hi: float, target: int = 5) -> list[float]:
    """Round tick values (1, 2, 2.5, 5 x 10^k) covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError("tick range must be finite")
    if hi < lo:
        lo, hi = hi, lo
    raw = hi / max(1, target) - lo / max(1, target)  # divided first: no overflow near float max
    if raw <= max(abs(lo), abs(hi)) * 1e-12 or raw < 1e-300:  # equal, or closer than floats resolve
        hi = lo + (abs(lo) if abs(lo) > 1e-300 else 1.0)
        raw = hi / max(1, target) - lo / max(1, target)
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step + 1e-9) * step
    ticks: list[float] = []
    t = start
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t = start + step * len(ticks)
    if ticks[-1] < hi:
        ticks.append(round(ticks[-1] + step, 12))
    return ticks


def log_ticks(lo: float, hi: float, binary: bool = False) -> list[float]:
    """Powers of 10 (or of 2 for byte sizes) spanning [lo, hi], thinned to at most ~8 ticks."""
    base = 2.0 if binary else 10.0
    a = math.floor(math.log(lo, base) + 1e-9)
    b = math.ceil(math.log(hi, base) - 1e-9)
    if b <= a:
        b = a + 1
    every = max(1, math.ceil((b - a) / 8))
    if binary and every > 1:
        every = 2 * math.ceil(every / 2)  # land on 1K, 1M, 1G when thinned
        a -= a % every
    return [base**e for e in range(a, b + 1, every)]


def fmt_num(v: float, binary: bool = False) -> str:
    """Short tick/label text: 0.25, 12.5, 3.2k, 1.5M (or 64K, 1M, 2G for byte sizes)."""
    if v == 0:
        return "0"
    if binary:
        for suffix, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
            if abs(v) >= scale:
                return f"{v / scale:.4g}{suffix}"
        return f"{v:.4g}"
    av = abs(v)
    for suffix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if av >= scale * 10 or (av >= scale and suffix != "k"):
            return f"{v / scale:.3g}{suffix}"
    if av >= 1000:
        return f"{v:.0f}"
    if av >= 0.01:
        return f"{v:.3g}"
    return f"{v:.2g}"


# --------------------------------------------------------------------------- canvas


class Canvas:
    """Accumulates one chart's SVG; the title and legend rows set where the plot starts."""

    def __init__(self, title: str, legend: Sequence[tuple[str, str, bool]] = (), height: float = HEIGHT) -> None:
        self.parts: list[str] = []
        self.height = height
        self.boxes: list[Box] = []
        self.title = title
        self.x0, self.x1 = M_LEFT, WIDTH - M_RIGHT
        shown = shorten(title, WIDTH - 16, TITLE_FONT, bold=True)
        self.text(8, 18, shown, anchor="start", size=TITLE_FONT, bold=True, extra=' font-size="13" font-weight="600"')
        rows = self._legend(list(legend), 18 + 4 + text_width(shown, TITLE_FONT, True))
        self.y0, self.y1 = height - M_BOTTOM, M_TOP + ROW * rows  # y grows downwards

    def add(self, s: str) -> None:
        self.parts.append(s)

    def text(self, x: float, y: float, s: str, anchor: str = "middle", cls: str = "", extra: str = "",
             size: float = FONT, bold: bool = False, box: Box | None = None) -> None:
        """Draw a fixed text (title, axis label) and claim its box."""
        self.boxes.append(box or text_box(x, y, s, anchor, size, bold))
        c = f' class="{cls}"' if cls else ""
        self.add(f'<text x="{_t(x)}" y="{_t(y)}" text-anchor="{anchor}"{c}{extra}>{escape(s)}</text>')

    def free(self, box: Box) -> bool:
        inside = box[0] >= 0 and box[1] >= 0 and box[2] <= WIDTH and box[3] <= self.height
        return inside and not any(overlaps(box, b) for b in self.boxes)

    def place(self, s: str, spots: Sequence[tuple[float, float, str]], extra: str = "") -> bool:
        """Draw ``s`` at the first free spot (x, y, anchor); False (nothing drawn) when none is."""
        for x, y, anchor in spots:
            if self.free(text_box(x, y, s, anchor)):
                self.text(x, y, s, anchor=anchor, extra=extra)
                return True
        return False

    def _legend(self, items: list[tuple[str, str, bool]], title_end: float) -> int:
        """Legend entries right-aligned; on the title's row when they fit beside it, else on rows
        of their own under it, at most ``MAX_LEGEND_ROWS`` of them: the last one then ends "+N more"
        (12 limits of a capacity chart left the plot 104 of 300 units, 32 series none). Returns the
        number of extra rows used."""
        if not items:
            return 0
        entries = [(lab := shorten(label, 220), color, dashed, text_width(lab) + 26) for label, color, dashed in items]
        rows: list[list[tuple[str, str, bool, float]]] = [[]]
        room = WIDTH - M_RIGHT - title_end  # the first row shares the title's line
        for e in entries:
            if sum(w for *_, w in rows[-1]) + e[3] > room and (rows[-1] or len(rows) == 1):
                rows.append([])
                room = WIDTH - M_RIGHT - 8
            rows[-1].append(e)
        if len(rows) > MAX_LEGEND_ROWS + 1:
            rows = rows[:MAX_LEGEND_ROWS + 1]
            left = len(entries) - sum(len(r) for r in rows)
            while True:  # make room on the last row for what says how many were left out
                more = f"+{left} more"
                if sum(w for *_, w in rows[-1]) + text_width(more) + 6 <= WIDTH - M_RIGHT - 8 or not rows[-1]:
                    break
                rows[-1].pop()
                left += 1
            rows[-1].append((more, "", False, text_width(more) + 6))
        for k, row in enumerate(rows):
            y = 18 + ROW * k
            x = WIDTH - M_RIGHT - sum(w for *_, w in row)
            for label, color, dashed, w in row:
                if not color:  # "+N more": words only
                    self.text(x + 6, y, label, anchor="start")
                    break
                dash = ' stroke-dasharray="5 3"' if dashed else ""
                self.add(f'<line x1="{_t(x)}" y1="{_t(y - 4)}" x2="{_t(x + 16)}" y2="{_t(y - 4)}" stroke="{color}" '
                         f'stroke-width="2"{dash}/>')
                self.text(x + 20, y, label, anchor="start")
                x += w
        return len(rows) - 1

    def svg(self, desc: str) -> str:
        head = (
            f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {_t(self.height)}" '
            f'role="img" font-family="system-ui,sans-serif" font-size="{FONT}">'
            f"<title>{escape(self.title)}</title><desc>{escape(desc)}</desc>"
        )
        return head + "".join(self.parts) + "</svg>"


# --------------------------------------------------------------------------- heat map
# A matrix of values by row and column name (collectives.links: bandwidth from each sender row
# to each receiver column). Low is warm, high is cool, on ColorBrewer's RdYlBu, which stays
# readable with the common colour-vision deficiencies; a value range over 100x (a shaped link is
# ~100x slower than the rest) is coloured on a log scale so the fast links do not all look alike.

HEATMAP_KIND = "heatmap"
MAX_HEATMAP = 64  # rows and columns each: 4,096 cells, already one pixel-ish line of text per row
NAME_CHARS = 100  # a row/column name is cut to this many characters when parsed
HEAT_STOPS = ("#d73027", "#f46d43", "#fdae61", "#fee090", "#ffffbf", "#e0f3f8", "#abd9e9", "#74add1", "#4575b4")
NULL_FILL = "#d9d9d9"
LOG_RATIO = 100.0  # max / min above which the colour scale is logarithmic
SCALE_W = 76  # the colour scale and its labels, right of the cells
TOOLTIP_CELLS = 256  # per-cell <title> hover text up to this many cells (it costs ~80 bytes a cell)


@dataclass(frozen=True)
class HeatmapSpec:
    title: str
    rows: list[str]
    cols: list[str]
    values: list[list[float | None]]  # len(rows) lists of len(cols); None: no measurement
    x_label: str = ""
    y_label: str = ""
    unit: str = ""
    marked: frozenset[tuple[int, int]] = frozenset()  # (row, col) cells outlined as failing
    kind: str = HEATMAP_KIND


def _names(raw: Mapping[str, Any], key: str, where: str) -> list[str]:
    names = raw.get(key)
    if not isinstance(names, (list, tuple)) or not names:
        raise ChartError(f"{where}.{key}: expected a non-empty list of names")
    if len(names) > MAX_HEATMAP:
        raise ChartError(f"{where}.{key}: {len(names)} names; a heat map draws at most {MAX_HEATMAP}")
    for i, n in enumerate(names):
        if not isinstance(n, str):
            raise ChartError(f"{where}.{key}[{i}]: {reprlib.repr(n)} is not a name (a string)")
    return [n[:NAME_CHARS] for n in names]


def _matrix(raw: Any, nr: int, nc: int, where: str) -> list[list[float | None]]:
    if not isinstance(raw, (list, tuple)) or len(raw) != nr:
        got = len(raw) if isinstance(raw, (list, tuple)) else type(raw).__name__
        raise ChartError(f"{where}.values: expected {nr} rows (one per name in rows), got {got}")
    out: list[list[float | None]] = []
    for i, row in enumerate(raw):
        if not isinstance(row, (list, tuple)) or len(row) != nc:
            got = len(row) if isinstance(row, (list, tuple)) else type(row).__name__
            raise ChartError(f"{where}.values[{i}]: expected {nc} values (one per name in cols), got {got}")
        for j, v in enumerate(row):
            if v is not None and not is_number(v):
                raise ChartError(f"{where}.values[{i}][{j}]: {reprlib.repr(v)} is not a number")
        out.append([None if v is None else float(v) for v in row])
    return out


def parse_heatmap(raw: Mapping[str, Any], where: str) -> HeatmapSpec:
    """A ``{"kind": "heatmap", ...}`` spec; sizes are checked before anything is iterated."""
    rows, cols = _names(raw, "rows", where), _names(raw, "cols", where)
    values = _matrix(raw.get("values"), len(rows), len(cols), where)
    marked_raw = raw.get("marked") or []
    if not isinstance(marked_raw, (list, tuple)) or len(marked_raw) > len(rows) * len(cols):
        raise ChartError(f"{where}.marked: expected a list of [row, col] pairs, at most one per cell")
    marked: set[tuple[int, int]] = set()
    for k, m in enumerate(marked_raw):
        ok = isinstance(m, (list, tuple)) and len(m) == 2 and all(type(x) is int for x in m)
        if not ok or not (0 <= m[0] < len(rows) and 0 <= m[1] < len(cols)):
            raise ChartError(f"{where}.marked[{k}]: expected [row, col] within {len(rows)} x {len(cols)}, "
                             f"got {reprlib.repr(m)}")
        marked.add((m[0], m[1]))
    return HeatmapSpec(title=str(raw.get("title", "")), rows=rows, cols=cols, values=values,
                       x_label=str(raw.get("x_label", "")), y_label=str(raw.get("y_label", "")),
                       unit=str(raw.get("unit", "")), marked=frozenset(marked))


@dataclass(frozen=True)
class HeatScale:
    """Value -> position on the colour scale (0 low .. 1 high) -> colour."""

    lo: float
    hi: float
    log: bool

    @classmethod
    def of(cls, values: list[float]) -> HeatScale:
        lo, hi = min(values), max(values)
        if max(abs(lo), abs(hi)) > 1e300:
            raise ChartError(f"values up to {max(abs(lo), abs(hi)):.3g} are too large to draw")
        pos = [v for v in values if v > 0]
        if lo >= 0 and pos and hi / min(pos) > LOG_RATIO:
            return cls(min(pos), hi, True)  # a zero is coloured as the lowest value
        return cls(lo, hi, False)

    def frac(self, v: float) -> float:
        if self.hi <= self.lo:
            return 0.5
        if self.log:
            f = (math.log10(max(v, self.lo)) - math.log10(self.lo)) / (math.log10(self.hi) - math.log10(self.lo))
        else:
            f = (v - self.lo) / (self.hi - self.lo)
        return min(1.0, max(0.0, f))

    def ticks(self) -> list[float]:
        if self.hi <= self.lo:
            return []
        ts = log_ticks(self.lo, self.hi) if self.log else nice_ticks(self.lo, self.hi)
        return [t for t in ts if self.lo <= t <= self.hi]


def heat_color(f: float) -> str:
    """Position 0..1 on HEAT_STOPS, interpolated in sRGB."""
    pos = min(1.0, max(0.0, f)) * (len(HEAT_STOPS) - 1)
    k = min(int(pos), len(HEAT_STOPS) - 2)
    a, b = HEAT_STOPS[k], HEAT_STOPS[k + 1]
    rgb = [round(int(a[i:i + 2], 16) + (int(b[i:i + 2], 16) - int(a[i:i + 2], 16)) * (pos - k)) for i in (1, 3, 5)]
    return "#" + "".join(f"{c:02x}" for c in rgb)


def _ink(fill: str) -> str:
    """Dark text on light cells, white on dark ones (relative luminance, WCAG)."""
    lin = [(c / 255) / 12.92 if c <= 10 else ((c / 255 + 0.055) / 1.055) ** 2.4
           for c in (int(fill[i:i + 2], 16) for i in (1, 3, 5))]
    return "#111" if 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2] > 0.25 else "#fff"


def heatmap_svg(spec: HeatmapSpec) -> str:
    """The matrix as coloured cells with their values, row and column names and a colour scale."""
    nr, nc = len(spec.rows), len(spec.cols)
    c = Canvas(spec.title, height=min(2 * HEIGHT, max(HEIGHT, M_TOP + M_BOTTOM + 16 * nr)))  # ~16 px a row
    present = [v for row in spec.values for v in row if v is not None]
    scale = HeatScale.of(present) if present else None
    row_w = min(120.0, max(text_width(shorten(n, 120)) for n in spec.rows))
    c.x0, c.x1 = (26 if spec.y_label else 6) + row_w + 6, WIDTH - M_RIGHT - SCALE_W
    _heat_axes(c, spec, row_w)
    cw, ch = (c.x1 - c.x0) / nc, (c.y0 - c.y1) / nr
    tips = nr * nc <= TOOLTIP_CELLS
    cells, marks = [], []
    for i, row in enumerate(spec.values):
        for j, v in enumerate(row):
            x, y = c.x0 + j * cw, c.y1 + i * ch
            fill = NULL_FILL if v is None or scale is None else heat_color(scale.frac(v))
            text = "–" if v is None else fmt_num(v)
            tip = ""
            if tips:
                shown = "no measurement" if v is None else f"{fmt_num(v)} {spec.unit}".strip()
                tip = f"<title>{escape(spec.rows[i])} → {escape(spec.cols[j])}: {escape(shown)}</title>"
            cells.append(f'<rect x="{_t(x)}" y="{_t(y)}" width="{_t(cw)}" height="{_t(ch)}" fill="{fill}">{tip}</rect>')
            if (i, j) in spec.marked:
                d = min(1.5, cw / 4, ch / 4)
                marks.append(f'<rect x="{_t(x + d)}" y="{_t(y + d)}" width="{_t(cw - 2 * d)}" height="{_t(ch - 2 * d)}"/>')
            if ch >= FONT * (ASCENT + DESCENT) + 2 and text_width(text) <= cw - 4:
                ink = "#444" if v is None else _ink(fill)  # inside its own cell: nothing else is drawn there
                c.text(x + cw / 2, y + ch / 2 + FONT * (ASCENT - DESCENT) / 2, text, extra=f' fill="{ink}"')
    grid = "1" if min(cw, ch) >= 10 else "0.4"  # white lines between cells, thin when cells are small
    c.parts.insert(1, f'<g class="heat-cells" stroke="#fff" stroke-width="{grid}">{"".join(cells)}</g>')
    if marks:
        c.add(f'<g class="heat-marks" fill="none" stroke="#000" stroke-width="3">{"".join(marks)}</g>')
    if scale is not None:
        _heat_legend(c, scale, spec.unit)
    kind = "no values" if scale is None else (
        f"{'log' if scale.log else 'linear'} colour scale {fmt_num(scale.lo)} to {fmt_num(scale.hi)} {spec.unit}".strip())
    return c.svg(f"heat map, {nr} x {nc} cells, {nr * nc - len(present)} without a value, "
                 f"{len(spec.marked)} marked, {kind}")


def _heat_axes(c: Canvas, spec: HeatmapSpec, row_w: float) -> None:
    """Axis labels and the row and column names; a name that would cover its neighbour is left out."""
    nr, nc = len(spec.rows), len(spec.cols)
    cw, ch = (c.x1 - c.x0) / nc, (c.y0 - c.y1) / nr
    cy = (c.y0 + c.y1) / 2
    if spec.y_label:  # rotated, as on the other charts
        label = shorten(spec.y_label, c.y0 - c.y1)
        w = text_width(label)
        c.text(14, cy, label, extra=f' transform="rotate(-90 14 {_t(cy)})"', box=(4.0, cy - w / 2, 18.0, cy + w / 2))
    if spec.x_label:
        c.text((c.x0 + c.x1) / 2, c.height - 8, shorten(spec.x_label, c.x1 - c.x0))
    base = FONT * (ASCENT - DESCENT) / 2
    for i, name in enumerate(spec.rows):
        c.place(shorten(name, row_w), [(c.x0 - 6, c.y1 + (i + 0.5) * ch + base, "end")])
    col_w = max(cw - 4, 40.0)
    for j, name in enumerate(spec.cols):
        c.place(shorten(name, col_w), [(c.x0 + (j + 0.5) * cw, c.y0 + 15, "middle")])


def _heat_legend(c: Canvas, scale: HeatScale, unit: str) -> None:
    """A vertical colour bar right of the cells, labelled at its ends and at round values."""
    x = c.x1 + 12
    label = f"{unit}, log" if scale.log and unit else "log" if scale.log else unit
    if label:
        c.place(shorten(label, WIDTH - x - 2), [(x - 4, c.y1 + 4, "start")])
    top, bottom, steps = c.y1 + 20, c.y0, 32
    h = (bottom - top) / steps
    bar = "".join(f'<rect x="{_t(x)}" y="{_t(bottom - (k + 1) * h)}" width="12" height="{_t(h + 0.3)}" '
                  f'fill="{heat_color((k + 0.5) / steps)}"/>' for k in range(steps))
    c.add(f'<g class="heat-scale">{bar}</g>')
    c.add(f'<rect x="{_t(x)}" y="{_t(top)}" width="12" height="{_t(bottom - top)}" fill="none" stroke="#999"/>')
    room = WIDTH - (x + 16) - 2
    for v in [scale.hi, scale.lo, *scale.ticks()] if scale.hi > scale.lo else [scale.lo]:
        y = bottom - scale.frac(v) * (bottom - top)
        if c.place(shorten(fmt_num(v), room), [(x + 16, y + 4, "start")]):
            c.add(f'<line x1="{_t(x + 12)}" y1="{_t(y)}" x2="{_t(x + 15)}" y2="{_t(y)}" stroke="#666"/>')
