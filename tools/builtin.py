"""Importing this module registers mibyan's built-in tools."""

from mibyan.tools import (
    delegation,
    file_tools,
    interaction,
    memory_tools,
    session_tools,
    terminal,
    todo,
    web_tools,
)

__all__ = [
    "delegation",
    "file_tools",
    "interaction",
    "memory_tools",
    "session_tools",
    "terminal",
    "todo",
    "web_tools",
]
