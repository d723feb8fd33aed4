"""The shared reader of untrusted files (day0.core.inputs): what it costs to read one, and the cap."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from day0.core.inputs import InputError, read_regular, strict_json


def test_reading_a_small_file_under_a_large_cap_allocates_about_the_file():
    """``read(cap + 1)`` allocated the whole cap before reading: 256 MiB for each 5 kB result
    ``day0 latency import`` read, refused outright under a strict overcommit policy."""
    path = Path(__file__)
    tracemalloc.start()
    try:
        data = read_regular(path, "test file", 256 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert data == path.read_bytes()
    assert peak < 4 * len(data) + (64 << 10)


def test_a_file_that_claims_no_size_is_read_to_its_end_and_to_the_cap():
    """/proc files claim 0 bytes and hold more: what is there is read, up to the cap and no further."""
    status = Path("/proc/self/status")
    if not status.is_file():
        pytest.skip("no /proc")
    assert read_regular(status, "status file", 1 << 20).startswith(b"Name:")
    with pytest.raises(InputError, match="over the 100 bytes a status file may hold"):
        read_regular(status, "status file", 100)


# Every shape the top level of a capped parse reads itself: lists of scalars (counted by their
# commas), of strings holding ']' and ',', of lists, of objects, empty ones, spaces around each
# separator, an object member that is not a list; and a document that is a list.
CAPPED_DOCS = ['{"n": 1, "s": "x]", "xs": [1, 2.5, -3e2, true, null], "ss": ["a]", "b,c", "\\"]"], '
               '"ls": [[1, 2], [], [3]], "os": [{"k": [1]}, {}], "e": [ ], "o": {"in": [1, 2, 3, 4]}}',
               '[1, [2], "3", {"4": 4}]']


def _outcome(text: str, **kw: object) -> tuple[str, object]:
    try:
        return "read", strict_json(text, "f.json", **kw)  # type: ignore[arg-type]
    except InputError as exc:
        return "refused", str(exc)


def _variants(text: str):
    """``text`` cut short at every place, and with each character dropped or replaced by JSON's punctuation."""
    for k in range(len(text) + 1):
        yield text[:k]
        yield text[:k] + text[k + 1:]
        for c in ',:[]{}" 0':
            yield text[:k] + c + text[k + 1:]


@pytest.mark.parametrize("doc", CAPPED_DOCS)
def test_a_capped_parse_reads_and_refuses_as_the_parse_does(doc):
    """With ``max_entries`` the top level is read by day0's own loop around the stdlib's scanner:
    each variant of a document, valid or not, must come out as the plain parse's (the same values,
    or the same refusal in json's own words) whenever no list is over the cap. One difference, on
    purpose: a top-level key written twice is refused where the second is read, before a JSON error
    further on that the plain parse (which looks for twins at the object's end) names instead."""
    for text in _variants(doc):
        capped, plain = _outcome(text, max_entries=100), _outcome(text)
        if capped != plain:
            assert capped[1].startswith("f.json: duplicate key") and plain[0] == "refused", text


def test_a_capped_parse_refuses_the_first_list_of_scalars_over_the_cap_naming_it():
    """Each top-level list of scalars is counted by its commas; one of exactly the cap is read. Lists
    of strings, lists or objects are the C scanner's whole (counting them entry by entry in Python
    made a vLLM result's ITL lists 1.5 to 2x slower to import), so they are read whatever the cap."""
    doc = CAPPED_DOCS[0]
    assert _outcome(doc, max_entries=5) == _outcome(doc)
    for cap, key in ((4, "xs"), (2, "xs"), (0, "xs")):
        kind, line = _outcome(doc, max_entries=cap, reason="a reader holds no more")
        assert (kind, line) == ("refused", f"f.json: {key}: more than {cap:,} entries; a reader holds no more")
    assert _outcome(doc.replace("2.5, -3e2, true, ", ""), max_entries=2) == _outcome(doc.replace("2.5, -3e2, true, ", ""))
    assert _outcome("[1, 2, 3, 4]", max_entries=3) == ("refused", "f.json: (top level): more than 3 entries")
    assert _outcome("[1, 2, 3, 4]", max_entries=4) == _outcome("[1, 2, 3, 4]")
    assert _outcome(CAPPED_DOCS[1], max_entries=1) == _outcome(CAPPED_DOCS[1])
    long_key = '{"' + "k" * 200_000 + '": [1, 2, 3]}'
    kind, line = _outcome(long_key, max_entries=2)
    assert kind == "refused" and len(line) < 200 and line.startswith("f.json: " + "k" * 77 + "...: more than 2 entries")


def test_a_capped_parse_refuses_a_key_twice_before_reading_its_value_again():
    """One key written again and again, each time with a list under the cap, would add up past it."""
    text = '{"a": [1, 2], "a": [3, 4], "a": [' + "5," * 10 + "6]}"
    assert _outcome(text, max_entries=3) == _outcome(text) == (
        "refused", "f.json: duplicate key 'a' (it appears twice in one object: readers disagree on which value counts)")
