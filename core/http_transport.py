"""An HTTP transport whose connections can be cut from another thread.

Closing a socket's file descriptor does not wake a thread blocked reading it, and sends nothing to the
server until that read returns. To abandon a call at once (interrupt, timeout) the connection must be
shut down: that wakes the reader with an error and tells the provider to stop generating. The transport
learns each connection's socket through httpcore's public `trace` request extension.

It also sends a request again, at once and on another connection, when a kept-alive connection it was
sent on turned out closed the moment it was sent: a server closes an idle connection when its keep-alive
runs out (uvicorn's after 5 s), and a request that set off in that instant finds it gone, unread. Only
then: a connection that fails later, or a new one, failed a request the server may have read and worked
on (a model call is not to be made twice), and that failure stands.
"""

from __future__ import annotations

import contextlib
import functools
import socket
import ssl
import threading
import time
import weakref
from typing import Any

import httpx2


@functools.cache  # a memo, not state: the context never changes once built
def shared_ssl_context() -> ssl.SSLContext:
    """httpx2's default TLS context, built once per process.

    Loading the CA bundle takes about 20 ms, which every new agent (a gateway builds one per message)
    would pay again; a client context is safe to share between connections and threads.
    """
    return httpx2.create_ssl_context()


#: Kept connections found closed one request is sent again after (the pool keeps a few, and the server
#: may have closed them all at once); then the failure stands.
_KEPT_CONNECTIONS_TRIED = 4


#: Seconds after its body was written within which a kept connection's failure is the race with the
#: server's close (its answer to what it did not read comes back within a round trip).
_CLOSED_UNREAD_WITHIN = 0.25


class _Sent:
    """What happened to one send of a request: whether it opened a new connection, and when its body
    was written (None while it was not, wholly)."""

    connected = False
    written_at: float | None = None

    def closed_unread(self) -> bool:
        """The kept connection it went on was closed by the server before it read the request."""
        return not self.connected and (
            self.written_at is None or time.monotonic() - self.written_at <= _CLOSED_UNREAD_WITHIN
        )


class AbortableTransport(httpx2.BaseTransport):
    """The default httpx2 transport (or `inner`), plus `abort()`: shut down every connection it opened.

    After `abort()` it refuses new requests, for good. `server` is what the last response said it came
    from (its `Server` header: llama.cpp's says "llama.cpp").
    """

    def __init__(self, inner: httpx2.BaseTransport | None = None, **kwargs: Any) -> None:
        if inner is None:
            kwargs.setdefault("verify", shared_ssl_context())
        self._inner = inner if inner is not None else httpx2.HTTPTransport(**kwargs)
        self._sockets: weakref.WeakSet[socket.socket] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._aborted = False
        self._traced = inner is None  # httpcore's connections say when they connect; another's may not
        self.server: str | None = None

    def _trace(self, sent: _Sent, event: str, info: dict[str, Any]) -> None:
        if event in ("connection.connect_tcp.started", "connection.connect_unix_socket.started"):
            sent.connected = True
        elif event == "http11.send_request_body.complete":
            sent.written_at = time.monotonic()
        elif event == "connection.connect_tcp.complete":
            stream = info.get("return_value")
            sock = stream.get_extra_info("socket") if stream is not None else None
            if isinstance(sock, socket.socket):
                with self._lock:
                    self._sockets.add(sock)
                    aborted = self._aborted
                if aborted:  # connected after the call was abandoned: cut it too
                    self.abort()

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        if self._aborted:
            raise httpx2.ConnectError("the call was abandoned", request=request)
        closed_kept = 0
        while True:
            sent = _Sent()
            request.extensions = {**request.extensions, "trace": functools.partial(self._trace, sent)}
            try:
                response = self._inner.handle_request(request)
            except (httpx2.RemoteProtocolError, httpx2.ReadError, httpx2.WriteError):
                # on a new connection or later than the close's race, cut by abort(), or with a body that
                # cannot be read twice: the failure is the server's answer (or ours), not a kept one's end
                if (
                    not sent.closed_unread()
                    or not self._traced
                    or self._aborted
                    or not isinstance(request.stream, httpx2.ByteStream)
                    or closed_kept == _KEPT_CONNECTIONS_TRIED
                ):
                    raise
                closed_kept += 1
                continue
            self.server = response.headers.get("server")
            return response

    @property
    def aborted(self) -> bool:
        """abort() was called: the transport refuses requests for good."""
        return self._aborted

    def abort(self) -> None:
        """Cut every open connection now; blocked reads fail at once and the server sees the hang-up."""
        with self._lock:
            self._aborted = True
            sockets = list(self._sockets)
            self._sockets.clear()
        for sock in sockets:
            # OSError: already closed by the other side, nothing left to cut
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._inner.close()
