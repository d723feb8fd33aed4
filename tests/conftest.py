"""Shared test settings: hypothesis must not flake on a busy 2-core CI machine."""

from hypothesis import HealthCheck, settings

settings.register_profile(
    "day0", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=60
)
settings.load_profile("day0")
