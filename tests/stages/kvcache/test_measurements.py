"""KV-cache measurements: the fragmentation formula (property-based, against a slot-by-slot model),
the /metrics estimator on real prometheus_client expositions, the workload, the checks, and one
short run against a live in-process engine on the tiny model."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from day0.client.prom import PromError
from day0.config.kvcache import KvCacheSection
from day0.config.profile import load_profile
from day0.engine import Endpoint
from day0.stages import kvcache as kv

# --------------------------------------------------------------------------- the formula


def slot_model(holdings: list[kv.Holding], block_size: int) -> tuple[int, int]:
    """(distinct slots, filled slots), block by block and slot by slot: the definition, literally."""
    filled: dict[int, set[int]] = {}
    for h in holdings:
        for i, bid in enumerate(h.block_ids):
            if bid is None:
                continue
            slots = filled.setdefault(bid, set())
            for j in range(block_size):
                if i * block_size + j < h.stored_tokens:
                    slots.add(j)
    return len(filled) * block_size, sum(len(s) for s in filled.values())


@st.composite
def pools(draw, max_requests: int = 6):
    """Requests as vLLM builds them: a leading run of blocks possibly shared with an earlier request
    (a prefix hit, always full blocks), then private blocks; optional null placeholders in front."""
    bs = draw(st.sampled_from([1, 2, 16, 32]))
    next_id = iter(range(1, 10_000))
    holdings: list[kv.Holding] = []
    shareable: list[int] = []
    for _ in range(draw(st.integers(0, max_requests))):
        nulls = draw(st.integers(0, 2)) if draw(st.booleans()) else 0
        donor = draw(st.sampled_from(holdings)) if holdings and draw(st.booleans()) else None
        shared: list[int | None] = []
        if donor is not None:  # a prefix hit reuses the donor's full leading blocks
            full = [b for i, b in enumerate(donor.block_ids) if b is not None and (i + 1) * bs <= donor.stored_tokens]
            shared = list(full[: draw(st.integers(0, len(full)))])
        private = [next(next_id) for _ in range(draw(st.integers(0, 5)))]
        ids = [None] * nulls + shared + private
        if not ids:
            continue
        lo = (nulls + len(shared)) * bs  # hits and placeholders count as computed tokens
        stored = draw(st.integers(lo, len(ids) * bs))
        holdings.append(kv.Holding(ids, stored))
    # what the sampler sees: the leading run of placeholders and blocks with ref_cnt > 1
    ref_cnt: dict[int, int] = {}
    for h in holdings:
        for b in h.block_ids:
            if b is not None:
                ref_cnt[b] = ref_cnt.get(b, 0) + 1
    for h in holdings:
        k = 0
        while k < len(h.block_ids) and (h.block_ids[k] is None or ref_cnt[h.block_ids[k]] > 1):
            k += 1
        shareable.append(k)
    return bs, holdings, shareable


@given(pools())
def test_count_blocks_equals_the_slot_model(pool):
    bs, holdings, _ = pool
    blocks = kv.count_blocks(holdings, bs)
    slots, filled = slot_model(holdings, bs)
    assert (blocks.allocated_tokens, blocks.stored_tokens) == (slots, filled)
    assert blocks.fragmentation == (0.0 if slots == 0 else 1 - filled / slots)


@given(pools())
def test_leading_scan_equals_the_full_count(pool):
    """The sampler only looks at each request's leading shared run; the rest is counted in O(1)."""
    bs, holdings, shareable = pool
    fast = [kv.Holding(h.block_ids, h.stored_tokens, k) for h, k in zip(holdings, shareable)]
    assert kv.count_blocks(fast, bs) == kv.count_blocks(holdings, bs)


