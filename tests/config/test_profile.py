"""Profiles: presets, extends, strict validation with key paths, overrides, secret removal."""


import pytest
from hypothesis import given
from hypothesis import strategies as st

from day0.config.errors import SettingsError
from day0.config.latency import LatencySection
from day0.config.profile import (
    ProfileError,
    deep_merge,
    load_profile,
    parse_override,
    preset_names,
)

REQUIRED_PRESETS = {"cpu-tiny", "h200x8", "supernode-tp8pp4-1m", "gb200-nvl72"}


def test_required_presets_ship_and_load():
    assert REQUIRED_PRESETS <= set(preset_names())
    for name in preset_names():
        p = load_profile(name)
        assert p.name == name


def test_default_is_cpu_tiny_on_the_cpu_backend():
    p = load_profile()
    assert p.name == "cpu-tiny"
    assert p.model.source == "tiny"
    assert p.topology.device == "cpu"
    # settings measured to work on the CPU backend (shared/notes/vllm-cpu.md)
    assert p.engine.args["block_size"] % 32 == 0
    assert p.model.tiny.hidden_size // p.model.tiny.num_attention_heads == 64


def test_supernode_preset_is_the_reference_deployment():
    p = load_profile("supernode-tp8pp4-1m")
    a = p.engine.args
    assert (a["tensor_parallel_size"], a["pipeline_parallel_size"]) == (8, 4)
    assert a["max_model_len"] >= 1_000_000 and a["block_size"] == 16 and a["enable_prefix_caching"]
    # INT4 is a quantization method in vLLM, never a dtype
    assert a["dtype"] in {"auto", "half", "float16", "bfloat16", "float", "float32"}
    assert a["quantization"] == "compressed-tensors"
    assert p.topology.world_size == 32


