"""`--per-provider N`: at most N model calls in flight to one provider, over all of a batch's agents.

It limits requests, not tasks: a task that runs its tools holds no slot. The slot is held until the
response (a stream too) is read to its end or closed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx2

from mibyan.core.http_transport import shared_ssl_context


class ProviderSlots:
    """A semaphore per provider address (scheme, host and port), shared by every agent of a batch."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._slots: dict[str, threading.BoundedSemaphore] = {}

    def of(self, request: httpx2.Request) -> threading.BoundedSemaphore:
        origin = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        with self._lock:
            return self._slots.setdefault(origin, threading.BoundedSemaphore(self.limit))


class _Released(httpx2.SyncByteStream):
    def __init__(self, inner: httpx2.SyncByteStream, release: threading.BoundedSemaphore) -> None:
        self._inner = inner
        self._release: threading.BoundedSemaphore | None = release

    def __iter__(self) -> Iterator[bytes]:
        yield from self._inner

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            slot, self._release = self._release, None
            if slot is not None:
                slot.release()


class LimitedTransport(httpx2.BaseTransport):
    """One agent's transport (real connections), waiting for its provider's slot before each request."""

    def __init__(self, slots: ProviderSlots) -> None:
        self._slots = slots
        self._inner = httpx2.HTTPTransport(verify=shared_ssl_context())

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        slot = self._slots.of(request)
        slot.acquire()
        try:
            response = self._inner.handle_request(request)
        except BaseException:
            slot.release()
            raise
        assert isinstance(response.stream, httpx2.SyncByteStream)
        return httpx2.Response(
            response.status_code,
            headers=response.headers,
            stream=_Released(response.stream, slot),
            extensions=response.extensions,
        )

    def close(self) -> None:
        self._inner.close()
