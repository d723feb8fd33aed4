"""Write the ``day0 latency import`` fixtures in tests/data/ from real runs of the other tools.

Each tool runs as a site would run it, against the scripted loopback server of the tests
(tests/support/sse_server.py, a known schedule and faults on demand), and its result file is kept as
written: ``vllm bench serve --save-result --save-detailed`` (and once without ``--save-detailed``,
the summary-only file the import refuses), and GuideLLM's ``--output kind=json`` report.

    .venv/bin/python benchmarks/make_import_fixtures.py [--guidellm-path DIR] [--out tests/data]

GuideLLM is not a dependency of day0: ``--guidellm-path`` names a folder it was installed into
with ``pip install --target`` (it is skipped without one). A tokenizer folder is needed by both
tools for their random prompts: the embedded tiny model's (built on first use).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from sse_server import Script, SSEServer  # noqa: E402

# The schedule every fixture was made against: TTFT 15 or 25 ms, 3 ms gaps, every third message's
# text empty (a token that is half a UTF-8 character), request 4 an HTTP 500, request 9 a stream
# cut after two messages.
SCRIPT = Script(ttft_ms=[15, 25], gaps_ms=[3], empty_text_every=3, errors={"4": "http500", "9": "drop"},
                error_after_messages=2, index_by_arrival=True)
VLLM_PREFIX = "day0-measure-abcdef-"  # vLLM sends it as X-Request-Id: the script's index is the request's


def tokenizer_dir() -> Path:
    from day0.model.tiny import TinySpec, cached_model

    return cached_model(TinySpec())


def vllm_bench(url: str, tok: Path, out: Path, detailed: bool, prompts: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "day0.engine.vllm_cli", "bench", "serve", "--backend", "openai",
               "--base-url", url, "--model", "scripted", "--tokenizer", str(tok), "--dataset-name", "random",
               "--random-input-len", "16", "--random-output-len", "6", "--num-prompts", str(prompts),
               "--request-rate", "50", "--ignore-eos", "--request-id-prefix", VLLM_PREFIX, "--save-result",
               "--result-dir", tmp, "--result-filename", "r.json", "--percentile-metrics", "ttft,tpot,itl,e2el",
               "--metric-percentiles", "50,90,99"] + (["--save-detailed"] if detailed else [])
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        if proc.returncode != 0:
            raise SystemExit(f"vllm bench serve failed (rc {proc.returncode}): {proc.stderr[-2000:]}")
        shutil.copy(Path(tmp) / "r.json", out)


def guidellm(url: str, tok: Path, out: Path, site: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "guidellm", "run", "--backend", f"kind=openai_http,target={url},model=scripted",
               "--profile", "kind=poisson,rate=20", "--constraint", "kind=max_requests,count=8",
               "--tokenizer", f"kind=huggingface_auto,model={tok}",
               "--data", "kind=synthetic_text,prompt_tokens=8,output_tokens=6",
               "--output", f"kind=json,path={tmp}/g.json", "--disable-console-interactive"]
        env = {**os.environ, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
        if proc.returncode != 0:
            raise SystemExit(f"guidellm failed (rc {proc.returncode}): {proc.stderr[-2000:]}")
        shutil.copy(Path(tmp) / "g.json", out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "data")
    ap.add_argument("--guidellm-path", type=Path, default=os.environ.get("GUIDELLM_PATH"),
                    help="folder GuideLLM was pip-installed into with --target (skipped without it)")
    a = ap.parse_args()
    tok = tokenizer_dir()
    with SSEServer(SCRIPT) as srv:
        vllm_bench(srv.url, tok, a.out / "vllm-bench-detailed.json", True, 12)
        srv.set_script(SCRIPT)
        vllm_bench(srv.url, tok, a.out / "vllm-bench-summary.json", False, 4)
        if a.guidellm_path:
            srv.set_script(Script(ttft_ms=[15, 25], gaps_ms=[3], errors={"3": "http500"}, index_by_arrival=True))
            guidellm(srv.url, tok, a.out / "guidellm-report.json", a.guidellm_path)
    print(f"fixtures written to {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
