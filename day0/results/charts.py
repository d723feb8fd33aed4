"""Inline SVG charts for the acceptance report, written by hand rather than with matplotlib.

Why not matplotlib: on the shared 2-core box, importing it costs ~1.8 s and each figure
~80 ms, so a report with twenty charts would miss the 2 s render budget before drawing
anything; its SVGs also carry dates and glyph outlines (non-deterministic, ~16 KB each).
The charts here are simple (lines, points, bars, reference lines), so a few hundred lines of
string building give deterministic, small, dependency-free SVG. ``benchmarks/bench_report.py``
measures both in the same run.

The chart spec is the evidence convention shared with the stages (``evidence["charts"]``);
``parse_spec`` turns a raw spec into typed objects and names the offending key on bad input.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from day0.core.stats import percentile as _percentile
from day0.results.chartbox import (  # noqa: F401  (sizes, numbers and the heat map re-exported for callers)
    HEATMAP_KIND,
    HEIGHT,
    M_BOTTOM,
    M_LEFT,
    M_RIGHT,
    M_TOP,
    MAX_HEATMAP,
    WIDTH,
    Canvas,
    ChartError,
    HeatmapSpec,
    _t,
    fmt_num,
    heatmap_svg,
    is_number,
    log_ticks,
    nice_ticks,
    parse_heatmap,
    shorten,
    text_width,
)

_Canvas = Canvas  # the name the chart functions grew up with

KINDS = ("line", "scatter", "bar")
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#8C6D1F", "#000000")
REF_COLOR = "#B2182B"
HALO = ' stroke="#fff" stroke-width="3" paint-order="stroke"'  # keeps labels legible over bars and lines
PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0, 99.9)

MAX_CATEGORIES = 500  # more bars than pixels is not a chart; use a line chart with numeric x


@dataclass(frozen=True)
class Series:
    name: str
    x: list[Any]
    y: list[float | None]


@dataclass(frozen=True)
class Reference:
    y: float
    label: str


@dataclass(frozen=True)
class ChartSpec:
    kind: str
    title: str
    x_label: str = ""
    y_label: str = ""
    x_log: bool = False
    series: list[Series] = field(default_factory=list)
    reference: list[Reference] = field(default_factory=list)


# --------------------------------------------------------------------------- numbers


def all_numbers(values: Sequence[Any]) -> bool:
    """Fast path for the common case (100k floats): every value a finite int/float or None."""
    vals = [v for v in values if v is not None]
    return set(map(type, vals)) <= {int, float} and all(map(math.isfinite, vals))


def clean_samples(raw: Any, where: str) -> list[float]:
    """Numbers from ``evidence["samples"]``; None (a NaN in JSON) is dropped, anything else is an error."""
    if not isinstance(raw, (list, tuple)):
        raise ChartError(f"{where}: expected a list of numbers, got {type(raw).__name__}")
    if all_numbers(raw):
        return [float(v) for v in raw if v is not None]
    out: list[float] = []
    for i, v in enumerate(raw):
        if v is None:
            continue
        if not is_number(v):
            raise ChartError(f"{where}[{i}]: {v!r} is not a number")
        out.append(float(v))
    return out


def percentile(sorted_xs: Sequence[float], q: float) -> float:
    """The latency checks' definition (day0.core.stats); a chart of no samples is a caller's bug."""
    if not sorted_xs:
        raise ValueError("percentile of no samples")
    return _percentile(sorted_xs, q, presorted=True)


def sample_stats(sorted_xs: Sequence[float]) -> dict[str, float]:
    """The figures printed next to a sample chart (count, mean, min, percentiles, max)."""
    n = len(sorted_xs)
    stats: dict[str, float] = {"count": float(n)}
    if n == 0:
        return stats
    try:
        stats["mean"] = math.fsum(sorted_xs) / n
    except OverflowError:  # a sum past 1.8e308: the mean itself is not, summed as fractions
        stats["mean"] = math.fsum(x / n for x in sorted_xs)
    stats["min"] = sorted_xs[0]
    for q in PERCENTILES:
        stats[f"p{q:g}"] = percentile(sorted_xs, q)
    stats["max"] = sorted_xs[-1]
    return stats


def cdf_points(sorted_xs: Sequence[float], max_points: int = 400) -> list[tuple[float, float]]:
    """At most ~max_points (value, fraction) pairs: even in probability, plus the far tail.

    Even spacing alone would hide p99.9 and the maximum, which are what an SLA reader looks at.
    """
    n = len(sorted_xs)
    if n == 0:
        return []
    if n <= max_points:
        return [(x, (i + 1) / n) for i, x in enumerate(sorted_xs)]
    ranks = {round(i * (n - 1) / (max_points - 1)) for i in range(max_points)}
    k = 2
    while 10.0**-k * n >= 1:  # 0.99, 0.999, ... down to single samples
        for tail in (10.0**-k, 5 * 10.0**-k):
            ranks.add(max(0, min(n - 1, round((1 - tail) * (n - 1)))))
        k += 1
    ranks.add(n - 1)
    return [(sorted_xs[r], (r + 1) / n) for r in sorted(ranks)]


def downsample(x: Sequence[float], y: Sequence[float], max_points: int) -> tuple[list[float], list[float]]:
    """Keep each bucket's lowest and highest y, so spikes survive (what a reader looks for)."""
    n = len(x)
    if n <= max_points or max_points < 4:
        return list(x), list(y)
    buckets = max_points // 2
    ox: list[float] = []
    oy: list[float] = []
    for b in range(buckets):
        lo, hi = b * n // buckets, (b + 1) * n // buckets
        if lo >= hi:
            continue
        idx = range(lo, hi)
        imin = min(idx, key=y.__getitem__)
        imax = max(idx, key=y.__getitem__)
        for i in sorted({imin, imax}):
            ox.append(x[i])
            oy.append(y[i])
    return ox, oy


