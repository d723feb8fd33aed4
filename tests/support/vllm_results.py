"""``vllm bench serve --save-result --save-detailed`` results of any size, with the keys vLLM writes.

The real fixture (tests/data/vllm-bench-detailed.json, benchmarks/make_import_fixtures.py) holds
12 requests; what an import costs in memory and time shows at thousands, so the memory test and
benchmarks/bench_import.py write their own. Per request, as ``vllm/benchmarks/serve.py`` keeps it:
``ttfts`` and ``itls`` (s), ``latencies`` (the send to the last chunk: the first token plus the
gaps), ``start_times`` (perf_counter at the send), ``queue_times``, ``input_lens``,
``output_lens``, ``generated_texts`` and ``errors``; the times are drawn from a seeded generator
and agree with each other and with ``duration``, so an import judges every request.
"""

from __future__ import annotations

import random
from typing import Any


def detailed_result(requests: int, tokens: int, *, seed: int = 0, digits: int | None = None,
                    text: str = "tok ") -> dict[str, Any]:
    """A result of ``requests`` successful requests of ``tokens`` output tokens each (one chunk a
    token), sent as a Poisson stream at 50 req/s. ``digits`` writes the gaps with that many
    decimals (vLLM writes a float's full repr, about 20 characters: fewer put more gaps in a byte,
    the denser file per byte); ``text`` is each token's text in ``generated_texts``."""
    rng = random.Random(seed)
    starts, ttfts, itls, latencies, queued = [], [], [], [], []
    t = 12330.222948419  # a perf_counter reading, as vLLM writes one
    for _ in range(requests):
        t += rng.expovariate(50.0)
        gaps = [rng.uniform(0.002, 0.004) for _ in range(tokens - 1)]
        gaps = [round(g, digits) for g in gaps] if digits is not None else gaps
        ttft = rng.uniform(0.015, 0.030)
        starts.append(t)
        ttfts.append(ttft)
        itls.append(gaps)
        latencies.append(ttft + sum(gaps) + 1e-5)  # the last chunk, then the stream's close
        queued.append(rng.uniform(0.0, 1e-4))
    duration = max(s + lat for s, lat in zip(starts, latencies)) - starts[0] if requests else 1.0
    out_tokens = requests * tokens
    return {
        "date": "20261207-120000", "endpoint_type": "openai", "backend": "openai", "label": None,
        "model_id": "synthetic", "tokenizer_id": "synthetic", "num_prompts": requests, "request_rate": 50.0,
        "burstiness": 1.0, "max_concurrency": None, "duration": duration, "completed": requests, "failed": 0,
        "total_input_tokens": 128 * requests, "total_output_tokens": out_tokens,
        "request_throughput": requests / duration, "request_goodput": None,
        "output_throughput": out_tokens / duration, "total_token_throughput": (out_tokens + 128 * requests) / duration,
        "input_lens": [128] * requests, "output_lens": [tokens] * requests, "ttfts": ttfts, "itls": itls,
        "latencies": latencies, "start_times": starts, "queue_times": queued,
        "generated_texts": [text * tokens] * requests, "errors": [""] * requests,
        "mean_ttft_ms": 1e3 * sum(ttfts) / max(1, requests),
    }


def tiny_result_text(requests: int) -> str:
    """A result of ``requests`` requests of one 3 ms gap each, written as densely as JSON allows
    (no spaces, 2 to 9 bytes an entry): about 41 bytes a request, against the 500 or so a parse of it
    builds, so a count large enough to matter fits in a small file. The figures agree with each
    other and with ``duration`` (a request every 20 ms), so an import under the cap judges them all."""
    def each(value: str) -> str:
        return ",".join([value] * requests)

    starts = ",".join(f"{i * 0.02:.2f}" for i in range(requests))
    duration = max(requests - 1, 0) * 0.02 + 0.024 + 1e-6
    head = (f'"date":"20261207-120000","backend":"openai","model_id":"synthetic","num_prompts":{requests},'
            f'"request_rate":50.0,"burstiness":1.0,"max_concurrency":null,"duration":{duration!r},'
            f'"completed":{requests},"failed":0')
    lists = {"input_lens": each("128"), "output_lens": each("2"), "ttfts": each("0.02"), "itls": each("[0.003]"),
             "latencies": each("0.024"), "start_times": starts, "queue_times": each("0"),
             "generated_texts": each('""'), "errors": each('""')}
    return "{" + head + "".join(f',"{k}":[{v}]' for k, v in lists.items()) + "}"
