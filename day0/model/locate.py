"""The one model locator: where a profile's model is, as vLLM is told it and as files on this machine.

``model.source = "tiny"`` is the embedded tiny model, built once into day0's cache; otherwise
``model.path`` is a local directory or a hub id (or a remote deployment's path, which has no
files here).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from day0.config.profile import Profile


def resolve_model(profile: Profile, log: Callable[[str], None] | None = None) -> str:
    """The ``--model`` value: the embedded tiny model's cached directory or the profile's path."""
    if profile.model.source == "tiny":
        from day0.model.tiny import cached_model

        return str(cached_model(profile.model.tiny, log=log))
    assert profile.model.path is not None
    return profile.model.path


def local_model_dir(profile: Profile) -> Path | None:
    """The model's directory on this machine (the tiny build, or model.path when it is a local
    directory), else None: a hub id or a remote deployment's path has nothing to read here."""
    if profile.model.source == "tiny":
        from day0.model.tiny import cached_model

        return cached_model(profile.model.tiny)
    path = Path(str(profile.model.path))
    return path if path.is_dir() else None
