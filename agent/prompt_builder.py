"""Turn step 3: the system prompt, assembled once per session and reused so prompt caches hit.

The parts, in a fixed order: the persona ($MIBYAN_HOME/SOUL.md, or the agent workspace's; else the
built-in one), tool-use guidance, the project's context file (the first .mibyan.md, AGENTS.md or
CLAUDE.md from the working directory up to the git root; an agent workspace's own AGENTS.md), the memory
snapshot (MEMORY.md, USER.md) as it was when the session started, the list of skills, and environment
facts (the date but not the time, so the prompt stays byte-identical all day). What varies per message
(matched skills, relevant facts) is sent as an ephemeral layer instead, so the cached prefix does not
move.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from mibyan.agent.protocol import AgentBase
from mibyan.tools.skills import SemanticMatcher, Skill, discover_skills, match_skills, skills_index

DEFAULT_PERSONA = """You are mibyan, a capable software engineering agent working in the user's terminal.
You help by reading and changing files and running tools. Be direct and accurate; say what you did."""

TOOL_GUIDANCE = """When a task needs information you do not have, use a tool rather than guessing.
Several independent tool calls may be made in one reply; they run concurrently.
Save what will matter in later sessions with the memory tool: your notes, or what you learn about the user.
When you are done, answer in plain text without calling a tool."""

CONTEXT_FILES = (".mibyan.md", "AGENTS.md", "CLAUDE.md")
_CONTEXT_CAP = 12_000
_FACTS_CAP = 800


def find_project_context(cwd: Path) -> Path | None:
    """The first context file from `cwd` up to the git root (or the filesystem root)."""
    for folder in (cwd, *cwd.parents):
        for name in CONTEXT_FILES:
            candidate = folder / name
            if candidate.is_file():
                return candidate
        if (folder / ".git").exists():
            return None
    return None


def capped(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    note = f"[… {len(text) - limit} characters of this file left out …]"
    return f"{text[:head]}\n\n{note}\n\n{text[-(limit - head) :]}"


@dataclass
class PromptState:
    """The session's system prompt and how per-message skills are matched.

    Attributes:
        text: the prompt, built on first use (None until then, and after a compression) and then reused
            byte for byte, so prompt caches hit.
        custom: the caller gave the prompt (system_message, or a leading system message): never rebuilt.
        skill_matcher: matches skills by meaning when `skills.embedding` is set.
    """

    text: str | None = None
    custom: bool = False
    skill_matcher: SemanticMatcher | None = None


class PromptBuilderMixin(AgentBase):
    """Builds the system prompt once per session, and the per-message context layers."""

    def _session_system_prompt(self) -> str:
        if self.prompt.text is None:
            self.prompt.text = self._build_system_prompt()
        return self.prompt.text

    def reload_prompt(self) -> str:
        """Rebuild the system prompt now (after a change to SOUL.md, the memory files or the skills).

        The new prompt is stored with the session, so a resume gets it too.
        """
        text = self.prompt.text = self._build_system_prompt()
        self.prompt.custom = False
        self.session.store.sessions.set_system_prompt(self.session.session_id, text)
        return text

    def _skills(self) -> list[Skill]:
        return discover_skills(self.persona_dir, self.workdir or Path.cwd())

    def _build_system_prompt(self) -> str:
        cwd = self.workdir or Path.cwd()
        soul = self.persona_dir / "SOUL.md"
        parts = [
            soul.read_text(encoding="utf-8").strip() if soul.is_file() else DEFAULT_PERSONA,
            TOOL_GUIDANCE,
        ]
        # an agent with a workspace (a gateway's) has its own context file, not the start folder's
        context_file = find_project_context(cwd) if self.workspace is None else self.workspace / "AGENTS.md"
        if context_file is not None and context_file.is_file():
            text = capped(context_file.read_text(encoding="utf-8", errors="replace").strip(), _CONTEXT_CAP)
            parts.append(f"# Project context ({context_file.name})\n\n{text}")
        memory = self.memory.snapshot()
        if memory:
            parts.append(f"# Memory from earlier sessions\n\n{memory}")
        skills = self._skills()
        if skills:
            parts.append("# Skills (read one with skill_view)\n\n" + skills_index(skills))
        parts.append(
            f"Working directory: {cwd}\nOperating system: {platform.system()} {platform.release()}\n"
            f"Today's date: {date.today().isoformat()}"
        )
        return "\n\n".join(parts)

    def _message_layers(self, message: str) -> list[str]:
        """Skills whose triggers the message names, and stored facts relevant to it."""
        skills = self._skills()
        matched = match_skills(skills, message)
        if self.prompt.skill_matcher is not None:
            matched += [s for s in self.prompt.skill_matcher.match(skills, message) if s not in matched]
        layers = [f"[Skill: {s.name}]\n{s.body}" for s in matched]
        facts = self.session.store.facts.relevant(message, owner=self.memory.fact_owner)
        if facts:
            text = capped("\n".join(f"- {fact}" for fact in facts), _FACTS_CAP)
            layers.append(f"[Facts you stored that may be relevant]\n{text}")
        return layers
