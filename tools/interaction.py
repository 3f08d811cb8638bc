"""clarify: the model asks the user a question (an agent-level tool: it needs the agent's callback)."""

from __future__ import annotations

from mibyan.tools.context import RunContext
from mibyan.tools.registry import tool

_NO_USER = "No user is available to answer. Continue with your best judgement and say what you assumed."


@tool(toolset="core", interactive=True)
def clarify(ctx: RunContext, question: str, choices: list[str] | None = None) -> str:
    """Ask the user a question and wait for the answer. Use it only when you cannot go on without it.

    Args:
        question: the question, complete enough to answer without more context.
        choices: the answers to offer, if the question has a few obvious ones.
    """
    callbacks = ctx.require_agent("clarify").callbacks
    if callbacks.clarify_callback is None:
        return _NO_USER
    answer = callbacks.emit("clarify_callback", str(question), choices)
    return str(answer) if answer not in (None, "") else "The user gave no answer."