class FakeScheduler:
    """The V1 scheduler's shape (block tables of objects with ref_cnt), mutated the ways vLLM mutates
    it, so the sampler's between-step cache of shared runs can be checked against a full recount."""

    def __init__(self, bs: int) -> None:
        self.bs = bs
        self.ids = iter(range(1, 1_000_000))
        self.tables: dict[str, list] = {}
        self.requests: dict[str, SimpleNamespace] = {}
        self.waiting: list = []
        pool = SimpleNamespace(num_gpu_blocks=10_000, null_block=SimpleNamespace(block_id=0, ref_cnt=0, is_null=True),
                               get_usage=lambda: 0.0)
        mgr = SimpleNamespace(block_size=bs, req_to_blocks=self.tables)
        self.kv_cache_manager = SimpleNamespace(coordinator=SimpleNamespace(single_type_managers=[mgr]), block_pool=pool)

    def new_block(self) -> SimpleNamespace:
        return SimpleNamespace(block_id=next(self.ids), ref_cnt=1, is_null=False)

    def add(self, rid: str, donor: str | None, hit: int, private: int, fill: int) -> None:
        shared = []
        if donor in self.tables:  # a prefix hit: the donor's leading full blocks, ref_cnt + 1
            full = self.requests[donor].num_computed_tokens // self.bs
            shared = [b for b in self.tables[donor][: min(hit, full)] if not b.is_null]
            for b in shared:
                b.ref_cnt += 1
        own = [self.new_block() for _ in range(max(private, 0 if shared else 1))]
        self.tables[rid] = shared + own
        stored = len(shared) * self.bs + min(fill, len(own) * self.bs)
        self.requests[rid] = SimpleNamespace(num_computed_tokens=stored, num_output_tokens=1)

    def grow(self, rid: str, tokens: int) -> None:
        req, table = self.requests[rid], self.tables[rid]
        req.num_computed_tokens += tokens
        while req.num_computed_tokens > len(table) * self.bs:
            table.append(self.new_block())

    def finish(self, rid: str) -> None:
        for b in self.tables.pop(rid):
            b.ref_cnt -= 1
        del self.requests[rid]

    def holdings(self) -> list[kv.Holding]:
        return [kv.Holding([None if b.is_null else b.block_id for b in t], self.requests[r].num_computed_tokens)
                for r, t in self.tables.items()]


ops_st = st.lists(st.tuples(st.sampled_from(["add", "grow", "finish"]), st.integers(0, 7), st.integers(0, 6),
                            st.integers(0, 4), st.integers(0, 100)), min_size=1, max_size=40)


@given(st.sampled_from([4, 16]), ops_st)
def test_sampler_between_steps_equals_a_full_recount(bs, ops):
    sched = FakeScheduler(bs)
    sampler = kv.SchedulerSampler(sched)
    for n, (op, who, hit, private, tokens) in enumerate(ops):
        rid, live = f"r{n}", sorted(sched.tables)
        if op == "add" or not live:
            sched.add(rid, live[who % len(live)] if live else None, hit, private, tokens)
        elif op == "grow":
            sched.grow(live[who % len(live)], tokens)
        else:
            sched.finish(live[who % len(live)])
        got = sampler.sample(float(n))
        slots, filled = slot_model(sched.holdings(), bs)
        assert (got.allocated_tokens, got.stored_tokens) == (slots, filled)
        assert got.running == len(sched.tables)


@given(st.integers(1, 64), st.integers(1, 100_000))
def test_one_request_wastes_less_than_one_block(bs, stored):
    blocks = math.ceil(stored / bs)
    c = kv.count_blocks([kv.Holding(list(range(blocks)), stored)], bs)
    assert c.allocated_tokens - c.stored_tokens == blocks * bs - stored < bs
    assert 0 <= c.fragmentation < bs / c.allocated_tokens


def test_shared_prefix_blocks_count_once():
    prefix = [1, 2, 3]  # 3 full blocks of 4
    a = kv.Holding(prefix + [10], 14)
    b = kv.Holding(prefix + [20, 21], 19)
    c = kv.count_blocks([a, b], 4)
    assert c.blocks == 6 and c.stored_tokens == 12 + 2 + 7


@given(st.integers(0, 10**9), st.integers(0, 10**9))
def test_fragmentation_formula(stored, allocated):
    if stored > allocated:
        with pytest.raises(ValueError, match="tokens stored in"):
            kv.fragmentation(stored, allocated)
        return
    f = kv.fragmentation(stored, allocated)
    assert 0.0 <= f <= 1.0
    assert f == (0.0 if allocated == 0 else 1 - stored / allocated)


def test_count_blocks_rejects_overfull_tables():
    with pytest.raises(ValueError, match="stores 33 tokens in 1 blocks of 32"):
        kv.count_blocks([kv.Holding([1], 33)], 32)


samples_st = st.lists(
    st.tuples(st.integers(0, 50_000), st.integers(0, 50_000)).map(lambda p: (min(p), max(p))), min_size=1, max_size=40)


