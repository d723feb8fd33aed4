"""Files handed to the collectives stage (nccl-tests output, NCCL_DEBUG logs, a result or a
settings file): the stage's caps on :mod:`day0.core.inputs`, which reads them without trusting them.

Whatever the path turns out to be (a FIFO nobody writes to, a directory, ``/dev/zero``, a symlink
loop, a 10 GB log, one line of 10 MB, binary bytes), the reader answers in bounded time and memory
with one :class:`InputError` naming the file (and the line and column where one applies), which the
command line prints as ``day0: <file>[:line[:col]]: <problem>``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from day0.core.inputs import InputError, text_lines

__all__ = ["MAX_FILE_BYTES", "MAX_JSON_BYTES", "MAX_LINE_BYTES", "UNREADABLE_LOG", "InputError", "iter_lines"]

#: Generous caps: a whole nccl-tests sweep is kilobytes, an NCCL_DEBUG=INFO log of thousands of
#: ranks a few hundred megabytes. Anything beyond is not one of them, or must be split.
MAX_FILE_BYTES = 256 << 20
MAX_JSON_BYTES = 64 << 20  # parsed whole: a JSON document costs several times its size in objects
MAX_LINE_BYTES = 1 << 20  # an NCCL ring line of 100,000 ranks is ~600 KB


def iter_lines(path: Path | str, *, lenient: bool = False) -> Iterator[tuple[int, str]]:
    """:func:`day0.core.inputs.text_lines` under the stage's caps (``lenient``: for the logs
    day0's own ranks wrote, where a killed rank may leave NUL padding)."""
    return text_lines(path, cap=MAX_FILE_BYTES, max_line=MAX_LINE_BYTES, lenient=lenient)


#: The line :func:`day0.stages.collectives.result.nccl_log_text` puts where a rank's log could not be
#: read (``UNREADABLE_LOG<TAB>path<TAB>problem``): the parser turns it into a refusal naming that file,
#: so a missing node's log can never leave the other nodes' connections to pass alone.
UNREADABLE_LOG = "day0-unreadable-nccl-log"
