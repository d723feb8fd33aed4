"""The sandbox a report's templates render in: Jinja2's, which keeps a site template from reaching
Python, plus bounds on what one expression may build. Jinja2's own sandbox lets ``"x" * 400000000``
build 400 MB, ``"%999999999d" % 1`` ask for a gigabyte, and ``"x"|center(200000000)`` or
``"{:>200000000}".format(1)`` build 200 MB; a report page is about a megabyte.

Each call that can build far more than it is given is sized from its arguments before it is made:
the operators, ``str``'s padding, format, join, tab and replace methods, and the filters that pad,
format, indent, join, wrap, dump JSON or slice. What is bounded is amplification: concatenation
(``~``, ``+``) builds only the sum of what it is given, so a template builds more only by doing more.
Not bounded: the time of a template's own loops (a site template is code its operator chose, as a
conftest is; the record's own template folder is never used).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sized
from functools import wraps
from typing import Any, Callable

from jinja2.exceptions import SecurityError
from jinja2.sandbox import SandboxedEnvironment

MAX_BUILT = 1 << 24  # characters or items one operator or call may produce
MAX_POWER_BITS = 1 << 20  # an integer power's size: 10 ** 10 ** 8 would hold the renderer for minutes
_WIDTH = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")  # a %-format's width, precision
_BRACE_SPEC = re.compile(r"\{[^{}]*:([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}")  # a str.format field's spec
_DIGITS = re.compile(r"\d+")

Sizer = Callable[[Any, tuple[Any, ...], dict[str, Any]], int]  # (the str or filtered value, args, kwargs) -> size


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], i: int, name: str, default: Any = 0) -> Any:
    return args[i] if len(args) > i else kwargs.get(name, default)


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def _widest(values: Any) -> int:
    """The largest width any of ``values`` could give a field taking its width from an argument:
    an int, digits as text, or either one level inside a list, tuple or dict (``{1[0]}``)."""
    def one(v: Any) -> int:
        if isinstance(v, str):
            return int(v) if v.isascii() and v.isdigit() and len(v) < 20 else 0
        return _int(v)
    out = 0
    for v in values:
        inner = v.values() if isinstance(v, dict) else v if isinstance(v, (list, tuple)) else (v,)
        out = max(out, *(one(x) for x in inner), 0)
    return out


def _percent_size(fmt: Any, args: Any = ()) -> int:
    """The widest field of a %-format; ``*`` takes its width from the arguments (``args``)."""
    widths = [w for m in _WIDTH.finditer(str(fmt)) for w in m.groups() if w]
    star = _widest(args if isinstance(args, (tuple, list)) else (args,)) if "*" in widths else 0
    return max([int(w) for w in widths if w != "*"] + [star], default=0)


def _format_size(fmt: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """The widest field of a ``str.format`` string: its specs' numbers, and any argument a nested
    field (``{0:{1}}``, ``{0:{1[0]}}``) could take its width from."""
    specs = [m.group(1) for m in _BRACE_SPEC.finditer(str(fmt))]
    widths = [int(d) for s in specs for d in _DIGITS.findall(s)]
    if any("{" in s for s in specs):
        widths.append(_widest((*args, *kwargs.values())))
    return max(widths, default=0)


def _join_size(sep: Any, items: Any) -> int:
    if not isinstance(items, Sized):
        return 0
    n = len(items)
    own = sum(len(str(x)) for x in items) if isinstance(items, (list, tuple)) else 0
    return own + len(str(sep)) * max(0, n - 1)


def _wrap_size(s: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    text, width = str(s), max(1, _int(_arg(args, kwargs, 0, "width", 79)))
    wrap = _arg(args, kwargs, 2, "wrapstring", None)
    return len(text) + len(str(wrap) if wrap is not None else "\n") * (len(text) // width + 1)


def _json_size(value: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """An indented dump's size, bounded above by the compact one's times the indent."""
    indent = _int(_arg(args, kwargs, 0, "indent", None))
    if indent <= 1:
        return 0
    try:
        return len(json.dumps(value, default=str)) * indent
    except (TypeError, ValueError, RecursionError):
        return 0


def _indent_size(v: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    width = _arg(args, kwargs, 0, "width", 4)
    return (len(width) if isinstance(width, str) else _int(width)) * (str(v).count("\n") + 1)


def _replace_size(s: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    old, new = str(_arg(args, kwargs, 0, "old", "")), str(_arg(args, kwargs, 1, "new", ""))
    return len(str(s)) + (str(s).count(old) if old else len(str(s)) + 1) * max(0, len(new) - len(old))


#: str methods a template may call, sized from the str and the arguments
STR_METHODS: dict[str, Sizer] = {
    "center": lambda s, a, k: _int(_arg(a, k, 0, "width")),
    "ljust": lambda s, a, k: _int(_arg(a, k, 0, "width")),
    "rjust": lambda s, a, k: _int(_arg(a, k, 0, "width")),
    "zfill": lambda s, a, k: _int(_arg(a, k, 0, "width")),
    "expandtabs": lambda s, a, k: s.count("\t") * _int(_arg(a, k, 0, "tabsize", 8)),
    "format": lambda s, a, k: _format_size(s, a, k),
    "join": lambda s, a, k: _join_size(s, _arg(a, k, 0, "iterable", ())),
    "format_map": lambda s, a, k: _format_size(s, (), dict(a[0]) if a and isinstance(a[0], dict) else {}),
    "replace": _replace_size,
}

#: Jinja2's filters that build more than they are given, sized from the value and the arguments
FILTERS: dict[str, Sizer] = {
    "center": lambda v, a, k: _int(_arg(a, k, 0, "width", 80)),
    "format": lambda v, a, k: _percent_size(v, tuple(a) or tuple(k.values())),  # do_format is `value % args`
    "indent": _indent_size,
    "join": lambda v, a, k: _join_size(_arg(a, k, 0, "d", ""), v),
    "tojson": _json_size,
    "wordwrap": _wrap_size,
    "replace": lambda v, a, k: _replace_size(v, a, k),
    "slice": lambda v, a, k: _int(_arg(a, k, 0, "slices")),
}


def _refuse(what: str, size: int) -> None:
    if size > MAX_BUILT:
        raise SecurityError(f"{what} of {size} items, past {MAX_BUILT}")


def _bounded(name: str, func: Callable[..., Any], sizer: Sizer) -> Callable[..., Any]:
    """``func`` (a filter) sized first; its ``jinja_pass_arg`` is kept (wraps copies it), so Jinja
    still passes the eval context first where the filter wants one."""
    skip = 1 if getattr(func, "jinja_pass_arg", None) is not None else 0  # the context Jinja passes first

    @wraps(func)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        value, rest = (args[skip], args[skip + 1:]) if len(args) > skip else ("", ())
        _refuse(f"the filter {name}", sizer(value, tuple(rest), kwargs))
        return func(*args, **kwargs)
    return bounded


class BoundedSandbox(SandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "%"})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.filters.update({name: _bounded(name, self.filters[name], sizer) for name, sizer in FILTERS.items()})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            seq, times = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(seq, (str, list, tuple)) and isinstance(times, int) and len(seq) * times > MAX_BUILT:
                raise SecurityError(f"a repetition of {len(seq) * times} items, past {MAX_BUILT}")
        elif operator == "**" and isinstance(left, int) and isinstance(right, int):
            if right > 0 and right * max(1, abs(left).bit_length()) > MAX_POWER_BITS:
                raise SecurityError(f"a power of {right * abs(left).bit_length()} bits, past {MAX_POWER_BITS}")
        elif operator == "%" and isinstance(left, str):
            width = _percent_size(left, right.values() if isinstance(right, dict) else right)
            if width > MAX_BUILT:
                raise SecurityError(f"a format width of {width}, past {MAX_BUILT}")
        return super().call_binop(context, operator, left, right)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """Jinja2 hands a template ``str.format`` and ``format_map`` as wrappers of its own (its
        safe formatter), which :meth:`call` cannot see through: they are sized here."""
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        owner, name = value.__self__, value.__name__

        @wraps(wrapped)
        def bounded(*args: Any, **kwargs: Any) -> str:
            _refuse(f"str.{name}", STR_METHODS[name](owner, args, kwargs))
            return wrapped(*args, **kwargs)
        return bounded

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (Jinja's own signature)
        owner, name = getattr(__obj, "__self__", None), getattr(__obj, "__name__", "")
        if isinstance(owner, str) and name in STR_METHODS:
            _refuse(f"str.{name}", STR_METHODS[name](owner, args, kwargs))
        return super().call(__context, __obj, *args, **kwargs)
