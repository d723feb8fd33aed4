"""The profile's ``[preflight]`` table: what the memory plan reserves beyond weights and KV cache
(docs/stages/preflight.md)."""

from __future__ import annotations

from pydantic import Field

from day0.config.section import Section
from day0.config.topology import MAX_DEVICE_MEMORY_GIB


class PreflightSection(Section):
    # peak activations, graphs and communicator buffers per rank, which vLLM measures at start-up
    activation_headroom_gib: float = Field(2.0, ge=0, le=MAX_DEVICE_MEMORY_GIB)