@given(samples_st)
def test_token_weighted_mean_is_the_allocation_weighted_mean_of_steps(pairs):
    samples = [kv.KvSample(t=i, allocated_tokens=a, stored_tokens=s, usage=0.0, running=1) for i, (s, a) in enumerate(pairs)]
    summ = kv.summarize(samples)
    held = [(s, a) for s, a in pairs if a > 0]
    assume(held)
    weighted = sum(a * (1 - s / a) for s, a in held) / sum(a for _, a in held)
    assert summ.mean == pytest.approx(weighted, abs=1e-12)
    assert summ.peak == max(1 - s / a for s, a in held)
    assert summ.samples == len(held)


def test_peak_only_counts_samples_at_long_context():
    samples = [kv.KvSample(0, 64, 40, 0.0, 1), kv.KvSample(1, 4096, 4090, 0.0, 2)]
    summ = kv.summarize(samples, long_context_tokens=2048)
    assert summ.peak == pytest.approx(6 / 4096) and summ.peak_samples == 1
    assert summ.mean == pytest.approx(1 - 4130 / 4160)


@pytest.mark.parametrize("states, steady", [
    ([(1, 10, False), (8, 10, False)], True),
    ([(0, 10, False), (5, 10, False)], False),  # one still prefilling
    ([(9, 10, False)], False),  # about to finish
    ([(0, 10, True), (3, 10, False)], True),  # finished ones do not matter
])
def test_is_steady(states, steady):
    assert kv.is_steady(states) is steady


# --------------------------------------------------------------------------- the black-box estimator


def exposition(engines: dict[str, tuple[float, int, int]], *, running: int | None = None, hits: float = 0.0,
               queries: float = 0.0, preemptions: float = 0.0, pool_bytes: int | None = None) -> str:
    """A real exposition from prometheus_client, shaped like vLLM's (engine -> usage, block size, blocks)."""
    reg = CollectorRegistry()
    usage = Gauge("vllm:kv_cache_usage_perc", "u", ["model_name", "engine"], registry=reg)
    info = Gauge("vllm:cache_config_info", "i", ["block_size", "num_gpu_blocks", "kv_cache_memory_bytes", "engine"],
                 registry=reg)
    run_g = Gauge("vllm:num_requests_running", "r", ["model_name", "engine"], registry=reg)
    c_hits = Counter("vllm:prefix_cache_hits", "h", ["model_name", "engine"], registry=reg)
    c_q = Counter("vllm:prefix_cache_queries", "q", ["model_name", "engine"], registry=reg)
    c_p = Counter("vllm:num_preemptions", "p", ["model_name", "engine"], registry=reg)
    for eng, (u, bs, n) in engines.items():
        usage.labels("m", eng).set(u)
        info.labels(str(bs), str(n), str(pool_bytes) if pool_bytes else "None", eng).set(1)
        if running is not None:
            run_g.labels("m", eng).set(running)
        c_hits.labels("m", eng).inc(hits)
        c_q.labels("m", eng).inc(queries)
        c_p.labels("m", eng).inc(preemptions)
    return generate_latest(reg).decode()


@given(st.integers(2, 200_000), st.data())
def test_used_blocks_are_recovered_exactly_from_the_usage_gauge(num_blocks, data):
    used = data.draw(st.integers(0, num_blocks - 1))
    usage = 1.0 - (num_blocks - 1 - used) / (num_blocks - 1)  # BlockPool.get_usage, as vLLM computes it
    m = kv.parse_kv_metrics(exposition({"0": (usage, 32, num_blocks)}))
    assert (m.used_blocks, m.usable_blocks, m.block_size, m.engines) == (used, num_blocks - 1, 32, 1)


def test_engines_are_summed_and_counters_read():
    text = exposition({"0": (0.5, 16, 101), "1": (0.25, 16, 101)}, running=3, hits=64, queries=256, preemptions=2,
                      pool_bytes=1 << 30)
    m = kv.parse_kv_metrics(text)
    assert (m.used_blocks, m.usable_blocks, m.running) == (75, 200, 6)
    assert (m.prefix_hits, m.prefix_queries, m.preemptions, m.kv_cache_memory_bytes) == (128, 512, 4, 1 << 30)


@pytest.mark.parametrize("text, match", [
    ("# nothing here\n", "no vllm:kv_cache_usage_perc"),
    ('vllm:kv_cache_usage_perc{engine="0"} 0.5\n', "no vllm:cache_config_info"),
    ('vllm:kv_cache_usage_perc{engine="0"} 0.5\nvllm:cache_config_info{engine="0",block_size="x"} 1\n',
     "no integer block_size"),
    ("this is { not prometheus\n", "not a Prometheus exposition"),
])
def test_bad_metrics_are_one_line_errors(text, match):
    with pytest.raises(PromError, match=match):
        kv.parse_kv_metrics(text)


