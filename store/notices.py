"""Notices: a write that others wait for wakes them when it commits (DESIGN §16).

A repository announces in the write's own transaction (`Database.announce`). PostgreSQL sends it as a
NOTIFY, which the server delivers when that transaction commits (never when it rolls back) to every
process that LISTENs, on any machine; SQLite wakes the waiters of its own process after the commit, and
other processes on the same file see the change when they look again. A notice carries only what
changed (a topic and a key), never the state itself: a waiter subscribes (`Database.listen`) before it
looks at what it waits for, then waits for a wakeup or its polling interval, whichever comes first, and
looks again. So a notice that is missed (the listening connection dropped, another machine's SQLite)
costs at most one polling interval, and a notice that arrives for nothing costs one look.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable

#: The reply of an inbox message was recorded, or the message failed. Key: the inbox id.
LEDGER = "mibyan_ledger"
#: A channel's lease was let go. Key: the channel.
LEASES = "mibyan_leases"
#: A channel's question was answered. Key: the channel.
QUESTIONS = "mibyan_questions"
#: A message was stored in a session. Key: the session id.
MESSAGES = "mibyan_messages"
#: Every topic, as a backend listens for them all on one connection.
TOPICS = (LEDGER, LEASES, QUESTIONS, MESSAGES)

Wake = Callable[[], object]


class Listening:
    """One subscription; `close()` (or the end of its `with`) ends it."""

    def __init__(self, close: Callable[[], None]) -> None:
        self._close: Callable[[], None] | None = close

    def close(self) -> None:
        if self._close is not None:
            self._close()
            self._close = None

    def __enter__(self) -> Listening:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Subscribers:
    """Who waits for which notice in this process: (topic, key) → the callbacks that wake them; a key of
    None hears every notice of its topic. Thread-safe; a callback runs on the delivering thread, so it
    only hands the wakeup on (sets an event, schedules on a loop)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wakes: dict[tuple[str, str | None], list[Wake]] = {}

    def add(self, topic: str, key: str | None, wake: Wake) -> Listening:
        entry = (topic, key)
        with self._lock:
            self._wakes.setdefault(entry, []).append(wake)

        def remove() -> None:
            with self._lock:
                wakes = self._wakes.get(entry, [])
                if wake in wakes:
                    wakes.remove(wake)
                if not wakes:
                    self._wakes.pop(entry, None)

        return Listening(remove)

    def deliver(self, topic: str, key: str) -> None:
        """Wake those waiting for `key` of `topic`, and those hearing the whole topic."""
        with self._lock:
            wakes = [*self._wakes.get((topic, key), ()), *self._wakes.get((topic, None), ())]
        for wake in wakes:
            wake()

    def wake_all(self) -> None:
        """Wake everyone (notices may have been missed: each looks again)."""
        with self._lock:
            wakes = [wake for entries in self._wakes.values() for wake in entries]
        for wake in wakes:
            wake()


class Waker:
    """A notice's wakeup for a coroutine: called on any thread, awaited on the loop it was made on."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._event = asyncio.Event()

    def __call__(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits any more
            self._loop.call_soon_threadsafe(self._event.set)

    async def wait(self, seconds: float) -> bool:
        """Until a wakeup came (True) or `seconds` passed (False); a wakeup that came meanwhile counts."""
        try:
            await asyncio.wait_for(self._event.wait(), seconds)
            woken = True
        except TimeoutError:
            woken = False
        self._event.clear()
        return woken
