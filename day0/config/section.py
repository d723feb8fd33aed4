"""The base of a profile section: a strict, frozen table that refuses unknown keys and non-finite numbers.

Every section model of the profile (``[model]``, ``[engine]``, ``[topology]``, ``[preflight]``,
``[weights]``, ``[kvcache]``, ``[risks]``, ``[report]``) derives from :class:`Section`, so a typo, a
wrong type or an ``inf`` is refused the same way everywhere (``day0.config.errors`` turns the
refusal into one line naming the key path).
"""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import BaseModel, ConfigDict

# A name a POSIX shell can export: [engine.env] names reach every node's `export NAME=...` (ssh).
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Section(BaseModel):
    # inf and nan are TOML floats; no key here means "unbounded" by inf, and nan passes no check.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


def checked_env(value: dict[str, str]) -> dict[str, str]:
    """An engine's environment (``[engine.env]``, a reference engine's): names a shell can export,
    since each goes into the environment of every rank on every node, over ssh by ``export
    NAME=...``, where ``X=1;touch f`` would run and ``NCCL-DEBUG`` would kill the rank before vLLM
    starts; no NUL in a value. The refusal never shows a value: it may be a secret."""
    for name in value:
        if not ENV_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not an environment variable name (letters, digits and _, "
                             "not starting with a digit)")
        if "\0" in str(value[name]):
            raise ValueError(f"{name}: its value holds a NUL byte, which no environment variable can")
    return value


def checked_args(value: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Engine arguments, passed through unchanged, so outside the sections' own ``allow_inf_nan =
    False``: a nan there was shown as "not set" by `profile show` while vLLM got
    ``--gpu-memory-utilization nan``; a NUL can be in no command-line argument."""
    def walk(v: Any, path: str) -> None:
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"{path}: {v} is not a finite number")
        if isinstance(v, str) and "\0" in v:
            raise ValueError(f"{path}: holds a NUL byte, which no command-line argument can")
        for k, item in (v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()):
            walk(item, f"{path}.{k}")
    for key, item in value.items():
        walk(item, f"{prefix}{key}")
    return value