_CONFIG = 'vllm:cache_config_info{engine="0",block_size="16",num_gpu_blocks="101"} 1\n'


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf", "1e400"])
@pytest.mark.parametrize("metric, rest", [
    ("vllm:kv_cache_usage_perc", ""),
    ("vllm:num_requests_running", 'vllm:kv_cache_usage_perc{engine="0"} 0.5\n'),
    ("vllm:num_requests_waiting", 'vllm:kv_cache_usage_perc{engine="0"} 0.5\n'),
    ("vllm:prefix_cache_hits_total", 'vllm:kv_cache_usage_perc{engine="0"} 0.5\n'),
])
def test_a_gauge_no_number_can_be_is_a_prom_error_naming_it(metric, rest, value):
    """NaN, +Inf or 1e400 reached round() or int() and raised ValueError or OverflowError, which
    the kvcache stage's callers (catching PromError) did not expect."""
    with pytest.raises(PromError, match="^" + metric.removesuffix("_total") + " is "):
        kv.parse_kv_metrics(_CONFIG + rest + f'{metric}{{engine="0"}} {value}\n')


@pytest.mark.parametrize("text, match", [
    ('vllm:kv_cache_usage_perc{engine="0"} 1.5\n', r"^vllm:kv_cache_usage_perc is 1.5, not a number in \[0, 1\]"),
    ('vllm:kv_cache_usage_perc{engine="0"} -0.1\n', "^vllm:kv_cache_usage_perc is -0.1"),
    ('vllm:kv_cache_usage_perc{engine="0"} 0.5\nvllm:num_requests_running{engine="0"} 2.5\n',
     "^vllm:num_requests_running is 2.5, not a count of requests"),
    ('vllm:kv_cache_usage_perc{engine="0"} 0.5\nvllm:num_requests_waiting{engine="0"} 1e300\n',
     "^vllm:num_requests_waiting is 1e\\+300, not a count of requests"),
])
def test_a_gauge_out_of_its_domain_is_a_prom_error_naming_it(text, match):
    with pytest.raises(PromError, match=match):
        kv.parse_kv_metrics(_CONFIG + text)


def test_a_block_count_past_a_float_is_a_prom_error():
    """usage x (num_gpu_blocks - 1) of 400 digits raised OverflowError."""
    text = 'vllm:cache_config_info{engine="0",block_size="16",num_gpu_blocks="1' + "0" * 400 + '"} 1\n'
    with pytest.raises(PromError, match="^vllm:cache_config_info has block_size 16 and num_gpu_blocks 1000"):
        kv.parse_kv_metrics(text + 'vllm:kv_cache_usage_perc{engine="0"} 0.5\n')