# --------------------------------------------------------------------------- spec parsing


def parse_spec(raw: Any, where: str) -> ChartSpec | HeatmapSpec:
    """A chart spec from evidence; ``where`` (e.g. ``latency.ttft_p99 evidence.charts[0]``) prefixes errors."""
    if not isinstance(raw, Mapping):
        raise ChartError(f"{where}: expected an object, got {type(raw).__name__}")
    kind = raw.get("kind", "line")
    if kind == HEATMAP_KIND:
        return parse_heatmap(raw, where)
    if kind not in KINDS:
        raise ChartError(f"{where}.kind: {kind!r} is not one of {(*KINDS, HEATMAP_KIND)}")
    series_raw = raw.get("series")
    if not isinstance(series_raw, list) or not series_raw:
        raise ChartError(f"{where}.series: expected a non-empty list")
    series: list[Series] = []
    for i, s in enumerate(series_raw):
        w = f"{where}.series[{i}]"
        if not isinstance(s, Mapping):
            raise ChartError(f"{w}: expected an object")
        xs, ys = s.get("x"), s.get("y")
        if not isinstance(ys, list):
            raise ChartError(f"{w}.y: expected a list of numbers")
        if xs is None:
            xs = list(range(len(ys)))
        if not isinstance(xs, list):
            raise ChartError(f"{w}.x: expected a list")
        if len(xs) != len(ys):
            raise ChartError(f"{w}: x has {len(xs)} values but y has {len(ys)}")
        if not all_numbers(ys):
            for j, v in enumerate(ys):
                if v is not None and not is_number(v):
                    raise ChartError(f"{w}.y[{j}]: {v!r} is not a number")
        if not all_numbers(xs):
            for j, v in enumerate(xs):
                if not (is_number(v) or isinstance(v, str) or v is None):
                    raise ChartError(f"{w}.x[{j}]: {v!r} is neither a number nor a label")
        series.append(Series(str(s.get("name", f"series {i + 1}")), list(xs), list(ys)))
    refs: list[Reference] = []
    for i, r in enumerate(raw.get("reference") or []):
        if not isinstance(r, Mapping) or not is_number(r.get("y")):
            raise ChartError(f"{where}.reference[{i}].y: expected a number")
        refs.append(Reference(float(r["y"]), str(r.get("label", ""))))
    return ChartSpec(
        kind=kind,
        title=str(raw.get("title", "")),
        x_label=str(raw.get("x_label", "")),
        y_label=str(raw.get("y_label", "")),
        x_log=bool(raw.get("x_log", False)),
        series=series,
        reference=refs,
    )


