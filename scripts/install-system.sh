#!/usr/bin/env bash
# The Debian packages day0 uses beside Python, installed when missing and this user may (root):
#   net       iproute2 (ip, tc): the emulated multi-node cluster (network namespaces, tbf shaping)
#   browser   chromium: the report's browser test
#   slurm     slurmctld, slurmd, slurm-client, munge: a real Slurm on the emulated nodes
#   lint      shellcheck: the image entrypoint's lint test
# Otherwise it says why, and the tests decide (the browser test fails under CI=true, the
# emulated-cluster tests skip with the reason where there is no root).
set -euo pipefail
want=()
for group in "$@"; do
  case $group in
    net) command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1 || want+=(iproute2) ;;
    browser) command -v chromium >/dev/null 2>&1 || [[ -n "${DAY0_CHROMIUM:-}" ]] || want+=(chromium) ;;
    slurm) for b in slurmctld slurmd sbatch munged; do
             command -v $b >/dev/null 2>&1 || [[ -x /usr/sbin/$b ]] || { want+=(slurmctld slurmd slurm-client munge); break; }
           done ;;
    lint) command -v shellcheck >/dev/null 2>&1 || want+=(shellcheck) ;;
    *) echo "[install] unknown package group: $group (net, browser, slurm, lint)" >&2; exit 2 ;;
  esac
done
[[ ${#want[@]} -eq 0 ]] && exit 0
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
  echo "[install] ${want[*]} not found and cannot apt-get them here: the tests that need them will say so" >&2
  exit 0
fi
echo "[install] installing ${want[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${want[@]}" >/dev/null