def engine_state(prompts: list[int], outs: list[int], bs: int, prefix: int = 0, group: list[int] | None = None):
    """What vLLM would hold: per request ceil((prompt + out - 1) / bs) blocks, a shared prefix's full blocks once."""
    shared = (prefix // bs) if group else 0
    blocks = sum(math.ceil((p + o - 1) / bs) for p, o in zip(prompts, outs)) - shared * (len(group or []) - 1)
    stored = sum(p + o - 1 for p, o in zip(prompts, outs)) - shared * bs * (len(group or []) - 1)
    return blocks, stored


@given(st.lists(st.integers(40, 5000), min_size=1, max_size=6), st.sampled_from([16, 32]), st.data())
def test_estimator_matches_the_engine_in_steady_state(prompts, bs, data):
    """Scripted /metrics for a known engine state: the client-side estimate is exact."""
    max_tokens = 50
    outs = [data.draw(st.integers(1, max_tokens - 2)) for _ in prompts]
    prefix = data.draw(st.integers(0, min(prompts) - 1))
    group = [0, 1] if len(prompts) > 1 and prefix >= bs else None
    blocks, stored = engine_state(prompts, outs, bs, prefix, group)
    n = 100_000
    text = exposition({"0": (blocks / (n - 1), bs, n)}, running=len(prompts))
    flights = [kv.Flight(p, max_tokens, received=o, prefix_group=0 if group and i in group else None,
                         prefix_len=prefix if group and i in group else 0) for i, (p, o) in enumerate(zip(prompts, outs))]
    snap = [f.snapshot() for f in flights]
    s = kv.blackbox_sample(1.0, kv.parse_kv_metrics(text), flights, snap, snap)
    assert s.usable and s.stored_tokens == stored and s.used_blocks == blocks
    assert s.as_sample().fragmentation == pytest.approx(kv.fragmentation(stored, blocks * bs))


def test_estimator_refuses_what_it_cannot_know():
    m = kv.parse_kv_metrics(exposition({"0": (10 / 999, 32, 1000)}, running=2))
    f = [kv.Flight(100, 10, received=3), kv.Flight(200, 10, received=0)]
    snap = [x.snapshot() for x in f]
    assert "prefilling" in kv.blackbox_sample(0, m, f, snap, snap).reason
    f[1].received = 9
    snap = [x.snapshot() for x in f]
    assert "about to finish" in kv.blackbox_sample(0, m, f, snap, snap).reason
    f[1].received = 4
    before = [x.snapshot() for x in f]
    f[0].done = True
    assert "finished during the scrape" in kv.blackbox_sample(0, m, f, before, [x.snapshot() for x in f]).reason
    f[0].done = False
    m3 = kv.parse_kv_metrics(exposition({"0": (10 / 999, 32, 1000)}, running=3))
    snap = [x.snapshot() for x in f]
    assert "other traffic" in kv.blackbox_sample(0, m3, f, snap, snap).reason


# --------------------------------------------------------------------------- workload and config failures


def tiny_settings(**over) -> KvCacheSection:
    base = dict(context_lengths=[1024, 256], short_requests=2, short_lengths=[40, 80], shared_prefix_tokens=100,
                shared_prefix_requests=2, output_tokens=8)
    return KvCacheSection(**{**base, **over})


def test_workload_shape_and_vocabulary():
    s = tiny_settings()
    wl = kv.build_workload(s, 384, {0, 1})
    assert [r.kind for r in wl] == ["long", "long", "shared", "shared", "short", "short"]
    assert [r.context for r in wl[:2]] == [1024, 256]
    assert all(r.max_tokens == 8 for r in wl)
    assert all(2 <= t < 384 for r in wl for t in r.prompt)
    assert wl[2].prompt[:100] == wl[3].prompt[:100] and wl[2].prompt[100:] != wl[3].prompt[100:]
    assert all(40 <= r.context <= 80 for r in wl if r.kind == "short")
    assert kv.build_workload(s, 384, {0, 1}) == wl
    assert kv.build_workload(s, 384, {0, 1}, salt="b")[0].prompt != wl[0].prompt
    assert kv.expected_hit_tokens(wl, 32) == 96


def test_profile_rejects_inconsistent_workloads():
    with pytest.raises(ValueError, match="short_lengths"):
        KvCacheSection(output_tokens=100, short_lengths=[64, 512])
    with pytest.raises(ValueError, match="context_lengths"):
        KvCacheSection(output_tokens=16, context_lengths=[16])
    assert load_profile("cpu-tiny").kvcache.context_lengths == [8192, 4096, 2048]


def test_workload_longer_than_max_model_len_is_a_config_failure_naming_both_numbers():
    wl = kv.build_workload(tiny_settings(context_lengths=[40000]), 384)
    with pytest.raises(kv.WorkloadRejected) as info:
        kv.check_fits(wl, 32768)
    assert "40000" in str(info.value) and "32768" in str(info.value)
    check = kv.rejected_check("kvcache.workload_fits", info.value, "http")
    assert check.status == "fail" and (check.value, check.limit) == (40000, 32768)
    kv.check_fits(wl, 40000)


@pytest.mark.parametrize("message, asked, engine", [
    ("The decoder prompt (length 40000) is longer than the maximum model length of 32768. Make sure", 40000, 32768),
    ("This model's maximum context length is 32768 tokens. However, your prompt contains 40000 input tokens, which "
     "exceeds this limit even without any output tokens.", 40000, 32768),
    ('http_400: {"error":{"message":"This model\'s maximum context length is 32768 tokens. However, your prompt '
     'contains at least 32769 input tokens', 32769, 32768),
])
def test_engine_refusals_are_parsed(message, asked, engine):
    r = kv.rejection_from_message(message, 0)
    assert r is not None and (r.context, r.max_model_len) == (asked, engine)
    assert kv.rejection_from_message("CUDA out of memory", 0) is None


# --------------------------------------------------------------------------- checks


def exact_run(fracs: list[float], *, error: str | None = None) -> kv.ExactRun:
    samples = [kv.KvSample(t=i, allocated_tokens=32_000, stored_tokens=round(32_000 * (1 - f)), usage=0.1,
                           running=3, steady=True, step=i) for i, f in enumerate(fracs)]
    reqs = [kv.RequestRecord(0, "long", 1000, 10, 10, 0, 0, True)]
    return kv.ExactRun(samples=samples, requests=reqs, block_size=32, num_blocks=8192, error=error)


def test_the_exact_hit_rate_is_a_skip_with_prefix_caching_off_as_the_http_views_is():
    """vLLM reports 0 cached tokens a request with caching off: the exact view read 0% and failed
    the shared-prefix floor, where the HTTP view of the same engine skipped."""
    s = tiny_settings()
    wl = kv.build_workload(s, 384)
    off = exact_run([0.01])
    off.prefix_caching = False
    hit = {c.id: c for c in kv.exact_checks(off, wl, s)}["kvcache.prefix_cache_hit_rate"]
    assert hit.status == "skip" and "prefix caching off" in hit.message
    on = {c.id: c for c in kv.exact_checks(exact_run([0.01]), wl, s)}["kvcache.prefix_cache_hit_rate"]
    assert on.status in ("pass", "fail") and on.value is not None


def test_exact_checks_pass_fail_and_keep_partial_samples():
    s = tiny_settings()
    wl = kv.build_workload(s, 384)
    ok = {c.id: c for c in kv.exact_checks(exact_run([0.01, 0.02]), wl, s)}
    assert ok["kvcache.fragmentation"].status == "pass" and ok["kvcache.fragmentation"].value == pytest.approx(1.5)
    assert ok["kvcache.fragmentation"].evidence["charts"][0]["reference"][0]["y"] == 5.0
    assert ok["kvcache.fragmentation_peak"].value == pytest.approx(2.0)
    bad = {c.id: c for c in kv.exact_checks(exact_run([0.04, 0.08]), wl, s)}
    assert bad["kvcache.fragmentation"].status == "fail" and bad["kvcache.fragmentation_peak"].status == "fail"
    died = {c.id: c for c in kv.exact_checks(exact_run([0.01], error="EngineDeadError: worker died"), wl, s)}
    assert died["kvcache.engine_alive"].status == "error" and "worker died" in died["kvcache.engine_alive"].message
    assert died["kvcache.fragmentation"].evidence["samples"] == [1.0]
    empty = {c.id: c for c in kv.exact_checks(exact_run([], error="EngineDeadError: x"), wl, s)}
    assert empty["kvcache.fragmentation"].status == "error"


def test_agreement_check():
    s = tiny_settings()
    bb = kv.BlackBoxRun(samples=[kv.BlackBoxSample(0.5, 1000, 32, 0.1, 2, 32_000 - 400, 2)])
    near = kv.agreement_check(exact_run([0.013]), bb, s)  # 1.3% vs 1.25%
    assert near.status == "pass" and near.value == pytest.approx(0.05, abs=1e-6)
    far = kv.agreement_check(exact_run([0.03]), bb, s)
    assert far.status == "fail" and far.value == pytest.approx(1.75, abs=1e-6)
    none = kv.agreement_check(exact_run([0.01]), kv.BlackBoxRun(samples=[]), s)
    assert none.status == "error" and "/metrics" in none.message  # could not measure: INCOMPLETE, not REJECTED


def test_capacity_margin_and_plan_table():
    cap = kv.Capacity(block_size=32, num_blocks=8192, kv_bytes_per_token=4096, target_context=16384,
                      target_concurrency=2, min_margin=0.5, engine_kv_bytes_per_token=4096)
    plan = SimpleNamespace(kv_bytes_per_token=4096, block_size=32, kv_blocks=8192, kv_tokens=262144,
                           kv_pool_bytes=1 << 30, tokens_needed=32768)
    checks = {c.id: c for c in kv.capacity_checks(cap, plan, "http")}
    assert checks["kvcache.capacity"].status == "pass" and checks["kvcache.capacity"].limit == 49152
    assert cap.margin == pytest.approx(262112 / 32768 - 1)
    assert checks["kvcache.kv_bytes_per_token"].status == "pass"
    assert checks["kvcache.capacity"].evidence["table"]["rows"][3] == ["KV blocks", 8192, 8192]
    small = kv.Capacity(32, 1024, 4096, 16384, 2, 0.0)
    assert kv.capacity_checks(small, None, "http")[0].status == "fail"


def test_capacity_is_judged_per_data_parallel_engine():
    """Two engines of 10K tokens each were summed into 20K that "held" a 16K context (a request's KV
    fits in one engine), and one null block was taken out in all instead of one each."""
    two = kv.Capacity(block_size=32, num_blocks=2 * 313, kv_bytes_per_token=4096, target_context=16384,
                      target_concurrency=1, min_margin=0.0, engines=2)
    assert two.pool_tokens == 312 * 32 and two.needed_tokens == 16384
    check = kv.capacity_checks(two, None, "http")[0]
    assert check.status == "fail" and "per engine, of 2 data-parallel engines" in check.message
    shared = kv.Capacity(32, 2 * 1025, 4096, 16384, 4, 0.0, engines=2)  # each engine serves 2 of the 4
    assert shared.needed_tokens == 2 * 16384 and kv.capacity_checks(shared, None, "http")[0].status == "pass"


def test_config_kv_bytes_per_token_splits_heads_and_layers():
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "num_attention_heads": 4,
           "num_key_value_heads": 2, "num_hidden_layers": 4, "head_dim": 64, "torch_dtype": "float32",
           "vocab_size": 384, "intermediate_size": 512}
    assert kv.config_kv_bytes_per_token(cfg, {"dtype": "float32"}) == 2 * 4 * 2 * 64 * 4
    assert kv.config_kv_bytes_per_token(cfg, {"dtype": "float32", "tensor_parallel_size": 2,
                                              "pipeline_parallel_size": 2}) == 2 * 2 * 1 * 64 * 4


