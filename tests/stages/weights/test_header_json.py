"""The shard header's JSON, judged as safetensors reads it: each case asks ``safetensors.safe_open``
in the test itself, so day0's verdict and the library's cannot drift apart silently.

Every case also records what safetensors 0.8 said when it was written: if a new release changes
its mind, the case fails saying so, and day0's rule (day0/model/safetensors_json.py) is revisited.
"""

from __future__ import annotations

import json
import struct
import tracemalloc
from pathlib import Path
from typing import NamedTuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from day0.model import safetensors_header as sh
from day0.model import safetensors_json as sjson
from day0.model.safetensors_header import HeaderError, read_header
from day0.stages.weights import audit
from tests.support import ckpt_factory as cf

U8 = b'{"dtype":"U8","shape":[2],"data_offsets":[0,2]}'


def entry(extra: bytes = b"", dtype: bytes = b'"U8"', shape: bytes = b"[2]", offsets: bytes = b"[0,2]") -> bytes:
    return b'{"dtype":' + dtype + b',"shape":' + shape + b',"data_offsets":' + offsets + extra + b"}"


class Case(NamedTuple):
    header: bytes
    data_len: int
    loads: bool  # what safetensors 0.8.0 said when the case was written
    says: str = ""  # a phrase day0's refusal must hold


