"""Reading and validating safetensors headers without touching tensor data.

Why not ``safetensors.safe_open``: it stops at the first inconsistency with a terse error
("invalid header length", "incomplete metadata") and maps the whole file. A Day-0 audit of a
multi-terabyte checkpoint must read only the first kilobytes of each shard and report *every*
broken tensor by name, so the format (8-byte little-endian header length, a JSON header, then
one byte buffer the header's ``data_offsets`` index into) is parsed here directly. The rules
match safetensors' own validation (tests check both agree on arbitrary mutated headers):
tensors tile the byte buffer exactly, in offset order, with no hole and no overlap, each tensor
spans ``numel x element size`` bytes, and the last tensor ends where the file ends. The JSON is
read as safetensors' serde_json reads it (:mod:`day0.model.safetensors_json`), not as Python's.
"""

from __future__ import annotations

import json
import math
import reprlib
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any, Literal

from day0.core.inputs import InputError, open_regular
from day0.model import safetensors_json as sjson

MAX_HEADER_BYTES = 100_000_000  # safetensors refuses larger headers (HeaderTooLarge)
LENGTH_FIELD_BYTES = 8
MAX_RANK = 64  # dimensions of one tensor; real ones have at most 5
MAX_BYTES = 2**64 - 1  # safetensors sizes are u64: a shape whose bytes overflow it is refused (ValidationOverflow)

# Bits per element for every dtype safetensors 0.8 knows. Sub-byte types (F4, F6_*) pack several
# elements per byte; a tensor of them must still occupy a whole number of bytes.
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}

ProblemKind = Literal["layout", "size"]


def loads_json(raw: bytes | str) -> Any:
    """``json.loads``, through msgspec's decoder when it is installed (vLLM depends on it).

    Why: a 1,000-shard checkpoint carries ~40 MB of header and index JSON; msgspec parses it
    several times faster. Anything msgspec refuses (NaN, integers beyond 64 bits, bad syntax) goes
    to the standard library, which either accepts it or raises the familiar JSONDecodeError.
    """
    if _msgspec_decode is not None:
        try:
            return _msgspec_decode(raw)
        except Exception:
            pass
    return json.loads(raw)


try:
    from msgspec.json import decode as _msgspec_decode
except ImportError:  # pragma: no cover - msgspec ships with vLLM
    _msgspec_decode = None


class HeaderError(ValueError):
    """The header cannot be read at all; the message is one line naming the file."""


@dataclass(slots=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int
    valid: bool = True  # False: dtype or shape unusable (reported); only its offsets are trusted

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True, slots=True)
class Problem:
    """One inconsistency inside a header. ``kind`` 'size' = the file is shorter/longer than the header says."""

    kind: ProblemKind
    message: str
    tensor: str | None = None
    value: Any = None
    limit: Any = None


@dataclass
class ShardHeader:
    """What a shard's header declares, plus every problem found in it."""

    name: str
    file_size: int
    header_len: int
    tensors: dict[str, TensorEntry] = field(default_factory=dict)
    metadata: dict[str, Any] | None = None
    problems: list[Problem] = field(default_factory=list)

    @property
    def data_start(self) -> int:
        return LENGTH_FIELD_BYTES + self.header_len

    @property
    def declared_size(self) -> int:
        """The file size the header implies: length field + header + end of the last tensor."""
        end = max((t.end for t in self.tensors.values()), default=0)
        return self.data_start + end


def read_header(path: Path, name: str | None = None) -> ShardHeader:
    """Parse and validate one shard's header, reading only ``8 + header length`` bytes.

    Raises :class:`HeaderError` when there is no usable header (too short, absurd length, not
    UTF-8/JSON/an object); every other inconsistency lands in ``ShardHeader.problems``.
    """
    label = name or Path(path).name
    raw, file_size = read_header_bytes(path, label)
    return parse_header(raw, file_size, label)


