"""The ``[collectives]`` settings as the stage uses them, and the busbw presets for a topology.

The table itself is defined once, :class:`~day0.config.collectives.CollectivesSection`
(``Profile.collectives`` is an instance of it). The ranks receive it as JSON: ``settings.to_dict()``
written by the launcher, ``CollectivesSection.from_mapping`` read back by
``python -m day0.stages.collectives _launch`` and by torchrun/srun ranks.
"""

from __future__ import annotations

from typing import Any, Mapping

from day0.config.collectives import (
    DTYPES,
    SCOPES,
    CollectivesSection,
    SettingsError,
    check_expected,
    parse_size,
)

__all__ = [
    "DTYPES",
    "EXPECTED_BUSBW_PRESETS",
    "SCOPES",
    "CollectivesSection",
    "SettingsError",
    "check_expected",
    "coerce_settings",
    "expected_busbw_preset",
    "human_bytes",
    "parse_size",
]

#: Realistic large-message busbw (GB/s) for presets. Sourced: H100/H200 8-GPU NVLink all_reduce
#: ~370 (ring) to ~480 (NVLS); NDR InfiniBand ~46 per NIC (one NIC per GPU, NCCL_ALGO=RING);
#: GB200 NVL72 all_reduce ~840. Other ops on NVLink are estimates near the ring figure: replace
#: them with a measured reference of the site's hardware.
EXPECTED_BUSBW_PRESETS: dict[str, dict[str, dict[str, float]]] = {
    "h100_h200_nvlink_8gpu": {
        "intra_node": {"all_reduce": 370.0, "all_gather": 340.0, "reduce_scatter": 340.0,
                       "all_to_all": 300.0, "broadcast": 300.0, "sendrecv": 300.0},
    },
    "ndr_infiniband": {
        "inter_node": {"all_reduce": 46.0, "all_gather": 46.0, "reduce_scatter": 46.0,
                       "all_to_all": 40.0, "broadcast": 40.0, "sendrecv": 40.0},
    },
    "gb200_nvl72": {
        "intra_node": {"all_reduce": 840.0},
        "inter_node": {"all_reduce": 840.0},
    },
    # Measured on a shared 2-core x86-64 box, gloo over loopback, 2 ranks, float32, 4 MiB:
    # 0.07-1.6 GB/s depending on the op and on the neighbours' load (docs/stages/collectives.md).
    # A floor that catches a broken setup (a 10x slowdown), not a performance target.
    "cpu_gloo_loopback": {
        "intra_node": {"all_reduce": 0.05, "all_gather": 0.05, "reduce_scatter": 0.05,
                       "all_to_all": 0.05, "expert_dispatch": 0.05, "expert_combine": 0.05,
                       "broadcast": 0.05, "sendrecv": 0.05},
    },
}


def human_bytes(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def coerce_settings(settings: CollectivesSection | Mapping[str, Any] | None) -> CollectivesSection:
    """The settings from the model itself, a table (TOML or the ranks' JSON), or nothing (defaults)."""
    if isinstance(settings, CollectivesSection):
        return settings
    if settings is not None and not isinstance(settings, Mapping) and hasattr(settings, "model_dump"):
        settings = settings.model_dump()  # another pydantic model holding the same keys
    return CollectivesSection.from_mapping(settings)


def expected_busbw_preset(*names: str) -> dict[str, dict[str, float]]:
    """Merge named presets of :data:`EXPECTED_BUSBW_PRESETS` (later names win per op)."""
    out: dict[str, dict[str, float]] = {}
    for name in names:
        if name not in EXPECTED_BUSBW_PRESETS:
            raise KeyError(f"no busbw preset {name!r} (known: {', '.join(EXPECTED_BUSBW_PRESETS)})")
        for scope, table in EXPECTED_BUSBW_PRESETS[name].items():
            out.setdefault(scope, {}).update(table)
    return out
