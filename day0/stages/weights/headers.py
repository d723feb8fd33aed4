"""Shard headers: read every present shard's header (kilobytes each, never the tensor data) and
judge its layout and size.

* ``weights.shard_header``: the header is readable, well-formed safetensors JSON;
* ``weights.shard_layout``: the tensors tile the data section exactly (dtype x shape = bytes);
* ``weights.shard_size``: the file is exactly as long as the header declares (no truncation or
  padding).

What is read lands in ``AuditRun.headers`` and ``AuditRun.located`` for the later steps.
"""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Union

from day0.model.safetensors_header import HeaderError, ShardHeader, parse_header, read_header_bytes, short_name
from day0.stages.weights.findings import AuditRun, human

_PROBE_READS = 8  # header reads timed before deciding whether threads would help
_SLOW_READ_S = 0.0005  # slower than this per header read: a remote file system, read in parallel
# JSON header bytes read in all. Parsed headers cost about 7 bytes of memory per byte, and
# safetensors allows 100 MB per file, so a hostile folder of many big headers would otherwise
# cost gigabytes; real checkpoints hold tens of MB of headers at most (kilobytes per shard).
MAX_TOTAL_HEADER_BYTES = 256_000_000

Parsed = Union[ShardHeader, HeaderError]


def read_headers(a: AuditRun) -> None:
    """Read the headers of every shard that is not missing, then record what they say."""
    todo = _distinct_files(a, [s for s in a.shards if s not in a.missing])
    bar = None
    if a.progress is True and len(todo) > 1:
        from tqdm import tqdm

        bar = tqdm(total=len(todo), unit="shard", desc="headers", file=sys.stderr, leave=False)
    try:
        results = _read_all(a, todo, bar)
    finally:
        if bar is not None:
            bar.close()
    _record(a, todo, results)


def _distinct_files(a: AuditRun, shards: list[str]) -> list[str]:
    """``shards`` less each name that is the same file as an earlier one (a hard link or symlink).

    vLLM would load such a file once per name, every tensor twice; and reading it again would
    let a folder of links to one huge header multiply the audit's time and memory. One finding
    per extra name, which counts as unreadable (its tensors are not verifiable by name).
    """
    first: dict[tuple[int, int], str] = {}
    keep = []
    for shard in shards:
        try:
            st = os.stat(a.dir / shard)
        except (OSError, ValueError):  # the read that follows names the problem
            keep.append(shard)
            continue
        same = first.setdefault((st.st_dev, st.st_ino), shard)
        if same == shard:
            keep.append(shard)
            continue
        a.unreadable.add(shard)
        a.fail("weights.shard_header", f"{shard}: the same file as {same} (a hard link or symlink to it): "
                                       "vLLM would load its tensors twice", shard=shard)
    return keep


def _read_all(a: AuditRun, todo: list[str], bar: Any) -> list[Parsed]:
    """Headers of ``todo`` in order, read in this thread or (on a slow file system) a thread pool."""
    spent = [0]  # header bytes parsed so far: past MAX_TOTAL_HEADER_BYTES the rest are not read

    def over_budget(shard: str) -> HeaderError | None:
        if spent[0] <= MAX_TOTAL_HEADER_BYTES:
            return None
        return HeaderError(f"{short_name(shard)}: not read: the shards before it hold {human(spent[0])} of "
                           f"header JSON, more than day0 audits ({human(MAX_TOTAL_HEADER_BYTES)})")

    # Each shard's problem is that shard's finding: nothing one file holds may stop the others
    # from being read, hence the broad excepts (the message names the shard and the error).
    def fetch(shard: str) -> tuple[bytes, int] | HeaderError:
        if (refused := over_budget(shard)) is not None:
            return refused
        try:
            return read_header_bytes(a.dir / shard, short_name(shard))
        except HeaderError as exc:
            return exc
        except Exception as exc:  # e.g. a path the OS refuses outright
            return HeaderError(f"{short_name(shard)}: cannot read ({type(exc).__name__}: {exc})")

    def parse(shard: str, got: tuple[bytes, int] | HeaderError) -> Parsed:
        if bar is not None:
            bar.update(1)
        if isinstance(got, HeaderError):
            return got
        if (refused := over_budget(shard)) is not None:
            return refused
        spent[0] += len(got[0])
        try:
            return parse_header(got[0], got[1], short_name(shard))
        except HeaderError as exc:
            return exc
        except Exception as exc:  # RecursionError and MemoryError included
            return HeaderError(f"{short_name(shard)}: header cannot be parsed ({type(exc).__name__})")

    # A local or page-cached read takes tens of microseconds, and threads would only add GIL
    # hand-offs; a network file system (Lustre, NFS, a FUSE bucket) takes milliseconds per
    # open, and there threads overlap the waits. So time a few reads first and decide.
    # Parsing holds the GIL either way and stays in this thread, consuming reads in order.
    probe = todo[:_PROBE_READS]
    t0 = time.perf_counter()
    fetched = [fetch(s) for s in probe]
    per_read = (time.perf_counter() - t0) / max(1, len(probe))
    results = [parse(s, got) for s, got in zip(probe, fetched)]
    rest = todo[len(probe):]
    if rest and a.workers > 1 and per_read > _SLOW_READ_S:
        with ThreadPoolExecutor(max_workers=min(4 * a.workers, 32), thread_name_prefix="day0-header") as pool:
            results += [parse(s, got) for s, got in zip(rest, pool.map(fetch, rest))]
    else:
        results += [parse(s, fetch(s)) for s in rest]
    return results


def _record(a: AuditRun, todo: list[str], results: list[Parsed]) -> None:
    """Keep each readable header, fail each unreadable one and each layout/size problem."""
    n_tensors = header_bytes = 0
    rows = []
    for shard, res in zip(todo, results):
        if isinstance(res, HeaderError):
            a.unreadable.add(shard)
            a.fail("weights.shard_header", str(res), shard=shard)
            continue
        a.headers[shard] = res
        n_tensors += len(res.tensors)
        header_bytes += res.header_len
        rows.append([shard, res.file_size, len(res.tensors), res.header_len])
        for name in res.tensors:
            a.located.setdefault(name, []).append(shard)
        for p in res.problems:
            cat = "weights.shard_size" if p.kind == "size" else "weights.shard_layout"
            a.fail(cat, p.message, shard=shard, tensor=p.tensor, value=p.value, limit=p.limit,
                   unit="bytes" if p.kind == "size" else "")
    if not todo:
        for cat in ("weights.shard_header", "weights.shard_layout", "weights.shard_size"):
            a.skip(cat, "not checked: no shard file to read")
        return
    table = {"columns": ["shard", "bytes", "tensors", "header bytes"], "rows": rows[:2000]}
    a.ok("weights.shard_header",
         f"{len(a.headers)} shard headers read: {n_tensors} tensors, {human(header_bytes)} of JSON",
         value=len(a.headers), unit="shards", evidence={"table": table})
    a.ok("weights.shard_layout",
         f"in all {len(a.headers)} readable shards the tensors tile the data exactly (dtype x shape = bytes)",
         value=n_tensors, unit="tensors")
    total = sum(h.file_size for h in a.headers.values())
    a.ok("weights.shard_size",
         f"all {len(a.headers)} readable shards are exactly the size their headers declare ({human(total)})",
         value=total, limit=total, unit="bytes")
