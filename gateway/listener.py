"""The HTTP listener mibyan's servers (the gateway's `http` connector, the session viewer) run on:
uvicorn, with the limits uvicorn leaves out.

uvicorn has no deadline for a request's headers and no cap on open connections, so a few hundred
connections that trickle a header byte now and then hold every file descriptor and nothing else is
answered, `/health` included. Here each connection must finish its headers within `header_timeout`
seconds of opening (or of its last answer), else it is answered 408 and closed; and past
`max_connections`, a new connection closes the one that has waited longest without a request in
progress (one trickling its headers, or idle between requests), so a client that sends its request at
once is still served. The body's deadline is the application's (`mibyan.gateway.connectors.
http_requests.read_body`): uvicorn hands the body over as it arrives.
"""

from __future__ import annotations

import asyncio
import resource
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

if TYPE_CHECKING:
    _Base = H11Protocol  # what the mixin relies on, which both of uvicorn's HTTP protocols have
else:
    _Base = object

_RESERVED_FILES = 64  # descriptors kept for what is not a connection: the store, logs, tools' pipes
_ACCEPT_BATCH = 64  # connections taken at once, before any is seen by the cap: asyncio accepts up to
# `backlog` in one go, twice before the first of them is seen, so 2 x this many more may be open
_TIMEOUT_REPLY = b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"


@dataclass(frozen=True)
class ListenerLimits:
    """How long a client may take over its request, and how many connections may be open at once."""

    header_timeout: float = 10
    body_timeout: float = 30
    max_connections: int = 200

    def within_open_files(self) -> ListenerLimits:
        """These limits, with `max_connections` lowered to what the process may open (`ulimit -n`)."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return self
        fits = max(8, soft - _RESERVED_FILES - 2 * _ACCEPT_BATCH)
        return (
            self
            if self.max_connections <= fits
            else ListenerLimits(self.header_timeout, self.body_timeout, fits)
        )


class _Guard(_Base):
    """A deadline on each request's headers, and the connection cap (see the module's docstring)."""

    limits: ClassVar[ListenerLimits]
    _waiting_since: float = 0.0
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._wait_for_headers()
        self._make_room()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._wait_for_headers()

    def _idle(self) -> bool:
        """No request in progress: its headers have not all arrived, or it has been answered."""
        return self.cycle is None or self.cycle.response_complete

    def _wait_for_headers(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._waiting_since = self.loop.time()
        self._deadline = self.loop.call_later(self.limits.header_timeout, self._headers_too_slow)

    def _headers_too_slow(self) -> None:
        self._deadline = None
        if self._idle() and not self.transport.is_closing():
            self.transport.write(_TIMEOUT_REPLY)
            self.transport.close()

    def _make_room(self) -> None:
        """Past the cap, close the connection idle longest (this one when all others are busy)."""
        # a closed connection leaves the set a moment later, and must not count meanwhile
        open_ = [c for c in self.connections if isinstance(c, _Guard) and not c.transport.is_closing()]
        if len(open_) <= self.limits.max_connections:
            return
        idle = [c for c in open_ if c is not self and c._idle()]
        oldest = min(idle, key=lambda c: c._waiting_since, default=self)
        oldest.transport.abort()  # at once: the point is to free its descriptor


def _protocol_base() -> type[H11Protocol]:
    """The protocol uvicorn's `http="auto"` would pick: httptools when it is installed, else h11."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return H11Protocol
    return HttpToolsProtocol  # type: ignore[return-value]  # same interface, another class


def server_config(app: Any, limits: ListenerLimits, **options: Any) -> uvicorn.Config:
    """A uvicorn configuration for `app` whose connections keep to `limits` (`options` are uvicorn's)."""
    base = _protocol_base()
    limits = limits.within_open_files()
    protocol = type(f"Guarded{base.__name__}", (_Guard, base), {"limits": limits})
    return uvicorn.Config(app, http=protocol, backlog=_ACCEPT_BATCH, **options)
