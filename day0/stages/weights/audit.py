"""Static audit of a safetensors checkpoint: index, shard files, headers, config, manifest.

Why static: a checkpoint that is missing a shard, was truncated by a failed copy, or belongs to a
different config fails minutes into an engine start-up (or, worse, loads and produces garbage).
Every one of those faults is visible in the index, the shard headers and ``config.json`` alone,
so this audit reads only those (kilobytes per shard, seconds for a 1,000-shard checkpoint) and
names each broken shard and tensor before any engine is started.

The steps run in order, each in the module named for what it checks (:mod:`.index`,
:mod:`.headers`, :mod:`.against_config`, :mod:`.integrity`); broken input never raises out of
:func:`audit`.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

from day0.core.inputs import path_problem
from day0.core.record import Check
from day0.stages.weights import against_config, headers, index, integrity
from day0.stages.weights.findings import CATEGORIES, DEFAULT_MAX_CHECKS_PER_CATEGORY, AuditRun
from day0.stages.weights.manifest import MANIFEST_NAME, Progress


def audit(
    model_dir: Path,
    *,
    verify_manifest: bool = True,
    workers: int | None = None,
    progress: Progress = False,
    manifest_name: str = MANIFEST_NAME,
    max_checks_per_category: int = DEFAULT_MAX_CHECKS_PER_CATEGORY,
    architectures: Sequence[str] = (),
) -> list[Check]:
    """Audit ``model_dir`` without loading tensor data; one check list, every problem in it.

    ``workers`` bounds the threads that read headers and hash files (default: usable CPUs).
    ``progress`` is True for a stderr bar, or a callable ``(bytes_done, bytes_total)`` for hashing.
    At most ``max_checks_per_category`` failed checks are emitted per category; the rest are
    folded into one more failed check whose evidence table lists them all. ``architectures``: the
    engine's ``hf_overrides.architectures``, which vLLM takes over config.json's.
    """
    run = AuditRun(Path(model_dir), verify_manifest, workers, progress, manifest_name, architectures)
    try:
        with _gc_paused():
            run_steps(run)
    except Exception as exc:  # a bug here must not cost the caller the checks already made
        run.crash(exc)
    return run.checks(max_checks_per_category)


def run_steps(a: AuditRun) -> None:
    """Every step in order; each reads what the earlier ones learnt (looked up at call time)."""
    why = path_problem(a.dir)
    if why != "is a directory, not a file":  # a symlink loop says so, not "does not exist"
        why = why or "is a file, not a directory"
        a.fail("weights.index", f"{a.dir}: {why}")
        for cat in CATEGORIES[1:]:
            a.skip(cat, f"not checked: model folder {a.dir} {why}")
        return
    index.check_index(a)
    index.check_presence(a)
    index.check_orphans(a)
    headers.read_headers(a)
    index.check_placement(a)
    index.check_total_size(a)
    against_config.check_against_config(a)
    integrity.check_manifest(a)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while building ~10 objects per tensor.

    Why: a 200,000-tensor checkpoint makes millions of long-lived objects and no cycles; the
    collector's repeated full passes over them cost about a third of the audit's CPU time.
    The previous state is restored, whatever happens.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