def read_header_bytes(path: Path, label: str) -> tuple[bytes, int]:
    """(raw JSON header bytes, file size): the I/O half of :func:`read_header`.

    Kept apart so many shards can be read by threads (I/O releases the GIL) while the parsing,
    which holds it, runs in one thread.
    """
    try:
        fh, st = open_regular(path, label=label)
        with fh:
            file_size = st.st_size
            head = fh.read(LENGTH_FIELD_BYTES)
            if len(head) < LENGTH_FIELD_BYTES:
                raise HeaderError(
                    f"{label}: file is {file_size} bytes, shorter than the 8-byte header length field"
                )
            n = int.from_bytes(head, "little")
            if n > MAX_HEADER_BYTES:
                raise HeaderError(
                    f"{label}: header length field says {n} bytes (safetensors allows at most "
                    f"{MAX_HEADER_BYTES}); not a safetensors file, or its first bytes are corrupt"
                )
            if LENGTH_FIELD_BYTES + n > file_size:
                raise HeaderError(
                    f"{label}: header length field says {n} bytes but only "
                    f"{file_size - LENGTH_FIELD_BYTES} follow it (file truncated inside the header?)"
                )
            raw = fh.read(n)
    except InputError as exc:
        raise HeaderError(str(exc)) from None
    except OSError as exc:
        raise HeaderError(f"{label}: cannot read ({exc.strerror or exc})") from None
    if len(raw) != n:
        raise HeaderError(f"{label}: header changed size while being read ({len(raw)} of {n} bytes)")
    return raw, file_size


def parse_header(raw: bytes, file_size: int, label: str) -> ShardHeader:
    """Decode the JSON header bytes as safetensors does and validate them against the file size.

    An ordinary header is judged on msgspec's fast parse; one that the fast parse cannot vouch
    for (see :mod:`day0.model.safetensors_json`) is parsed again the strict way and judged on that.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HeaderError(f"{label}: header is not UTF-8 (byte {exc.start} of the header)") from None
    if raw.startswith(sjson.BOM):
        raise HeaderError(f"{label}: header starts with a UTF-8 byte-order mark (EF BB BF), which safetensors "
                          "refuses: the JSON must start at the header's first byte")
    obj = sjson.fast(raw)
    if obj is not None:
        meta_key = "__metadata__" in obj
        header, plain = _judge(obj, len(raw), file_size, label)
        if plain and sjson.no_repeated_key(raw, header.tensors, header.metadata, meta_key):
            return header
        del obj, header  # the strict parse must not hold the fast one too: it doubled the peak
    return _strict(text, len(raw), file_size, label)


def _strict(text: str, header_len: int, file_size: int, label: str) -> ShardHeader:
    """The header parsed and judged the serde_json way: what that refuses while parsing is a
    :class:`HeaderError` (the shard is unreadable to safetensors), the rest the header's problems."""
    try:
        obj = sjson.strict(text)
    except sjson.Refused as exc:
        raise HeaderError(f"{label}: {exc}") from None
    except RecursionError:  # safetensors headers are 3 levels deep; this one is thousands
        raise HeaderError(f"{label}: {sjson.TOO_DEEP}") from None
    except ValueError as exc:  # an integer of more digits than int() converts
        raise HeaderError(f"{label}: header is not usable JSON ({str(exc).split(';')[0]})") from None
    if not isinstance(obj, dict):
        raise HeaderError(f"{label}: header JSON is a {type(obj).__name__}, not an object (starts {text[:16]!r})")
    metadata = obj.get("__metadata__")
    header, plain = _judge(obj, header_len, file_size, label)
    try:
        if not plain:
            sjson.check_values(obj, metadata, surrogates="\\u" in text)
        elif "\\u" in text:  # a metadata key written twice keeps the header plain: its earlier values count too
            meta = header.metadata or {}
            sjson.check_strings([*header.tensors, *meta, *meta.values(), *(v for _, v in sjson.replaced(meta))])
    except sjson.Refused as exc:
        raise HeaderError(f"{label}: {exc}") from None
    return header