# --------------------------------------------------------------------------- SVG writer


@dataclass
class _Axis:
    lo: float
    hi: float
    log: bool = False
    binary: bool = False
    labels: list[str] | None = None  # categorical axis

    def frac(self, v: float) -> float:
        if self.log:
            return (math.log10(v) - math.log10(self.lo)) / (math.log10(self.hi) - math.log10(self.lo))
        return (v - self.lo) / (self.hi - self.lo)

    def ticks(self) -> list[float]:
        if self.labels is not None:
            n = len(self.labels)
            every = max(1, math.ceil(n / 12))
            return [float(i) for i in range(0, n, every)]
        if self.log:
            return [t for t in log_ticks(self.lo, self.hi, self.binary) if self.lo <= t <= self.hi * 1.0000001]
        return [t for t in nice_ticks(self.lo, self.hi) if self.lo - 1e-9 <= t <= self.hi + 1e-9]

    def label(self, t: float) -> str:
        if self.labels is not None:
            s = self.labels[int(t)]
            return s if len(s) <= 14 else s[:13] + "…"
        return fmt_num(t, self.binary)


def _linear_axis(values: list[float], include_zero: bool, bars: bool = False) -> _Axis:
    """``include_zero``: non-negative values start at 0; ``bars``: 0 is always on the axis (a bar
    grows from 0: all-negative bars were drawn from above the plot, over the title)."""
    lo, hi = min(values), max(values)
    if max(abs(lo), abs(hi)) > 1e300:
        raise ChartError(f"values up to {max(abs(lo), abs(hi)):.3g} are too large to draw")
    if (include_zero or bars) and lo >= 0:
        lo = 0.0
    if bars and hi <= 0:
        hi = 0.0
    if hi == lo:
        pad = abs(hi) * 0.1 or 1.0
        lo, hi = (lo - pad if lo != 0 else 0.0), hi + pad
    ticks = nice_ticks(lo, hi)
    return _Axis(min(lo, ticks[0]), max(hi, ticks[-1]))


def _log_axis(values: list[float], binary: bool) -> _Axis:
    lo, hi = min(values), max(values)
    if hi > 1e300 or lo < 1e-300:
        raise ChartError(f"x values from {lo:.3g} to {hi:.3g} are out of range for a log axis")
    if hi == lo:
        lo, hi = lo / 2, hi * 2
    return _Axis(lo, hi, log=True, binary=binary)


