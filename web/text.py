"""Stored text as HTML: the one place the viewer turns untrusted strings into markup.

Everything shown came from a model, its tools or whoever wrote to them, so it is escaped here and
nowhere else: `text_html` for plain text (control and format characters shown as visible escapes),
`markdown_html` for answers (markdown-it with raw HTML off, images off, and links only to http(s),
mailto and this page), `snippet_html` for search snippets (the highlight marks are random per search
and applied after escaping, so stored text cannot forge them) and `attribute` for text inside an
attribute. Each returns `Markup` for the templates, whose autoescape handles everything else.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.renderer import RendererHTML
from markdown_it.token import Token
from markdown_it.utils import EnvType, OptionsDict
from markupsafe import Markup, escape

from mibyan.core.sanitize import visible, visible_with

_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.\-]*):")
#: What a browser ignores in a URL (so `java\tscript:` is `javascript:` to it).
_IGNORED_IN_URL = re.compile(r"[\x00-\x20\x7f]")
_SAFE_SCHEMES = frozenset({"http", "https", "mailto"})


def _escape_mark(escaped: str) -> str:
    return f'<span class="ctl">{escaped}</span>'


def text_html(text: str | None) -> Markup:
    """Plain text as HTML: escaped, with control characters as marked-up escapes (`\\x1b`)."""
    if not text:
        return Markup("")
    return Markup(visible_with(str(escape(text)), _escape_mark))


def attribute(text: str | None) -> str:
    """Text for an attribute (a tooltip): visible escapes, no markup; autoescape quotes it."""
    return visible(text or "")


def safe_link(url: str) -> bool:
    """Whether a link in stored Markdown may stay a link: http(s), mailto, or a path on this page."""
    squeezed = _IGNORED_IN_URL.sub("", url)
    found = _SCHEME.match(squeezed)
    if found is None:
        return not squeezed.startswith("\\")
    return found.group(1).lower() in _SAFE_SCHEMES


def _link_open(
    renderer: RendererHTML, tokens: Sequence[Token], index: int, options: OptionsDict, env: EnvType
) -> str:
    tokens[index].attrSet("rel", "noopener noreferrer nofollow")
    return renderer.renderToken(tokens, index, options, env)


def _markdown() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
    md.enable("table").enable("strikethrough").disable("image")
    md.validateLink = safe_link  # type: ignore[method-assign]
    md.add_render_rule("link_open", _link_open)
    return md


_MD = _markdown()  # built once: nothing changes its rules afterwards


def markdown_html(text: str | None) -> Markup:
    """An answer's Markdown as HTML (raw HTML shown as text, unsafe links left as text)."""
    if not text:
        return Markup("")
    return Markup(_MD.render(visible(text)))


def snippet_html(snippet: str | None, marks: tuple[str, str]) -> Markup:
    """A search snippet whose matches FTS5 wrapped in `marks`, escaped, with the matches in <mark>."""
    opening, closing = marks
    parts: list[str] = []
    for index, piece in enumerate((snippet or "").split(opening)):
        if index == 0:
            parts.append(text_html(piece))
            continue
        matched, _, rest = piece.partition(closing)
        parts.append(f"<mark>{text_html(matched)}</mark>{text_html(rest)}")
    return Markup("".join(parts))


def pretty_arguments(arguments: Any) -> str:
    """A tool call's arguments as indented JSON when they parse, else as they were sent."""
    import json

    if not isinstance(arguments, str):
        return json.dumps(arguments, ensure_ascii=False, indent=2)
    try:
        return json.dumps(json.loads(arguments), ensure_ascii=False, indent=2)
    except ValueError:
        return arguments
