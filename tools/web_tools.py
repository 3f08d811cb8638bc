"""web_fetch: read a web page as text.

Redirects are followed here, one hop at a time, so that every address is judged by
`tools.web_policy` before anything is sent to it.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from typing import TYPE_CHECKING, Any

from mibyan.core.errors import ToolError
from mibyan.core.interruptible import InterruptSignal
from mibyan.tools.context import RunContext
from mibyan.tools.registry import tool
from mibyan.tools.web_policy import checked_addresses

if TYPE_CHECKING:
    from mibyan.core.http_transport import AbortableTransport

#: What one fetch found: the final address, status, content type, encoding and body.
_Fetched = tuple[str, int, str, str, bytearray]

_MAX_BYTES = 2 * 1024 * 1024
_MAX_REDIRECTS = 5
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
def web_fetch(ctx: RunContext, url: str, timeout: int = 20) -> str:
    """Fetch a web page (http or https) and return its text; HTML is reduced to readable text.

    Addresses on this machine or its private network are refused unless the user allows them.

    Args:
        url: the address to fetch, starting with http:// or https://.
        timeout: seconds the whole fetch may take.
    """
    return fetch_page(url, timeout=timeout, allow_private=ctx.allow_private_web, signal=ctx.signal)


def fetch_page(
    url: str,
    *,
    timeout: float,
    allow_private: bool,
    transport: Any = None,
    signal: InterruptSignal | None = None,
) -> str:
    """What web_fetch returns for `url`: the page as text, or a ToolError saying why not.

    Args:
        url: the address to fetch.
        timeout: seconds the whole fetch may take (redirects and a slowly sent page included).
        allow_private: loopback and private addresses may be reached (`web.allow_private`).
        transport: an httpx2 transport to send through instead of the network (for tests).
        signal: the call's stop signal: set, the fetch is cut off at once.
    """
    import httpx2

    if not url.startswith(("http://", "https://")):
        raise ToolError("only http:// and https:// addresses can be fetched")
    from mibyan.core.http_transport import AbortableTransport

    abortable = AbortableTransport(transport)

    def fetch() -> tuple[str, int, str, str, bytearray]:
        try:
            with httpx2.Client(timeout=timeout, transport=abortable) as client:
                return _fetch(client, url, allow_private=allow_private)
        except httpx2.InvalidURL as exc:
            raise ToolError(f"cannot fetch {url}: not a valid address ({exc})") from None
        except httpx2.HTTPError as exc:
            raise ToolError(f"cannot fetch {url}: {exc}") from None

    stop = signal if signal is not None else InterruptSignal()
    final, status, kind, encoding, body = _interruptibly(fetch, abortable, url, timeout, stop)
    text = bytes(body[:_MAX_BYTES]).decode(encoding, errors="replace")
    if "html" in kind or text.lstrip()[:15].lower().startswith(("<!doctype html", "<html")):
        text = html_to_text(text)
    elif not kind.startswith("text/") and "json" not in kind and "xml" not in kind:
        return f"HTTP {status}: {kind or 'unknown type'}, {len(body)} bytes (not text)"
    cut = " (cut at 2 MB)" if len(body) > _MAX_BYTES else ""
    return f"HTTP {status} {final}{cut}\n\n{text}"


def _interruptibly(
    fetch: Callable[[], _Fetched],
    transport: AbortableTransport,
    url: str,
    timeout: float,
    signal: InterruptSignal,
) -> _Fetched:
    """Run `fetch` on a helper thread, so an interrupt cuts its connection instead of waiting for it."""
    wake = signal.notify
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = fetch()
        except BaseException as exc:  # handed to the tool's thread, which re-raises it
            outcome["error"] = exc
        finally:
            wake()

    threading.Thread(target=run, name="mibyan-web-fetch", daemon=True).start()
    # The client's timeout bounds each read, not the whole fetch: a slow trickle must end too.
    signal.wait_until(lambda: bool(outcome), timeout)
    if not outcome:
        transport.abort()
        if signal.is_set():
            raise ToolError(f"interrupted while fetching {url}")
        raise ToolError(f"cannot fetch {url}: no complete reply within {timeout:g} s")
    if "error" in outcome:
        raise outcome["error"]
    value: _Fetched = outcome["value"]
    return value


def _fetch(client: Any, url: str, *, allow_private: bool) -> tuple[str, int, str, str, bytearray]:
    """GET `url`, following up to _MAX_REDIRECTS redirects, each hop's address judged before it is
    reached. Returns the final address, status, content type, encoding and body."""
    import httpx2

    current = httpx2.URL(url)
    for _ in range(_MAX_REDIRECTS + 1):
        with _open(client, current, allow_private=allow_private) as reply:
            location = reply.headers.get("location")
            if reply.is_redirect and location:
                following = current.join(location)
                if following.scheme not in ("http", "https"):
                    raise ToolError(f"not followed: {current} redirects to {following}, which is not http(s)")
                current = following
                continue
            body = bytearray()
            for chunk in reply.iter_bytes():
                body += chunk
                if len(body) > _MAX_BYTES:
                    break
            kind = reply.headers.get("content-type", "")
            return str(current), reply.status_code, kind, reply.encoding or "utf-8", body
    raise ToolError(f"cannot fetch {url}: more than {_MAX_REDIRECTS} redirects")


@contextlib.contextmanager
def _open(client: Any, url: Any, *, allow_private: bool) -> Iterator[Any]:
    """A streamed GET of `url` made to an address `checked_addresses` allowed, not to the name again
    (the Host header and, for https, the TLS server name and certificate check keep the name)."""
    import httpx2

    port = url.port or (443 if url.scheme == "https" else 80)
    name = url.raw_host.decode("ascii")
    if not name:
        raise ToolError(f"cannot fetch {url}: the address names no host")
    addresses = checked_addresses(name, port, allow_private=allow_private)
    host_header = url.netloc.decode("ascii").rpartition("@")[2]
    failure: httpx2.ConnectError | None = None
    for address in addresses:
        request = client.build_request(
            "GET",
            url.copy_with(host=address),
            headers={"Host": host_header},
            extensions={"sni_hostname": name},
        )
        try:
            reply = client.send(request, stream=True)
        except httpx2.ConnectError as exc:
            failure = exc
            continue
        try:
            yield reply
        finally:
            reply.close()
        return
    raise ToolError(f"cannot fetch {url}: {failure}")