CASES: dict[str, Case] = {
    # refused by safetensors, passed by day0 before
    "bom": Case(b"\xef\xbb\xbf{\"a\":" + U8 + b"}", 2, False, "byte-order mark"),
    "metadata-twice": Case(b'{"__metadata__":{"k":"v"},"__metadata__":{"k":"v"},"a":' + U8 + b"}", 2, False,
                           "__metadata__ is written twice"),
    "metadata-twice-null": Case(b'{"__metadata__":null,"__metadata__":null,"a":' + U8 + b"}", 2, False,
                                "__metadata__ is written twice"),
    "dtype-twice": Case(b'{"a":{"dtype":"U8","dtype":"U8","shape":[2],"data_offsets":[0,2]}}', 2, False,
                        "dtype is written twice"),
    "data-offsets-twice": Case(b'{"a":' + entry(b',"data_offsets":[0,2]') + b"}", 2, False,
                               "data_offsets is written twice"),
    "dtype-twice-one-spelled-with-an-escape": Case(
        b'{"a":{"dtype":"U8","d\\u0074ype":"U8","shape":[2],"data_offsets":[0,2]}}', 2, False, "dtype is written twice"),
    "tensor-twice-earlier-not-an-entry": Case(b'{"a":5,"a":' + U8 + b"}", 2, False, "tensor a is written twice"),
    "tensor-three-times-the-first-not-an-entry": Case(b'{"a":5,"a":' + U8 + b',"a":' + U8 + b"}", 2, False,
                                                      "tensor a is written 3 times, and an earlier entry is a int"),
    "tensor-twice-earlier-dim-negative-zero": Case(b'{"a":' + entry(shape=b"[2,-0]") + b',"a":' + U8 + b"}", 2, False,
                                                   "tensor a is written twice"),
    "offset-negative-zero": Case(b'{"a":' + entry(offsets=b"[-0,2]") + b"}", 2, False, "reads -0 as a float"),
    "dim-negative-zero": Case(b'{"a":' + entry(shape=b"[0,-0]", offsets=b"[0,0]") + b"}", 0, False,
                              "reads -0 as a float"),
    "1e400-in-an-extra-field": Case(b'{"a":' + entry(b',"x":1e400') + b"}", 2, False, "beyond a 64-bit float"),
    "minus-1e400": Case(b'{"a":' + entry(b',"x":[-1e400]') + b"}", 2, False, "beyond a 64-bit float"),
    "400-digit-integer": Case(b'{"a":' + entry(b',"x":' + b"9" * 400) + b"}", 2, False, "400 digits"),
    "nan": Case(b'{"a":' + entry(b',"x":NaN') + b"}", 2, False, "NaN"),
    "infinity": Case(b'{"a":' + entry(b',"x":-Infinity') + b"}", 2, False, "Infinity"),
    "lone-high-surrogate-in-a-name": Case(b'{"\\ud800":' + U8 + b"}", 2, False, "lone UTF-16 surrogate"),
    "lone-low-surrogate-in-a-name": Case(b'{"a\\udc00":' + U8 + b"}", 2, False, "lone UTF-16 surrogate"),
    "high-surrogate-then-no-low": Case(b'{"\\ud800\\u0041":' + U8 + b"}", 2, False, "lone UTF-16 surrogate"),
    "lone-surrogate-in-metadata": Case(b'{"__metadata__":{"k":"\\ud800"},"a":' + U8 + b"}", 2, False,
                                       "lone UTF-16 surrogate"),
    "lone-surrogate-in-an-earlier-metadata-value": Case(b'{"__metadata__":{"k":"\\ud800","k":"ok"},"a":' + U8 + b"}", 2,
                                                        False, "lone UTF-16 surrogate"),
    "lone-surrogate-in-an-extra-field": Case(b'{"a":' + entry(b',"x":["\\udfff"]') + b"}", 2, False,
                                             "lone UTF-16 surrogate"),
    "lone-surrogate-key-of-a-list-in-an-entry": Case(b'{"a":' + entry(b',"\\ud800":[]') + b"}", 2, False,
                                                     "lone UTF-16 surrogate escape (not Unicode) in the entry of tensor 'a'"),
    "lone-surrogate-key-of-an-object-in-an-extra-field": Case(b'{"a":' + entry(b',"x":[{"\\udc00":{"y":1}}]') + b"}", 2,
                                                              False, "lone UTF-16 surrogate"),
    "lone-surrogate-in-a-name-beside-an-extra-field": Case(
        b'{"a\\ud800":' + U8 + b',"b":' + entry(b',"x":1', offsets=b"[2,4]") + b"}", 4, False,
        "lone UTF-16 surrogate escape (not Unicode) in tensor name 'a\\ud800'"),
    "dim-2-64-beside-a-zero": Case(b'{"a":' + entry(shape=b"[0,18446744073709551616]", offsets=b"[0,0]") + b"}", 0,
                                   False, "2**64 or more"),
    "dims-overflow-before-a-zero": Case(b'{"a":' + entry(shape=b"[4294967296,4294967296,0]", offsets=b"[0,0]") + b"}",
                                        0, False, "64-bit"),
    "nested-128-levels": Case(b'{"a":' + entry(b',"x":' + b"[" * 126 + b"]" * 126) + b"}", 2, False,
                              "nested too deeply"),
    "float-dim-after-the-same-int-shape": Case(
        b'{"a":' + U8 + b',"b":' + entry(shape=b"[2.0]", offsets=b"[2,4]") + b"}", 4, False, "non-negative integers"),
    "bool-dim-after-the-same-int-shape": Case(
        b'{"a":' + entry(shape=b"[1]", offsets=b"[0,1]") + b',"b":' + entry(shape=b"[true]", offsets=b"[1,2]") + b"}",
        2, False, "non-negative integers"),
    "shape-an-object": Case(b'{"a":' + entry(shape=b"{}", offsets=b"[0,1]") + b"}", 1, False, "non-negative integers"),
    "utf16-header": Case(b'{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}'.decode().encode("utf-16-le"), 2,
                         False, "not JSON"),
    # accepted by safetensors: day0 must pass them too
    "plain": Case(b'{"__metadata__":{"format":"pt"},"a":' + U8 + b"}", 2, True),
    "leading-whitespace": Case(b' \n\t{"a":' + U8 + b"}", 2, True),
    "trailing-space-padding": Case(b'{"a":' + U8 + b"}     ", 2, True),
    "tensor-twice-the-last-counts": Case(b'{"a":' + entry(shape=b"[4]", offsets=b"[0,4]") + b',"a":' + U8 + b"}", 2,
                                         True),
    "tensor-twice-earlier-overflows": Case(
        b'{"a":' + entry(shape=b"[4294967296,4294967296,0]", offsets=b"[0,0]") + b',"a":' + U8 + b"}", 2, True),
    "metadata-key-twice": Case(b'{"__metadata__":{"k":"1","k":"2"},"a":' + U8 + b"}", 2, True),
    "extra-field-twice": Case(b'{"a":' + entry(b',"x":1,"x":2') + b"}", 2, True),
    "numbers-serde-reads-as-floats-in-an-extra-field": Case(
        b'{"a":' + entry(b',"x":[-0,18446744073709551616,-9223372036854775809,1.7976931348623157e308,1e-400]') + b"}",
        2, True),
    "nested-127-levels": Case(b'{"a":' + entry(b',"x":' + b"[" * 125 + b"]" * 125) + b"}", 2, True),
    "surrogate-pair-in-a-name": Case(b'{"\\ud83d\\ude00":' + U8 + b"}", 2, True),
    "escaped-backslash-before-u": Case(b'{"a\\\\ud800":' + U8 + b"}", 2, True),
    "colons-and-escaped-quotes-in-strings": Case(
        b'{"__metadata__":{"a:b":"{\\"x\\": 1}"},"l:0":' + U8 + b',"l:1":' + entry(offsets=b"[2,4]") + b"}", 4, True),
    "dim-2-64-minus-1-after-a-zero": Case(b'{"a":' + entry(shape=b"[0,18446744073709551615]", offsets=b"[0,0]") + b"}",
                                          0, True),
    "dims-2-61-then-zero": Case(b'{"a":' + entry(b"", b'"BF16"', b"[2305843009213693952,0]", b"[0,0]") + b"}", 0, True),
}


