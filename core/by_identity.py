"""Values worked out from objects that are never changed once made (a history's messages), kept by the
object's identity: a gateway sends a channel's whole history at each of its messages, and sizing and
encoding each message again every time was most of what a long history cost."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

_Object = TypeVar("_Object")
_Value = TypeVar("_Value")


class ByIdentity(Generic[_Object, _Value]):
    """`compute(obj)`, worked out once per object while the objects held weigh at most `kept` in all
    (`weigh(value)`: about the memory an object and its value hold; all are let go once past it).

    The object is held with its value, so its identity is not given to another object meanwhile. Only
    for objects nobody changes in place: a changed one would keep the value of what it was. Safe on any
    thread (two threads may both work a value out; either is kept).
    """

    def __init__(
        self, compute: Callable[[_Object], _Value], weigh: Callable[[_Value], int], kept: int = 16_000_000
    ) -> None:
        self._compute = compute
        self._weigh = weigh
        self._kept = kept
        self._values: dict[int, tuple[_Object, _Value]] = {}
        self._weight = 0

    def __call__(self, obj: _Object) -> _Value:
        known = self._values.get(id(obj))
        if known is not None and known[0] is obj:
            return known[1]
        value = self._compute(obj)
        weight = self._weigh(value)
        if self._weight + weight > self._kept:  # the histories of lately: let the older ones go at once
            self._values, self._weight = {}, 0
        self._values[id(obj)] = (obj, value)
        self._weight += weight
        return value
