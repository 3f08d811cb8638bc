"""File tools: read, write and list files relative to the working directory."""

from __future__ import annotations

import difflib
import fnmatch
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from mibyan.agent.errors import ToolError
from mibyan.tools.registry import tool


def _resolve(path: str) -> Path:
    return Path(path).expanduser()


_MAX_READ_BYTES = 20 * 1024 * 1024


def _looks_binary(path: Path) -> bool:
    with path.open("rb") as handle:
        return b"\x00" in handle.read(8192)


@tool(toolset="core", max_result_chars=100_000)
def read_file(path: str, offset: int = 1, limit: int = 2000) -> str:
    """Read a text file and return its lines, each prefixed with its line number.

    Args:
        path: the file to read, absolute or relative to the working directory.
        offset: the first line to return (1-based).
        limit: how many lines to return at most.
    """
    target = _resolve(path)
    if target.is_dir():
        raise ToolError(f"{path} is a directory; use list_directory")
    if not target.exists():
        raise ToolError(f"no such file: {path}")
    size = target.stat().st_size
    if _looks_binary(target):
        return f"{path} is a binary file ({size} bytes); it cannot be shown as text"
    if size > _MAX_READ_BYTES:
        raise ToolError(
            f"{path} is {size} bytes, too large to read; use search_files or terminal (head, sed -n)"
        )
    start = max(offset, 1) - 1
    chosen: list[str] = []
    total = 0
    with target.open(encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle):
            total = number + 1
            if start <= number < start + max(limit, 1):
                chosen.append(f"{number + 1:6}\t{line}")
    body = "".join(chosen)
    if start + len(chosen) < total:
        body += f"\n... {total - start - len(chosen)} more lines (use offset to read on)"
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


@tool(toolset="core", resource="path")
def patch(path: str, old: str, new: str) -> str:
    """Replace one exact piece of text in a file and return the change as a unified diff.

    `old` must appear exactly once in the file (include enough surrounding lines to make it unique);
    whitespace and indentation must match exactly.

    Args:
        path: the file to change.
        old: the exact text to replace.
        new: the text to put in its place.
    """
    target = _resolve(path)
    try:
        original = target.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ToolError(f"no such file: {path}; use write_file to create it") from None
    count = original.count(old) if old else 0
    if count != 1:
        where = "does not appear" if count == 0 else f"appears {count} times"
        raise ToolError(f"the old text {where} in {path}; it must match exactly once")
    updated = original.replace(old, new, 1)
    temporary = target.with_name(f".{target.name}.mibyan-tmp")
    temporary.write_text(updated, encoding="utf-8")
    os.replace(temporary, target)
    diff = difflib.unified_diff(
        original.splitlines(keepends=True),
        updated.splitlines(keepends=True),
        fromfile=f"a/{path}",
        tofile=f"b/{path}",
    )
    return "".join(diff)


_SKIP_DIRS = {".git", ".hg", ".svn", "node_modules", "__pycache__", ".venv", "venv", ".mypy_cache"}


def _walk(root: Path) -> Iterator[Path]:
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        for name in sorted(files):
            yield Path(folder) / name


def _search_with_ripgrep(pattern: str, root: str, glob: str | None, cap: int) -> str | None:
    rg = shutil.which("rg")
    if rg is None:
        return None
    command = [
        rg,
        "--line-number",
        "--no-heading",
        "--color",
        "never",
        "--max-columns",
        "300",
        "-e",
        pattern,
        root,
    ]
    if glob:
        command[1:1] = ["--glob", glob]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode == 2:
        raise ToolError(done.stderr.strip() or "ripgrep failed")
    lines = done.stdout.splitlines()
    return _capped(lines, cap)


def _capped(lines: list[str], cap: int) -> str:
    if not lines:
        return "no matches"
    more = f"\n... {len(lines) - cap} more matches (narrow the search)" if len(lines) > cap else ""
    return "\n".join(lines[:cap]) + more


@tool(toolset="core", max_result_chars=60_000)
def search_files(pattern: str = "", path: str = ".", glob: str | None = None, max_results: int = 200) -> str:
    """Search file contents with a regular expression, or find files by name with a glob.

    With `pattern`, returns matching lines as path:line:text. With only `glob`, returns matching file paths.
    Skips .git, node_modules, virtual environments and binary files.

    Args:
        pattern: a regular expression to look for in file contents (Python / ripgrep syntax).
        path: the directory (or file) to search in.
        glob: only files whose name matches this glob, such as "*.py".
        max_results: how many matches to return at most.
    """
    root = _resolve(path)
    if not root.exists():
        raise ToolError(f"no such path: {path}")
    if not pattern:
        if not glob:
            raise ToolError("give a pattern to search contents, or a glob to find files")
        names = [str(p) for p in _walk(root) if fnmatch.fnmatch(p.name, glob)]
        return _capped(names, max_results)
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise ToolError(f"invalid regular expression: {exc}") from None
    fast = _search_with_ripgrep(pattern, str(root), glob, max_results)
    if fast is not None:
        return fast
    hits: list[str] = []
    for file in [root] if root.is_file() else _walk(root):
        if glob and not fnmatch.fnmatch(file.name, glob):
            continue
        try:
            if _looks_binary(file):
                continue
            with file.open(encoding="utf-8", errors="replace") as handle:
                for number, line in enumerate(handle, start=1):
                    if regex.search(line):
                        hits.append(f"{file}:{number}:{line.rstrip()[:300]}")
        except OSError:
            continue
        if len(hits) > max_results:
            break
    return _capped(hits, max_results)
