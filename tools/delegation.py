"""delegate_task: hand goals to subagents that work with their own history and budget.

Each child is a fresh AIAgent on the parent's current provider, with its own IterationBudget capped at
`delegation.max_iterations`, a restricted toolset (no delegate_task, clarify or memory unless configured,
and nesting only down to `delegation.max_depth`), dangerous commands denied unless the parent's user
approved them for the session (a gateway's channel is asked, as for its parent), and a timeout. Children
share the parent's MCP servers (their connections, not new processes). Several tasks run at once
(`delegation.max_concurrent`).
The parent gets each child's summary (capped), status and usage; children's sessions are stored with the
parent's session as parent_id and source "subagent". Interrupting the parent interrupts its children.
A child works where its parent does, within the same limits: the same working directory, sandbox,
workspace (a gateway agent's persona and memory) and session_search scope, and none of the tools its
parent was not given.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from mibyan.core.errors import MibyanError, ToolError
from mibyan.tools.approval import Approver
from mibyan.tools.context import RunContext
from mibyan.tools.registry import tool

if TYPE_CHECKING:
    from mibyan.agent.protocol import AgentCore
    from mibyan.agent.turn_state import ConversationResult
    from run_agent import AIAgent

SUBAGENT_PROMPT = (
    "You are a subagent: another agent gave you one task. Work on it with your tools, then end with a "
    "concise report of what you did, what you found, and anything left undone. Your report is all the "
    "other agent will see."
)
_ALWAYS_DENIED = ("clarify", "memory")


@dataclass
class ChildOutcome:
    label: str
    goal: str
    result: ConversationResult | None = None
    error: str | None = None


def _tasks(goal: str | None, context: str | None, tasks: list[Any] | None) -> list[dict[str, str]]:
    given: list[Any] = list(tasks or [])
    if goal:
        given = [{"goal": goal, "context": context or ""}, *given]
    cleaned = []
    for task in given:  # the model may send a task as its goal alone, a string
        if isinstance(task, str):
            task = {"goal": task}
        if not isinstance(task, dict) or not str(task.get("goal") or "").strip():
            raise ToolError("each task needs a goal")
        cleaned.append({"goal": str(task["goal"]).strip(), "context": str(task.get("context") or "").strip()})
    if not cleaned:
        raise ToolError("give a goal, or tasks: a list of {goal, context}")
    return cleaned


def _make_child(parent: AgentCore, new_agent: Callable[..., AIAgent], label: str) -> AIAgent:
    """A subagent of `parent`, made by the factory the parent passed (`RunContext.new_agent`); its
    commands' questions are answered from the parent's session, by the verdicts they were asked with."""
    delegation = parent.settings.delegation
    depth = parent.delegation_depth + 1
    denied = [name for name in _ALWAYS_DENIED if name not in delegation.allow_tools]
    toolsets = list(parent.settings.tools.toolsets)
    if depth >= delegation.max_depth:
        denied.append("delegate_task")
    runtime = parent.provider.runtime

    def progress(phase: str, name: str, detail: dict[str, Any]) -> None:
        parent.callbacks.emit(
            "tool_progress_callback", phase, f"{label} › {name}", {**detail, "subagent": label}
        )

    def status(kind: str, message: str) -> None:
        parent.callbacks.emit("status_callback", kind, f"{label}: {message}")

    child = new_agent(
        model=runtime.model,
        provider=runtime.provider,
        base_url=runtime.base_url,
        api_key=runtime.api_key,
        api_mode=runtime.api_mode,
        max_iterations=delegation.max_iterations,
        home=parent.home,
        enabled_toolsets=toolsets,
        source="subagent",
        yolo=parent.tools.approvals.yolo,
        denied_tools=denied,
        # none its parent is not offered, its MCP servers' included: a denied tool stays denied
        allowed_tools=[schema.name for schema in parent.tools.schemas],
        tool_progress_callback=progress,
        status_callback=status,
        approval_callback=Approver(parent.tools.approvals.answer_from_session),
        workspace=parent.workspace,
        memory=parent.memory,  # a gateway channel's subagent remembers for that channel, not for all
        workdir=parent.workdir,
        sandbox=parent.sandbox,
        # the parent's MCP servers, not new ones: the child uses its connections, the parent closes them
        mcp_connections=parent.tools.mcp.connections if parent.tools.mcp is not None else None,
        session_scope=parent.session_scope,
        delegation_depth=depth,
    )
    parent.tools.approvals.for_subagent(child.tools.approvals)
    child.session.parent_id = parent.session.session_id
    return child


def _run_child(parent: AgentCore, child: AIAgent, task: dict[str, str], outcome: ChildOutcome) -> None:
    prompt = f"Task: {task['goal']}" + (f"\n\nContext:\n{task['context']}" if task["context"] else "")
    try:
        outcome.result = child.run_conversation(
            prompt, system_message=f"{child._session_system_prompt()}\n\n{SUBAGENT_PROMPT}"
        )
    except MibyanError as exc:
        outcome.error = str(exc)


def _report(outcome: ChildOutcome, cap: int) -> str:
    head = f"## {outcome.label}: {outcome.goal}"
    if outcome.result is None:
        return f"{head}\nstatus: error\n{outcome.error or 'the subagent did not finish'}"
    result = outcome.result
    summary = (result["final_response"] or result["error"] or "(no report)").strip()
    if len(summary) > cap:
        summary = summary[:cap] + f"\n[… {len(summary) - cap} characters of the report cut]"
    usage = result["usage"]
    return (
        f"{head}\nstatus: {result['exit_reason']} · {result['api_calls']} model calls · "
        f"{usage['input_tokens']:,} in / {usage['output_tokens']:,} out · session {result['session_id']}\n"
        f"{summary}"
    )


def run_delegation(ctx: RunContext, tasks: list[dict[str, str]]) -> str:
    """Run the tasks of one delegate_task call and return the reports for the model."""
    parent = ctx.require_agent("delegate_task")
    if ctx.new_agent is None:
        raise ToolError("delegate_task needs a way to make subagents, and this agent was given none")
    delegation = parent.settings.delegation
    outcomes = [ChildOutcome(label=f"subagent {i + 1}", goal=t["goal"]) for i, t in enumerate(tasks)]
    children = [_make_child(parent, ctx.new_agent, outcome.label) for outcome in outcomes]
    for child in children:
        parent.adopt_child(child)
    wake = ctx.waker()
    try:
        with ThreadPoolExecutor(
            min(delegation.max_concurrent, len(tasks)), thread_name_prefix="mibyan-child"
        ) as pool:
            futures = [
                pool.submit(_run_child, parent, child, task, outcome)
                for child, task, outcome in zip(children, tasks, outcomes, strict=True)
            ]
            for future in futures:
                future.add_done_callback(lambda _f: wake())
            ctx.wait_or_stop(lambda: all(f.done() for f in futures), delegation.timeout)
            if not all(f.done() for f in futures):
                late = f"timed out after {delegation.timeout:g} s"
                reason = "interrupted" if ctx.stop_requested() else late
                for child, future in zip(children, futures, strict=True):
                    if not future.done():
                        child.interrupt()
                        parent.callbacks.emit("status_callback", "subagent", f"stopping a subagent: {reason}")
    finally:
        for child in children:
            parent.release_child(child)
            child.close()
    for outcome in outcomes:
        if outcome.result is not None:
            ctx.add_usage(outcome.result["usage"])
    return "\n\n".join(_report(outcome, delegation.summary_chars) for outcome in outcomes)


class DelegatedTask(TypedDict):
    """One task for a subagent.

    Attributes:
        goal: what the subagent must do, in one or two sentences.
        context: what it needs to know for that (files, constraints, what done looks like).
    """

    goal: str
    context: NotRequired[str]


@tool(toolset="core")
def delegate_task(
    ctx: RunContext,
    goal: str | None = None,
    context: str | None = None,
    tasks: list[DelegatedTask] | None = None,
) -> str:
    """Hand work to subagents: each gets a fresh context and its own tools, and reports back when done.

    Use it for independent pieces of work (research, a change in one area, checking something), so your
    own context stays small. Several tasks run at the same time. Give each everything it needs to know:
    a subagent sees none of this conversation.

    Args:
        goal: one task to delegate.
        context: what the subagent needs to know for that goal (files, constraints, what done looks like).
        tasks: several tasks to run at once, each with its goal and (optional) context.
    """
    return run_delegation(ctx, _tasks(goal, context, list(tasks or [])))
