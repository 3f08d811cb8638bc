"""Importing this module registers mibyan's built-in tools."""

from tools import file_tools, interaction, session_tools, terminal, web_tools

__all__ = ["file_tools", "interaction", "session_tools", "terminal", "web_tools"]