def test_extends_overrides_only_what_it_names(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text('extends = "h200x8"\nname = "mine"\n[sla]\nttft_p99_ms = 900\n[engine.args]\nmax_num_seqs = 7\n')
    p = load_profile(str(f))
    base = load_profile("h200x8")
    assert p.name == "mine"
    assert p.sla.ttft_p99_ms == 900 and p.sla.tpot_p99_ms == base.sla.tpot_p99_ms
    assert p.engine.args["max_num_seqs"] == 7
    assert p.engine.args["tensor_parallel_size"] == base.engine.args["tensor_parallel_size"]


def test_extends_a_relative_file_and_detects_cycles(tmp_path):
    (tmp_path / "a.toml").write_text('extends = "b.toml"\n')
    (tmp_path / "b.toml").write_text('extends = "a.toml"\n')
    with pytest.raises(ProfileError, match="cycle"):
        load_profile(str(tmp_path / "a.toml"))


@pytest.mark.parametrize(
    "text, expected",
    [
        ('[sla]\nttft_p99_ms = "fast"\n', "sla.ttft_p99_ms: expected a number"),
        ("[slaa]\nx = 1\n", "slaa: unknown key"),
        ("[engine]\nmodee = 'server'\n", "engine.modee: unknown key"),
        ('[engine]\nmode = "external"\n', "engine.url: required when mode"),
        ('[model]\nsource = "path"\n', "model.path: required when source"),
        ('[topology]\nnodes = 0\n', "topology.nodes:"),
        ('[topology]\nmaster_port = 65535\n', "topology.master_port:"),  # the collectives' would be 65536
        ('[topology]\nintra_node = "nvl"\n', "topology.intra_node: expected 'shm', 'pcie' or 'nvlink'"),
        ("[kvcache]\nfragmentation_limit = 5\n", "kvcache.fragmentation_limit:"),
        ("[engine.args]\ngpu_memory_utilization = nan\n", "engine.args.gpu_memory_utilization: nan is not a finite"),
        ("[engine.args]\nspeculative_config = {x = [1.0, inf]}\n", "speculative_config.x.1: inf is not a finite"),
        ("[sla]\nttft_p100_ms = 5\n", "sla.limits.ttft_p100_ms: the percentile must lie strictly between 0 and 100"),
        ("[sla]\ntpot_p0_ms = 5\n", "sla.limits.tpot_p0_ms: the percentile must lie strictly between 0 and 100"),
        ('[report]\nsignatories = [{name = "A"}]\n', "report.signatories.0.role: required value missing"),
        ("[sla\n", "not valid TOML"),
        ("extends = 3\n", "extends: expected a string"),
        ('extends = "no-such-preset"\n', "no such preset"),
    ],
)
def test_broken_profiles_name_the_key(tmp_path, text, expected):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(ProfileError) as err:
        load_profile(str(f))
    msg = str(err.value)
    assert expected in msg
    assert "\n" not in msg and str(f) in msg


def test_missing_file_is_named():
    with pytest.raises(ProfileError, match="nowhere.toml: profile file not found"):
        load_profile("nowhere.toml")


def test_engine_args_pass_through_unchanged(tmp_path):
    f = tmp_path / "p.toml"
    f.write_text('[engine.args]\nsome_future_vllm_flag = {a = [1, 2]}\nspeculative_config = {method = "ngram"}\n')
    p = load_profile(str(f))
    assert p.engine.args == {"some_future_vllm_flag": {"a": [1, 2]}, "speculative_config": {"method": "ngram"}}


def test_secrets_are_removed_from_the_resolved_profile():
    p = load_profile("cpu-tiny", overrides={"engine": {"env": {"HF_TOKEN": "hf_abc", "VLLM_API_KEY": "k"}}})
    env = p.resolved()["engine"]["env"]
    assert env["HF_TOKEN"] == "<redacted>" and env["VLLM_API_KEY"] == "<redacted>"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    # look-alike keys are not secrets
    assert p.resolved()["model"]["tiny"]["num_key_value_heads"] == 2


_keys = st.text(alphabet="abcdefgh", min_size=1, max_size=3)
_trees = st.recursive(st.integers() | st.text(max_size=3),
                      lambda children: st.dictionaries(_keys, children, max_size=3), max_leaves=8)


@given(st.dictionaries(_keys, _trees, max_size=4), st.dictionaries(_keys, _trees, max_size=4))
def test_deep_merge_keeps_every_override_and_every_untouched_key(base, over):
    merged = deep_merge(base, over)

    def check(m, b, o):
        for k, v in o.items():
            if isinstance(v, dict) and isinstance(b.get(k), dict):
                check(m[k], b[k], v)
            else:
                assert m[k] == v
        for k, v in b.items():
            if k not in o:
                assert m[k] == v

    check(merged, base, over)


@given(st.lists(st.sampled_from(["engine", "args", "x_y"]), min_size=1, max_size=4), st.integers())
def test_parse_override_builds_the_nested_table(path, value):
    out = parse_override(".".join(path) + f"={value}")
    for p in path:
        out = out[p]
    assert out == value


def test_parse_override_keeps_strings_and_rejects_garbage():
    assert parse_override("engine.mode=inprocess") == {"engine": {"mode": "inprocess"}}
    assert parse_override('engine.args.enforce_eager=true') == {"engine": {"args": {"enforce_eager": True}}}
    # blanks around a dot are not the key's, as TOML reads them (engine.args[" max_num_seqs"] reached vLLM as "-- max-num-seqs")
    assert parse_override("engine.args. max_num_seqs = 8") == {"engine": {"args": {"max_num_seqs": 8}}}
    # the parent is read before overrides apply: --day0-set extends=... changed the record, not the profile
    with pytest.raises(ProfileError, match="extends: a profile's parent cannot be overridden"):
        load_profile("cpu-tiny", overrides=parse_override('extends="cpu-2node"'))
    with pytest.raises(ProfileError):
        parse_override("no-equals-sign")


@pytest.mark.parametrize("override, message", [
    ({"kvcache": {"outptu_tokens": 3}}, "--day0-set: kvcache.outptu_tokens: unknown key; did you mean 'output_tokens'?"),
    ({"engnie": {"mode": "server"}}, "--day0-set: engnie: unknown key; did you mean 'engine'?"),
    ({"sla": {"ttft_p99_ms": "fast"}}, "--day0-set: sla.ttft_p99_ms: expected a number"),
])
def test_an_override_error_names_the_override_and_suggests_the_key(override, message):
    with pytest.raises(ProfileError) as err:
        load_profile("cpu-tiny", overrides=override)
    assert str(err.value) == message


def test_an_unknown_key_far_from_any_lists_the_known_ones(tmp_path):
    (tmp_path / "p.toml").write_text('extends = "cpu-tiny"\n[topology]\nzzz = 1\n')
    with pytest.raises(ProfileError, match=r"p.toml: topology.zzz: unknown key \(known: device, accelerator, "):
        load_profile(tmp_path / "p.toml")


def test_the_schema_describes_every_section(capsys):
    import json

    from day0 import cli

    assert cli.main(["profile", "schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert {"model", "engine", "topology", "sla", "latency", "kvcache", "risks", "compare"} <= set(schema["properties"])
    latency = schema["$defs"]["LatencySection"]
    assert latency["additionalProperties"] is False and "sweep_rates" in latency["properties"]
    defs = schema["$defs"]
    assert "limits" in defs["SlaSection"]["properties"] and defs["SlaSection"]["patternProperties"]
    assert "origin" not in schema["properties"] and schema["additionalProperties"] is False


def _refused(tmp_path, text: str) -> str:
    """The one-line refusal of a profile that extends cpu-tiny with ``text``."""
    (tmp_path / "p.toml").write_text(f'extends = "cpu-tiny"\n{text}')
    with pytest.raises(ProfileError) as err:
        load_profile(tmp_path / "p.toml")
    return str(err.value)


@pytest.mark.parametrize("text, message", [
    ("[latency]\nnum_request = 8\n", "latency.num_request: unknown key; did you mean 'num_requests'?"),
    ('[latency]\nendpoint = "embeddings"\n', "latency.endpoint: expected 'completions' or 'chat', got 'embeddings'"),
    ("[latency]\nconcurrency = 0\n", "latency.concurrency: must be >= 1 with load = 'concurrency' (got 0)"),
    ("[latency]\ninput_len = [10, 2]\n", "latency.input_len: need 1 <= lo <= hi, got [10, 2]"),
    ("[latency]\ninput_len = 8\nprefix_len = 8\n", "latency.prefix_len: 8 must be below the shortest input_len (8)"),
    ("[latency]\nsweep_rates = [4, 2]\n", "latency.sweep_rates: must be ascending"),
    # a step at inf has no arrival gap to keep: its client lag always passed it, an INCOMPLETE every run
    ("[latency]\nsweep_rates = [1, inf]\n", "latency.sweep_rates.1: expected a finite number (not inf or nan)"),
    # the client counts tokens for n choices only where n is a whole number: "2" would count as 1
    ('[latency.extra_body]\nn = "2"\n', "latency.extra_body.n: expected a whole number of choices >= 1, got '2'"),
    ("[latency.extra_body]\nn = 2.0\n", "latency.extra_body.n: expected a whole number of choices >= 1, got 2.0"),
    # merged last, a key day0 sets would override its setting unseen: the record would say 64 tokens
    ("[latency.extra_body]\nmax_tokens = 8\n",
     "latency.extra_body.max_tokens: set by day0 from latency.output_len; set that instead"),
    ('[latency.extra_body]\nstream = false\n', "latency.extra_body.stream: set by day0, which always streams"),
    ("[sla]\nttft_ms = 3\n", "sla.ttft_ms: unknown key; did you mean 'ttft_p99_ms'?"),
    ("[sla]\nlimits = {ttft_p9x_ms = 3}\n", "sla.limits.ttft_p9x_ms: not a '<ttft|tpot|itl|e2e>_p<NN>_ms' limit"),
    ("[latency.search]\ntarget_rate = inf\n", "latency.search.target_rate: expected a finite number (not inf or nan)"),
    ("[sla]\nttft_p99_ms = inf\n", "sla.ttft_p99_ms: expected a finite number (not inf or nan)"),
    ("[sla]\nlimits = {itl_p50_ms = nan}\n", "sla.limits.itl_p50_ms: expected a finite number (not inf or nan)"),
    ("[risks.cost]\nprice_per_device_hour = inf\n",
     "risks.cost.price_per_device_hour: expected a finite number (not inf or nan)"),
    ("[latency.search]\nstart_rate = inf\n", "latency.search.start_rate: expected a finite number (not inf or nan)"),
    ("[latency.search]\nstart_rate = 50.0\nmax_rate = 20.0\n", "latency.search.start_rate: 50 is above max_rate (20)"),
    ("[latency.search]\nover = \"concurrency\"\nstart_concurrency = 9\nmax_concurrency = 4\n",
     "latency.search.start_concurrency: 9 is above max_concurrency (4)"),
])
def test_latency_and_sla_are_typed_like_every_section(tmp_path, text, message):
    err = _refused(tmp_path, text)
    assert message in err and "\n" not in err


@pytest.mark.parametrize("text, message", [
    ("[risks.isolation]\nprompt_tokens = 100000000000\n", "risks.isolation.prompt_tokens: input should be less than"),
    ("[risks.cost]\nmeasure_requests = 1000000000000\n", "risks.cost.measure_requests: input should be less than"),
])
def test_risks_sizes_that_would_be_built_in_memory_are_bounded(tmp_path, text, message):
    """10^11 prompt tokens were accepted, about 5 TB of prompts built before the first request (a hunt)."""
    err = _refused(tmp_path, text)
    assert message in err and "\n" not in err


@pytest.mark.parametrize("text, message", [
    ('[engine.env]\n"X=1;touch f;Y" = "v"\n', "engine.env: 'X=1;touch f;Y' is not an environment variable name"),
    ('[engine.env]\nNCCL-DEBUG = "INFO"\n', "engine.env: 'NCCL-DEBUG' is not an environment variable name"),
    ('[topology]\nhosts = ["gpu01", "-Eday0-ssh.log"]\n', "topology.hosts: '-Eday0-ssh.log' is not a host name"),
    # a reference engine's env and args are merged into [engine.env] and [engine.args] unchecked (a hunt)
    ('[risks.accuracy]\nreference_env = { "X=1;touch /tmp/pwn" = "v" }\n',
     "risks.accuracy.reference_env: 'X=1;touch /tmp/pwn' is not an environment variable name"),
    ('[risks.accuracy]\nreference_env = { NCCL_DEBUG = "a\\u0000b" }\n', "NCCL_DEBUG: its value holds a NUL byte"),
    ('[risks.accuracy]\nreference_args = [{ gpu_memory_utilization = nan }]\n',
     "risks.accuracy.reference_args: [0].gpu_memory_utilization: nan is not a finite number"),
    ('[risks.accuracy]\nreference_args = [{}, { dtype = "bf\\u0000loat16" }]\n',
     "risks.accuracy.reference_args: [1].dtype: holds a NUL byte"),
])
def test_names_that_reach_a_remote_shell_or_ssh_are_refused_in_one_line(tmp_path, text, message):
    """An [engine.env] name goes to every node as `export NAME=...`, a host to ssh's argv: a name
    that is not one would run as shell, kill the rank, or be read as an option."""
    err = _refused(tmp_path, text)
    assert message in err and "\n" not in err


@pytest.mark.parametrize("table", [
    "short_requests = 100000000",
    "short_lengths = [200, 4611686018427387904]\nshort_requests = 1",
    "context_lengths = [4611686018427387904]",
    "context_lengths = []\ntarget_context = 1099511627776",
    "shared_prefix_tokens = 70000000",
    "shared_prefix_tokens = 1\nshared_prefix_requests = 200000",  # each request's short suffix counts (the review)
], ids=["many-short", "long-short", "long-context", "target", "prefix", "prefix-suffixes"])
def test_a_kvcache_workload_past_what_day0_builds_is_refused_at_load(tmp_path, table):
    """Accepted before and then built in the kvcache stage, after the engine was up: 1.5 GB and
    still going at 60 s, or a MemoryError. One line at load time, naming the key that makes it."""
    p = tmp_path / "k.toml"
    p.write_text(f'extends = "cpu-tiny"\n[kvcache]\n{table}\n')
    with pytest.raises(ProfileError, match=r"kvcache: the workload would hold [\d,]+ tokens, over the 67,108,864"):
        load_profile(p)


@pytest.mark.parametrize("table, where", [('[engine.args]\n"a\\u0000b" = 1', "engine.args.a"),
                                          ('[engine.args]\nserved_model_name = "a\\u0000b"', "served_model_name"),
                                          ('[engine.env]\nHF_TOKEN = "Zq9\\u0000Secret"', "HF_TOKEN")],
                         ids=["key", "argument", "env-value"])
def test_a_nul_byte_where_no_flag_argument_or_variable_can_hold_one_is_refused_naming_its_key(tmp_path, table, where):
    """The OS refused it later as "embedded null byte", naming nothing. A run's name may hold one
    (tests/hostile/test_names.py: made safe where it becomes a path); a path is named by its reader."""
    p = tmp_path / "nul.toml"
    p.write_text(f'extends = "h200x8"\n{table}\n')
    with pytest.raises(ProfileError, match="NUL byte") as exc:
        load_profile(p)
    assert str(p) in str(exc.value) and where in str(exc.value) and "Zq9" not in str(exc.value)


@pytest.mark.parametrize("key, problem", [("sk-Pasted-Canary-0453", "not an environment variable name"),
                                          ("hf_" + "Pasted0Canary" * 3, "shaped like a key")])
def test_a_key_pasted_as_engine_api_key_env_is_refused_without_repeating_it(tmp_path, key, problem):
    """`profile show` printed it and the run record kept it as a setting; a token with its issuer's
    prefix is a valid variable name, so its shape decides (the review)."""
    p = tmp_path / "k.toml"
    p.write_text(f'extends = "cpu-tiny"\n[engine]\napi_key_env = "{key}"\n')
    with pytest.raises(ProfileError) as exc:
        load_profile(p)
    assert "engine.api_key_env" in str(exc.value) and problem in str(exc.value)
    assert key not in str(exc.value)


def test_one_key_setting_a_latency_api_key_env_points_to_the_engines(tmp_path):
    """The key every request carries is engine.api_key_env; a profile still setting it under
    [latency] is refused in one line saying where it belongs."""
    (tmp_path / "p.toml").write_text('extends = "cpu-tiny"\n[latency]\napi_key_env = "GATEWAY_KEY"\n')
    with pytest.raises(ProfileError) as err:
        load_profile(tmp_path / "p.toml")
    assert str(err.value) == (f"{(tmp_path / 'p.toml').resolve()}: latency.api_key_env: not a [latency] key; set "
                              "engine.api_key_env (the one key setting, sent with every request to the engine)")
    with pytest.raises(SettingsError, match=r"^latency.api_key_env: not a \[latency\] key; set engine.api_key_env"):
        LatencySection.from_table({"api_key_env": "GATEWAY_KEY"})
    assert "api_key_env" not in LatencySection.model_fields


def test_latency_and_sla_load_typed_with_any_percentile_limit(tmp_path):
    (tmp_path / "p.toml").write_text('extends = "cpu-tiny"\n[latency]\ninput_len = [8, 16]\nrequest_rate = inf\n'
                                     "[sla]\nttft_p90_ms = 800\nlimits = {tpot_p99_9_ms = 300}\n")
    p = load_profile(tmp_path / "p.toml")
    assert p.latency.input_len == [8, 16] and p.latency.num_requests == 0 and p.latency.request_rate == float("inf")
    assert p.sla.limits == {"ttft_p90_ms": 800.0, "tpot_p90_ms": 200.0, "e2e_p90_ms": 30000.0,
                            "tpot_p99_9_ms": 300.0}
    assert p.sla.latency_limits() == [("ttft", 90.0, 800.0), ("tpot", 90.0, 200.0), ("tpot", 99.9, 300.0),
                                      ("e2e", 90.0, 30000.0)]
    # no request count set: the fewest that bound the highest limited percentile (p99.9 at 95%)
    assert p.latency.measured_requests(p.sla) == 2995
    assert load_profile("cpu-tiny").latency.measured_requests(load_profile("cpu-tiny").sla) == 32
    assert p.resolved()["latency"]["input_len"] == [8, 16]


@pytest.mark.parametrize("text, message", [
    ('[collectives]\nmax_byte = "1M"\n', "collectives.max_byte: unknown key; did you mean 'max_bytes'?"),
    ('[collectives]\nmax_bytes = "lots"\n', "collectives.max_bytes: cannot read 'lots' as bytes (e.g. 1024, '64K', '1G')"),
    ('[collectives]\nmin_bytes = "4M"\nmax_bytes = "1M"\n', "collectives.max_bytes: 1048576 is below min_bytes (4194304)"),
    ('[collectives]\ndtype = "int4"\n', "collectives.dtype: 'int4' is not one of float32, "),
    ('[collectives]\nops = ["all_reduce", "gather"]\n', "collectives.ops: 'gather' is only importable from nccl-tests"),
    ('[collectives]\nbackend = "mpi"\n', "collectives.backend: expected 'auto', 'nccl' or 'gloo', got 'mpi'"),
    ("[collectives]\ntp_equivalence = 1\n", "collectives.tp_equivalence: expected true or false"),
    ("[collectives]\nin_place = false\nout_of_place = false\n", "collectives: out_of_place and in_place are both false"),
    ("[collectives.expected_busbw.rack]\nall_reduce = 1\n", "collectives.expected_busbw.rack: scope must be intra_node or"),
    ('[collectives.expected_busbw.intra_node]\nallreduce = "fast"\n',
     "collectives.expected_busbw.intra_node.allreduce: expected GB/s >= 0, got 'fast'"),
    ("[compare]\nhistroy_runs = 3\n", "compare.histroy_runs: unknown key; did you mean 'history_runs'?"),
    ('[compare]\ndefault_tolerance = "fast"\n', "compare.default_tolerance: 'fast' is not a tolerance"),
    ('[compare.tolerances]\n"collectives.*.busbw" = "-5%"\n', "compare.tolerances.collectives.*.busbw: '-5%' is not a"),
    ("[compare]\nspread_k = inf\n", "compare.spread_k: "),
])
def test_collectives_and_compare_are_typed_like_every_section(tmp_path, text, message):
    err = _refused(tmp_path, text)
    assert message in err and "\n" not in err and "p.toml: " in err


def test_an_unknown_collectives_key_on_the_command_line_is_named_with_a_suggestion():
    with pytest.raises(ProfileError) as err:
        load_profile("cpu-tiny", overrides={"collectives": {"tp_equivalnce": False}})
    assert str(err.value) == "--day0-set: collectives.tp_equivalnce: unknown key; did you mean 'tp_equivalence'?"


def test_collectives_and_compare_load_typed(tmp_path):
    (tmp_path / "p.toml").write_text('extends = "cpu-tiny"\n[collectives]\nmax_bytes = "64K"\ndtype = "bf16"\n'
                                     'ops = ["allreduce", "all-gather"]\nresults_file = "/shared/coll.json"\n'
                                     "[collectives.expected_busbw.intra_node]\nalltoall = 2\n"
                                     '[compare]\nhistory_runs = 7\n[compare.tolerances]\nttft_p99 = "10%"\n')
    p = load_profile(tmp_path / "p.toml")
    c = p.collectives
    assert (c.min_bytes, c.max_bytes, c.dtype, c.ops) == (1024, 65536, "bfloat16", ["all_reduce", "all_gather"])
    assert (c.results_file, c.tp_equivalence, c.world_size) == ("/shared/coll.json", False, 2)  # the rest from cpu-tiny
    assert c.expected_busbw["intra_node"]["all_to_all"] == 2.0  # op names made canonical
    assert c.expected_busbw["intra_node"]["all_reduce"] == 0.05  # tables merge key by key
    assert p.resolved()["collectives"]["max_bytes"] == 65536
    assert (p.compare.history_runs, p.compare.tolerance_for("latency.ttft_p99", "latency.ttft_p99").amount) == (7, 0.1)
    assert load_profile("cpu-tiny").collectives.max_bytes == 4 << 20


def test_the_schema_describes_collectives_and_compare(capsys):
    import json

    from day0 import cli

    assert cli.main(["profile", "schema"]) == 0
    defs = json.loads(capsys.readouterr().out)["$defs"]
    coll, comp = defs["CollectivesSection"], defs["CompareSection"]
    assert coll["additionalProperties"] is False and comp["additionalProperties"] is False
    assert {"ops", "min_bytes", "max_bytes", "dtype", "expected_busbw", "pass_fraction", "world_size", "results_file",
            "tp_equivalence"} <= set(coll["properties"])
    assert {"string", "integer"} <= {t["type"] for t in coll["properties"]["max_bytes"]["anyOf"]}  # "4M" or bytes
    assert "bf16" in coll["properties"]["dtype"]["enum"]
    assert {"history_runs", "spread_k", "gross_factor", "default_tolerance", "tolerances"} <= set(comp["properties"])
    assert all(p.get("description") for p in comp["properties"].values())


def test_the_config_layer_imports_nothing_above_it():
    """config sits on core only: validating a profile never loads a stage or the results."""
    import subprocess
    import sys

    code = ("import sys, day0.config.profile as p; p.load_profile('cpu-tiny'); "
            "print(sorted(m for m in sys.modules if m.startswith('day0.') "
            "and not m.startswith(('day0.config', 'day0.core'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_extends_chain_is_bounded_and_names_its_files(tmp_path):
    for i in range(40):
        (tmp_path / f"p{i}.toml").write_text(f'extends = "p{i + 1}.toml"\n')
    with pytest.raises(ProfileError, match=r"p0.toml: extends: chain of more than 16 files \(.*p0.toml -> .*p1.toml"):
        load_profile(tmp_path / "p0.toml")


def test_unreadable_profile_bytes_are_a_profile_error_naming_the_offset(tmp_path):
    (tmp_path / "p.toml").write_bytes(b'name = "\xc3\x28"\n')
    with pytest.raises(ProfileError, match=r"p.toml: not UTF-8 text \(byte 0xc3 at offset 8\)"):
        load_profile(tmp_path / "p.toml")
    (tmp_path / "q.toml").write_text("x = " + "[" * 50 + "]" * 50 + "\n")
    with pytest.raises(ProfileError, match="q.toml: x: arrays or tables nested deeper than 32 levels"):
        load_profile(tmp_path / "q.toml")
