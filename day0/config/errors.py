"""One line for a table that failed validation: the dotted key path, then what is wrong with it.

Every section of a profile is a strict pydantic model; pydantic reports a list of errors with a
location tuple. The profile (``day0.config.profile``), the stage's own ``[collectives]`` reader and
the ``[compare]`` reader of stored run records all turn the first of them into the same line
(the stages' readers raise it as :class:`SettingsError`):

    sla.ttft_p99_ms: expected a number
    kvcache.outptu_tokens: unknown key; did you mean 'output_tokens'?
    collectives.max_bytes: cannot read 'lots' as bytes (e.g. 1024, '64K', '1G')

Files that cannot be read at all are :mod:`day0.core.inputs`' question; the names this module
gave its answers (``InputError``, ``path_problem``) stay importable from here for the config
readers that use them.
"""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ValidationError

from day0.core.inputs import InputError, path_problem

__all__ = ["InputError", "SettingsError", "first_error", "known_keys", "path_problem"]

_EXPECTED = {
    "float_type": "expected a number",
    "int_type": "expected an integer",
    "string_type": "expected a string",
    "bool_type": "expected true or false",
    "dict_type": "expected a table",
    "model_type": "expected a table",
    "list_type": "expected an array",
    "extra_forbidden": "unknown key",
    "missing": "required value missing",
    "finite_number": "expected a finite number (not inf or nan)",
}
# Location parts pydantic adds that are not TOML keys.
_NOT_KEYS = ("function-after", "function-before", "[key]")


class SettingsError(ValueError):
    """A stage's setting that cannot be used (a ``[latency]``, ``[sla]`` or ``[collectives]`` value,
    or the command-line flag that set it); the message is one line naming the key or flag."""


def known_keys(root: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys the table at ``loc`` (a key path under ``root`` ending in the unknown key) accepts."""
    model: Any = root
    for part in loc[:-1]:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None or not isinstance(field.annotation, type) or not issubclass(field.annotation, BaseModel):
            return []
        model = field.annotation
    return [k for k, f in getattr(model, "model_fields", {}).items() if not f.exclude]


def _is_key_path(text: str) -> bool:
    return all(part.isidentifier() for part in text.split("."))


def first_error(exc: ValidationError, root: type[BaseModel], prefix: str = "") -> str:
    """``key.path: why`` for the first error; ``prefix`` (e.g. ``collectives``) heads the path
    when ``root`` is one section rather than the whole profile."""
    err = exc.errors(include_url=False)[0]
    parts = [str(p) for p in err["loc"] if p not in _NOT_KEYS]
    loc = ".".join([prefix, *parts] if prefix else parts)
    kind = err["type"]
    if kind == "extra_forbidden":
        known = known_keys(root, tuple(p for p in err["loc"] if p not in _NOT_KEYS))
        close = difflib.get_close_matches(str(err["loc"][-1]), known, n=1, cutoff=0.6)
        msg = f"unknown key; did you mean {close[0]!r}?" if close else "unknown key"
        if not close and known:
            msg += f" (known: {', '.join(known)})"
    elif kind in _EXPECTED:
        msg = _EXPECTED[kind]
    elif kind == "literal_error":
        msg = f"expected {err['ctx']['expected']}, got {err['input']!r}"
    elif kind == "value_error":
        msg = str(err["msg"]).removeprefix("Value error, ")
        # validators report "field: why" (or "table.key: why"); attach the key to the section path
        if ": " in msg and _is_key_path(msg.split(": ", 1)[0]):
            field, why = msg.split(": ", 1)
            loc = f"{loc}.{field}" if loc else field
            msg = why
    else:
        msg = f"{err['msg'].lower()}, got {err['input']!r}"
    return f"{loc}: {msg}" if loc else msg

