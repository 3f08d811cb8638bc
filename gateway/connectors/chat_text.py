"""A reply's text for chat platforms: split into parts under the platform's limit without breaking a code
fence, and Markdown turned into the small, safe HTML subset chat clients render (Matrix `formatted_body`).
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from typing import Literal

_FENCE = re.compile(r"^\s*(```|~~~)")


def _blocks(text: str) -> list[list[str]]:
    """The text as blocks of lines: each fenced code block whole, everything else line by line."""
    blocks: list[list[str]] = []
    fence: list[str] | None = None
    for line in text.split("\n"):
        if fence is not None:
            fence.append(line)
            if _FENCE.match(line) and len(fence) > 1:
                blocks.append(fence)
                fence = None
        elif _FENCE.match(line):
            fence = [line]
        else:
            blocks.append([line])
    if fence is not None:  # an unclosed fence runs to the end, as Markdown reads it
        blocks.append(fence)
    return blocks


def _bytes(text: str) -> int:
    return len(text.encode())


def _cut_long_line(line: str, limit: int, size: Callable[[str], int] = len) -> list[str]:
    if size is len:
        return [line[start : start + limit] for start in range(0, len(line), limit)] or [""]
    pieces: list[str] = []
    current: list[str] = []
    used = 0  # by bytes: cut between characters, never inside one
    for char in line:
        width = size(char)
        if current and used + width > limit:
            pieces.append("".join(current))
            current, used = [], 0
        current.append(char)
        used += width
    pieces.append("".join(current))
    return pieces


def _cut_fence(block: list[str], limit: int, size: Callable[[str], int] = len) -> list[str]:
    """A code block longer than a part: each piece closed and the next reopened with the same opener."""
    opener = block[0]
    closed = _FENCE.match(block[-1]) is not None and len(block) > 1
    body = block[1:-1] if closed else block[1:]
    closer = block[-1].strip() if closed else opener.strip()[:3]
    room = max(limit - size(opener) - size(closer) - 2, 1)
    pieces: list[str] = []
    current: list[str] = []
    used = 0
    for line in (piece for raw in body for piece in _cut_long_line(raw, room, size)):
        if current and used + size(line) + 1 > room:
            pieces.append("\n".join([opener, *current, closer]))
            current, used = [], 0
        current.append(line)
        used += size(line) + 1
    pieces.append("\n".join([opener, *current, closer]))
    return pieces


def split_reply(text: str, limit: int, unit: Literal["characters", "bytes"] = "characters") -> list[str]:
    """`text` in parts of at most `limit` characters (or UTF-8 bytes), cut between lines; a fenced code
    block stays in one part when it fits in one, and is otherwise closed and reopened at each cut."""
    size: Callable[[str], int] = len if unit == "characters" else _bytes
    if size(text) <= limit:
        return [text]
    parts: list[str] = []
    current: str | None = None  # None: the part has nothing yet ("" is an empty line)
    for block in _blocks(text):
        joined = "\n".join(block)
        pieces = [joined] if size(joined) <= limit else None
        if pieces is None:
            fenced = _FENCE.match(block[0])
            pieces = _cut_fence(block, limit, size) if fenced else _cut_long_line(joined, limit, size)
        for piece in pieces:
            candidate = piece if current is None else f"{current}\n{piece}"
            if size(candidate) <= limit:
                current = candidate
                continue
            if current is not None:
                parts.append(current)
            current = piece
    if current is not None:
        parts.append(current)
    return parts


_INLINE = [
    (re.compile(r"\*\*(.+?)\*\*"), r"<strong>\1</strong>"),
    (re.compile(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])"), r"<em>\1</em>"),
    (re.compile(r"~~(.+?)~~"), r"<del>\1</del>"),
    (re.compile(r"\[([^\]]+)\]\((https?://[^\s)\"]+)\)"), r'<a href="\2">\1</a>'),
]


def _inline(line: str) -> str:
    """Escape, then mark up one line; inline code is left as it is written."""
    pieces = re.split(r"(`[^`]+`)", line)
    out = []
    for piece in pieces:
        if len(piece) > 1 and piece.startswith("`") and piece.endswith("`"):
            out.append(f"<code>{html.escape(piece[1:-1], quote=False)}</code>")
            continue
        escaped = html.escape(piece, quote=True)
        for pattern, replacement in _INLINE:
            escaped = pattern.sub(replacement, escaped)
        out.append(escaped)
    return "".join(out)


def markdown_html(text: str) -> str:
    """The reply as chat HTML: code blocks, inline code, bold, italics, links (http and https only),
    headings and lists; everything else escaped, so the model's text can never inject markup."""
    out: list[str] = []
    in_list = False
    for block in _blocks(text):
        first = block[0]
        if _FENCE.match(first):
            language = re.sub(r"[^\w+-]", "", first.strip()[3:])
            closed = len(block) > 1 and _FENCE.match(block[-1]) is not None
            code = html.escape("\n".join(block[1:-1] if closed else block[1:]), quote=False)
            attribute = f' class="language-{language}"' if language else ""
            line = f"<pre><code{attribute}>{code}\n</code></pre>"
        elif item := re.match(r"^\s*[-*+]\s+(.*)$", first):
            line = ("" if in_list else "<ul>") + f"<li>{_inline(item.group(1))}</li>"
            out.append(line)
            in_list = True
            continue
        elif heading := re.match(r"^(#{1,6})\s+(.*)$", first):
            level = len(heading.group(1))
            line = f"<h{level}>{_inline(heading.group(2))}</h{level}>"
        else:
            line = _inline(first) + "<br>"
        if in_list:
            out.append("</ul>")
            in_list = False
        out.append(line)
    if in_list:
        out.append("</ul>")
    rendered = "".join(out)
    return rendered.removesuffix("<br>")
