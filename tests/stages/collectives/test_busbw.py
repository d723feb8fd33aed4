"""The busbw formulas against nccl-tests' definitions (doc/PERFORMANCE.md, src/*.cu)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from day0.core.collective_ops import OPS, UnknownCollective, canonical_op
from day0.stages.collectives.busbw import algbw_gbps, bus_factor, busbw_gbps, plan, size_from_count

ranks = st.integers(min_value=1, max_value=4096)
sizes = st.integers(min_value=0, max_value=1 << 40)
secs = st.floats(min_value=1e-7, max_value=1e3, allow_nan=False, allow_infinity=False)
elem = st.sampled_from([1, 2, 4, 8])


def test_factors_match_the_nccl_tests_table():
    n = 8
    assert bus_factor("all_reduce", n) == pytest.approx(2 * 7 / 8)
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        assert bus_factor(op, n) == pytest.approx(7 / 8)
    for op in ("broadcast", "sendrecv", "reduce"):
        assert bus_factor(op, n) == 1.0


def test_a_known_h100_line_reproduces():
    # all_reduce_perf on 8 GPUs, 128 MiB in 635.2 us: nccl-tests prints algbw 211.30 busbw 369.77.
    s, t = 134217728, 635.2e-6
    assert round(algbw_gbps(s, t), 2) == 211.30
    assert round(busbw_gbps("all_reduce", s, t, 8), 2) == 369.77


@given(op=st.sampled_from(OPS.runnable()), n=ranks, size=sizes, t=secs)
def test_busbw_is_algbw_times_factor(op, n, size, t):
    assert busbw_gbps(op, size, t, n) == pytest.approx(algbw_gbps(size, t) * bus_factor(op, n))


@given(n=ranks)
def test_factor_bounds_and_single_rank(n):
    for op in OPS:
        f = bus_factor(op, n)
        assert 0.0 <= f < 2.0
    # all_reduce moves twice what reduce_scatter or all_gather moves (reduce-scatter + all-gather).
    assert bus_factor("all_reduce", n) == pytest.approx(2 * bus_factor("reduce_scatter", n))
    if n == 1:
        assert bus_factor("all_reduce", 1) == 0.0  # nothing crosses a bus with one rank
        assert bus_factor("sendrecv", 1) == 1.0


@given(size=st.integers(min_value=1, max_value=1 << 40), t=secs, k=st.floats(min_value=1.01, max_value=100))
def test_algbw_is_linear_in_size_and_inverse_in_time(size, t, k):
    assert algbw_gbps(size * k, t) == pytest.approx(k * algbw_gbps(size, t))
    assert algbw_gbps(size, t * k) == pytest.approx(algbw_gbps(size, t) / k)


def test_no_time_no_bandwidth():
    assert math.isnan(algbw_gbps(1024, 0.0))
    assert math.isnan(busbw_gbps("all_reduce", 1024, -1.0, 4))


@given(op=st.sampled_from([op for op in OPS.runnable() if not OPS[op].uneven_splits]), size=sizes, e=elem,
       n=st.integers(min_value=1, max_value=512))
@settings(max_examples=300)
def test_plan_rounds_down_like_nccl_tests(op, size, e, n):
    """Even ops; an uneven op's point is whole rows of its routing (tests/stages/collectives/test_expert.py)."""
    p = plan(op, size, e, n)
    assert p.size_bytes <= size
    split = op in ("all_gather", "reduce_scatter", "all_to_all")
    assert size - p.size_bytes < (e * n if split else e)
    if split:
        assert p.elements == p.chunk * n
    else:
        assert p.chunk == p.elements
    assert size_from_count(op, p.count, e, n) == p.size_bytes


@pytest.mark.parametrize(
    "spelling,name",
    [("allreduce", "all_reduce"), ("all_reduce_perf", "all_reduce"), ("alltoall", "all_to_all"),
     ("AllGather", "all_gather"), ("sendrecv_perf", "sendrecv"), ("bcast", "broadcast"),
     ("reduce-scatter", "reduce_scatter")],
)
def test_canonical_names(spelling, name):
    assert canonical_op(spelling) == name


def test_unknown_op_names_itself():
    with pytest.raises(UnknownCollective, match="allfoo"):
        bus_factor("allfoo", 2)
    with pytest.raises(ValueError, match="nranks"):
        bus_factor("all_reduce", 0)
