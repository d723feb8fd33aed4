"""What a command prints: every line redacted, then escaped, on its way to the terminal.

A command's output is a channel like a run's files: it lands in CI logs, tickets and screen
shares, and it quotes what nobody vetted (a profile's keys and values, a config path, a server's
model id or error body, a record's messages, a tool's stderr). Two questions are asked of every
such line and each has one answer in day0: *may it hold a secret?* (:class:`day0.core.redact.Redactor`,
by known value and by shape) and *may it act on the terminal?* (:func:`day0.core.inputs.term_safe`).
:class:`Terminal` asks both, in that order (redaction reads the text as it was; escaping first
would turn a newline inside a secret into ``\\n`` and hide it from the redactor), so a command
holds one Terminal and never calls ``print`` on untrusted text itself.

A line day0 formats may still span several lines (a table): :meth:`Terminal.block` keeps day0's
own newlines only when the formatter already passed each line through :meth:`Terminal.line`, so
an untrusted newline can never forge a line of its own.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any, TextIO

from day0.core.inputs import term_safe
from day0.core.redact import Redactor


@dataclass(frozen=True)
class Terminal:
    """The one way a command prints untrusted text: ``Terminal(profile.redactor()).print(...)``.

    The default redactor knows the secrets of this environment (variables named like secrets) and
    every secret shape, which is what a command without a profile can know.
    """

    redactor: Redactor = field(default_factory=Redactor.from_sources)

    def line(self, text: object) -> str:
        """``text`` as one printable line: secrets redacted, then every control character escaped."""
        return term_safe(self.redactor.text(str(text)))

    def print(self, *lines: object, err: bool = False) -> None:
        """Each of ``lines`` as one line of stdout (stderr with ``err``); no line can become two."""
        out: TextIO = sys.stderr if err else sys.stdout
        for text in lines or ("",):
            print(self.line(text), file=out)

    def block(self, text: str, err: bool = False) -> None:
        """A multi-line text day0 formatted from lines that each went through :meth:`line` (or
        :func:`term_safe`): its own newlines are kept, every line is redacted again."""
        self.print(*text.split("\n"), err=err)

    def export(self, data: Any, *, by_key: bool = True) -> Any:
        """A JSON-like value for a ``--json`` export, redacted as the event log redacts a check: values
        under secret keys blanked, every string through :meth:`Redactor.text`. ``by_key=False`` for
        day0's own tables, where ``key`` names a figure, not a credential (``Redactor.strings``)."""
        return self.redactor(data) if by_key else self.redactor.strings(data)

    def json(self, data: Any, indent: int | None = 2, *, by_key: bool = True) -> str:
        """``data`` redacted (:meth:`export`), as JSON text (control characters escaped by JSON itself)."""
        return json.dumps(self.export(data, by_key=by_key), indent=indent)
