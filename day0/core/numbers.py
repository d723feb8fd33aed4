"""Whole numbers typed by a person (command-line counts): one parser, so every count refuses alike;
and a count a server sent (a response's ``usage``), read one way wherever it is read.

``int()`` takes more than a count should: ``-5``, ``+3``, ``1_000``, `` 7 `` and Arabic-Indic or
full-width digits all parse. A count on day0's command line is ASCII digits within stated bounds, or
argparse's one-line usage error naming the option.
"""

from __future__ import annotations

import argparse
import math
from typing import Any, Callable

MAX_DIGITS = 12


def whole_number(minimum: int = 0, maximum: int = 10**12) -> Callable[[str], int]:
    """An argparse ``type`` for a count in [minimum, maximum]."""

    def parse(text: str) -> int:
        if not (text.isascii() and text.isdigit()) or len(text) > MAX_DIGITS:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number (ASCII digits, >= {minimum})")
        value = int(text)
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"{value} is outside {minimum}..{maximum}")
        return value

    parse.__name__ = "whole number"  # argparse names the type in its message
    return parse


# The largest token count a server is believed: far past any context or batch (a server sends
# thousands), and exact in a double, so every figure computed from it in floats stays finite.
TOKEN_COUNT_MAX = 2**53


def token_count(value: Any) -> int | None:
    """``value`` as a count a server sent: a finite, non-negative whole number (``4`` or ``4.0``) up
    to ``TOKEN_COUNT_MAX``, else None. ``Infinity``, ``1e999``, ``NaN``, ``-1``, ``true`` or ``"4"``
    is no count a server could have meant, and ``int()`` of the first two raises OverflowError; nor
    is an integer of 400 digits, which JSON allows and which once ended ``day0 latency`` with
    "int too large to convert to float" when the token throughput was computed."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= TOKEN_COUNT_MAX:
        return value
    return None