def _frame(c: _Canvas, xa: _Axis, ya: _Axis, x_label: str, y_label: str, categorical_x: bool) -> tuple:
    def px(v: float) -> float:
        f = (v + 0.5) / len(xa.labels) if categorical_x and xa.labels else xa.frac(v)
        return c.x0 + f * (c.x1 - c.x0)

    def py(v: float) -> float:
        return c.y0 - ya.frac(v) * (c.y0 - c.y1)

    grid: list[str] = []
    cy = (c.y0 + c.y1) / 2
    if y_label:  # rotated: its box is tall and narrow
        y_label = shorten(y_label, c.y0 - c.y1)
        w = text_width(y_label)
        c.text(14, cy, y_label, extra=f' transform="rotate(-90 14 {_t(cy)})"', box=(4.0, cy - w / 2, 18.0, cy + w / 2))
    if x_label:
        c.text((c.x0 + c.x1) / 2, HEIGHT - 8, shorten(x_label, c.x1 - c.x0))
    for t in ya.ticks():  # a tick label that would cover its neighbour is left out, its grid line kept
        y = py(t)
        grid.append(f'<line x1="{c.x0}" y1="{_t(y)}" x2="{c.x1}" y2="{_t(y)}"/>')
        c.place(ya.label(t), [(c.x0 - 6, y + 4, "end")])
    for t in xa.ticks():
        x = px(t)
        if not categorical_x:
            grid.append(f'<line x1="{_t(x)}" y1="{c.y1}" x2="{_t(x)}" y2="{c.y0}"/>')
        c.place(xa.label(t), [(x, c.y0 + 15, "middle")])
    c.parts.insert(0, f'<g stroke="#e3e3e3" stroke-width="1">{"".join(grid)}</g>')
    c.add(f'<rect x="{c.x0}" y="{c.y1}" width="{c.x1 - c.x0}" height="{c.y0 - c.y1}" fill="none" stroke="#999"/>')
    return px, py


def _references(c: _Canvas, refs: list[Reference], px_lo: float, px_hi: float, py) -> None:
    for r in refs:
        y = py(r.y)
        c.add(
            f'<line x1="{_t(px_lo)}" y1="{_t(y)}" x2="{_t(px_hi)}" y2="{_t(y)}" stroke="{REF_COLOR}" '
            f'stroke-width="1.5" stroke-dasharray="6 4"/>'
        )
        if r.label:  # above the line at the right, else below it, else at the left
            c.place(r.label, [(px_hi - 4, y - 4, "end"), (px_hi - 4, y + 12, "end"), (px_lo + 4, y - 4, "start"),
                              (px_lo + 4, y + 12, "start"), (px_hi - 4, y - 16, "end"), (px_hi - 4, y + 24, "end")],
                    extra=f' fill="{REF_COLOR}"{HALO}')


def render_spec(spec: ChartSpec | HeatmapSpec, max_points: int = 800) -> str:
    """One chart spec as an SVG string; long series are downsampled to ``max_points``."""
    if isinstance(spec, HeatmapSpec):
        return heatmap_svg(spec)
    seen = _categories(spec)
    labels = list(seen) if seen is not None else None
    prepared = [(s, *_points(spec, s, seen, max_points)) for s in spec.series]
    all_x = [x for _, xs, _ in prepared for x in xs]
    all_y = [r.y for r in spec.reference] + [y for _, _, ys in prepared for y in ys]
    if not all_y or (labels is None and not all_x):
        raise ChartError(f"chart {spec.title!r}: no finite points to draw")
    if labels is not None:
        xa = _Axis(0, max(1, len(labels)), labels=labels)
    elif spec.x_log:
        xa = _log_axis(all_x, _all_powers_of_two(spec.series))
    else:
        xa = _linear_axis(all_x, include_zero=False)
    ya = _linear_axis(all_y, include_zero=True, bars=spec.kind == "bar")
    nser = len(prepared)
    legend = [(s.name, PALETTE[k % len(PALETTE)], False) for k, (s, _, _) in enumerate(prepared)] if nser > 1 else []
    legend += [(r.label or "reference", REF_COLOR, True) for r in spec.reference if nser > 1]
    c = _Canvas(spec.title, legend)
    px, py = _frame(c, xa, ya, spec.x_label, spec.y_label, labels is not None)
    for k, (s, xs, ys) in enumerate(prepared):
        _draw_series(c, spec.kind, PALETTE[k % len(PALETTE)], xs, ys, px, py, k, nser, len(labels or []))
    _references(c, spec.reference, c.x0, c.x1, py)
    npts = sum(len(xs) for _, xs, _ in prepared)
    return c.svg(f"{spec.kind} chart, {nser} series, {npts} points drawn")