def write(path: Path, case: Case) -> Path:
    return cf.write_raw_shard(path, case.header, case.data_len)


def safetensors_loads(path: Path) -> bool:
    try:
        with safe_open(str(path), framework="np") as fh:
            for name in fh.keys():
                fh.get_slice(name).get_shape()
    except Exception:
        return False
    return True


def day0_refusal(path: Path) -> str | None:
    """The first line day0 refuses the shard with, or None when it passes."""
    try:
        header = read_header(path)
    except HeaderError as exc:
        return str(exc)
    return header.problems[0].message if header.problems else None


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_day0_refuses_a_header_exactly_when_safetensors_does(tmp_path: Path, case: Case) -> None:
    path = write(tmp_path / "x.safetensors", case)
    library = safetensors_loads(path)
    assert library == case.loads, f"safetensors now {'loads' if library else 'refuses'} this header: revisit day0's rule"
    refusal = day0_refusal(path)
    assert (refusal is None) == library, refusal
    if refusal is not None:
        assert refusal.startswith("x.safetensors: ") and "\n" not in refusal and case.says in refusal, refusal


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_the_fast_parse_and_the_strict_one_judge_alike(tmp_path: Path, case: Case,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """msgspec's parse is only a shortcut: without it every header gets the same verdict and words."""
    path = write(tmp_path / "x.safetensors", case)
    with_fast = day0_refusal(path)
    monkeypatch.setattr(sjson, "fast", lambda raw: None)
    assert day0_refusal(path) == with_fast


def test_an_ordinary_header_is_judged_on_the_fast_parse_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The strict parse costs a few times msgspec's: a header as writers produce it (names with
    colons included) must not need it."""
    ck = cf.make_checkpoint(tmp_path / "m", num_shards=1)
    ordinary = read_header(ck.path(0))
    colons = write(tmp_path / "c.safetensors", CASES["colons-and-escaped-quotes-in-strings"])
    monkeypatch.setattr(sh, "_strict", lambda *a: pytest.fail("the strict parse ran on an ordinary header"))
    assert read_header(ck.path(0)).tensors == ordinary.tensors and not ordinary.problems
    assert set(read_header(colons).tensors) == {"l:0", "l:1"}


REFUSED = [name for name, case in CASES.items() if not case.loads]


@pytest.mark.parametrize("name", REFUSED)
def test_the_audit_names_the_shard_in_one_failed_check(tmp_path: Path, name: str) -> None:
    ck = cf.make_checkpoint(tmp_path / "m")
    write(ck.path(1), CASES[name])
    failed = [c for c in audit(ck.dir) if c.failed and c.id in ("weights.shard_header", "weights.shard_layout")]
    assert failed, name
    assert failed[0].message.startswith(f"{ck.shards[1]}: ") and CASES[name].says in failed[0].message


def test_a_key_written_many_times_is_one_problem_with_its_count(tmp_path: Path) -> None:
    """Each repetition was its own problem, kept for the whole audit: a 5 MB header of "t":0
    repeated held 833,323 of them (2.2 s, +271 MB) and the CLI printed 200 identical lines."""
    n = 50_000
    header = b"{" + b'"t":0,' * n + b'"__metadata__":{},' * 3 + b'"t":' + U8 + b"}"
    path = write(tmp_path / "x.safetensors", Case(header, 2, False))
    assert not safetensors_loads(path)
    expected = [
        f"x.safetensors: tensor t is written {n + 1:,} times, and an earlier entry is a int, not an object "
        "(safetensors reads each value)",
        "x.safetensors: __metadata__ is written 3 times (safetensors refuses a repeated field)"]
    assert [p.message for p in read_header(path).problems] == expected
    ck = cf.make_checkpoint(tmp_path / "m")
    write(ck.path(1), Case(header, 2, False))
    failed = [c.message for c in audit(ck.dir) if c.failed and c.id in ("weights.shard_header", "weights.shard_layout")]
    assert failed == [f"{ck.shards[1]}: {m.split(': ', 1)[1]}" for m in expected], failed


def _peak_bytes(raw: bytes) -> int:
    """Peak Python memory parse_header allocates on ``raw`` (the bytes themselves excluded)."""
    tracemalloc.start()
    try:
        sh.parse_header(raw, 8 + len(raw), "x.safetensors")
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _ordinary(size: int, first: bytes = b"") -> bytes:
    """An ordinary header of about ``size`` bytes: empty tensors, ``first`` before them."""
    e = entry(shape=b"[0]", offsets=b"[0,0]")
    parts = [b'"layer.%d.w":%s' % (i, e) for i in range(size // (len(e) + 14))]
    return b"{" + first + b",".join(parts) + b"}"


def test_the_strict_parse_costs_about_what_an_ordinary_header_of_its_size_costs() -> None:
    """The strict path held the fast parse while it parsed again, and its walk kept a tuple per
    container: a 10 MB list of {} in an extra field took +703 MB, and a 20 MB ordinary header with
    one name written twice +466 MB, against +227 MB for the same header without the repeat."""
    size = 1_000_000
    ordinary = _peak_bytes(_ordinary(size))
    e = entry(shape=b"[0]", offsets=b"[0,0]")
    many_objects = b'{"t":' + entry(b',"x":[' + b"{}," * (size // 3) + b"{}]", b'"U8"', b"[0]", b"[0,0]") + b"}"
    name_twice = _ordinary(size, b'"a":' + e + b',"a":' + e + b",")
    # Measured on 1 MB: 5.7x and 1.9x the ordinary header's peak before, 2.0x and 1.0x after (the
    # 333,000 dicts themselves: msgspec's parse costs about as much).
    assert _peak_bytes(many_objects) < 3 * ordinary
    assert _peak_bytes(name_twice) < 1.5 * ordinary


names = st.text(alphabet='ab:."\\', min_size=1, max_size=4)


@st.composite
def headers_with_repeats(draw: st.DrawFn) -> tuple[bytes, int]:
    """Valid headers (names and metadata may hold colons and escapes), then keys written twice:
    a tensor (its earlier value an entry or not), a field, __metadata__, a metadata key, an extra."""
    tensors = draw(st.lists(names, min_size=1, max_size=4, unique=True))
    parts = [json.dumps(t) + ":" + json.dumps({"dtype": "U8", "shape": [1], "data_offsets": [i, i + 1]})
             for i, t in enumerate(tensors)]
    meta = draw(st.dictionaries(names, names, max_size=2))
    if meta or draw(st.booleans()):
        parts.insert(0, '"__metadata__":' + json.dumps(meta))
    for kind, at in draw(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 9)), max_size=2)):
        i = at % len(tensors)
        name = json.dumps(tensors[i])
        field = '"dtype":"U8",' if kind == 0 else '"x":1,' if kind == 1 else ""
        if field:  # a field or an extra written twice in tensor i's entry
            parts = [p.replace(":{", ":{" + field, 1) if p.startswith(name + ":") else p for p in parts]
        elif kind == 2:
            parts.insert(at % (len(parts) + 1), name + ":" + json.dumps({"dtype": "U8", "shape": [9], "data_offsets": [0, 9]}))
        elif kind == 3:
            parts.insert(at % (len(parts) + 1), name + ":[1]")
        elif kind == 4:
            parts.insert(at % (len(parts) + 1), '"__metadata__":{}')
        elif meta:
            key = json.dumps(next(iter(meta)))
            parts = [p.replace('"__metadata__":{', '"__metadata__":{' + key + ':"v",', 1) for p in parts]
    return ("{" + ",".join(parts) + "}").encode(), len(tensors)


@given(header=headers_with_repeats())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_keys_written_twice_are_judged_as_safetensors_judges_them(
        tmp_path_factory: pytest.TempPathFactory, header: tuple[bytes, int]) -> None:
    """The fast path proves "no key twice" by counting colons; safetensors is the judge of the proof."""
    path = write(tmp_path_factory.mktemp("r") / "x.safetensors", Case(*header, loads=True))
    refusal = day0_refusal(path)
    assert (refusal is None) == safetensors_loads(path), (header[0], refusal)


def test_the_length_field_still_counts_trailing_padding(tmp_path: Path) -> None:
    """Space padding after the JSON is part of the header (writers align the data to 8 bytes)."""
    path = write(tmp_path / "x.safetensors", CASES["trailing-space-padding"])
    raw = path.read_bytes()
    assert struct.unpack("<Q", raw[:8])[0] == len(CASES["trailing-space-padding"].header)
    assert read_header(path).data_start == 8 + len(CASES["trailing-space-padding"].header)
