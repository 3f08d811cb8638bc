"""clarify: the model asks the user a question (an agent-level tool: it needs the agent's callback)."""

from __future__ import annotations

from mibyan.core.errors import ToolError
from mibyan.tools.registry import tool


@tool(toolset="core", interactive=True)
def clarify(question: str, choices: list[str] | None = None) -> str:
    """Ask the user a question and wait for the answer. Use it only when you cannot go on without it.

    Args:
        question: the question, complete enough to answer without more context.
        choices: the answers to offer, if the question has a few obvious ones.
    """
    raise ToolError("clarify runs inside an agent session")