def _judge(obj: dict[str, Any], header_len: int, file_size: int, label: str) -> tuple[ShardHeader, bool]:
    """The header ``obj`` declares, with its problems; and whether it is plain: metadata of
    strings, every entry exactly a known dtype, a shape and a pair of offsets, no key twice."""
    header = ShardHeader(name=label, file_size=file_size, header_len=header_len)
    plain = type(obj) is dict
    header.problems.extend(_repeated_keys(obj, label))
    metadata = obj.pop("__metadata__", None)
    if metadata is not None:
        if not isinstance(metadata, dict) or not all(type(v) is str for v in metadata.values()) or any(
                type(v) is not str for _, v in sjson.replaced(metadata)):
            plain = False
            header.problems.append(
                Problem("layout", f"{label}: __metadata__ must map strings to strings", "__metadata__")
            )
        else:
            header.metadata = metadata
    data_start = LENGTH_FIELD_BYTES + header_len
    header.tensors, problems, entries_plain = _validate(obj, file_size - data_start, label, data_start)
    header.problems.extend(problems)
    return header, plain and entries_plain


def _repeated_keys(obj: dict[str, Any], label: str) -> list[Problem]:
    """One problem per top-level key written twice that safetensors refuses, with its count of
    repetitions: ``__metadata__`` (a struct field), or a tensor name one of whose earlier values is
    not an entry. Fine otherwise: serde_json reads each value, and the last one counts.

    Why once per key: a 5 MB header of ``"t":0`` repeated gave 833,323 identical problems (2.2 s
    and +271 MB, kept for the whole audit); a key's earlier values are judged only until one fails.
    """
    times: dict[str, int] = {}
    why: dict[str, str] = {}
    for key, value in sjson.replaced(obj):
        times[key] = times.get(key, 1) + 1
        if key != "__metadata__" and key not in why and (bad := _not_an_entry(value)):
            why[key] = bad
    problems = []
    for key, n in times.items():
        written = "written twice" if n == 2 else f"written {n:,} times"
        if key == "__metadata__":
            message = f"__metadata__ is {written} (safetensors refuses a repeated field)"
        elif key in why:
            message = f"tensor {short_name(key)} is {written}, and {why[key]} (safetensors reads each value)"
        else:
            continue
        problems.append(Problem("layout", f"{label}: {message}", key))
    return problems


def validate_entries(
    entries: dict[str, Any], data_len: int, label: str = "shard", data_start: int = 0
) -> tuple[dict[str, TensorEntry], list[Problem]]:
    """Check tensor entries against each other and a byte buffer of ``data_len`` bytes.

    Returns the well-formed entries and every problem: malformed entries, byte lengths that
    disagree with dtype x shape, holes and overlaps between tensors, and a buffer that is shorter
    (truncated) or longer (padded) than the tensors cover.
    """
    tensors, problems, _ = _validate(entries, data_len, label, data_start)
    return tensors, problems


def _validate(
    entries: dict[str, Any], data_len: int, label: str, data_start: int
) -> tuple[dict[str, TensorEntry], list[Problem], bool]:
    """:func:`validate_entries`, and whether every entry was plain (exactly a known dtype, a
    shape and a pair of offsets, of integers, no key twice): only then may a fast parse stand."""
    tensors: dict[str, TensorEntry] = {}
    problems: list[Problem] = []
    plain = True
    # (dtype, shape) -> byte length, or None when not a whole number of bytes. Checkpoints repeat
    # a handful of shapes thousands of times (one per layer or expert), so this is mostly hits.
    # A hit needs the dims to be ints: (2.0,), (True,) and (-0.0,) equal (2,), (1,) and (0,).
    nbytes_of: dict[tuple[str, tuple[int, ...]], int | None] = {}
    for tname, info in entries.items():
        entry = None
        if type(info) is dict and len(info) == 3:  # fast path: a well-formed entry, the common case
            try:
                dtype, dims, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
                shape = tuple(dims)
                key = (dtype, shape)
                nbytes = nbytes_of[key] if key in nbytes_of else nbytes_of.setdefault(key, _nbytes(dtype, shape))
                if (nbytes != -1 and type(dims) is list and type(begin) is int and type(end) is int
                        and 0 <= begin <= end <= MAX_BYTES and _ALL_INT(map(type, shape))):
                    entry = TensorEntry(tname, dtype, shape, begin, end)
            except (TypeError, KeyError, ValueError):
                pass
        if entry is None:
            plain = False
            entry = _entry(tname, info, label, problems)
            if entry is None:
                continue
            nbytes = _nbytes(entry.dtype, entry.shape) if entry.valid else -1
        tensors[tname] = entry
        if not entry.valid:
            continue  # reported by _entry; its offsets still take part in the tiling check
        if nbytes is None:
            problems.append(Problem(
                "layout",
                f"{label}: tensor {short_name(tname)}: {entry.numel} x {entry.dtype} is {entry.numel * DTYPE_BITS[entry.dtype]} "
                "bits, not a whole number of bytes",
                tname,
            ))
        elif entry.end - entry.begin != nbytes:
            problems.append(Problem(
                "layout",
                f"{label}: tensor {short_name(tname)}: data_offsets span {entry.end - entry.begin} bytes, "
                f"but {entry.dtype} x {list(entry.shape)} needs {nbytes}",
                tname, entry.end - entry.begin, nbytes,
            ))
    problems.extend(_tiling_problems(tensors, data_len, label, data_start))
    return tensors, problems, plain


