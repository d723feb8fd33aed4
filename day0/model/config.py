"""The one answer to "what is this profile's model": its config.json, read offline.

The checkpoint's own config is the truth when it is on disk; ``model.config`` (a path or a
bundled example) lets a supernode be planned before the weights exist. Stage 0 lints and plans
from it, the kvcache stage prices KV bytes per token from it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from day0.config.profile import Profile
from day0.model import archs


class ConfigUnavailable(RuntimeError):
    """No config.json can be read offline for this profile (a hub id without ``model.config``)."""


def model_config(profile: Profile) -> tuple[dict[str, Any], str]:
    """(config.json contents, where it came from): the model's own, else ``model.config``.

    The checkpoint's config is the truth when it is on disk; ``model.config`` lets a supernode be
    planned from a config.json (or a bundled example) before the weights exist.
    """
    if profile.model.source == "tiny":
        from day0.model.tiny import cached_model

        d = cached_model(profile.model.tiny)
        return _read(d / "config.json"), str(d / "config.json")
    assert profile.model.path is not None
    own = Path(profile.model.path) / "config.json"
    if own.is_file():
        return _read(own), str(own)
    ref = profile.model.config
    if ref:
        if ref in archs.example_names():
            return archs.example_config(ref), f"example config {ref!r}"
        path = Path(ref)
        return _read(path if path.name.endswith(".json") else path / "config.json"), str(path)
    raise ConfigUnavailable(f"model.path {profile.model.path!r} has no local config.json; set model.config to a "
                            f"config.json path or one of {', '.join(archs.example_names())}")


def _read(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigUnavailable(f"{path}: config.json not found") from None
    except json.JSONDecodeError as exc:
        raise ConfigUnavailable(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
