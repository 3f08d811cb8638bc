"""Text that did not come from mibyan is made safe before it reaches a terminal: `visible(text)`.

Model text, reasoning, tool output, commands, paths, titles and stored messages may carry escape
sequences (clear the screen, move the cursor up and overwrite what the user is about to approve, set
the window title, write the clipboard) or Unicode that reorders or hides what is shown (bidi overrides,
zero-width characters, tag characters). `visible` replaces every such character by its Python escape
(ESC becomes the four characters `\\x1b`), so it is seen and cannot act. Newlines and tabs stay.

The set is every code point of the Unicode categories Cc (controls, C0 and C1), Cf (format: bidi
controls, zero-width characters, tags), Zl and Zp (line and paragraph separators) and Cs (lone
surrogates), written out as ranges so that importing this costs nothing; a test checks the ranges
against `unicodedata` for every code point.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TextIO

_UNSAFE = re.compile(
    "\r\n|["
    "\x00-\x08\x0b-\x1f\x7f-\x9f"
    "\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u180e"
    "\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f"
    "\ud800-\udfff\ufeff\ufff9-\ufffb"
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0001\U000e0020-\U000e007f"
    "]"
)


def _escape(match: re.Match[str]) -> str:
    found = match.group()
    if found == "\r\n":  # a Windows line end moves to the next line like "\n" does: nothing to show
        return "\n"
    code = ord(found)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def visible(text: str) -> str:
    """`text` with every control, format and separator character shown as an escape (\\n and \\t kept)."""
    if _UNSAFE.search(text) is None:
        return text
    return _UNSAFE.sub(_escape, text)


def visible_with(text: str, wrap: Callable[[str], str]) -> str:
    """`visible(text)`, each escape passed through `wrap` (a page marks them up to tell them apart).

    `wrap` gets the escape only (such as `\\x1b`, ASCII letters, digits and a backslash), never the text.
    """
    if _UNSAFE.search(text) is None:
        return text
    return _UNSAFE.sub(lambda match: "\n" if match.group() == "\r\n" else wrap(_escape(match)), text)


def _json_escape(match: re.Match[str]) -> str:
    found = match.group()
    if found == "\r\n":
        return "\\r\\n"
    code = ord(found)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def visible_json(document: str) -> str:
    """A JSON document (from `json.dumps(..., ensure_ascii=False)`) with the same characters written as
    `\\uXXXX` escapes: the same data, readable in every other script, and safe on a terminal."""
    if _UNSAFE.search(document) is None:
        return document
    return _UNSAFE.sub(_json_escape, document)


def for_stream(stream: TextIO, text: str) -> str:
    """`text` as it should be written to `stream`: made visible on a terminal, unchanged for a pipe or
    a file (a program reading mibyan's answer gets its bytes as they are)."""
    return visible(text) if stream.isatty() else text
