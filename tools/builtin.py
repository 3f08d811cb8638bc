"""Importing this module registers mibyan's built-in tools."""

from tools import file_tools, session_tools

__all__ = ["file_tools", "session_tools"]
