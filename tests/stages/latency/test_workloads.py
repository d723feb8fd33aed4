"""Workloads like production and latency that is not the prefix cache: ShareGPT lengths, the
long-context mix, the per-run nonce's settings and the ``latency.prefix_cache_share`` check.

``tests/data/sharegpt-small.json`` is synthetic, written for these tests: ShareGPT's shape
(a list of ``{"conversations": [{"from", "value"}, ...]}``) with words drawn at random, twelve
usable conversations and four that vLLM bench's filter or shape rules drop.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from day0.client.prom import PrefixCacheWindow
from day0.config.errors import SettingsError
from day0.config.latency import LatencySection
from day0.config.profile import load_profile
from day0.core.inputs import InputError
from day0.stages.latency.checks import prefix_cache_check
from day0.stages.latency.cli import main as latency_main
from day0.stages.latency.datasets import TOKENS_PER_WORD, sharegpt_lengths
from day0.stages.latency.measurement import CacheIntent
from day0.stages.latency.run import cache_intent
from day0.stages.latency.settings import engine_context, workload_spec
from tests.support import DATA

SHAREGPT = DATA / "sharegpt-small.json"


def _word_tokenizer(folder: Path) -> Path:
    """A real tokenizer.json whose tokens are whitespace words, so counts are checkable by hand."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {w for c in json.loads(SHAREGPT.read_text()) for t in c["conversations"] for w in t["value"].split()}
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(sorted(words) + ["[UNK]"])}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder


def _expected(count, max_total: int = 2048, max_prompt: int = 1024) -> list[tuple[int, int]]:
    out = []
    for entry in json.loads(SHAREGPT.read_text()):
        conv = entry["conversations"]
        human = next((t["value"] for t in conv if t["from"] == "human"), None)
        gpt = next((t["value"] for t in conv if t["from"] == "gpt"), None)
        if human is None or gpt is None:
            continue
        p, o = count(human), count(gpt)
        if p >= 4 and o >= 4 and p <= max_prompt and p + o <= max_total:
            out.append((p, o))
    return out


def test_sharegpt_lengths_in_the_models_tokens_filtered_as_vllm_bench(tmp_path):
    d = sharegpt_lengths(SHAREGPT, _word_tokenizer(tmp_path / "tok"))
    expected = _expected(lambda text: len(text.split()))
    assert list(d.pairs) == expected and len(expected) == 13  # 12 + the one whose system turn comes first
    assert d.skipped == 2 and "tokenizer" in d.counted_with
    short = sharegpt_lengths(SHAREGPT, tmp_path / "tok", max_model_len=100)
    assert list(short.pairs) == _expected(lambda text: len(text.split()), 100, 100)
    assert len(short.pairs) < len(d.pairs)


def test_sharegpt_lengths_without_a_tokenizer_use_the_documented_estimate():
    import math

    d = sharegpt_lengths(SHAREGPT, None)
    assert list(d.pairs) == _expected(lambda text: math.ceil(len(text.split()) * TOKENS_PER_WORD))
    assert "estimate" in d.counted_with


@pytest.mark.parametrize("content, where", [
    (b"{not json", "not JSON"),
    (b'{"conversations": []}', "(top level): expected a list"),
    (b'[{"conversations": [{"from": "human", "value": 3}]}]', "[0].conversations[0]: expected"),
    (b'[{"conversations": {"from": "human"}}]', "[0].conversations: expected a list"),
    (b'[7]', "[0]: expected an object"),
    (b'[{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}]', "conversations: none"),
])
def test_an_unusable_dataset_is_one_line_naming_the_file_and_key(tmp_path, content, where):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(InputError) as exc:
        sharegpt_lengths(path)
    assert str(path) in str(exc.value) and where in str(exc.value) and "\n" not in str(exc.value)


