"""A secret given as a list, in free text: bracketed (JSON, a Python repr such as vLLM's
``api_key=['a', 'b']``, one level of nested lists) or a YAML block (``api_key:`` then ``- X``).

The patterns here say where such a list's items start and end; :func:`has_secret_item` says
whether any one of them reads as a secret, and then the whole list goes. Why a module of its own:
most of what free text can hide in a list is escaping (a JSON list quoted in a log line quoted in
an event), and each depth has its own rule for where an item ends; :mod:`day0.core.redact` puts
these pieces into its shapes and keeps the names and values that are no list.
"""

from __future__ import annotations

import re

# A YAML list's next item: a line break (or a JSON-escaped one), the indent, and its dash.
YAML_ITEM = r"(?:\r?\n|\\{1,3}n)[ \t]{0,64}+-[ \t]{1,16}+"
# Blank or comment lines between a YAML list's items (at most 64 of them).
YAML_GAP = r"(?:\r?\n[ \t]{0,64}+(?:#[^\r\n]{0,1024}+)?(?=\r?\n)){0,64}+"
# A YAML block's next item, which may be empty (`-` alone on its line)
YAML_BLOCK_ITEM = r"(?:\r?\n|\\{1,3}n)[ \t]{0,64}+-(?:[ \t]{1,16}+|(?=\r?\n|\\n|$))"


def _quoted_item(depth: int, quote: str) -> str:
    """A list's item in quotes escaped ``depth`` backslashes deep, to the quote escaped as its
    opening one and then the item's end (a comma, the list's ``]``, a line break). A quote escaped
    deeper is the item's own character; in JSON-escaped text ``\\.`` would read the closing ``\\"``
    as one and run on past the list, over whatever came next (a secret in a later field). At depth
    d the item's own quote stands after 2d+1 backslashes and its own backslash is 2d+2 of them, so
    an item ending in a backslash still closes where it does."""
    if depth == 0:
        body = r"[^%s\\\r\n]|\\[^\r\n]" % quote
    else:
        unit = 2 * depth + 2  # an escaped backslash of the item's own text, at this depth
        body = (r"[^%s\\\r\n]|(?:\\{%d})*+\\{%d}%s|(?:\\{%d})++(?=\\{%d}%s)|\\++(?!%s)"
                % (quote, unit, 2 * depth + 1, quote, unit, depth, quote, quote))
    return r"\\{%d}%s(?:%s){0,512}+\\{%d}%s(?=\s*+(?:[,\]]|\\{1,7}[nrt]))" % (depth, quote, body, depth, quote)


# A list's quoted item, whole, where an item starts: a bracket inside it is the secret's character,
# not the list's end (`"api_key": ["Xy]Z..."]` lost only `Xy` before). Not a match (an unclosed or
# odd quote): the list is read character by character, to its first bracket, as before.
QUOTED_ITEM = r"(?:(?<![^\s\[,])|(?<=\\[nrt]))(?:" + "|".join(_quoted_item(d, q) for d in (7, 3, 1, 0) for q in "\"'") + ")"
# A bracketed list's items, after its `[`: quoted items whole, a nested list, anything but a bracket
LIST_ITEMS = QUOTED_ITEM + r"|\[[^\[\]]{0,4096}+\]|[^\[\]]"
# A flag's list (`--api-key ["X"]`): the same on one line, to its `]` or the line's end: a `[` that
# never closes is no list of keys that a log would print across lines
FLAG_LIST_ITEMS = QUOTED_ITEM + r"|\[[^\[\]\r\n]{0,4096}+\]|[^\[\]\r\n]"

_YAML_NEXT = re.compile(YAML_GAP + YAML_BLOCK_ITEM)
# A list's items: quoted (a comma inside stays inside), or anything to the next comma
_LIST_ITEM = re.compile(r"\s*+(?:\\{0,7}\"(?:[^\"\\]|\\.){0,512}+\\{0,7}\"|\\{0,7}'(?:[^'\\]|\\.){0,512}+\\{0,7}'|[^,]*+)")
# A blank, or a line break or tab JSON-escaped up to three deep: what stands around a pretty-printed item
_BLANK = re.compile(r"\s|\\{1,7}[nrt](?![A-Za-z0-9])")  # not a backslash inside a secret: Pa\tss9word
_BLANKS = re.compile(r"(?:\s|\\{1,7}[nrt])*+")
# An item's edges: blanks, brackets, quotes, backslashes and JSON-escaped breaks, from the front, and
# (on the reversed item) from the back; one possessive pass each, so a long run inside costs nothing.
_ITEM_LEAD = re.compile(r"[\s\[\]\\\"']*+")
_ITEM_TAIL = re.compile(r"(?:[\s\[\]\"']|[nrt]\\{1,7}|\\)*+")
_NOT_VALUES = frozenset({"true", "false", "null", "none"})
LETTER = re.compile(r"[a-z]", re.IGNORECASE)  # a bare value is a word, not a number, when it holds one


def has_secret_item(items: str, *, yaml: bool, digits_ok: bool, min_len: int) -> bool:
    """Whether any item of a list under a secret's name (``items``: a bracketed list's inside, or a
    YAML block from its first item) would be a secret standing alone; a list of counts, flags or
    tokenizer words stays."""
    pieces = _YAML_NEXT.split(items) if yaml else _LIST_ITEM.findall(items)
    return any(_item_is_secret(piece, digits_ok, min_len) for piece in pieces)


def _item_is_secret(piece: str, digits_ok: bool, min_len: int) -> bool:
    """One item, judged as a value standing alone would be: quoted, ``min_len`` characters; bare,
    its first word of ``min_len`` with a letter (or digits under a credential's name), not
    ``true``/``null``. So ``"secret": [true, false]``, ``"token": [1, 2]`` and ``[r for r in batch
    if r.has_new_token]`` stay. Line breaks and indents around it go first, JSON-escaped ones too
    (a pretty-printed list quoted in a string: ``[\\n    \\"X\\"``)."""
    piece = piece[_BLANKS.match(piece).end():]
    start, end = _ITEM_LEAD.match(piece).end(), len(piece) - _ITEM_TAIL.match(piece[::-1]).end()
    inner = piece[start:max(start, end)]
    if len(inner) < min_len:
        return False
    if re.match(r"[\s\[]*\\{0,7}[\"']", piece):
        return True
    word = _BLANK.split(inner, 1)[0]  # a bare item with blanks: its first word, as a bare value is read
    return (len(word) >= min_len and word.lower() not in _NOT_VALUES
            and (digits_ok or bool(LETTER.search(word))))