def test_prefix_check_flags_a_difference_and_an_idle_cache():
    same = kv.PrefixProbe([1, 2, 3], [1, 2, 3], 0, 96, 128)
    assert [c.status for c in kv.prefix_check(same, "http")] == ["pass", "pass"]
    diff = kv.PrefixProbe([1, 2, 3], [1, 5, 3], 0, 96, 128)
    assert kv.prefix_check(diff, "http")[0].status == "fail" and "from token 1" in kv.prefix_check(diff, "http")[0].message
    cold = kv.PrefixProbe([1], [1], 0, 0, 128)
    assert kv.prefix_check(cold, "http")[1].status == "fail"


# --------------------------------------------------------------------------- running both views


class FakeEngines:
    """The session's Engines as run_views sees them: each view is an engine or the error starting it raises."""

    def __init__(self, http, scheduler) -> None:
        self._views = {"http": http, "scheduler": scheduler}
        self.asked: list[str] = []

    def _view(self, name):
        self.asked.append(name)
        if isinstance(self._views[name], BaseException):
            raise self._views[name]
        return self._views[name]

    def http(self):
        return self._view("http")

    def scheduler(self):
        return self._view("scheduler")


HTTP_ENGINE = SimpleNamespace(endpoint=Endpoint("http://engine", "m", headers={"Authorization": "Bearer k"}), alive=None)


