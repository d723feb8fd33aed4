"""The one answer to "what is this profile's model": its config.json, read offline.

The checkpoint's own config is the truth when it is on disk; ``model.config`` (a path or a
bundled example) lets a supernode be planned before the weights exist. Stage 0 lints and plans
from it, the kvcache stage prices KV bytes per token from it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from day0.config.profile import Profile
from day0.core.inputs import InputError, path_problem
from day0.model import archs
from day0.model.jsonfile import MAX_CONFIG_BYTES, read_json


class ConfigUnavailable(RuntimeError):
    """No config.json can be read offline for this profile (a hub id without ``model.config``)."""


class ConfigInvalid(ValueError):
    """A config.json that is there but cannot describe the model: one line, ``<file>: <key>: <problem>``.

    Why not :class:`ConfigUnavailable`: that one means "nothing to plan from" (a stage skips); a
    broken config is unusable input, never a skip that could pass for "not applicable".
    """


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
    if os.path.lexists(own):  # a FIFO or a dangling link is refused by name, not skipped as absent
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
    """config.json, read strictly: a regular file, bounded, JSON without repeated keys, and every
    key day0 reads that it sets typed and in range (:func:`day0.model.archs.check_types`; whether
    the keys a tensor list needs are all there is :func:`day0.model.arch_tensors.check_config`'s question)."""
    if path_problem(path) == "does not exist":
        raise ConfigUnavailable(f"{path}: config.json not found")
    try:
        config = read_json(path, limit=MAX_CONFIG_BYTES, what="a config.json", unique_keys=True)
    except InputError as exc:
        raise ConfigInvalid(str(exc)) from None
    try:
        archs.check_types(config)
    except archs.ConfigError as exc:
        raise ConfigInvalid(f"{path}: {exc.key}: {exc.problem}") from None
    return config
