"""Turn step 3: the system prompt, assembled once per session and reused so prompt caches hit."""

from __future__ import annotations

import platform
from datetime import date
from pathlib import Path

DEFAULT_PERSONA = """You are mibyan, a capable software engineering agent working in the user's terminal.
You help by reading and changing files and running tools. Be direct and accurate; say what you did."""

TOOL_GUIDANCE = """When a task needs information you do not have, use a tool rather than guessing.
Several independent tool calls may be made in one reply; they run concurrently.
When you are done, answer in plain text without calling a tool."""


class PromptBuilderMixin:
    """Builds the system prompt; the result is cached for the whole session."""

    _system_prompt: str | None

    def _session_system_prompt(self) -> str:
        if self._system_prompt is None:
            self._system_prompt = self._build_system_prompt()
        return self._system_prompt

    def _build_system_prompt(self) -> str:
        # Today's date but not the time, so the prompt (and the provider's cache of it) is stable all day.
        facts = (
            f"Working directory: {Path.cwd()}\nOperating system: {platform.system()} {platform.release()}\n"
            f"Today's date: {date.today().isoformat()}"
        )
        return "\n\n".join([DEFAULT_PERSONA, TOOL_GUIDANCE, facts])
