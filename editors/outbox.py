"""What mibyan says to the editor, in the order it happened, from whichever thread it happened on.

The agent works on worker threads; the connection lives on the asyncio loop. `Outbox.post` is safe from
any thread and keeps order: one task on the loop sends the updates one after the other. `flushed()`
waits until everything posted before it is out, so a prompt's answer never overtakes its last update,
and `call(...)` sends a request (a permission question, a file read) only after the updates before it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from acp.interfaces import Client

    from mibyan.editors.updates import Update

log = logging.getLogger("mibyan.editors")
T = TypeVar("T")


class Outbox:
    """The ordered stream of session updates to one editor connection."""

    def __init__(self, client: Client, loop: asyncio.AbstractEventLoop) -> None:
        self.client = client
        self.loop = loop
        self._queue: asyncio.Queue[tuple[str, Update] | asyncio.Future[None]] = asyncio.Queue()
        self._pump: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._pump = self.loop.create_task(self._send_all(), name="mibyan-acp-outbox")

    def post(self, session_id: str, update: Update) -> None:
        """Queue one update (from any thread); it is sent after everything posted before it."""
        try:
            self.loop.call_soon_threadsafe(self._queue.put_nowait, (session_id, update))
        except RuntimeError:  # the loop has closed: the editor is gone
            log.debug("an update after the connection closed was dropped")

    async def flushed(self) -> None:
        """Wait until every update posted so far has been sent (call on the loop)."""
        # a post from another thread that is scheduled but not yet queued must come first
        await asyncio.sleep(0)
        marker: asyncio.Future[None] = self.loop.create_future()
        self._queue.put_nowait(marker)
        await marker

    def call(self, request: Callable[[], Awaitable[T]]) -> Future[T]:
        """From a worker thread: send `request()` after the updates posted before it.

        Returns:
            A future of its answer; cancelling it withdraws the request.
        """

        async def in_order() -> T:
            await self.flushed()
            return await request()

        return asyncio.run_coroutine_threadsafe(in_order(), self.loop)

    async def _send_all(self) -> None:
        while True:
            item = await self._queue.get()
            if isinstance(item, asyncio.Future):
                if not item.done():
                    item.set_result(None)
                continue
            session_id, update = item
            try:
                await self.client.session_update(session_id=session_id, update=update)
            except ConnectionError:
                log.debug("an update could not be sent: the connection is closed")
            except Exception:  # one update that fails to send must not stop the ones after it
                log.exception("a session update could not be sent")

    async def close(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump


async def settle_in_thread(work: Callable[[], T], *, name: str) -> T:
    """Run blocking `work()` on a thread of its own and wait for it without blocking the loop."""
    import threading

    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if done.done():
            return
        if error is None:
            done.set_result(value)
        else:
            done.set_exception(error)

    def run() -> None:
        try:
            value = work()
        except BaseException as exc:  # handed to the waiting coroutine
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, value, None)

    threading.Thread(target=run, name=name, daemon=True).start()
    return await done
