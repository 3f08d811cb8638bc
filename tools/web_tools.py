"""web_fetch: read a web page as text."""

from __future__ import annotations

import re
from html.parser import HTMLParser

from mibyan.agent.errors import ToolError
from mibyan.tools.registry import tool

_MAX_BYTES = 2 * 1024 * 1024
_SKIP_TAGS = {"script", "style", "noscript", "svg", "head", "template"}
_BLOCK_TAGS = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "section", "article", "pre"}


class _TextExtractor(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skipping = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIP_TAGS:
            self._skipping += 1
        elif tag in _BLOCK_TAGS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIP_TAGS and self._skipping:
            self._skipping -= 1
        elif tag in _BLOCK_TAGS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skipping:
            self.parts.append(data)


def html_to_text(html: str) -> str:
    extractor = _TextExtractor()
    extractor.feed(html)
    text = "".join(extractor.parts)
    text = re.sub(r"[ \t\r\f\v]+", " ", text)
    return re.sub(r"\n\s*\n+", "\n\n", text).strip()


@tool(toolset="core", max_result_chars=40_000)
def web_fetch(url: str, timeout: int = 20) -> str:
    """Fetch a web page (http or https) and return its text; HTML is reduced to readable text.

    Args:
        url: the address to fetch, starting with http:// or https://.
        timeout: seconds to wait for the server.
    """
    import httpx2

    if not url.startswith(("http://", "https://")):
        raise ToolError("only http:// and https:// addresses can be fetched")
    try:
        with (
            httpx2.Client(follow_redirects=True, timeout=timeout) as client,
            client.stream("GET", url) as reply,
        ):
            body = bytearray()
            for chunk in reply.iter_bytes():
                body += chunk
                if len(body) > _MAX_BYTES:
                    break
            kind = reply.headers.get("content-type", "")
            status = reply.status_code
            encoding = reply.encoding or "utf-8"
    except httpx2.HTTPError as exc:
        raise ToolError(f"cannot fetch {url}: {exc}") from None
    text = bytes(body[:_MAX_BYTES]).decode(encoding, errors="replace")
    if "html" in kind or text.lstrip()[:15].lower().startswith(("<!doctype html", "<html")):
        text = html_to_text(text)
    elif not kind.startswith("text/") and "json" not in kind and "xml" not in kind:
        return f"HTTP {status}: {kind or 'unknown type'}, {len(body)} bytes (not text)"
    cut = " (cut at 2 MB)" if len(body) > _MAX_BYTES else ""
    return f"HTTP {status} {url}{cut}\n\n{text}"
