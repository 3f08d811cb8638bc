"""Tool dispatch: the calls of one reply run concurrently; results land in the model's order.

Scheduling rules: an interactive call (clarify) is a barrier: the calls before it finish, it runs alone,
then the rest go on. Calls that touch one resource (write_file and patch on one path) run in their given
order. Everything else runs at once, up to `agent.max_parallel_tools`. Each result is appended (and
stored) as soon as it and every result before it are in.

Per call: resolve → pre_tool_call hook → approval → handler → post_tool_call hook → tool message, with
`tool_progress_callback` before and after. The loop waits interruptibly: `interrupt()` stops the wait at
once, running tools are told to stop, and every unfinished call gets an "interrupted" result.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import wait as wait_for_futures
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from mibyan.agent.adapters.base import Usage
from mibyan.agent.hooks import Hooks
from mibyan.agent.messages import INTERRUPTED_RESULT, ToolCall, tool_message
from mibyan.agent.protocol import AgentBase
from mibyan.agent.tool_threads import RunningCall, start_call
from mibyan.agent.turn_state import Continue, Interrupted, TurnState
from mibyan.core.errors import ToolError, ToolFailed
from mibyan.tools import context
from mibyan.tools.approval import ApprovalPolicy, ApprovalRequest
from mibyan.tools.context import RunContext
from mibyan.tools.registry import ToolSpec, get_tool
from mibyan.tools.schema import ToolSchema
from model_tools import check_arguments, parse_arguments, run_tool

if TYPE_CHECKING:
    from mibyan.tools.mcp_tools import McpToolset
    from run_agent import AIAgent

log = logging.getLogger("mibyan.tools")

_PREVIEW_CHARS = 200
#: After an interrupt, how long running tools get to stop (kill their processes) before the turn returns.
_STOP_GRACE = 0.15


def cap_result(text: str, limit: int) -> str:
    """Cut `text` to `limit` characters, keeping head and tail, with a note of how much was cut."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n\n[... {cut} characters cut from the middle of this output ...]\n\n{text[-tail:]}"


@dataclass
class ToolRuntime:
    """What the agent runs tools with.

    Attributes:
        schemas: the tools the model sees (the selection of toolsets, allow and deny lists).
        approvals: who decides whether a dangerous command runs (`yolo` may be switched on the fly).
        hooks: the pre/post tool and LLM call hooks.
        mcp: the tools of the agent's MCP servers, when it has any; their specs are `local` (this
            agent's own, looked up before the registry) and their schemas follow the built-in ones.
    """

    schemas: list[ToolSchema]
    approvals: ApprovalPolicy
    hooks: Hooks
    mcp: McpToolset | None = None
    local: dict[str, ToolSpec] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._builtin = list(self.schemas)

    def resolve(self, name: str) -> ToolSpec | None:
        """The spec of a tool this agent may know: one of its MCP tools, else a registered tool."""
        return self.local.get(name) or get_tool(name)

    def refresh(self, *, wait: bool = True) -> list[str]:
        """Bring the MCP tools up to date (servers that started or failed); returns lines to report.

        Before the first request (`wait`), it waits for the servers whose tools are not known yet.
        """
        if self.mcp is None:
            return []
        specs = self.mcp.refresh(wait=wait)
        if specs is not None:
            self.local = specs
            self.schemas = [*self._builtin, *(spec.schema for spec in specs.values())]
        return self.mcp.notices() if wait else []

    def start_mcp(self) -> None:
        """Start the MCP servers now, if they are not started yet (see McpConnections.start)."""
        if self.mcp is not None:
            self.mcp.connections.start()

    def hand_over_mcp(self, successor: ToolRuntime) -> None:
        """Make `successor` (built on these MCP connections) their owner: closing this runtime leaves
        them running, closing the successor stops them."""
        mine, theirs = self.mcp, successor.mcp
        if mine is not None and theirs is not None and mine.owned and theirs.connections is mine.connections:
            mine.owned, theirs.owned = False, True

    def close(self) -> None:
        """Stop the MCP servers this agent started (a subagent's are its parent's)."""
        if self.mcp is not None:
            self.mcp.close()


@dataclass
class PlannedCall:
    """One tool call, resolved and parsed before anything runs."""

    call_id: str
    name: str
    raw_args: Any
    spec: ToolSpec | None = None
    args: dict[str, Any] | None = None
    error: str | None = None
    resource: str | None = None
    timeout: float = 300.0
    index: int = 0  # its place among the reply's calls

    @property
    def interactive(self) -> bool:
        return self.spec is not None and self.spec.interactive


