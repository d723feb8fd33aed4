"""The base of a profile section: a strict, frozen table that refuses unknown keys and non-finite numbers.

Every section model of the profile (``[model]``, ``[engine]``, ``[topology]``, ``[preflight]``,
``[weights]``, ``[kvcache]``, ``[risks]``, ``[report]``) derives from :class:`Section`, so a typo, a
wrong type or an ``inf`` is refused the same way everywhere (``day0.config.errors`` turns the
refusal into one line naming the key path).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    # inf and nan are TOML floats; no key here means "unbounded" by inf, and nan passes no check.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)