def _entry(tname: str, info: Any, label: str, problems: list[Problem]) -> TensorEntry | None:
    """The entry as declared; ``valid=False`` when its dtype or shape is unusable.

    An entry whose offsets are readable still takes part in the tiling check even if its dtype or
    shape is broken, so one bad field gives one problem, not a cascade of holes and size errors.
    """

    def bad(why: str) -> None:
        problems.append(Problem("layout", f"{label}: tensor {short_name(tname)}: {why}", tname))

    if not isinstance(info, dict):
        bad(f"entry is a {type(info).__name__}, not an object")
        return None
    for field_name in sorted({k for k, _ in sjson.replaced(info)} & sjson.STRUCT_FIELDS):
        bad(f"{field_name} is written twice in its entry (safetensors refuses a repeated field)")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_uint(o) or _past_u64(o) for o in offsets):
        bad(f"data_offsets {reprlib.repr(offsets)} is not a pair of non-negative integers{_as_float(offsets)}")
        return None
    begin, end = offsets
    if _past_u64(begin) or _past_u64(end):
        bad(f"data_offsets {reprlib.repr(offsets)} reach past what a 64-bit size can count")
        return None
    if end < begin:
        bad(f"data_offsets [{begin}, {end}] end before they begin")
        return None
    valid = True
    if not isinstance(shape, list) or not all(_is_uint(d) or _past_u64(d) for d in shape):
        bad(f"shape {reprlib.repr(shape)} is not a list of non-negative integers{_as_float(shape)}")
        shape, valid = [], False
    elif len(shape) > MAX_RANK:
        bad(f"shape has {len(shape)} dimensions (at most {MAX_RANK})")
        shape, valid = [], False
    elif any(_past_u64(d) for d in shape):
        bad(f"shape {reprlib.repr(shape)} has a dimension of 2**64 or more: safetensors reads it as a "
            "float, not a 64-bit size, even where a 0 makes the tensor empty")
        shape, valid = [], False
    elif _count_overflows(shape, DTYPE_BITS.get(dtype if isinstance(dtype, str) else "", 8)):
        bad(f"shape {reprlib.repr(shape)} holds more elements or bits than a 64-bit size can count "
            "(safetensors multiplies the dimensions in order and refuses an overflow, even before a 0)")
        shape, valid = [], False
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        bad(f"dtype {reprlib.repr(dtype)} is not a safetensors dtype")
        dtype, valid = reprlib.repr(dtype), False
    return TensorEntry(tname, dtype, tuple(shape), begin, end, valid)


def _not_an_entry(info: Any) -> str:
    """Why an earlier value of a tensor name written twice is not an entry safetensors reads ("" if
    it is one). serde_json reads each value into a tensor entry before the last replaces it, so
    its types count; its offsets and size do not (only the last value is laid out)."""
    if not isinstance(info, dict):
        return f"an earlier entry is a {type(info).__name__}, not an object"
    repeated = sorted({k for k, _ in sjson.replaced(info)} & sjson.STRUCT_FIELDS)
    missing = sorted(sjson.STRUCT_FIELDS - set(info))
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if repeated or missing:
        return f"an earlier entry has {'repeated' if repeated else 'no'} {', '.join(repeated or missing)}"
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        return f"an earlier entry's dtype {reprlib.repr(dtype)} is not a safetensors dtype"
    if not isinstance(shape, list) or not all(_is_uint(d) and d <= MAX_BYTES for d in shape):
        return f"an earlier entry's shape {reprlib.repr(shape)} is not a list of 64-bit sizes"
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_uint(o) and o <= MAX_BYTES for o in offsets):
        return f"an earlier entry's data_offsets {reprlib.repr(offsets)} is not a pair of 64-bit sizes"
    return ""


