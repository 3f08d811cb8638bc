"""memory, skills_list and skill_view: agent-level tools over the mibyan home."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from agent_state import SessionStore, mask_secrets
from mibyan.core.errors import ToolError
from mibyan.tools.context import RunContext
from mibyan.tools.registry import tool
from mibyan.tools.skills import discover_skills, skills_index

if TYPE_CHECKING:
    from mibyan.agent.memory import MemoryStore


def apply_memory(
    memory: MemoryStore,
    store: SessionStore,
    action: str,
    target: str = "memory",
    content: str = "",
    old: str = "",
    query: str = "",
) -> str:
    if action == "read":
        return memory.read(target) or f"({target} is empty)"
    if action == "remember":
        if not content.strip():
            raise ToolError("remember needs content: the fact to keep")
        if mask_secrets(content) != content:
            raise ToolError("that looks like a secret (a key or token); secrets are never stored")
        memory.check_keeps()
        store.facts.add(content.strip(), owner=memory.fact_owner)
        return "fact stored; it will be offered again when a message mentions its words"
    if action == "recall":
        facts = store.facts.relevant(query or content, owner=memory.fact_owner)
        return "\n".join(f"- {f}" for f in facts) or "no stored fact matches"
    return memory.change(target, action, content=content, old=old)


def view_skill(home: Path, name: str, cwd: Path | None = None) -> str:
    for skill in discover_skills(home, cwd or Path.cwd()):
        if skill.name == name:
            return skill.body
    raise ToolError(f"no skill named {name!r}; skills_list shows them")


def list_skills(home: Path, cwd: Path | None = None) -> str:
    return skills_index(discover_skills(home, cwd or Path.cwd())) or "no skills installed"


@tool(toolset="core")
def memory(
    ctx: RunContext,
    action: str,
    target: str = "memory",
    content: str | None = None,
    old: str | None = None,
    query: str | None = None,
) -> str:
    """Keep what matters across sessions. Two small files go into every future session's prompt:
    "memory" (your notes: conventions, decisions, where things are) and "user" (the user's preferences).
    Facts beyond them are stored with "remember" and come back when a message mentions their words.

    Args:
        action: add, replace, remove or read (for target), remember (store a fact), recall (search facts).
        target: "memory" (MEMORY.md, 2,200 characters) or "user" (USER.md, 1,375 characters).
        content: the text to add, the replacement text, or the fact to remember.
        old: for replace and remove, a unique part of the text to change.
        query: for recall, what to look for.
    """
    agent = ctx.require_agent("memory")
    return apply_memory(
        agent.memory,
        agent.session.store,
        # the model may send null or a number where the schema says string
        str(action or ""),
        str(target or "memory"),
        str(content or ""),
        str(old or ""),
        str(query or ""),
    )


@tool(toolset="core")
def skills_list(ctx: RunContext) -> str:
    """List the skills installed for this user and project (name: description)."""
    agent = ctx.require_agent("skills_list")
    return list_skills(agent.persona_dir, agent.workdir)


@tool(toolset="core")
def skill_view(ctx: RunContext, name: str) -> str:
    """Read a skill's full instructions.

    Args:
        name: the skill's name, as skills_list shows it.
    """
    agent = ctx.require_agent("skill_view")
    return view_skill(agent.persona_dir, str(name), agent.workdir)
