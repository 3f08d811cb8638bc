"""Tool calls on their own daemon threads.

A tool that never returns (a read from a FIFO, a hung server) must not keep the process alive after the
turn has given up on it, and must not take the place of the calls after it. So each call runs on a fresh
daemon thread instead of a pool worker: an abandoned call is left behind without blocking the next
call or the interpreter's exit, and a call's deadline counts from the moment its thread starts it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Generic, TypeVar

T = TypeVar("T")


class RunningCall(Generic[T]):
    """One call started on its own daemon thread: its future, and when it began."""

    def __init__(self, timeout: float) -> None:
        self.future: Future[T] = Future()
        self.timeout = timeout
        self.started_at: float | None = None

    def deadline(self) -> float:
        """When the call is given up; a call whose thread has not started yet has its whole timeout."""
        started = self.started_at if self.started_at is not None else time.monotonic()
        return started + self.timeout


def start_call(
    work: Callable[[], T], *, timeout: float, on_done: Callable[[], None], name: str = "mibyan-tool"
) -> RunningCall[T]:
    """Run `work()` on a new daemon thread; `on_done` is called (on that thread) when it ends."""
    call: RunningCall[T] = RunningCall(timeout)

    def run() -> None:
        call.future.set_running_or_notify_cancel()
        call.started_at = time.monotonic()
        try:
            call.future.set_result(work())
        except BaseException as exc:  # handed to whoever reads the future
            call.future.set_exception(exc)

    call.future.add_done_callback(lambda _future: on_done())
    threading.Thread(target=run, name=name, daemon=True).start()
    return call