def test_a_dataset_whose_parse_would_dwarf_its_bytes_is_refused_before_parsing(tmp_path, monkeypatch):
    """300,000 empty conversations (13 MB) held 14 times their bytes once parsed (the hunt): the
    objects and lists are counted first, and the cap is lowered here so the file stays small."""
    import day0.stages.latency.datasets as datasets

    one = b'{"conversations": [{"from": "human", "value": "a b c d e"}, {"from": "gpt", "value": "f g h i j"}]}'
    path = tmp_path / "many.json"
    path.write_bytes(b"[" + b",".join([one] * 100) + b"]")
    assert len(sharegpt_lengths(path).pairs) == 100
    monkeypatch.setattr(datasets, "MAX_DATASET_CONTAINERS", 400)  # 100 x (3 objects + 1 list) + 1 = 401
    with pytest.raises(InputError) as exc:
        sharegpt_lengths(path)
    assert str(exc.value).startswith(f"{path}: 401 '{{' and '['") and "pass a sample" in str(exc.value)


def test_day0_latency_exits_2_on_an_unusable_dataset(tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text('[{"conversations": 5}]')
    with socket.socket() as listener:  # something accepts the connection; the dataset is refused first
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        rc = latency_main(["--url", url, "--vocab-size", "100", "--model", "m", "--dataset", f"sharegpt:{path}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and str(path) in err and "[0].conversations" in err


def test_dataset_and_length_mix_settings_are_validated():
    with pytest.raises(SettingsError, match="latency.dataset"):
        LatencySection.from_table({"dataset": "/no/kind.json"})
    with pytest.raises(SettingsError, match="length_mix: not with dataset"):
        LatencySection.from_table({"dataset": "sharegpt:/x.json", "length_mix": "long_context"})
    with pytest.raises(SettingsError, match="max_model_len"):
        workload_spec(LatencySection.from_table({"length_mix": "long_context"}))
    assert LatencySection().fresh_prompts is True


def test_the_supernode_preset_spreads_prompts_up_to_its_1m_context():
    profile = load_profile("supernode-tp8pp4-1m")
    ctx = engine_context(profile.engine.args, None)
    spec = workload_spec(profile.latency, nonce=1, ctx=ctx)
    assert spec.input_dist == "log_uniform"
    assert spec.input_len == [4096, 1048576 - 256]
    assert ctx.block_size == 16


def _intent(intended: float, allowance: float, hits: float | None, queries: float = 1000.0) -> CacheIntent:
    window = PrefixCacheWindow(hits, queries) if hits is not None else None
    return CacheIntent(intended, allowance, 16, True, window)


def test_prefix_cache_share_fails_above_what_the_workload_intends():
    assert prefix_cache_check(_intent(0.0, 0.02, 10)).status == "pass"
    hit = prefix_cache_check(_intent(0.0, 0.02, 875))  # the repeated run: 11,200 of 12,800
    assert hit.status == "fail" and hit.value == pytest.approx(0.875) and "cache hits" in hit.message
    assert prefix_cache_check(_intent(0.5, 0.02, 500)).status == "pass"
    assert prefix_cache_check(_intent(0.5, 0.02, 560)).status == "fail"
    unmeasured = prefix_cache_check(_intent(0.0, 0.02, None))
    assert unmeasured.status == "skip" and unmeasured.limit == pytest.approx(0.02)
    assert prefix_cache_check(_intent(0.0, 0.02, 0, queries=0)).status == "skip"


def test_cache_intent_allows_one_block_per_request():
    from day0.client.workload import WorkloadSpec, build_requests

    reqs = build_requests(WorkloadSpec([100, 300], 2, prefix_len=40, seed=1, nonce=3), 1000, 10)
    c = cache_intent(reqs, LatencySection(), 32, "")
    total = sum(r.input_len for r in reqs)
    assert c.intended == pytest.approx(10 * 48 / total)
    assert c.allowance == pytest.approx(10 * 32 / total)
    assert cache_intent(reqs, LatencySection(), None, "").block_size == 16  # vLLM's GPU default
