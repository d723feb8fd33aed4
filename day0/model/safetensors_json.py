"""A safetensors header's JSON as the safetensors library reads it, not as Python's ``json`` does.

Why: safetensors (Rust) reads the header with serde_json into typed structs, which refuses JSON
that Python's parsers take without a word, so a checker that parsed with ``json`` or msgspec
passed shards that vLLM then failed to load. Asked of safetensors 0.8 itself (the tests ask it
again on every case, so the two cannot drift apart silently), serde_json refuses:

* a UTF-8 byte-order mark before the JSON (``json.loads`` of bytes skips it);
* NaN and Infinity, and numbers beyond a 64-bit float (``1e400``, a 309-digit integer), anywhere;
* nesting of 128 levels or more anywhere (its recursion limit);
* a ``\\ud800`` escape that is not half of a surrogate pair, anywhere;
* a key written twice where it names a struct field: ``__metadata__`` at the top, ``dtype``,
  ``shape`` or ``data_offsets`` in an entry. Elsewhere the last value counts (a tensor name or a
  metadata key twice), but each earlier value must still be of the right type;
* ``-0`` and integers of 2**64 or more where an integer is expected: serde_json reads them as
  floats (those checks are the validator's, :mod:`day0.model.safetensors_header`).

It accepts leading and trailing whitespace (0.8 does not require the header to start with ``{``).

The fast path stays: msgspec parses an ordinary header, and :func:`fast` keeps its result only
when the bytes cannot hold any of the above (no ``\\u`` escape, no ``-0``), :func:`no_repeated_key`
proves no key was written twice, and the validator finds every entry plain. Anything else is
parsed again by :func:`strict`, which reads the JSON the serde way (a few times msgspec's time).
"""

from __future__ import annotations

import json
import math
import re
from itertools import chain
from typing import Any, Collection, Iterable, Iterator

BOM = b"\xef\xbb\xbf"
MAX_DEPTH = 127  # serde_json refuses the 128th nested array or object
MAX_U64 = 2**64 - 1
STRUCT_FIELDS = frozenset({"dtype", "shape", "data_offsets"})
TOO_DEEP = f"header JSON is nested too deeply to be a safetensors header (safetensors reads at most {MAX_DEPTH} levels)"
_MIN_I64 = -(2**63)
_NEG_ZERO = re.compile(rb"-0[\s,\]}]")  # the integer -0; -0.5 and -0e1 are floats everywhere
_NEG_ZERO_TEXT = re.compile(_NEG_ZERO.pattern.decode())
_SURROGATE = re.compile("[\ud800-\udfff]")  # only a lone one survives json's decoding (pairs combine)

try:
    from msgspec.json import decode as _msgspec_decode
except ImportError:  # pragma: no cover - msgspec ships with vLLM
    _msgspec_decode = None


class Refused(ValueError):
    """The header's JSON is not what safetensors reads; the message says why, without the file."""


class Repeated(dict[str, Any]):
    """A JSON object with a key written more than once: it holds the last value of each key (as
    serde_json and Python do); ``earlier`` holds the values those replaced, in order."""

    earlier: list[tuple[str, Any]]


class NegativeZero(float):
    """The integer ``-0``, which serde_json reads as the float -0.0 (so safetensors refuses it as
    a dimension or an offset); it shows as written, so a refusal quotes what the file says."""

    def __repr__(self) -> str:
        return "-0"


_CONTAINERS = frozenset({dict, list, Repeated})
_NEG_ZERO_VALUE = NegativeZero(-0.0)


def fast(raw: bytes) -> dict[str, Any] | None:
    """msgspec's parse of ``raw``, or None when it refuses or when the bytes hold what only the
    strict parse reads right: a ``\\u`` escape (a lone surrogate, a key spelled another way) or
    the integer ``-0``. Writers produce neither; other escapes read the same in both parsers."""
    if _msgspec_decode is None or (b"\\" in raw and b"\\u" in raw) or (b"-" in raw and _NEG_ZERO.search(raw)):
        return None
    try:
        obj = _msgspec_decode(raw)
    except Exception:  # malformed, out of range, too deep: the strict parse says which
        return None
    return obj if type(obj) is dict else None


def no_repeated_key(raw: bytes, names: Collection[str], metadata: dict[str, str] | None, meta_key: bool) -> bool:
    """True when no key in ``raw`` was written twice, for a header :func:`fast` parsed whose
    tensor entries (one per name in ``names``) each hold exactly dtype, shape and data_offsets,
    and whose top level holds ``__metadata__`` when ``meta_key``: ``metadata`` (or null).

    Why it holds: with no ``\\u`` escape in the bytes, each ``:`` is either inside a string, as
    written, or follows a key; a key written twice adds a ``:`` the parsed objects do not hold.
    Tensor names and metadata are the only strings that may hold one (dtypes are known names).
    """
    keys = 4 * len(names) + meta_key + len(metadata or ())
    colons = raw.count(b":")
    if colons == keys:  # the common case: no string holds a colon
        return True
    strings = "".join(names).count(":")
    if metadata:
        strings += "".join(metadata).count(":") + "".join(metadata.values()).count(":")
    return colons == keys + strings


