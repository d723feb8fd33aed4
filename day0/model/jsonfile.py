"""JSON input files (config.json, the shard index, a manifest) read so that nothing in them can
hang, exhaust memory, or end in anything but one line that names the file.

Why a module of its own: the reading is :mod:`day0.core.inputs`' (a FIFO or a device where a file
should be, a file far larger than its kind ever is, bytes that are not UTF-8, nesting past
Python's recursion limit, a key written twice); what is here is each file's size cap and which
JSON it is held to, and the fast parser a 1,000-shard index wants, which lives in the model layer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from day0.core.inputs import loose_json, read_regular, strict_json
from day0.model.safetensors_header import loads_json

MAX_CONFIG_BYTES = 16 << 20  # published config.json files are a few KB; multimodal ones tens of KB
MAX_INDEX_BYTES = 256 << 20  # a 1,000-shard index with 200,000 tensors is ~20 MB
MAX_MANIFEST_BYTES = 64 << 20


def read_json(path: Path, *, limit: int, label: str | None = None, what: str = "a JSON file",
              unique_keys: bool = False) -> Any:
    """A regular file of at most ``limit`` bytes, parsed as JSON; ``what`` ("an index") names its
    kind in a refusal.

    ``unique_keys`` holds it to strict JSON (:func:`day0.core.inputs.strict_json`: a key twice,
    NaN, a number beyond a float refused): for config.json readers disagree on which of two values
    counts (Python's json and vLLM take the last, others the first or refuse), so a checker that
    silently took one could judge a model vLLM does not load. Without it the file is parsed as any
    reader would (:func:`day0.core.inputs.loose_json`, msgspec's speed for a 20 MB index), and an
    odd value is the finding of the check that reads it.
    """
    raw = read_regular(path, what.removeprefix("an ").removeprefix("a "), limit, label=label)
    where = str(path) if label is None else label
    return strict_json(raw, where) if unique_keys else loose_json(raw, where, loads=loads_json)