def _categories(spec: ChartSpec) -> dict[str, int] | None:
    """Category label -> slot for a categorical x axis (bars, or any string x), else None."""
    if not (spec.kind == "bar" or any(isinstance(v, str) for s in spec.series for v in s.x)):
        return None
    seen: dict[str, int] = {}
    for s in spec.series:
        for v in s.x:
            seen.setdefault(_label(v), len(seen))
    if len(seen) > MAX_CATEGORIES:
        raise ChartError(f"{len(seen)} categories; a categorical chart draws at most {MAX_CATEGORIES}")
    return seen


def _points(spec: ChartSpec, s: Series, seen: dict[str, int] | None,
            max_points: int) -> tuple[list[float], list[float]]:
    """One series' drawable (x, y): missing y and (log x) non-positive x dropped, categories as
    slots, a line sorted by x, long numeric series downsampled."""
    xs: list[float] = []
    ys: list[float] = []
    if seen is None and None not in s.x and all_numbers(s.x):  # fast path: numeric x (validated)
        keep = [(x, y) for x, y in zip(s.x, s.y) if y is not None and (not spec.x_log or x > 0)]
        xs = [float(x) for x, _ in keep]
        ys = [float(y) for _, y in keep]
    else:
        for xv, yv in zip(s.x, s.y):
            if yv is None:
                continue
            if seen is not None:
                xs.append(float(seen[_label(xv)]))
            elif not is_number(xv) or (spec.x_log and xv <= 0):
                continue
            else:
                xs.append(float(xv))
            ys.append(float(yv))
    if seen is None and spec.kind == "line" and xs != sorted(xs):
        order = sorted(range(len(xs)), key=xs.__getitem__)
        xs, ys = [xs[i] for i in order], [ys[i] for i in order]
    if seen is None:
        xs, ys = downsample(xs, ys, max_points) if spec.kind == "line" else _stride(xs, ys, max_points)
    return xs, ys


