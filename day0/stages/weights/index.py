"""Index and shard consistency: ``model.safetensors.index.json`` against the files on disk and
the tensors their headers hold.

* ``weights.index``: the index is readable JSON with a ``weight_map`` of in-folder file names
  (or, without an index, the ``*.safetensors`` files vLLM would load);
* ``weights.shards_present`` / ``weights.orphan_shards``: every shard it names exists, and no
  ``*.safetensors`` file lies outside it;
* ``weights.tensor_placement``: each tensor is in the header of the shard the index names, and
  only there;
* ``weights.total_size``: ``metadata.total_size`` equals the tensor bytes of the shards.
"""

from __future__ import annotations

import os
import reprlib
from collections import Counter
from pathlib import Path
from typing import Any

from day0.core.inputs import InputError, path_problem
from day0.model.jsonfile import MAX_INDEX_BYTES, read_json
from day0.model.safetensors_header import short_name
from day0.stages.weights.findings import INDEX_NAME, AuditRun, human
from day0.stages.weights.manifest import inside_folder


def shard_names(model_dir: Path) -> tuple[list[str], dict[str, str] | None]:
    """(shard names, weight_map or None): the index's shards, else every *.safetensors file."""
    index_path = model_dir / INDEX_NAME
    if index_path.is_file():
        try:
            doc = read_json(index_path, limit=MAX_INDEX_BYTES, label=INDEX_NAME, what="an index")
            weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
            if isinstance(weight_map, dict):
                names = sorted({v for v in weight_map.values() if isinstance(v, str) and inside_folder(v, model_dir)})
                return names, weight_map
        except InputError:
            pass
    return sorted(p.name for p in model_dir.glob("*.safetensors")), None


# --------------------------------------------------------------------------- the index


def check_index(a: AuditRun) -> None:
    """Read the index into ``a.weight_map`` / ``a.shards`` (or fall back to the files on disk)."""
    path = a.dir / INDEX_NAME
    on_disk = sorted(p.name for p in a.dir.glob("*.safetensors"))
    if not os.path.lexists(path):
        return _no_index(a, on_disk)
    fallback = f"; auditing the {len(on_disk)} *.safetensors files found instead"
    try:
        doc = read_json(path, limit=MAX_INDEX_BYTES, label=INDEX_NAME, what="an index")
    except InputError as exc:  # a FIFO, a symlink loop, not UTF-8 or JSON, nested too deep...
        return _index_unusable(a, f"{exc}{fallback}", on_disk)
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict):
        return _index_unusable(a, f"{INDEX_NAME}: no \"weight_map\" object{fallback}", on_disk)
    good = _usable_entries(a, weight_map)
    meta = doc.get("metadata")
    a.index_meta = meta if isinstance(meta, dict) else {}
    a.weight_map = good
    a.shards = sorted(set(good.values()))
    if not good:
        a.fail("weights.index", f"{INDEX_NAME}: weight_map names no tensor")
    a.ok("weights.index", f"{INDEX_NAME}: {len(good)} tensors in {len(a.shards)} shards",
         value=len(a.shards), unit="shards")


def _no_index(a: AuditRun, on_disk: list[str]) -> None:
    a.shards = on_disk
    if not on_disk:
        others = sorted(p.name for p in a.dir.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".gguf"))
        hint = f" (found {', '.join(others[:3])}: this audit covers safetensors only)" if others else ""
        a.fail("weights.index", f"{a.dir}: no {INDEX_NAME} and no *.safetensors file{hint}")
    else:
        kind = "single-file checkpoint" if len(on_disk) == 1 else f"{len(on_disk)} *.safetensors files"
        a.ok("weights.index", f"no {INDEX_NAME}: {kind}, vLLM loads every *.safetensors file",
             value=len(on_disk), unit="shards")
    a.skip("weights.shards_present", f"not checked: no {INDEX_NAME} names shards that could be missing")
    a.skip("weights.orphan_shards", f"not checked: without {INDEX_NAME} every *.safetensors file is a shard")
    a.skip("weights.total_size", f"not checked: no {INDEX_NAME}")


def _usable_entries(a: AuditRun, weight_map: dict[Any, Any]) -> dict[str, str]:
    """The weight_map entries that name a file inside the model folder; the rest are failures."""
    good: dict[str, str] = {}
    verdicts: dict[Any, bool] = {}  # per distinct shard value: thousands of tensors share one
    for tensor, shard in weight_map.items():
        try:
            fine = verdicts[shard]
        except (KeyError, TypeError):
            fine = isinstance(shard, str) and inside_folder(shard, a.dir)
            if isinstance(shard, str):
                verdicts[shard] = fine
        if fine:
            good[tensor] = shard
        elif not isinstance(shard, str) or not shard:
            a.fail("weights.index", f"{INDEX_NAME}: weight_map[{short_name(tensor)!r}] is "
                                    f"{short_name(str(shard))!r}, not a file name", tensor=tensor)
        else:
            a.fail("weights.index", f"{INDEX_NAME}: weight_map[{short_name(tensor)!r}] = {short_name(shard)!r} "
                                    "points outside the model folder (or is not a usable path)",
                   tensor=tensor, shard=shard)
    return good


