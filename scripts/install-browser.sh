#!/usr/bin/env bash
# The report's browser test needs headless Chromium (Debian package `chromium`). Installs it when
# missing and this user may (root); otherwise says why, and the test itself decides (it fails
# under CI=true, skips with the reason elsewhere).
set -euo pipefail
if command -v chromium >/dev/null 2>&1 || [[ -n "${DAY0_CHROMIUM:-}" ]]; then
  exit 0
fi
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
  echo "[install] chromium not found and cannot apt-get it here: the report browser test will not run" >&2
  exit 0
fi
echo "[install] installing chromium for the report's browser test"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends chromium >/dev/null
