"""Plugin hooks around tool calls and model calls.

A Python caller registers with `agent.hooks.register("pre_tool_call", fn)`; the configuration names
importable callables under `hooks:`. A `pre_tool_call` hook that returns a string blocks the call, and
the model sees the reason; a `post_tool_call` hook that returns a string replaces the result. A
`pre_llm_call` hook sees copies of the request's messages. A hook that raises is logged and skipped: a
plugin bug must not break the turn.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, cast

from mibyan.config.loader import HooksSection
from mibyan.core.errors import ConfigError

if TYPE_CHECKING:
    from mibyan.agent.messages import Message

log = logging.getLogger("mibyan.hooks")

HookName = Literal["pre_tool_call", "post_tool_call", "pre_llm_call", "post_llm_call"]
HOOK_NAMES: tuple[HookName, ...] = ("pre_tool_call", "post_tool_call", "pre_llm_call", "post_llm_call")


def import_callable(path: str) -> Callable[..., Any]:
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"hooks: {path!r} must look like 'package.module:function'")
    try:
        target = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"hooks: cannot import {path!r} ({exc})") from None
    if not callable(target):
        raise ConfigError(f"hooks: {path!r} is not callable")
    return target  # type: ignore[no-any-return]


class Hooks:
    """The hooks of one agent."""

    def __init__(self) -> None:
        self._hooks: dict[str, list[Callable[..., Any]]] = {name: [] for name in HOOK_NAMES}

    @classmethod
    def from_config(cls, section: HooksSection) -> Hooks:
        hooks = cls()
        for name in HOOK_NAMES:
            for path in getattr(section, name):
                hooks.register(name, import_callable(path))
        return hooks

    def register(self, name: HookName, fn: Callable[..., Any]) -> None:
        if name not in self._hooks:
            raise ValueError(f"unknown hook {name!r} (known: {', '.join(HOOK_NAMES)})")
        self._hooks[name].append(fn)

    def _run(self, name: str, *args: Any) -> list[Any]:
        answers = []
        for fn in self._hooks[name]:
            try:
                answers.append(fn(*args))
            except Exception:  # a plugin's bug must not break the turn
                log.exception("%s hook %r raised; skipped", name, fn)
        return answers

    def before_tool(self, name: str, args: dict[str, Any], task_id: str | None) -> str | None:
        """The reason a hook blocks this call, or None."""
        for answer in self._run("pre_tool_call", name, args, task_id):
            if isinstance(answer, str) and answer:
                return answer
        return None

    def after_tool(self, name: str, args: dict[str, Any], result: str, task_id: str | None) -> str:
        for answer in self._run("post_tool_call", name, args, result, task_id):
            if isinstance(answer, str):
                result = answer
        return result

    def before_llm(self, messages: list[Message], tools: list[Any]) -> None:
        if self._hooks["pre_llm_call"]:  # copies: a history's messages are shared, never changed in place
            self._run("pre_llm_call", [cast("Message", dict(m)) for m in messages], tools)

    def after_llm(self, response: Any) -> None:
        if self._hooks["post_llm_call"]:
            self._run("post_llm_call", response)