def _index_unusable(a: AuditRun, message: str, on_disk: list[str]) -> None:
    a.fail("weights.index", message)
    a.shards = on_disk
    for cat in ("weights.shards_present", "weights.orphan_shards", "weights.total_size"):
        a.skip(cat, f"not checked: {INDEX_NAME} is unusable")


# --------------------------------------------------------------------------- the files it names


def check_presence(a: AuditRun) -> None:
    if a.weight_map is None:
        return
    per_shard = Counter(a.weight_map.values())
    total = 0
    for shard in a.shards:
        path = a.dir / shard
        why = path_problem(path)
        if not why:
            total += path.stat().st_size
            continue
        a.missing.add(shard)
        if why.startswith("dangling symlink"):
            why = f"is a symlink to {os.readlink(path)}, which does not exist (incomplete download?)"
        elif why == "does not exist":
            why = f"is missing from {a.dir}"
        elif why.startswith("symlink loop"):
            why = f"is a {why}"
        a.fail("weights.shards_present",
               f"{short_name(shard)}: named in the index for {per_shard[shard]} tensors but {why}", shard=shard)
    a.ok("weights.shards_present",
         f"all {len(a.shards)} shards named in the index exist ({human(total)} in all)",
         value=len(a.shards), limit=len(a.shards), unit="shards")


def check_orphans(a: AuditRun) -> None:
    if a.weight_map is None:
        return
    named = set(a.shards)
    for path in sorted(a.dir.glob("*.safetensors")):
        if path.name in named:
            continue
        try:
            size = human(path.stat().st_size)
        except OSError:
            size = "unreadable"
        a.fail("weights.orphan_shards",
               f"{path.name} ({size}) is not named in {INDEX_NAME}; vLLM skips it: delete it or regenerate the index",
               shard=path.name)
    a.ok("weights.orphan_shards", f"no *.safetensors file outside {INDEX_NAME}", value=0, limit=0, unit="files")


# --------------------------------------------------------------------------- the tensors their headers hold


def check_placement(a: AuditRun) -> None:
    cat = "weights.tensor_placement"
    if not a.headers:
        a.skip(cat, "not checked: no readable shard header")
        return
    unverified = _indexed_tensors_in_their_shard(a) if a.weight_map is not None else 0
    for tensor, shards in a.located.items():
        indexed = a.weight_map.get(tensor) if a.weight_map is not None else None
        if len(shards) > 1:
            note = f"; the index names {indexed}" if indexed else ""
            a.fail(cat, f"tensor {tensor} is in the headers of {len(shards)} shards: {', '.join(shards)}{note}",
                   shard=shards[0], tensor=tensor, value=len(shards), limit=1, unit="shards")
        elif a.weight_map is not None and indexed is None:
            a.fail(cat, f"{shards[0]}: tensor {tensor} is in the header but not in {INDEX_NAME}",
                   shard=shards[0], tensor=tensor)
    if a.weight_map is not None:
        note = f" ({unverified} tensors of missing/unreadable shards not verifiable)" if unverified else ""
        a.ok(cat, f"each of {len(a.weight_map) - unverified} indexed tensors is in the header of the shard "
                  f"the index names, and only there{note}", value=len(a.weight_map) - unverified, unit="tensors")
    else:
        a.ok(cat, f"no tensor appears in more than one of the {len(a.headers)} shards",
             value=len(a.located), unit="tensors")


def _indexed_tensors_in_their_shard(a: AuditRun) -> int:
    """Fail each indexed tensor its shard's header lacks; returns how many could not be verified."""
    assert a.weight_map is not None
    unverified = 0
    for tensor, shard in a.weight_map.items():
        if shard not in a.headers:
            unverified += 1  # missing or unreadable shard: reported once, per shard
            continue
        if tensor in a.headers[shard].tensors:
            continue
        elsewhere = [s for s in a.located.get(tensor, []) if s != shard]
        where = f" (it is in {', '.join(elsewhere)})" if elsewhere else ""
        a.fail("weights.tensor_placement",
               f"{shard}: tensor {tensor} is listed in the index for this shard but is not in its header{where}",
               shard=shard, tensor=tensor)
    return unverified


def check_total_size(a: AuditRun) -> None:
    cat = "weights.total_size"
    if a.weight_map is None:
        return
    declared = a.index_meta.get("total_size")
    if declared is None:
        a.skip(cat, f"not checked: {INDEX_NAME} has no metadata.total_size")
        return
    if a.missing or a.unreadable or len(a.headers) != len(a.shards):
        a.skip(cat, "not checked: some shards are missing or unreadable")
        return
    actual = sum(t.nbytes for h in a.headers.values() for t in h.tensors.values())
    if type(declared) is not int or declared != actual:  # NaN, 1e999, "217984" and true are not sizes
        shown = reprlib.repr(declared)
        a.fail(cat, f"{INDEX_NAME}: metadata.total_size is {shown} bytes, the shards' tensors hold {actual} "
                    "(index written for other shards?)", value=actual,
               limit=declared if type(declared) is int else shown, unit="bytes")
        return
    a.ok(cat, f"metadata.total_size {actual} bytes = sum of tensor bytes in the shards",
         value=actual, limit=declared, unit="bytes")