def test_views_run_http_first_and_a_view_that_cannot_start_is_a_check(monkeypatch):
    from day0.engine import EngineError, ViewUnavailable
    from day0.stages.kvcache import views

    s, calls = tiny_settings(), []
    wl = kv.build_workload(s, 384)

    def blackbox(base_url, model, workload, *, samples, headers, **kw):
        calls.append(("blackbox", base_url, model, headers))
        return kv.BlackBoxRun(samples=samples, scrapes=0, block_size=32, passes=1)

    monkeypatch.setattr(views, "run_blackbox", blackbox)
    monkeypatch.setattr(views, "run_exact", lambda llm, workload, **kw: calls.append(("exact", llm)) or exact_run([0.01]))
    both = kv.run_views(FakeEngines(HTTP_ENGINE, SimpleNamespace(llm="llm")), wl, s)
    assert calls == [("blackbox", "http://engine", "m", {"Authorization": "Bearer k"}), ("exact", "llm")]
    assert both.exact is not None and both.blackbox is not None and both.why_incomparable() is None
    assert [c.id for c in both.checks][:2] == ["kvcache.fragmentation", "kvcache.fragmentation_peak"]

    gpu = kv.run_views(FakeEngines(EngineError("server died", log_excerpt="OOM"), ViewUnavailable("not on GPUs")),
                       wl, s)
    checks = {c.id: c for c in gpu.checks}
    assert checks["kvcache.fragmentation"].status == "skip" and checks["kvcache.fragmentation"].message == "not on GPUs"
    bb = checks["kvcache.blackbox_fragmentation"]
    assert bb.status == "error" and bb.message == "engine failed: server died" and bb.evidence["log_excerpt"] == "OOM"
    assert gpu.exact is None and gpu.blackbox is None
    assert gpu.why_incomparable() == "needs both the scheduler and the HTTP view (both are started on CPU targets only)"


