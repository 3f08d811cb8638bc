"""The interruptible call (core/interruptible.py): work on a worker thread, the caller free to leave it
at an interrupt. Its threads are kept for the next call, and that must never show: a call is never held
up by work abandoned before it, sees nothing an earlier work left in its context, and works in a forked
child as in the parent."""

from __future__ import annotations

import contextvars
import os
import threading

import pytest
from conftest import wait_until

from mibyan.core.errors import TurnInterrupted
from mibyan.core.interruptible import InterruptSignal, call_interruptibly

LEFT_BEHIND: contextvars.ContextVar[str] = contextvars.ContextVar("left_behind", default="nothing")


def test_a_call_runs_at_once_while_work_abandoned_before_it_still_runs() -> None:
    release = threading.Event()
    signal = InterruptSignal()
    signal.set()  # interrupted from the start: the caller leaves the blocked work behind
    with pytest.raises(TurnInterrupted):
        call_interruptibly(lambda: release.wait(60), signal=signal, timeout=60)
    try:
        answers = [
            call_interruptibly(lambda n=n: n * 2, signal=InterruptSignal(), timeout=60) for n in range(5)
        ]
        assert answers == [0, 2, 4, 6, 8]
    finally:
        release.set()


def test_a_works_context_starts_empty_whatever_an_earlier_work_set() -> None:
    def leave_something() -> str:
        LEFT_BEHIND.set("a secret of the last call")
        return LEFT_BEHIND.get()

    assert (
        call_interruptibly(leave_something, signal=InterruptSignal(), timeout=60)
        == "a secret of the last call"
    )
    for _ in range(3):
        assert call_interruptibly(LEFT_BEHIND.get, signal=InterruptSignal(), timeout=60) == "nothing"


def test_an_error_of_the_work_is_the_callers_and_the_next_call_is_answered() -> None:
    def fail() -> None:
        raise ValueError("the work failed")

    with pytest.raises(ValueError, match="the work failed"):
        call_interruptibly(fail, signal=InterruptSignal(), timeout=60)
    assert call_interruptibly(lambda: "next", signal=InterruptSignal(), timeout=60) == "next"


def test_a_forked_child_makes_calls_as_its_parent_does() -> None:
    assert call_interruptibly(lambda: "parent", signal=InterruptSignal(), timeout=60) == "parent"
    reading, writing = os.pipe()
    child = os.fork()
    if child == 0:  # the child: its parent's idle threads are not there
        try:
            answer = call_interruptibly(lambda: b"child", signal=InterruptSignal(), timeout=10)
            os.write(writing, answer)
        finally:
            os._exit(0)
    os.close(writing)
    try:
        with os.fdopen(reading, "rb") as pipe:
            assert pipe.read() == b"child"
    finally:
        os.waitpid(child, 0)


def test_what_a_work_returned_is_not_held_once_the_caller_has_let_it_go() -> None:
    import gc
    import weakref

    class Answer:
        pass

    answer = call_interruptibly(Answer, signal=InterruptSignal(), timeout=60)
    kept = weakref.ref(answer)
    del answer
    # the worker lets go of it once it is back among the idle threads, an instant after the caller woke
    assert wait_until(lambda: gc.collect() >= 0 and kept() is None, timeout=5)
