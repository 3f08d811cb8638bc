"""The wire APIs mibyan speaks. Standard library only: the CLI's argument parser imports it at start-up."""

from __future__ import annotations

from typing import Literal

ApiMode = Literal["chat_completions", "codex_responses", "anthropic_messages"]
API_MODES: tuple[ApiMode, ...] = ("chat_completions", "codex_responses", "anthropic_messages")
