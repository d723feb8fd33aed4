"""Whether the checkpoint's bytes are the published ones: the audit's ``weights.manifest`` step,
and the command that writes the manifest from a trusted copy.

The manifest covers every shard plus the index and config.json; hashing and the file format live
in :mod:`day0.stages.weights.manifest`.
"""

from __future__ import annotations

import os
from pathlib import Path

from day0.stages.weights import manifest as manifest_mod
from day0.stages.weights.findings import CONFIG_NAME, INDEX_NAME, AuditRun, human
from day0.stages.weights.index import shard_names
from day0.stages.weights.manifest import MANIFEST_NAME, ManifestError, Progress


def write_manifest(
    model_dir: Path,
    *,
    workers: int | None = None,
    progress: Progress = False,
    manifest_name: str = MANIFEST_NAME,
) -> Path:
    """Hash every shard (plus the index and config.json) into ``model_dir/day0-manifest.json``.

    Raises :class:`~day0.stages.weights.manifest.ManifestError` (one line) when there is nothing to hash or a
    file cannot be read; unlike :func:`~day0.stages.weights.audit.audit` this is a command, so failure is an exception.
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ManifestError(f"{model_dir}: not a directory")
    shards, _ = shard_names(model_dir)
    present = [s for s in shards if (model_dir / s).is_file()]
    if not present:
        raise ManifestError(f"{model_dir}: no safetensors shard to hash")
    extra = [n for n in (INDEX_NAME, CONFIG_NAME) if (model_dir / n).is_file()]
    return manifest_mod.write(model_dir, present + extra, workers=workers, progress=progress,
                              manifest_name=manifest_name)


def check_manifest(a: AuditRun) -> None:
    cat = "weights.manifest"
    path = a.dir / a.manifest_name
    if not a.verify_manifest:
        a.skip(cat, "not checked: manifest verification turned off")
        return
    if not os.path.lexists(path):  # a symlink loop or a FIFO is a finding, not "no manifest"
        a.skip(cat, f"not checked: no {a.manifest_name} in {a.dir} "
                    f"(create one with `day0 weights manifest {a.dir}` from a trusted copy)")
        return
    try:
        files = manifest_mod.load(path)
    except ManifestError as exc:
        a.fail(cat, str(exc))
        return
    required = [s for s in a.shards] + [n for n in (INDEX_NAME, CONFIG_NAME) if (a.dir / n).is_file()]
    result = manifest_mod.verify(a.dir, files, required, manifest_name=a.manifest_name,
                                 workers=a.workers, progress=a.progress)
    for name, message in result.problems:
        a.fail(cat, message, shard=name)
    rate = result.bytes_hashed / 1e6 / result.seconds if result.seconds > 0 else 0.0
    a.ok(cat, f"{len(result.checked)} files ({human(result.bytes_hashed)}) match {a.manifest_name} "
              f"(sha256, {rate:,.0f} MB/s with {a.workers} workers)",
         value=len(result.checked), limit=len(files), unit="files",
         evidence={"bytes_hashed": result.bytes_hashed, "seconds": round(result.seconds, 3),
                   "mb_per_s": round(rate, 1), "workers": a.workers})
