"""Every profile knob of stage 3 on ``day0 latency``'s command line, with its unit, validated as the
profile's own tables are; and goodput judged at exactly the per-request limits a person sets."""

from __future__ import annotations

import argparse
import re

import pytest

from day0.client.loadgen import LoadShape, PhaseResult, RequestResult
from day0.config.errors import SettingsError
from day0.config.latency import LatencySection, SlaSection
from day0.stages.latency import compute_metrics, main
from day0.stages.latency.checks import goodput_check
from day0.stages.latency.cli import add_cli, endpoint_from_args, settings_from_args
from day0.stages.latency.settings import load_shape, search_shape

UNITS = {"--ttft-p99-ms": "MS", "--tpot-p99-ms": "MS", "--itl-p99-ms": "MS", "--e2e-p99-ms": "MS", "--limit": "KEY=MS",
         "--min-output-throughput": "TOK/S", "--min-request-throughput": "REQ/S", "--min-goodput": "REQ/S",
         "--goodput": "METRIC:MS,...", "--max-error-rate": "FRACTION", "--percentiles": "P,P,...",
         "--request-timeout": "S", "--stall-timeout": "S", "--workers": "N", "--rate": "REQ/S", "--duration": "S",
         "--arrivals": "{immediate,vllm}"}


def _help(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("argv", [(), ("import",)])
def test_help_lists_every_knob_with_its_unit(capsys, argv):
    text = " ".join(_help(capsys, *argv).split())
    for flag, unit in UNITS.items():
        if argv and flag in ("--request-timeout", "--stall-timeout", "--workers", "--rate", "--duration", "--arrivals"):
            continue  # an import measures nothing: load and client flags do not apply
        assert re.search(rf"{re.escape(flag)} {re.escape(unit)} ", text), (flag, unit)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_cli(parser.add_subparsers(dest="command"))
    return parser.parse_args(["latency", "--url", "http://h:1", *argv])


def test_flags_become_the_profiles_tables():
    lat, sla = settings_from_args(_args(
        "--rate", "40", "--arrivals", "vllm", "--workers", "3", "--request-timeout", "9", "--stall-timeout", "2",
        "--percentiles", "50,99.9", "--limit", "ttft_p90_ms=800", "--limit", "tpot_p99_9_ms=300",
        "--min-goodput", "2.5", "--min-request-throughput", "3", "--min-output-throughput", "100",
        "--goodput", "ttft:500,e2el:2000", "--ttft-p99-ms", "900"))
    assert (lat.load, lat.request_rate, lat.arrivals, lat.workers) == ("rate", 40.0, "vllm", 3)
    assert (lat.request_timeout_s, lat.stall_timeout_s, lat.percentiles) == (9.0, 2.0, [50.0, 99.9])
    assert sla.limits == {"ttft_p90_ms": 800.0, "tpot_p99_9_ms": 300.0} and sla.ttft_p99_ms == 900.0
    assert (sla.min_goodput_req_s, sla.min_request_throughput_req_s, sla.min_output_throughput_tok_s) == (2.5, 3.0, 100.0)
    assert sla.goodput_slo_ms == {"ttft": 500.0, "e2e": 2000.0}
    assert sla.latency_limits() == [("ttft", 90.0, 800.0), ("ttft", 99.0, 900.0), ("tpot", 99.9, 300.0)]
    lat, _ = settings_from_args(_args())
    assert (lat.workers, lat.arrivals) == (0, "immediate")  # 0: from the offered load and the cores
    assert lat.search is None  # the capacity search runs only when asked for


def test_an_sla_preset_is_mlperfs_limits_and_an_explicit_limit_wins():
    _, sla = settings_from_args(_args("--sla-preset", "llama2-70b-interactive"))
    assert sla.latency_limits() == [("ttft", 99.0, 450.0), ("tpot", 99.0, 40.0)]
    _, sla = settings_from_args(_args("--sla-preset", "deepseek-r1", "--ttft-p99-ms", "1000"))
    assert sla.latency_limits() == [("ttft", 99.0, 1000.0), ("tpot", 99.0, 80.0)]
    assert SlaSection.from_table({"preset": "llama3.1-405b"}).latency_limits() == [("ttft", 99.0, 6000.0),
                                                                                  ("tpot", 99.0, 175.0)]
    with pytest.raises(SettingsError, match="sla.preset: expected 'llama2-70b'"):
        SlaSection.from_table({"preset": "llama2-7b"})


def test_search_flags_become_the_search_table():
    lat, _ = settings_from_args(_args("--search"))
    assert lat.search is not None and lat.search.start_rate == 1.0 and lat.search.requests == 0
    lat, _ = settings_from_args(_args("--search-start-rate", "5", "--search-requests", "64", "--target-rate", "50"))
    assert (lat.search.start_rate, lat.search.requests, lat.search.target_rate) == (5.0, 64, 50.0)
    assert lat.search.probe_requests == 32  # the default climb probes
    lat, _ = settings_from_args(_args("--search-probe-requests", "0"))
    assert lat.search is not None and lat.search.probe_requests == 0 and lat.search.confirm_s == 30.0
    lat, _ = settings_from_args(_args("--search-confirm-s", "120", "--duration", "600"))
    assert lat.search is not None and lat.search.confirm_s == 120.0


def test_a_step_or_search_point_offers_exactly_its_rate_unless_asked_for_the_draw():
    """Its verdict names its rate; the measured load stays as drawn (its achieved rate is reported)."""
    lat, _ = settings_from_args(_args("--search", "--seed", "4", "--rate", "12"))
    for shape in (search_shape(lat, 12.0), load_shape(lat, 12.0)):
        assert shape.exact_rate and shape.offsets(60)[-1] == pytest.approx(59 / 12.0, rel=1e-12)
    measured = load_shape(lat)
    assert not measured.exact_rate and measured.offsets(60)[-1] != pytest.approx(59 / 12.0, rel=1e-3)
    lat, _ = settings_from_args(_args("--search", "--drawn-rates", "--seed", "4"))
    assert not lat.exact_rates and search_shape(lat, 12.0).offsets(60) == measured.offsets(60)


@pytest.mark.parametrize("argv, named", [
    (("--limit", "ttft_p9x_ms=3"), "--limit ttft_p9x_ms: not a"),
    # p100 divided by log(1) in the request count and came out as a ZeroDivisionError traceback
    (("--limit", "ttft_p100_ms=5"), "--limit ttft_p100_ms: the percentile must lie strictly between 0 and 100"),
    (("--limit", "e2e_p150_ms=5"), "--limit e2e_p150_ms: the percentile must lie strictly between 0 and 100"),
    # above 0, but 0 once divided by 100: it was "day0: math domain error", naming nothing
    (("--limit", "ttft_p0_" + "0" * 322 + "1_ms=5"), "the percentile must lie strictly between 0 and 100"),
    # the key as typed: its dot was taken for a settings path's ("--limit ttft_p99 9_ms: ...")
    (("--limit", "ttft_p99.9_ms=-1"), "--limit ttft_p99.9_ms: input should be greater than 0"),
    (("--limit", "ttft_p99.9_ms=nan"), "--limit ttft_p99.9_ms: expected a finite number"),
    (("--limit", "ttft_p90_ms"), "--limit 'ttft_p90_ms': expected KEY=MS"),
    (("--limit", "ttft_p90_ms=fast"), "--limit 'ttft_p90_ms=fast': expected KEY=MS"),
    (("--goodput", "itl:5"), "--goodput 'itl:5': expected METRIC:MS"),
    (("--goodput", "ttft:-1"), "--goodput 'ttft:-1'"),
    (("--goodput", "ttft"), "--goodput 'ttft'"),
    (("--percentiles", "50,120"), "--percentiles (item 2): input should be less than or equal to 100"),
    (("--confidence", "2"), "--confidence: input should be less than 1"),
    (("--rate", "-1"), "--rate: input should be greater than 0"),
    (("--input-len", "0"), "--input-len: need 1 <= lo <= hi"),
    (("--min-goodput", "-2"), "--min-goodput: input should be greater than or equal to 0"),
    (("--search-start-rate", "0"), "--search-start-rate: "),
    (("--search-confirm-s", "-1"), "--search-confirm-s: "),
    # a hold as long as every phase's scheduling would be cut short: MLPerf's 600 s needs a longer duration
    (("--search-confirm-s", "600"), "--search-confirm-s: 600 s must be below duration_s (300 s)"),
])
def test_a_bad_flag_is_one_line_naming_it(argv, named):
    """The flag as typed, not the settings key it sets: a user of --url has no profile to look in."""
    with pytest.raises(SettingsError) as err:
        settings_from_args(_args(*argv))
    assert named in str(err.value) and "\n" not in str(err.value)
    assert "latency." not in str(err.value) and "sla." not in str(err.value)


def test_every_key_a_refusal_names_as_a_flag_is_a_flag_of_both_commands():
    """key_flags is written by hand beside the flag tables: a renamed flag must not leave a refusal
    naming one that does not exist (the live run's parser, and import's for the SLA ones)."""
    from day0.stages.latency.cli import add_cli, key_flags

    live = add_cli(argparse.ArgumentParser(prog="day0").add_subparsers())
    imp = next(a for a in live._actions if isinstance(a, argparse._SubParsersAction)).choices["import"]
    assert set(key_flags().values()) <= {o for a in live._actions for o in a.option_strings}
    sla_flags = {f for k, f in key_flags().items() if k.startswith("sla.")} | {"--percentiles"}
    assert sla_flags <= {o for a in imp._actions for o in a.option_strings}


@pytest.mark.parametrize("flag", ["--workers", "--num-requests", "--concurrency"])
def test_a_count_that_is_not_a_whole_number_never_reaches_the_settings(flag, capsys):
    """argparse refuses it first (day0.core.numbers.whole_number), naming the flag: exit 2."""
    with pytest.raises(SystemExit) as exited:
        _args(flag, "-1")
    assert exited.value.code == 2 and f"argument {flag}: '-1' is not a whole number" in capsys.readouterr().err


def test_api_key_env_sets_the_engines_key(monkeypatch):
    """--api-key-env is a profile's engine.api_key_env: the one key setting, read by the endpoint."""
    monkeypatch.setenv("DAY0_CLI_TEST_KEY", "sk-cli-test-0451")
    endpoint = endpoint_from_args(_args("--api-key-env", "DAY0_CLI_TEST_KEY"))
    assert endpoint.headers == {"Authorization": "Bearer sk-cli-test-0451"} and endpoint.base_url == "http://h:1"
    assert "sk-cli" not in repr(endpoint)
    assert endpoint_from_args(_args()).headers == {}
    monkeypatch.delenv("DAY0_CLI_TEST_KEY")
    with pytest.raises(SettingsError) as err:
        endpoint_from_args(_args("--api-key-env", "DAY0_CLI_TEST_KEY"))
    assert str(err.value).startswith("--api-key-env: environment variable DAY0_CLI_TEST_KEY is not set")


def test_the_profile_refuses_a_goodput_slo_on_a_metric_that_is_not_per_request():
    with pytest.raises(SettingsError, match=r"sla.goodput_slo_ms.itl: not a per-request metric"):
        SlaSection.from_table({"goodput_slo_ms": {"itl": 5}})
    with pytest.raises(SettingsError, match="latency.arrivals"):
        LatencySection.from_table({"arrivals": "later"})


def _phase(ttfts_ms: list[float]) -> PhaseResult:
    results = []
    for i, ttft in enumerate(ttfts_ms):
        r = RequestResult(i, "measure", 10.0 + i, 10.0 + i, 8, 3)
        r.ok, r.msg_t, r.msg_n, r.output_tokens = True, [ttft / 1e3, ttft / 1e3 + 0.01, ttft / 1e3 + 0.02], [1, 1, 1], 3
        r.finished = 10.0 + i + ttft / 1e3 + 0.02
        results.append(r)
    return PhaseResult("measure", LoadShape(), results, 10.0, 20.0)


def test_goodput_judges_each_metric_at_the_limit_set():
    """TTFTs 100, 300, 600 ms. Limits ttft p50 <= 200 and p99 <= 500: without goodput_slo_ms a request
    is held to the loosest (500 ms): two are good. With goodput_slo_ms = {ttft = 200}: one."""
    phase = _phase([100.0, 300.0, 600.0])
    derived = SlaSection.from_table({"ttft_p99_ms": 500, "ttft_p50_ms": 200})
    explicit = SlaSection.from_table({"ttft_p99_ms": 500, "ttft_p50_ms": 200, "goodput_slo_ms": {"ttft": 200}})
    assert derived.per_request_slo() == {"ttft": 500.0} and explicit.per_request_slo() == {"ttft": 200.0}
    m = compute_metrics(phase, [50, 99], derived.per_request_slo())
    assert m.good_requests == 2 and m.goodput == pytest.approx(2 / 10.0)
    assert "the loosest [sla] limit per metric" in goodput_check(m, derived).message
    m = compute_metrics(phase, [50, 99], explicit.per_request_slo())
    assert m.good_requests == 1
    c = goodput_check(m, SlaSection.from_table({"goodput_slo_ms": {"ttft": 200}, "min_goodput_req_s": 0.2}))
    assert c.status == "fail" and "ttft <= 200 ms" in c.message and "loosest" not in c.message
    # tpot in the SLO: the last token 20 ms after the first, over 2 more tokens = 10 ms for each of them
    m = compute_metrics(phase, [50], SlaSection.from_table({"goodput_slo_ms": {"tpot": 4.9}}).per_request_slo())
    assert m.good_requests == 0


BAD_VALUES = ["abc", "1e999", "-1", "nan", "", "\u0663", "99999999999999999999999", "-0", "0", "inf", "1:2:3", "a:b",
              ",", "1,,2", "1,,x", "ttft:nan", "x=", "=5", "\u0663:\u0664"]
DETAILED = "tests/data/vllm-bench-detailed.json"


def _value_flags(command: str) -> list[str]:
    """Every flag of ``day0 latency`` (or its ``import``) that takes a value, but for the paths
    (an output file, a folder to read) and --url, whose refusals have tests of their own."""
    from day0.cli import build_parser

    live = build_parser("latency")._subparsers._group_actions[0].choices["latency"]
    parser = live._subparsers._group_actions[0].choices["import"] if command == "import" else live
    skip = {"--json", "--out", "--url", "--tokenizer", "--dataset", "--api-key-env"}
    return [o for a in parser._actions if a.nargs != 0 for o in a.option_strings
            if o.startswith("--") and o not in skip]


@pytest.mark.parametrize("command, flag", [(c, f) for c in ("live", "import") for f in _value_flags(c)])
def test_every_flag_refuses_a_bad_value_in_one_line(command, flag, capsys, monkeypatch):
    """Whatever is typed after a flag ends in a verdict (import: 0 or 1) or one line and exit 2,
    never a traceback: --sweep-rates abc escaped every handler as argparse's ArgumentTypeError.
    The live run stops where it would connect (stubbed), so an accepted value is one line too."""
    from day0.cli import main as day0_main
    from day0.stages.latency import cli as latency_cli

    def unreachable(url: str) -> None:
        raise ValueError("--url: not connected in this test")

    monkeypatch.setattr(latency_cli, "reachable", unreachable)
    head = ["latency", "import", DETAILED] if command == "import" else ["latency", "--url", "http://h", "--vocab-size", "9"]
    for value in BAD_VALUES:
        try:
            rc = day0_main([*head, flag, value])
        except SystemExit as exited:
            rc = exited.code
        err = capsys.readouterr().err.strip()
        assert (rc in (0, 1) and command == "import" and not err) or (rc == 2 and err and "\n" not in err), \
            (flag, value, rc, err)
