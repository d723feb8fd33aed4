"""The shared reader of untrusted files (day0.core.inputs): what it costs to read one, and the cap."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from day0.core.inputs import InputError, read_regular


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