def strict(text: str) -> Any:
    """Parse ``text`` as serde_json does, as far as parsing goes; :class:`Refused` for NaN,
    Infinity and floats beyond 64 bits. What :func:`check_values` checks is left to it.

    Repeated keys come back as :class:`Repeated` objects, and ``-0`` as :class:`NegativeZero`;
    the caller judges them where it knows which keys are struct fields. An integer hook costs
    as much as the parse, so it runs only where the text holds a ``-0``. Integers of 2**64 or
    more, which serde_json reads as floats, stay Python ints: the validator refuses them as sizes,
    :func:`check_values` those beyond a float. RecursionError (nesting Python's parser cannot
    follow) and ValueError (an integer of more digits than ``int()`` converts) are the caller's.
    """
    hook = _integer if "-0" in text and _NEG_ZERO_TEXT.search(text) else None
    try:
        return json.loads(text, object_pairs_hook=_object, parse_int=hook, parse_float=_float,
                          parse_constant=_constant)
    except json.JSONDecodeError as exc:
        raise Refused(f"header is not JSON ({exc.msg} at char {exc.pos})") from None


def check_values(top: dict[str, Any], metadata: Any, *, surrogates: bool) -> None:
    """:class:`Refused` for what serde_json refuses in any value, the replaced values of a
    repeated key included (it read those too): nesting past :data:`MAX_DEPTH`, an integer beyond
    a 64-bit float, and (when ``surrogates``: the text holds a ``\\u`` escape) a lone surrogate,
    in a key or a value.

    ``top`` is the header without ``__metadata__``, which is ``metadata``. A walk of every value:
    for headers whose entries are not all plain (the only ones that can nest or hide a number).
    Depth first, one iterator per open container: the walk's own memory is bounded by the
    nesting (at most :data:`MAX_DEPTH`), not by the count of containers (a tuple per container
    took a 10 MB list of ``{}`` from +241 MB to +703 MB).
    """
    for root in (top, {"__metadata__": metadata}):
        stack: list[tuple[Iterator[tuple[Any, Any]], str | None]] = [(_items(root), None)]
        while stack:
            items, where = stack[-1]
            for k, v in items:
                here = k if where is None else where  # the top-level key: a tensor name or __metadata__
                # The key first: serde_json reads it whatever its value is, an object or a list included.
                if surrogates and ((type(k) is str and _SURROGATE.search(k)) or (type(v) is str and _SURROGATE.search(v))):
                    raise Refused(f"header holds a lone UTF-16 surrogate escape (not Unicode) in {_place(here, where, k)}")
                kind = type(v)
                if kind in _CONTAINERS:
                    if len(stack) >= MAX_DEPTH:  # v is one level deeper than its container, empty or not
                        raise Refused(TOO_DEEP)
                    if v:
                        stack.append((_items(v), here))
                        break  # into v; this container's iterator resumes after it
                elif kind is int and not _MIN_I64 <= v <= MAX_U64 and not _fits_f64(v):
                    raise Refused(f"header holds an integer of {len(str(abs(v)))} digits in {_place(here, where, k)}, "
                                  "beyond a 64-bit float")
            else:
                stack.pop()


def _items(node: Any) -> Iterator[tuple[Any, Any]]:
    """(key, value) pairs of an object, the values a repeated key replaced included; (index,
    value) of a list."""
    if isinstance(node, Repeated):
        return chain(node.items(), node.earlier)
    return iter(node.items()) if isinstance(node, dict) else enumerate(node)


def check_strings(strings: Iterable[str]) -> None:
    """:class:`Refused` for a lone surrogate in ``strings``: the only check a plain header needs
    once the text holds a ``\\u`` escape (its other strings are known dtype names)."""
    if _SURROGATE.search("".join(strings)):
        raise Refused("header holds a lone UTF-16 surrogate escape (not Unicode) in a tensor name or __metadata__")


def replaced(obj: Any) -> list[tuple[str, Any]]:
    """The (key, value) pairs a later value of the same key replaced in ``obj``; none in most."""
    return obj.earlier if isinstance(obj, Repeated) else []


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) == len(pairs):
        return out
    last = {k: i for i, (k, _) in enumerate(pairs)}
    rep = Repeated(out)
    rep.earlier = [pair for i, pair in enumerate(pairs) if last[pair[0]] != i]  # the parser's own tuples
    return rep


def _integer(text: str) -> int | float:
    return _NEG_ZERO_VALUE if text == "-0" else int(text)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise Refused(f"header holds the number {_clip(text)}, beyond a 64-bit float")
    return value


def _constant(name: str) -> float:
    raise Refused(f"header holds {name}, which is not JSON (safetensors refuses NaN and Infinity)")


def _place(top: str, where: str | None, key: Any) -> str:
    """Where in the header a refused string is: a tensor's name, its entry, or __metadata__."""
    if top == "__metadata__":
        return "__metadata__"
    name = ascii(top[:80] + ("..." if len(top) > 80 else ""))
    return f"tensor name {name}" if where is None and _SURROGATE.search(key) else f"the entry of tensor {name}"


def _clip(text: str) -> str:
    return text if len(text) <= 24 else f"{text[:20]}..."


def _fits_f64(value: int) -> bool:
    try:
        float(value)
    except OverflowError:
        return False
    return True
