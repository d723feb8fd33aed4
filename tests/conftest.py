"""Shared test settings: hypothesis must not flake on a busy 2-core CI machine."""

import os

from hypothesis import HealthCheck, settings

# vLLM's collect_env takes seconds per run, and the harness's tests start dozens of short runs;
# tests/test_environment.py runs it on purpose.
os.environ.setdefault("DAY0_COLLECT_ENV", "0")

settings.register_profile(
    "day0", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=60
)
settings.load_profile("day0")