def _as_float(values: Any) -> str:
    """Why a value spelled as an integer is not one to safetensors ('' if none is such)."""
    if isinstance(values, list) and any(isinstance(v, sjson.NegativeZero) for v in values):
        return " (safetensors' JSON reader, serde_json, reads -0 as a float)"
    return ""


def _past_u64(x: Any) -> bool:
    """An integer of 2**64 or more (which safetensors' serde_json reads as a float)."""
    return type(x) is int and x > MAX_BYTES


def short_name(name: str) -> str:
    """A tensor name as one line may quote it: control characters escaped, whole up to 200
    characters, else its start and its length."""
    if not name.isprintable():
        name = name.encode("unicode_escape").decode("ascii")
    return name if len(name) <= 200 else f"{name[:120]}... ({len(name)} characters)"


def _nbytes(dtype: Any, shape: tuple[Any, ...]) -> int | None:
    """Bytes a tensor occupies; None if not whole bytes; -1 if dtype or shape is malformed."""
    bits = DTYPE_BITS.get(dtype) if isinstance(dtype, str) else None
    if bits is None or len(shape) > MAX_RANK or not all(_is_uint(d) and d <= MAX_BYTES for d in shape):
        return -1
    if _count_overflows(shape, bits):
        return -1  # _entry reports it
    total = math.prod(shape) * bits
    return None if total % 8 else total // 8


def _count_overflows(shape: list[int] | tuple[int, ...], bits: int) -> bool:
    """Whether safetensors' size arithmetic overflows a u64: it multiplies the dimensions in order
    (so [2**40, 2**40, 0] overflows before the 0), then the count by the dtype's bits."""
    numel = 1
    for d in shape:
        numel *= d
        if numel > MAX_BYTES:
            return True
    return numel * bits > MAX_BYTES


_ALL_INT = {int}.issuperset  # of map(type, dims): bool and float are no dims, even where they equal one


def _is_uint(x: Any) -> bool:
    return type(x) is int and x >= 0


def _tiling_problems(
    tensors: dict[str, TensorEntry], data_len: int, label: str, data_start: int
) -> list[Problem]:
    """Tensors must tile [0, data_len) exactly: sorted by offset, each begins where the last ended."""
    problems: list[Problem] = []
    ordered = sorted(tensors.values(), key=attrgetter("begin", "end"))
    cursor = 0
    last: TensorEntry | None = None  # the tensor that reaches furthest so far
    for t in ordered:
        if t.begin > cursor:
            after = f"after {short_name(last.name)}" if last else "at the start of the data"
            problems.append(Problem(
                "layout",
                f"{label}: {t.begin - cursor} bytes [{cursor}, {t.begin}) {after} belong to no tensor "
                f"(hole before {short_name(t.name)})",
                t.name, t.begin, cursor,
            ))
        elif t.begin < cursor and last is not None:
            problems.append(Problem(
                "layout",
                f"{label}: tensor {short_name(t.name)} [{t.begin}, {t.end}) overlaps {short_name(last.name)} "
                f"[{last.begin}, {last.end})",
                t.name, t.begin, cursor,
            ))
        if last is None or t.end >= cursor:
            cursor, last = t.end, t
    if cursor != data_len:
        if cursor > data_len:
            cut = [t.name for t in ordered if t.end > data_len]
            what = f"truncated: {cursor - data_len} bytes missing, {len(cut)} tensor(s) cut off, first {short_name(cut[0])}"
        else:
            what = f"padded: {data_len - cursor} bytes after the end of the last tensor"
        problems.append(Problem(
            "size",
            f"{label}: header says {data_start + cursor} bytes, file has {data_start + data_len} ({what})",
            None, data_start + data_len, data_start + cursor,
        ))
    return problems
