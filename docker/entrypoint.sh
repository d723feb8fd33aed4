#!/usr/bin/env bash
# day0 container entrypoint: run the Day0 suites against a profile mounted into the container.
#
#   docker run ... IMAGE                                   all stages, profile /profiles/profile.toml
#   docker run ... IMAGE -m "day0 and collectives" -v      extra arguments go to pytest
#   docker run ... IMAGE day0 compare /reports/latest --baseline latest-accepted
#   docker run ... IMAGE bash                              a shell
#
# Environment (all optional):
#   DAY0_PROFILE   a profile file (mounted) or a preset name        [/profiles/profile.toml]
#   DAY0_OUT       run folders, reports/latest and the history      [/reports]
#   DAY0_MARKER    pytest -m expression                             [day0]
#   DAY0_BASELINE  compare with PATH | latest-accepted | latest     [none]
#   DAY0_SUITES    the staged suites                                [/opt/day0/day0/suites]
#   DAY0_PYTHON    the interpreter that has vLLM and day0           [python3]
#
# The last step is exec'd, so `docker stop` (SIGTERM) reaches pytest, which stops the engine
# and writes the run record before exiting.
set -euo pipefail

profile=${DAY0_PROFILE:-/profiles/profile.toml}
out=${DAY0_OUT:-/reports}
marker=${DAY0_MARKER:-day0}
suites=${DAY0_SUITES:-/opt/day0/day0/suites}
python=${DAY0_PYTHON:-python3}

die() {
  echo "day0 entrypoint: $*" >&2
  exit 2
}

case "${1:-}" in
  day0)
    shift
    exec "$python" -m day0.cli "$@"
    ;;
  bash | sh)
    exec "$@"
    ;;
esac

if [[ "$profile" == */* || "$profile" == *.toml ]]; then
  [[ -f "$profile" ]] || die "profile $profile not found: mount it (-v \$PWD/site.toml:$profile:ro) or set DAY0_PROFILE to a preset name"
fi
[[ -d "$suites" ]] || die "suites folder $suites not found (set DAY0_SUITES)"
mkdir -p "$out" 2>/dev/null || true
[[ -d "$out" && -w "$out" ]] || die "output folder $out is not writable by uid $(id -u): mount a writable folder there (-v \$PWD/reports:$out)"

args=("$suites" -m "$marker" --day0-profile "$profile" --day0-out "$out")
if [[ -n "${DAY0_BASELINE:-}" ]]; then
  args+=(--day0-baseline "$DAY0_BASELINE")
fi
exec "$python" -m pytest "${args[@]}" "$@"
