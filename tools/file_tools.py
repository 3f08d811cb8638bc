"""File tools: read, write and list files relative to the working directory."""

from __future__ import annotations

import os
from pathlib import Path

from agent.errors import ToolError
from tools.registry import tool


def _resolve(path: str) -> Path:
    return Path(path).expanduser()


@tool(toolset="core", max_result_chars=100_000)
def read_file(path: str, offset: int = 1, limit: int = 2000) -> str:
    """Read a text file and return its lines, each prefixed with its line number.

    Args:
        path: the file to read, absolute or relative to the working directory.
        offset: the first line to return (1-based).
        limit: how many lines to return at most.
    """
    target = _resolve(path)
    try:
        with target.open(encoding="utf-8", errors="replace") as handle:
            lines = handle.readlines()
    except FileNotFoundError:
        raise ToolError(f"no such file: {path}") from None
    except IsADirectoryError:
        raise ToolError(f"{path} is a directory; use list_directory") from None
    start = max(offset, 1) - 1
    chosen = lines[start : start + max(limit, 1)]
    body = "".join(f"{start + i + 1:6}\t{line}" for i, line in enumerate(chosen))
    if start + len(chosen) < len(lines):
        body += f"\n... {len(lines) - start - len(chosen)} more lines (use offset to read on)"
    return body or "(empty file)"


@tool(toolset="core", resource="path")
def write_file(path: str, content: str) -> str:
    """Write text to a file, replacing it if it exists and creating parent folders as needed.

    Args:
        path: the file to write, absolute or relative to the working directory.
        content: the complete new content of the file.
    """
    target = _resolve(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.mibyan-tmp")
    temporary.write_text(content, encoding="utf-8")
    os.replace(temporary, target)
    return f"wrote {len(content.encode())} bytes to {path}"


@tool(toolset="core")
def list_directory(path: str = ".") -> str:
    """List the entries of a directory; folders end with a slash.

    Args:
        path: the directory to list; the working directory when omitted.
    """
    target = _resolve(path)
    try:
        entries = sorted(target.iterdir(), key=lambda p: p.name)
    except FileNotFoundError:
        raise ToolError(f"no such directory: {path}") from None
    except NotADirectoryError:
        raise ToolError(f"{path} is a file; use read_file") from None
    return "\n".join(p.name + ("/" if p.is_dir() else "") for p in entries) or "(empty directory)"
