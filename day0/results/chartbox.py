"""Where each text of a chart goes, so that no label covers another or leaves its chart.

SVG text does not flow: a label drawn at a point stays there even when a title, a legend or
another label already holds the spot (the memory-plan chart's legend once sat on its title, and
"limit 0.04 GB/s" ran into the axis). The canvas therefore keeps the box of every text it
draws, estimated from the font's advance widths (DejaVu Sans, what system-ui resolves to on a
bare Linux, is the widest common choice, so the estimate errs wide), and a movable label takes
the first of its candidate spots that is free and inside the chart. The browser test
(tests/test_report_browser.py) checks the result with getBBox() in real Chromium.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

WIDTH, HEIGHT = 640, 300
M_LEFT, M_RIGHT, M_TOP, M_BOTTOM = 64, 20, 30, 46
FONT = 11
TITLE_FONT = 13
ROW = 15  # one line of legend
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
        if ch in _NARROW:
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
    if text_width(s, size, bold) <= width:
        return s
    while s and text_width(s + "…", size, bold) > width:
        s = s[:-1]
    return s + "…"


class Canvas:
    """Accumulates one chart's SVG; the title and legend rows set where the plot starts."""

    def __init__(self, title: str, legend: Sequence[tuple[str, str, bool]] = ()) -> None:
        self.parts: list[str] = []
        self.boxes: list[Box] = []
        self.title = title
        self.x0, self.x1 = M_LEFT, WIDTH - M_RIGHT
        shown = shorten(title, WIDTH - 16, TITLE_FONT, bold=True)
        self.text(8, 18, shown, anchor="start", size=TITLE_FONT, bold=True, extra=' font-size="13" font-weight="600"')
        rows = self._legend(list(legend), 18 + 4 + text_width(shown, TITLE_FONT, True))
        self.y0, self.y1 = HEIGHT - M_BOTTOM, M_TOP + ROW * rows  # y grows downwards

    def add(self, s: str) -> None:
        self.parts.append(s)

    def text(self, x: float, y: float, s: str, anchor: str = "middle", cls: str = "", extra: str = "",
             size: float = FONT, bold: bool = False, box: Box | None = None) -> None:
        """Draw a fixed text (title, axis label) and claim its box."""
        self.boxes.append(box or text_box(x, y, s, anchor, size, bold))
        c = f' class="{cls}"' if cls else ""
        self.add(f'<text x="{_t(x)}" y="{_t(y)}" text-anchor="{anchor}"{c}{extra}>{escape(s)}</text>')

    def free(self, box: Box) -> bool:
        inside = box[0] >= 0 and box[1] >= 0 and box[2] <= WIDTH and box[3] <= HEIGHT
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
        of their own under it. Returns the number of extra rows used."""
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
        for k, row in enumerate(rows):
            y = 18 + ROW * k
            x = WIDTH - M_RIGHT - sum(w for *_, w in row)
            for label, color, dashed, w in row:
                dash = ' stroke-dasharray="5 3"' if dashed else ""
                self.add(f'<line x1="{_t(x)}" y1="{_t(y - 4)}" x2="{_t(x + 16)}" y2="{_t(y - 4)}" stroke="{color}" '
                         f'stroke-width="2"{dash}/>')
                self.text(x + 20, y, label, anchor="start")
                x += w
        return len(rows) - 1

    def svg(self, desc: str) -> str:
        head = (
            f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
            f'role="img" font-family="system-ui,sans-serif" font-size="{FONT}">'
            f"<title>{escape(self.title)}</title><desc>{escape(desc)}</desc>"
        )
        return head + "".join(self.parts) + "</svg>"