def _draw_series(c: _Canvas, kind: str, color: str, xs: list[float], ys: list[float], px, py,
                 k: int, nser: int, ncat: int) -> None:
    """Series ``k`` of ``nser``: bars side by side in each category slot, dots, or a polyline
    (with dots when it has few points)."""
    if kind == "bar":
        slot = (c.x1 - c.x0) / max(1, ncat) * 0.8
        bw = slot / nser
        base = py(0.0)  # on the axis: bar charts' axes hold 0
        rects = []
        for xv, yv in zip(xs, ys):
            x = px(xv) - slot / 2 + k * bw
            y = py(yv)
            top, h = min(y, base), abs(base - y)
            rects.append(f'<rect x="{_t(x)}" y="{_t(top)}" width="{_t(bw * 0.92)}" height="{_t(h)}"/>')
        c.add(f'<g fill="{color}">{"".join(rects)}</g>')
    elif kind == "scatter":
        dots = "".join(f'<circle cx="{_t(px(a))}" cy="{_t(py(b))}" r="2.5"/>' for a, b in zip(xs, ys))
        c.add(f'<g fill="{color}" fill-opacity="0.75">{dots}</g>')
    else:
        pts = " ".join(f"{_t(px(a))},{_t(py(b))}" for a, b in zip(xs, ys))
        c.add(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{pts}"/>')
        if len(xs) <= 40:
            dots = "".join(f'<circle cx="{_t(px(a))}" cy="{_t(py(b))}" r="2.5"/>' for a, b in zip(xs, ys))
            c.add(f'<g fill="{color}">{dots}</g>')


def _label(v: Any) -> str:
    return v if isinstance(v, str) else fmt_num(v) if is_number(v) else "?"


def _stride(xs: list[float], ys: list[float], max_points: int) -> tuple[list[float], list[float]]:
    if len(xs) <= max_points:
        return xs, ys
    step = len(xs) / max_points
    idx = sorted({int(i * step) for i in range(max_points)})
    return [xs[i] for i in idx], [ys[i] for i in idx]


def _all_powers_of_two(series: list[Series]) -> bool:
    xs = [v for s in series for v in s.x if type(v) in (int, float) and math.isfinite(v)]
    return bool(xs) and all(v >= 1 and float(v).is_integer() and (int(v) & (int(v) - 1)) == 0 for v in xs)


def cdf_chart(sorted_xs: Sequence[float], unit: str, title: str, limit: float | None = None) -> str:
    """Empirical CDF of the samples (downsampled) with the check's limit as a vertical line."""
    pts = cdf_points(sorted_xs)
    if not pts:
        raise ChartError(f"chart {title!r}: no samples")
    c = _Canvas(title)
    xs = [p[0] for p in pts] + ([limit] if limit is not None else [])
    xa = _linear_axis(xs, include_zero=min(xs) >= 0 and min(xs) < 0.5 * max(xs))
    ya = _Axis(0.0, 1.0)
    px, py = _frame(c, xa, ya, unit, "fraction of samples", False)
    path = " ".join(f"{_t(px(x))},{_t(py(f))}" for x, f in pts)
    c.add(f'<polyline fill="none" stroke="{PALETTE[0]}" stroke-width="2" points="{path}"/>')
    if limit is not None:
        x = px(limit)
        c.add(
            f'<line x1="{_t(x)}" y1="{c.y1}" x2="{_t(x)}" y2="{c.y0}" stroke="{REF_COLOR}" '
            f'stroke-width="1.5" stroke-dasharray="6 4"/>'
        )
        c.place(f"limit {fmt_num(limit)} {unit}".strip(),
                [(x - 4, c.y1 + 14, "end"), (x + 4, c.y1 + 14, "start"), (x + 4, c.y0 - 8, "start"),
                 (x - 4, c.y0 - 8, "end"), (c.x1 - 4, c.y1 + 28, "end")], extra=f' fill="{REF_COLOR}"{HALO}')
    return c.svg(f"CDF of {len(sorted_xs)} samples, {len(pts)} points drawn")


def percentile_chart(sorted_xs: Sequence[float], unit: str, title: str, limit: float | None = None) -> str:
    """Bars for p50..p99.9 and max: the figures an SLA is written against."""
    if not sorted_xs:
        raise ChartError(f"chart {title!r}: no samples")
    names = [f"p{q:g}" for q in PERCENTILES] + ["max"]
    values = [percentile(sorted_xs, q) for q in PERCENTILES] + [sorted_xs[-1]]
    c = _Canvas(title)
    xa = _Axis(0, len(names), labels=names)
    ya = _linear_axis(values + ([limit] if limit is not None else []), include_zero=True, bars=True)
    px, py = _frame(c, xa, ya, "", unit, True)
    slot = (c.x1 - c.x0) / len(names) * 0.6
    base = py(0.0)  # on the axis (bars=True)
    bars = []
    for i, v in enumerate(values):
        x, y = px(i) - slot / 2, py(v)
        top, h = min(y, base), abs(base - y)
        bars.append(f'<rect x="{_t(x)}" y="{_t(top)}" width="{_t(slot)}" height="{_t(h)}"/>')
    c.add(f'<g fill="{PALETTE[0]}">' + "".join(bars) + "</g>")
    if limit is not None:
        _references(c, [Reference(limit, f"limit {fmt_num(limit)} {unit}".strip())], c.x0, c.x1, py)
    for i, v in enumerate(values):  # past its bar's end, else just inside it
        end = py(v)
        spots = [(px(i), end - 4), (px(i), end + 14)] if v >= 0 else [(px(i), end + 14), (px(i), end - 4)]
        c.place(fmt_num(v), [(x, y, "middle") for x, y in spots], extra=HALO)
    return c.svg(f"percentiles of {len(sorted_xs)} samples")
