"""Who may see the viewer: the one gate every request passes, `Guard` (an ASGI middleware).

The page shows everything ever said to the agent, so a request is served only when
- its Host header names a loopback address (a web page that points its own domain at 127.0.0.1, DNS
  rebinding, sends its domain as the Host and is refused), and
- it carries the token `mibyan web` printed: in the address once (`?token=...`, then redirected to the
  same address without it, with the token in an HttpOnly, SameSite=Strict cookie), or in that cookie.
Anything else is 403. Every response, a refusal too, carries a Content-Security-Policy that lets the
page run only the viewer's own script and load nothing from elsewhere.
"""

from __future__ import annotations

import hmac
import re
from urllib.parse import parse_qsl, quote, urlencode

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mibyan.core.net import is_loopback_host

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
_HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
    (b"cross-origin-resource-policy", b"same-origin"),
]
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(?::[0-9]{1,5})?$")
_REFUSED = b"403: open the address 'mibyan web' printed (it carries the token), on this machine\n"


def host_of(header: str) -> str:
    """The host part of a Host header (`[::1]:8080` → `[::1]`, `127.0.0.1:80` → `127.0.0.1`); "" for a
    header that is not a host and an optional port."""
    found = _HOST.match(header)
    return found.group(1) if found else ""


class Guard:
    """Serve a request only with a loopback Host and the token; add the security headers to all.

    Args:
        app: the viewer.
        token: the secret of this run of `mibyan web`.
        cookie: the cookie's name (one per port, so two viewers on one machine do not clobber each other).
    """

    def __init__(self, app: ASGIApp, *, token: str, cookie: str) -> None:
        self.app = app
        self._token = token.encode()
        self._cookie = cookie

    def _matches(self, candidate: str | None) -> bool:
        return candidate is not None and hmac.compare_digest(candidate.encode(), self._token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # the viewer speaks plain HTTP only: a websocket is turned away
            await send({"type": "websocket.close", "code": 1008})
            return
        headers = Headers(scope=scope)
        if not is_loopback_host(host_of(headers.get("host", ""))):
            await _respond(send, 403, _REFUSED)
            return
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        offered = [value for key, value in query if key == "token"]
        if offered:
            if not self._matches(offered[-1]):
                await _respond(send, 403, _REFUSED)
                return
            await self._redirect_with_cookie(scope, query, send)
            return
        if not self._matches(_cookie(headers, self._cookie)):
            await _respond(send, 403, _REFUSED)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *_HEADERS]}
            await send(message)

        await self.app(scope, receive, send_with_headers)

    async def _redirect_with_cookie(self, scope: Scope, query: list[tuple[str, str]], send: Send) -> None:
        """The same address without the token (out of the address bar and history), and the cookie."""
        kept = urlencode([(key, value) for key, value in query if key != "token"])
        # one leading slash: `//host/` would send the browser to another site
        location = "/" + quote(scope["path"]).lstrip("/") + (f"?{kept}" if kept else "")
        cookie = f"{self._cookie}={self._token.decode()}; HttpOnly; SameSite=Strict; Path=/"
        await _respond(send, 303, b"", ((b"location", location.encode()), (b"set-cookie", cookie.encode())))


def _cookie(headers: Headers, name: str) -> str | None:
    for header in headers.getlist("cookie"):
        for part in header.split(";"):
            key, _, value = part.strip().partition("=")
            if key == name:
                return value
    return None


async def _respond(send: Send, status: int, body: bytes, extra: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
        *extra,
        *_HEADERS,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