def test_an_interrupted_view_keeps_its_samples(monkeypatch):
    from day0.stages.kvcache import views

    s = tiny_settings()
    wl = kv.build_workload(s, 384)

    def exact(llm, workload, *, samples, **kw):
        samples.extend(exact_run([0.01, 0.02]).samples)
        raise KeyboardInterrupt

    monkeypatch.setattr(views, "run_blackbox", lambda *a, **kw: kv.BlackBoxRun(samples=[]))
    monkeypatch.setattr(views, "run_exact", exact)
    out = kv.ViewRuns()
    with pytest.raises(KeyboardInterrupt):
        kv.run_views(FakeEngines(HTTP_ENGINE, SimpleNamespace(llm="llm")), wl, s, out=out)
    checks = {c.id: c for c in out.checks}
    assert out.exact is not None and out.exact.error == "interrupted" and len(out.exact.samples) == 2
    assert checks["kvcache.fragmentation"].value == pytest.approx(1.5) and checks["kvcache.engine_alive"].status == "error"


# --------------------------------------------------------------------------- one live engine


def test_live_inprocess_engine_accounting_matches_the_block_pool():
    """The tiny model in-process: at every step our per-request count equals the pool's own count of
    blocks in use (shared prefix blocks once), the prefix hit happens, and bad input is refused."""
    from day0.engine import InprocessEngine

    profile = load_profile("cpu-tiny")
    eng = InprocessEngine(profile, log=lambda m: None)
    eng.start()
    try:
        size, specials = kv.workload_vocab(profile)
        s = tiny_settings(context_lengths=[700, 300], shared_prefix_tokens=200, short_lengths=[40, 90], output_tokens=6)
        wl = kv.build_workload(s, size, specials)
        run = kv.run_exact(eng.llm, wl)
        assert run.error is None and run.rejected is None
        assert [r.output_tokens for r in run.requests] == [6] * len(wl)
        pool = eng.scheduler.kv_cache_manager.block_pool
        for sample in run.samples:
            assert sample.allocated_tokens // run.block_size == round(sample.usage * (pool.num_gpu_blocks - 1))
        assert any(x.steady for x in run.samples)
        assert run.requests[3].cached_tokens == kv.expected_hit_tokens(wl, run.block_size) > 0
        assert 0 < kv.summarize(run.samples).mean < 0.2

        too_long = kv.build_workload(tiny_settings(context_lengths=[40000], short_requests=0, shared_prefix_tokens=0),
                                     size, specials)
        rejected = kv.run_exact(eng.llm, too_long)
        limit = str(profile.engine.args["max_model_len"])
        assert rejected.rejected is not None and "40000" in str(rejected.rejected) and limit in str(rejected.rejected)
        assert not rejected.samples

        probe = kv.prefix_probe_inprocess(eng.llm, kv.probe_prompt(tiny_settings(prefix_check_tokens=300), size,
                                                                    specials), 4)
        assert probe.identical and probe.cold_cached == 0 and probe.warm_cached >= 256

        real_step, calls = eng.llm.llm_engine.step, []

        def dying_step():  # the engine dies on its third step
            calls.append(1)
            if len(calls) > 2:
                raise RuntimeError("worker died (injected)")
            return real_step()

        eng.llm.llm_engine.step = dying_step
        died = kv.run_exact(eng.llm, kv.build_workload(s, size, specials, salt="dies"))
        assert died.error == "RuntimeError: worker died (injected)" and len(died.samples) == 2
        checks = {c.id: c for c in kv.exact_checks(died, wl, s)}
        assert checks["kvcache.engine_alive"].status == "error" and "injected" in checks["kvcache.engine_alive"].message
        assert len(checks["kvcache.fragmentation"].evidence["time_series"]["t_s"]) == 2
    finally:
        eng.stop()
