"""Tool dispatch: the calls of one reply run concurrently; results land in the model's order.

Calls go to a thread pool and the loop waits on them interruptibly: `interrupt()` stops the wait at
once, and every call without a result gets an "interrupted" result, so the history stays valid.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from agent.callbacks import Callbacks
from agent.errors import ToolError
from agent.interruptible import InterruptSignal
from agent.messages import INTERRUPTED_RESULT, tool_message
from agent.turn_state import Continue, Interrupted, TurnState
from agent_state import SessionStore
from model_tools import check_arguments, parse_arguments, run_tool
from tools.registry import get_tool
from tools.session_tools import search_sessions

_PREVIEW_CHARS = 200


def cap_result(text: str, limit: int) -> str:
    """Cut `text` to `limit` characters, keeping head and tail, with a note of how much was cut."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n\n[... {cut} characters cut from the middle of this output ...]\n\n{text[-tail:]}"


class ToolExecutorMixin:
    """Runs the tool calls of a reply and appends their results."""

    callbacks: Callbacks
    _signal: InterruptSignal
    _tool_pool: ThreadPoolExecutor | None
    _max_parallel_tools: int
    store: SessionStore
    session_id: str

    def _pool(self) -> ThreadPoolExecutor:
        if self._tool_pool is None:
            self._tool_pool = ThreadPoolExecutor(self._max_parallel_tools, thread_name_prefix="mibyan-tool")
        return self._tool_pool

    def _agent_level_tools(self) -> dict[str, Callable[[dict[str, Any]], str]]:
        """Tools that read or change the agent's own state, run here instead of through the registry."""
        return {"session_search": self._session_search}

    def _session_search(self, args: dict[str, Any]) -> str:
        return search_sessions(
            self.store,
            query=str(args["query"]),
            role=args.get("role"),
            since=args.get("since"),
            scope=str(args.get("scope", "all")),
            current_lineage=self.store.lineage(self.session_id),
            limit=int(args.get("limit", 10)),
        )

    def _run_tool_call(self, task_id: str, call: dict[str, Any]) -> tuple[str, bool]:
        """Resolve → run → cap one call. Returns (result text, ok). Never raises for the model's mistakes."""
        name = call["function"]["name"]
        raw_args = call["function"].get("arguments")
        started = time.monotonic()
        self.callbacks.emit("tool_progress_callback", "start", name, {"arguments": raw_args})
        spec = get_tool(name)
        ok = False
        try:
            if spec is None:
                raise ToolError(f"unknown tool {name!r}")
            args = parse_arguments(raw_args)
            agent_level = self._agent_level_tools().get(name)
            if agent_level is not None:
                check_arguments(spec, args)
                result = cap_result(agent_level(args), spec.max_result_chars)
            else:
                result = cap_result(run_tool(spec, args, task_id), spec.max_result_chars)
            ok = True
        except ToolError as exc:
            result = f"error: {exc}"
        self.callbacks.emit(
            "tool_progress_callback",
            "end",
            name,
            {
                "arguments": raw_args,
                "ok": ok,
                "duration": time.monotonic() - started,
                "preview": result[:_PREVIEW_CHARS],
            },
        )
        return result, ok

    def _execute_tool_calls(self, turn: TurnState, calls: list[dict[str, Any]]) -> Continue | Interrupted:
        """Run every call of a reply; append each result in the calls' order as soon as it is ready."""
        pool = self._pool()
        futures: list[Future[tuple[str, bool]]] = []
        for call in calls:
            future = pool.submit(self._run_tool_call, turn.task_id, call)
            future.add_done_callback(lambda _f: self._signal.notify())
            futures.append(future)
        interrupted = False
        for call, future in zip(calls, futures, strict=True):
            name = call["function"]["name"]
            self._signal.wait_until(future.done, None)
            if future.done():
                result, ok = future.result()
                turn.tool_failures[name] = 0 if ok else turn.tool_failures.get(name, 0) + 1
            else:
                result, interrupted = INTERRUPTED_RESULT, True
            turn.history.append(tool_message(call["id"], result, name=name))
        return Interrupted() if interrupted else Continue()