class ToolExecutorMixin(AgentBase):
    """Runs the tool calls of a reply and appends their results."""

    # -- one call ------------------------------------------------------------------------------------

    def _plan(self, call: ToolCall) -> PlannedCall:
        function = call.get("function") or {}
        plan = PlannedCall(
            call_id=call["id"],
            name=str(function.get("name", "")),
            raw_args=function.get("arguments"),
            timeout=self.settings.agent.tool_timeout,
        )
        plan.spec = self.tools.resolve(plan.name)
        try:
            if plan.spec is None:
                raise ToolError(f"unknown tool {plan.name!r}")
            if all(schema.name != plan.name for schema in self.tools.schemas):
                # Only what the model was offered runs: tools.allow/deny and a subagent's narrower
                # selection are limits on what runs, not just on what the model is shown.
                raise ToolError(
                    f"{plan.name!r} is not one of your tools here; use only the tools you were given"
                )
            plan.args = parse_arguments(plan.raw_args)
            check_arguments(plan.spec, plan.args)
        except ToolError as exc:
            plan.error = f"error: {exc}"
            return plan
        spec = plan.spec
        if spec.resource and isinstance(plan.args.get(spec.resource), str):
            where = self.workdir or Path.cwd()
            plan.resource = os.path.normpath(where / os.path.expanduser(plan.args[spec.resource]))
        if spec.timeout is not None:
            plan.timeout = spec.timeout
        if isinstance(plan.args.get("timeout"), int | float):
            # a tool that enforces its own timeout gets the time it was asked for, plus a grace period
            plan.timeout = max(plan.timeout, float(plan.args["timeout"]) + 10)
        return plan

    def _run_context(self, plan: PlannedCall, turn: TurnState) -> RunContext:
        """What the call's handler is told of its run: the handlers that declare a `RunContext` get it."""

        def add_usage(usage: dict[str, int]) -> None:
            with turn.lock:
                turn.usage.add(Usage(**{k: v for k, v in usage.items() if k != "total_tokens"}))

        # a subagent is made as this agent was (run_agent.AIAgent), without tools/ importing the agent
        new_agent = cast("Callable[..., AIAgent]", type(self))
        return RunContext(
            task_id=turn.task_id,
            signal=self._signal,
            home=self.home,
            sandbox=self.sandbox,
            protected=self._hook_files(),
            allow_private_web=self.settings.web.allow_private,
            workdir=self.workdir,
            agent_folder=self.workspace,
            isolated=self.sandbox.isolated,
            call_id=plan.call_id,
            files=self.file_access,
            agent=self,
            new_agent=new_agent,
            add_usage=add_usage,
        )

    def _run_plan(self, plan: PlannedCall, turn: TurnState) -> tuple[str, bool]:
        """Hooks → approval → handler → hooks for one resolved call. Runs on a worker thread."""
        assert plan.spec is not None and plan.args is not None
        spec, args, task_id = plan.spec, plan.args, turn.task_id
        bound = self._run_context(plan, turn)
        # current on this thread too, for the editor's permission question (editors/bridge.py)
        token = context.bind(bound)
        try:
            reason = self.tools.hooks.before_tool(plan.name, args, task_id)
            if reason is not None:
                return f"blocked by a hook: {reason}", False
            if spec.dangerous is not None:
                verdict = spec.dangerous(args, bound)
                subject = spec.subject(args, bound) if spec.subject is not None else None
                subject = subject or str(args.get("command") or json.dumps(args, ensure_ascii=False))
                asked = ApprovalRequest(
                    call_id=plan.call_id, tool=plan.name, subject=subject, verdict=verdict
                )
                allowed, why = self.tools.approvals.decide(asked, signal=bound.signal)
                if why:  # a command that needed approval: the transcript shows who decided, and how
                    detail = {"call_id": plan.call_id, "tool": plan.name, "allowed": allowed, "why": why}
                    self.session.store.events.record(self.session.session_id, "approval", json.dumps(detail))
                if not allowed:
                    self.callbacks.emit("status_callback", "denied", f"{plan.name}: {why}")
                    return why, False
                bound = replace(bound, approved=verdict)
                context.unbind(token)
                token = context.bind(bound)
            result = run_tool(spec, args, bound)
            result = self.tools.hooks.after_tool(plan.name, args, result, task_id)
            return cap_result(result, spec.max_result_chars), True
        except ToolFailed as exc:  # what the tool ran was stopped: its output is the result, failed
            return cap_result(str(exc), spec.max_result_chars), False
        except ToolError as exc:
            return f"error: {exc}", False
        except Exception as exc:  # the tool boundary: any failure becomes text for the model, never a crash
            log.warning("tool %s failed", plan.name, exc_info=exc)
            return f"error: {type(exc).__name__}: {exc}", False
        finally:
            context.unbind(token)

    def _hook_files(self) -> tuple[Path, ...]:
        """The source files of the configured hooks: code mibyan runs, so no tool may write it."""
        files: list[Path] = []
        for paths in self.settings.hooks.model_dump().values():
            for hook in paths:
                module = sys.modules.get(hook.partition(":")[0])
                source = getattr(module, "__file__", None)
                if source:
                    files.append(Path(source))
        return tuple(files)

    def _run_with_progress(self, plan: PlannedCall, turn: TurnState) -> tuple[str, bool]:
        started = time.monotonic()
        self.callbacks.emit(
            "tool_progress_callback",
            "start",
            plan.name,
            {"arguments": plan.raw_args, "call_id": plan.call_id, "index": plan.index},
        )
        result, ok = (plan.error, False) if plan.error is not None else self._run_plan(plan, turn)
        self.callbacks.emit(
            "tool_progress_callback",
            "end",
            plan.name,
            {
                "arguments": plan.raw_args,
                "call_id": plan.call_id,
                "ok": ok,
                "interrupted": self._signal.is_set(),  # it returned, but because it was stopped
                "duration": time.monotonic() - started,
                "preview": result[:_PREVIEW_CHARS],
                "result": result,
            },
        )
        return result, ok

    # -- a reply's calls -------------------------------------------------------------------------------

    @staticmethod
    def _can_start(index: int, plans: list[PlannedCall], finished: set[int], running: set[int]) -> bool:
        plan = plans[index]
        earlier = range(index)
        if plan.interactive:
            return not running and all(j in finished for j in earlier)
        for j in earlier:
            if j in finished:
                continue
            if plans[j].interactive or (plan.resource is not None and plans[j].resource == plan.resource):
                return False
        return True

    def _execute_tool_calls(self, turn: TurnState, calls: list[ToolCall]) -> Continue | Interrupted:
        """Run every call of a reply; append each result in the calls' order as soon as it is ready."""
        plans = [replace(self._plan(call), index=index) for index, call in enumerate(calls)]
        # the failure note goes on a tool's last call of the batch: one place, whatever finishes first
        last_of_tool = {plan.name: plan.index for plan in plans}
        results: dict[int, tuple[str, bool]] = {}
        running: dict[int, RunningCall[tuple[str, bool]]] = {}
        pending = list(range(len(plans)))
        appended = 0
        limit = self.settings.agent.max_parallel_tools
        while True:
            for index, call in list(running.items()):
                if call.future.done():
                    results[index] = call.future.result()
                elif time.monotonic() >= call.deadline():
                    results[index] = (
                        f"error: {plans[index].name} did not finish within "
                        f"{plans[index].timeout:g} s and was abandoned",
                        False,
                    )
                else:
                    continue
                del running[index]
            while appended in results:
                plan = plans[appended]
                noted = last_of_tool[plan.name] == appended
                self._append_result(turn, plan, *results[appended], noted=noted)
                appended += 1
            if appended == len(plans):
                return Continue()
            if self._signal.is_set():
                return self._stop_tools(turn, plans, results, running, appended)
            for index in list(pending):
                if len(running) < limit and self._can_start(index, plans, set(results), set(running)):
                    plan = plans[index]
                    running[index] = start_call(
                        partial(self._run_with_progress, plan, turn),
                        timeout=plan.timeout,
                        on_done=self._signal.notify,
                    )
                    pending.remove(index)
            nearest = min(call.deadline() for call in running.values())
            self._signal.wait_until(
                lambda: any(call.future.done() for call in running.values()),
                max(0.0, nearest - time.monotonic()),
            )

    def _stop_tools(
        self,
        turn: TurnState,
        plans: list[PlannedCall],
        results: dict[int, tuple[str, bool]],
        running: dict[int, RunningCall[tuple[str, bool]]],
        appended: int,
    ) -> Interrupted:
        """After an interrupt: give running tools a moment to stop, then close every call with a result."""
        # The interrupt signal is set, so wait on the futures themselves, not on the signal.
        wait_for_futures([call.future for call in running.values()], timeout=_STOP_GRACE)
        for index in range(appended, len(plans)):
            result = results.get(index)
            entry = running.get(index)
            if result is None and entry is not None and entry.future.done():
                result = entry.future.result()
            self._append_result(turn, plans[index], *(result or (INTERRUPTED_RESULT, False)), count=False)
        return Interrupted()

    def _append_result(
        self,
        turn: TurnState,
        plan: PlannedCall,
        result: str,
        ok: bool,
        *,
        count: bool = True,
        noted: bool = True,
    ) -> None:
        """Append a call's result; `count` it towards its tool's failures in a row, and (`noted`) say so
        in it once they reach max_tool_failures."""
        if count:
            failures = 0 if ok else turn.tool_failures.get(plan.name, 0) + 1
            turn.tool_failures[plan.name] = failures
            if noted and failures >= self.settings.agent.max_tool_failures:
                result += (
                    f"\n\n[{plan.name} has failed {failures} times in a row. Stop repeating the same call: "
                    "check the arguments against the tool's description, or take a different approach.]"
                )
        turn.history.append(tool_message(plan.call_id, result, name=plan.name))
