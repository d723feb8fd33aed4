"""Record values as table text: one cell per value, nested tables flattened to dotted rows.

Kept apart from the report module so the page, the first-screen summary and any site template
format a value the same way; every function caps what it emits, so a huge or hostile record
cannot bloat the page.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

MAX_FLAT_ROWS = 400
MAX_TABLE_ROWS = 500
MAX_TABLE_COLS = 50  # 500 rows of 8,000 columns made a 40 MB page


def fmt_value(v: Any, limit: int = 200) -> str:
    """A value as a person reads it in a table cell (raw numbers stay in run.json)."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 100_000 else str(v)
    if isinstance(v, float):
        av = abs(v)
        if v == 0:
            return "0"
        if av >= 1e12:
            return f"{v:.3e}"
        if av >= 1000:
            return f"{v:,.0f}" if v.is_integer() else f"{v:,.1f}"
        if av >= 1e-3:
            return f"{v:.4g}"
        return f"{v:.3e}"
    text = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def duration(start: str | None, end: str | None) -> str:
    """The time between two ISO times as "1h 02m 03s" / "2m 03s"; "—" when either is not one."""
    try:
        secs = (datetime.fromisoformat(str(end)) - datetime.fromisoformat(str(start))).total_seconds()
    except (TypeError, ValueError):
        return "—"
    h, rem = divmod(int(round(secs)), 3600)
    m, s = divmod(rem, 60)
    return f"{h}h {m:02d}m {s:02d}s" if h else f"{m}m {s:02d}s"


def _summary(v: Any) -> str:
    """One-cell summary of a structured fact (devices list, topology table)."""
    if isinstance(v, list) and v and all(isinstance(d, dict) for d in v):
        names: dict[str, int] = {}
        for d in v:
            n = str(d.get("name") or d.get("model") or d.get("type") or "device")
            names[n] = names.get(n, 0) + 1
        return ", ".join(f"{c} × {n}" for n, c in names.items())
    if isinstance(v, list):
        return fmt_value(", ".join(fmt_value(x) for x in v), 300)
    if isinstance(v, dict):
        return fmt_value(", ".join(f"{k}={fmt_value(x, 80)}" for k, x in v.items()), 300)
    return fmt_value(v, 300)


def flatten(obj: Any, prefix: str = "", out: list[tuple[str, str]] | None = None) -> list[tuple[str, str]]:
    """Nested tables as (dotted.key, text) rows, capped so a huge profile cannot bloat the page."""
    out = [] if out is None else out
    if len(out) >= MAX_FLAT_ROWS:
        return out
    if isinstance(obj, dict) and obj:
        for k, v in obj.items():
            flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(obj, list) and obj and any(isinstance(x, (dict, list)) for x in obj):
        for i, v in enumerate(obj):
            flatten(v, f"{prefix}[{i}]", out)
    elif isinstance(obj, list):
        out.append((prefix, fmt_value(", ".join(fmt_value(x) for x in obj), 500) if obj else "[]"))
    else:
        out.append((prefix, fmt_value(obj, 500) if obj != {} else "{}"))
    if len(out) == MAX_FLAT_ROWS:
        out.append(("…", "more entries in run.json"))
    return out


def lookup(data: Mapping[str, Any], *paths: str) -> Any:
    """The first present value among dotted ``paths`` (the environment's keys vary by collector)."""
    for p in paths:
        cur: Any = data
        for part in p.split("."):
            if not isinstance(cur, Mapping) or part not in cur:
                cur = None
                break
            cur = cur[part]
        if cur not in (None, "", [], {}):
            return cur
    return None


@dataclass
class TableView:
    columns: list[str]
    rows: list[list[str]]
    more: int = 0  # rows left out
    more_columns: int = 0  # columns (or cells past the header) left out

    @property
    def note(self) -> str:
        """What was left out, in words ("" when nothing was)."""
        parts = [f"{n:,} more {what}" for n, what in ((self.more, "rows"), (self.more_columns, "columns")) if n]
        return f"{' and '.join(parts)} in run.json." if parts else ""


def table_view(raw: Any, where: str) -> tuple[TableView | None, str | None]:
    """An evidence ``table`` as cells, capped in rows and in columns (the rest stay in run.json);
    or the problem with it, naming ``where``."""
    if not isinstance(raw, dict) or not isinstance(raw.get("columns"), list) or not isinstance(raw.get("rows"), list):
        return None, f"{where}: expected {{columns: [..], rows: [[..], ..]}}"
    rows = raw["rows"][:MAX_TABLE_ROWS]
    for i, r in enumerate(rows):
        if not isinstance(r, list):
            return None, f"{where}.rows[{i}]: expected a list of cells"
    width = max([len(raw["columns"]), *(len(r) for r in rows)])
    cols = [fmt_value(x, 80) for x in raw["columns"][:MAX_TABLE_COLS]]
    shown = [[fmt_value(x) for x in r[:MAX_TABLE_COLS]] for r in rows]
    return TableView(cols, shown, max(0, len(raw["rows"]) - MAX_TABLE_ROWS), max(0, width - MAX_TABLE_COLS)), None
