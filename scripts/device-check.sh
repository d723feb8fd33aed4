#!/usr/bin/env bash
# One prepared run of day0's GPU code paths on a CUDA machine without vLLM (docs/device-check.md).
#
#   here, once (reaches PyPI):   bash scripts/device-check.sh --prepare
#   on the device machine:       bash scripts/device-check.sh [python -m day0.device_check options]
#
# The device machine has torch, transformers and safetensors but not pydantic, which day0's
# profiles and the collectives stage need, and it cannot install anything. --prepare downloads
# pydantic's wheels for the device's Python into build/device-wheels (ignored by git: name it in
# the device tool's `carry`); the run unpacks them into build/device-site on PYTHONPATH when
# pydantic is missing. day0 itself is never installed: PYTHONPATH holds this checkout.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
ROOT=$PWD
WHEELS=${DAY0_DEVICE_WHEELS:-$ROOT/build/device-wheels}
# Under the checkout, not $TMPDIR: pydantic-core is a shared library, and a /tmp mounted noexec
# would refuse to load it. build/ is git-ignored and the checkout is where the carried wheels are.
SITE=${DAY0_DEVICE_SITE:-$ROOT/build/device-site}
DEVICE_PYTHON_VERSION=${DEVICE_PYTHON_VERSION:-3.12}  # the device image's python3 (KINDS.md: 3.12.3)

if [ -n "${PYTHON:-}" ]; then
    PY=$PYTHON
elif [ -x "$ROOT/.venv/bin/python" ]; then
    PY=$ROOT/.venv/bin/python
else
    PY=python3  # on the device machine: the one that holds PyTorch
fi

if [ "${1:-}" = "--prepare" ]; then
    # The versions day0 is tested with here, for the device's CPython and x86-64 Linux.
    pins=$("$PY" -c 'import importlib.metadata as m; print(" ".join(f"{d}=={m.version(d)}" for d in
        ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions")))') || exit 2
    # Into a fresh folder, then in place of the old wheels: the device unpacks every *.whl it finds,
    # so a stale version left from an earlier --prepare would be unpacked beside the new one.
    mkdir -p "$(dirname "$WHEELS")" || exit 2
    fresh=$(mktemp -d "${WHEELS%/}.new.XXXXXX") || exit 2
    abi=cp${DEVICE_PYTHON_VERSION/./}
    # shellcheck disable=SC2086 # pins is a list of requirements
    if ! "$PY" -m pip download -q --no-deps --only-binary=:all: -d "$fresh" \
        --python-version "$DEVICE_PYTHON_VERSION" --implementation cp --abi "$abi" --abi abi3 --abi none \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform any $pins; then
        rm -rf "$fresh"
        echo "device-check: pip download failed; $WHEELS is left as it was" >&2
        exit 1
    fi
    mkdir -p "$WHEELS" && rm -f "$WHEELS"/*.whl && mv "$fresh"/*.whl "$WHEELS"/ && rmdir "$fresh" || exit 1
    echo "wheels for CPython $DEVICE_PYTHON_VERSION in $WHEELS:"
    ls -l "$WHEELS"
    echo "device tool: run(command=\"bash scripts/device-check.sh\", carry=[\"build/device-wheels\"], timeout_s=560)"
    exit 0
fi

export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

unpack() {  # DEST WHEEL...: wheels are zip files; no pip, no network, nothing installed
    local dest=$1 whl
    shift
    mkdir -p "$dest" || return 1
    for whl in "$@"; do "$PY" -m zipfile -e "$whl" "$dest" || return 1; done
}

if ! "$PY" -c 'import pydantic' 2>/dev/null; then
    shopt -s nullglob
    main=() te=()
    for whl in "$WHEELS"/*.whl; do
        case $(basename "$whl") in typing_extensions-*) te+=("$whl") ;; *) main+=("$whl") ;; esac
    done
    if [ ${#main[@]} -eq 0 ]; then
        echo "device-check: pydantic is not importable and $WHEELS holds no wheels: the steps that need it" \
             "will report errors (run 'bash scripts/device-check.sh --prepare' where PyPI answers, and carry" \
             "build/device-wheels)" >&2
    else
        rm -rf "$SITE"
        unpack "$SITE/main" "${main[@]}" || exit 2
        # After the image's own packages would be better, but PYTHONPATH comes first: add only the
        # wheels the image lacks, and a newer typing_extensions only when pydantic needs it.
        export PYTHONPATH="$PYTHONPATH:$SITE/main"
        if ! "$PY" -c 'import pydantic' 2>/dev/null && [ ${#te[@]} -gt 0 ]; then
            unpack "$SITE/te" "${te[@]}" || exit 2
            export PYTHONPATH="$ROOT:$SITE/te:${PYTHONPATH#"$ROOT":}"
        fi
        "$PY" -c 'import pydantic; print("device-check: pydantic", pydantic.VERSION, "from", pydantic.__file__)' >&2 \
            || echo "device-check: pydantic still not importable from $SITE" >&2
    fi
fi

exec "$PY" -m day0.device_check "$@"
