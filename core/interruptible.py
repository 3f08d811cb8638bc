"""The interruptible call: blocking work on a worker thread, abandoned at once on interrupt.

The caller waits on whichever comes first: the work finishing, the interrupt signal, or the timeout.
An interrupted or timed-out call is abandoned: its `on_abandon` hook closes the connection so the
provider stops generating, and whatever the worker still produces is discarded.
"""

from __future__ import annotations

import contextvars
import functools
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from mibyan.core.errors import ProviderError, TurnInterrupted

T = TypeVar("T")


class InterruptSignal:
    """A thread-safe interrupt flag that also wakes whoever waits on it."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._set = False

    def set(self) -> None:
        with self._condition:
            self._set = True
            self._condition.notify_all()

    def clear(self) -> None:
        with self._condition:
            self._set = False

    def is_set(self) -> bool:
        return self._set

    def notify(self) -> None:
        """Wake the waiters so they re-check their condition."""
        with self._condition:
            self._condition.notify_all()

    def wait_until(self, done: Callable[[], bool], timeout: float | None) -> bool:
        """Wait until `done()` is true or the signal is set; False on timeout."""
        with self._condition:
            return self._condition.wait_for(lambda: self._set or done(), timeout)

    def sleep(self, seconds: float) -> None:
        """Sleep, but raise `TurnInterrupted` as soon as the signal is set."""
        if self.wait_until(lambda: False, seconds) and self._set:
            raise TurnInterrupted()


class _Outcome(Generic[T]):
    __slots__ = ("done", "error", "value")

    def __init__(self) -> None:
        self.done = False
        self.value: T | None = None
        self.error: BaseException | None = None


#: How long the work may take to return once its result is whole, with the cut that wakes it.
_CUT_RETURNS_WITHIN = 5.0


@dataclass(frozen=True)
class StallLimit:
    """A bound on the silence of work that has started to flow: `silence()` is the seconds since it last
    moved (None while it has not started), `seconds` how long that may grow.

    `whole()` is the seconds since the work's result became whole while the work goes on (None until
    then: a stream's last event came, and its connection is being read to the end); past `linger`, the
    work is cut off (`on_abandon`) and its result stands."""

    silence: Callable[[], float | None]
    seconds: float
    whole: Callable[[], float | None] = lambda: None
    linger: float = 1.0


def call_interruptibly(
    work: Callable[[], T],
    *,
    signal: InterruptSignal,
    timeout: float,
    on_abandon: Callable[[], None] = lambda: None,
    name: str = "mibyan-call",
    stall: StallLimit | None = None,
) -> T:
    """Run `work()` on a worker thread and wait for it, the interrupt, the timeout, or a stall.

    Raises:
        TurnInterrupted: the signal was set before the work finished.
        ProviderError: reason "timeout" when `timeout` seconds passed first; reason "dropped_stream"
            when, once it flowed, the work was silent for `stall.seconds`.
        Whatever `work()` raised.
    """
    outcome: _Outcome[T] = _Outcome()

    def run() -> None:
        try:
            outcome.value = work()
        except BaseException as exc:  # handed to the waiting thread, which re-raises it
            outcome.error = exc
        finally:
            outcome.done = True
            signal.notify()

    _WORKERS.start(run, name)
    ended = _wait(outcome, signal, timeout, stall)
    if signal.is_set():
        # An interrupt wins even over a reply that completed in the same instant: the user asked to stop.
        if not outcome.done:
            on_abandon()
        raise TurnInterrupted()
    if not outcome.done and ended == "lingered":
        on_abandon()  # what it still reads is not the result: the cut makes it return what it has
        signal.wait_until(lambda: outcome.done, _CUT_RETURNS_WITHIN)
        if signal.is_set():
            raise TurnInterrupted()
        if not outcome.done:
            message = "the stream's connection could not be cut after its end"
            raise ProviderError(message, reason="dropped_stream")
    if not outcome.done:
        on_abandon()
        if ended == "stalled" and stall is not None:
            raise ProviderError(
                f"the stream stalled: nothing arrived for {stall.seconds:g} s", reason="dropped_stream"
            )
        raise ProviderError(f"the model call took longer than {timeout:g} s", reason="timeout")
    if outcome.error is not None:
        raise outcome.error
    return outcome.value  # type: ignore[return-value]


class _Workers:
    """The threads interruptible work runs on, each kept for the next work once its own returns: a
    gateway makes a model call for every message, and starting a thread for each cost more than handing
    a waiting one its work. Work that was abandoned keeps its thread until it returns."""

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._idle: list[queue.SimpleQueue[tuple[Callable[[], None], str]]] = []
        self._lock = threading.Lock()

    def start(self, work: Callable[[], None], name: str) -> None:
        """Run `work` on an idle thread, or on a new one."""
        with self._lock:
            handed = self._idle.pop() if self._idle else None
        if handed is None:
            handed = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(handed,), name=name, daemon=True).start()
        handed.put((work, name))

    def _serve(self, handed: queue.SimpleQueue[tuple[Callable[[], None], str]]) -> None:
        while True:
            work, name = handed.get()
            threading.current_thread().name = name
            contextvars.Context().run(work)  # as on a thread of its own: no context an earlier work set
            del work  # nor does an idle thread hold on to what the last one returned
            with self._lock:
                if len(self._idle) >= self._keep:
                    return
                self._idle.append(handed)

    def forget(self) -> None:
        """In a forked child: the idle threads were the parent's."""
        self._idle = []
        self._lock = threading.Lock()


_WORKERS = _Workers(keep=16)
os.register_at_fork(after_in_child=_WORKERS.forget)


def _wait(outcome: _Outcome[T], signal: InterruptSignal, timeout: float, stall: StallLimit | None) -> str:
    """Wait for the outcome, the signal or the timeout: "done" (or timed out, or signalled); "stalled"
    when the work fell silent; "lingered" when its result was whole and it went on past `linger`. The
    worker notifies `signal` when its result becomes whole."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        whole = None if stall is None else stall.whole()  # read once: the wake-up below goes by it
        if stall is not None:
            if whole is not None:  # a whole result does not stall: what is left is only its end
                if whole >= stall.linger:
                    return "lingered"
                left = min(left, stall.linger - whole)
            else:
                silence = stall.silence()
                if silence is not None and silence >= stall.seconds:
                    return "stalled"
                # Before the work flows, look again every `seconds`: it may start, and stall, meanwhile.
                left = min(left, stall.seconds - (silence or 0.0))
        # woken when the work ends, or when its result becomes whole (the linger starts)
        signal.wait_until(functools.partial(_woken, outcome, stall, whole), max(left, 0.0))
        if outcome.done or signal.is_set():
            return "done"
        if time.monotonic() >= deadline:  # a whole result is kept at the deadline too: it is cut short
            return "lingered" if stall is not None and stall.whole() is not None else "done"


def _woken(outcome: _Outcome[T], stall: StallLimit | None, whole: float | None) -> bool:
    """The work ended, or its result became whole since the wait's last look (`whole`: what it saw)."""
    return outcome.done or (whole is None and stall is not None and stall.whole() is not None)
