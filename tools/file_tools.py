"""File tools: read, write and list files relative to the working directory.

Every call is judged by `tools.path_policy` twice: before it runs (the `dangerous=` verdict, which
goes through the approval flow) and again at the moment it acts, on a fresh resolution of the path, so
a symlink swapped in between cannot redirect an approved call. Writes go through `tools.safe_write`.

When the caller reads and writes files elsewhere (an editor's buffers, `RunContext.files`), read_file,
write_file and patch hand it the judged, resolved path instead of opening the file themselves.
"""

from __future__ import annotations

import difflib
import fnmatch
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from mibyan.core.errors import ToolError
from mibyan.tools.approval import Verdict
from mibyan.tools.context import RunContext
from mibyan.tools.path_policy import Access, PathJudgement, judge_path
from mibyan.tools.registry import tool
from mibyan.tools.safe_write import atomic_write


def _judge(bound: RunContext, path: str, access: Access) -> PathJudgement:
    path = str(path)  # the model may send a number where the schema says string
    if "\x00" in path:
        raise ToolError("a path cannot contain a NUL character")
    return judge_path(
        path,
        access,
        home=bound.judge_home(),
        cwd=bound.workdir,
        protected=bound.protected,
        agent_folder=bound.agent_folder,
        isolated=bound.isolated,
        temp=bound.sandbox.temp if bound.sandbox is not None else None,
    )


def _given(bound: RunContext, path: str) -> Path:
    """The path as the model wrote it, from the tools' working directory when that is not the process's."""
    given = Path(path).expanduser()
    return bound.workdir / given if bound.workdir is not None else given


def _policy(access: Access) -> Callable[[dict[str, Any], RunContext], Verdict]:
    def verdict(args: dict[str, Any], ctx: RunContext) -> Verdict:
        return _judge(ctx, str(args.get("path") or "."), access).verdict

    return verdict


_SHOWN_LINES = 12


def _excerpt(text: str, mark: str) -> list[str]:
    lines = text.split("\n")
    shown = [f"{mark}{line}" for line in lines[:_SHOWN_LINES]]
    if len(lines) > _SHOWN_LINES:
        shown.append(f"… {len(lines) - _SHOWN_LINES} more lines")
    return shown


def _subject(name: str, access: Access) -> Callable[[dict[str, Any], RunContext], str]:
    """The approval question's subject: the tool and the resolved path, and for a write what it writes
    (the first lines of the content, or the lines a patch takes out and puts in)."""

    def subject(args: dict[str, Any], ctx: RunContext) -> str:
        lines = [f"{name} {_judge(ctx, str(args.get('path') or '.'), access).shown}"]
        if isinstance(args.get("content"), str):
            lines += _excerpt(args["content"], "  ")
        if isinstance(args.get("old"), str) and isinstance(args.get("new"), str):
            lines += _excerpt(args["old"], "- ") + _excerpt(args["new"], "+ ")
        return "\n".join(lines)

    return subject


def _resolve(bound: RunContext, path: str, access: Access = "read") -> Path:
    """The file to open for `path`, judged again now; raises ToolError unless it is allowed."""
    judged = _judge(bound, path, access)
    verdict = judged.verdict
    if verdict.tier == "hardline":
        raise ToolError(f"blocked: {verdict.reason}; mibyan never does this")
    if verdict.tier == "dangerous" and bound.approved != verdict:
        raise ToolError(f"not done: this {verdict.reason}, and the user did not approve that")
    return judged.target


_MAX_READ_BYTES = 20 * 1024 * 1024


def _read_text(ctx: RunContext, target: Path) -> str:
    files = ctx.files
    if files is not None and files.reads:
        return files.read_text(target, ctx.signal)
    return target.read_text(encoding="utf-8")


def _write_text(ctx: RunContext, target: Path, text: str) -> None:
    files = ctx.files
    if files is not None and files.writes:
        files.write_text(target, text, ctx.signal)
    else:
        atomic_write(target, text.encode("utf-8"))


def _numbered(text: str, offset: int, limit: int) -> str:
    """The lines of `text` from `offset` (1-based), at most `limit`, each prefixed with its number."""
    lines = text.splitlines(keepends=True)
    start = max(offset, 1) - 1
    chosen = lines[start : start + max(limit, 1)]
    body = "".join(f"{start + i + 1:6}\t{line}" for i, line in enumerate(chosen))
    if start + len(chosen) < len(lines):
        body += f"\n... {len(lines) - start - len(chosen)} more lines (use offset to read on)"
    return body or "(empty file)"


def _looks_binary(path: Path) -> bool:
    with path.open("rb") as handle:
        return b"\x00" in handle.read(8192)


@tool(
    toolset="core",
    max_result_chars=100_000,
    dangerous=_policy("read"),
    subject=_subject("read_file", "read"),
)
def read_file(ctx: RunContext, path: str, offset: int = 1, limit: int = 2000) -> str:
    """Read a text file and return its lines, each prefixed with its line number.

    Args:
        path: the file to read, absolute or relative to the working directory.
        offset: the first line to return (1-based).
        limit: how many lines to return at most.
    """
    target = _resolve(ctx, path)
    if target.is_dir():
        raise ToolError(f"{path} is a directory; use list_directory")
    files = ctx.files
    if not target.exists():
        if files is not None and files.reads:  # an editor's new buffer, not saved yet
            return _numbered(files.read_text(target, ctx.signal), offset, limit)
        raise ToolError(f"no such file: {path}")
    if not target.is_file():  # a pipe would block the read until the tool times out
        raise ToolError(f"{path} is not a regular file (a device, socket or pipe)")
    size = target.stat().st_size
    if _looks_binary(target):
        return f"{path} is a binary file ({size} bytes); it cannot be shown as text"
    if size > _MAX_READ_BYTES:
        raise ToolError(
            f"{path} is {size} bytes, too large to read; use search_files or terminal (head, sed -n)"
        )
    if files is not None and files.reads:
        # the editor's buffer, with the changes not saved yet; the policy above judged the path all the same
        return _numbered(files.read_text(target, ctx.signal), offset, limit)
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


@tool(
    toolset="core",
    resource="path",
    dangerous=_policy("write"),
    subject=_subject("write_file", "write"),
)
def write_file(ctx: RunContext, path: str, content: str) -> str:
    """Write text to a file, replacing it if it exists and creating parent folders as needed.

    Args:
        path: the file to write, absolute or relative to the working directory.
        content: the complete new content of the file.
    """
    target = _resolve(ctx, path, "write")
    if target.is_dir():
        raise ToolError(f"{path} is a directory")
    if target.exists() and not target.is_file():
        raise ToolError(f"{path} is not a regular file (a device, socket or pipe); it is left alone")
    _write_text(ctx, target, content)
    return f"wrote {len(content.encode())} bytes to {path}"


@tool(toolset="core", dangerous=_policy("read"), subject=_subject("list_directory", "read"))
def list_directory(ctx: RunContext, path: str = ".") -> str:
    """List the entries of a directory; folders end with a slash.

    Args:
        path: the directory to list; the working directory when omitted.
    """
    target = _resolve(ctx, path)
    try:
        entries = sorted(target.iterdir(), key=lambda p: p.name)
    except FileNotFoundError:
        raise ToolError(f"no such directory: {path}") from None
    except NotADirectoryError:
        raise ToolError(f"{path} is a file; use read_file") from None
    return "\n".join(p.name + ("/" if p.is_dir() else "") for p in entries) or "(empty directory)"


@tool(toolset="core", resource="path", dangerous=_policy("write"), subject=_subject("patch", "write"))
def patch(ctx: RunContext, path: str, old: str, new: str) -> str:
    """Replace one exact piece of text in a file and return the change as a unified diff.

    `old` must appear exactly once in the file (include enough surrounding lines to make it unique);
    whitespace and indentation must match exactly.

    Args:
        path: the file to change.
        old: the exact text to replace.
        new: the text to put in its place.
    """
    target = _resolve(ctx, path, "write")
    if target.exists() and not target.is_file():
        raise ToolError(f"{path} is not a regular file (a device, socket or pipe); it is left alone")
    try:
        original = _read_text(ctx, target)
    except FileNotFoundError:
        raise ToolError(f"no such file: {path}; use write_file to create it") from None
    count = original.count(old) if old else 0
    if count != 1:
        where = "does not appear" if count == 0 else f"appears {count} times"
        raise ToolError(f"the old text {where} in {path}; it must match exactly once")
    updated = original.replace(old, new, 1)
    _write_text(ctx, target, updated)
    diff = difflib.unified_diff(
        original.splitlines(keepends=True),
        updated.splitlines(keepends=True),
        fromfile=f"a/{path}",
        tofile=f"b/{path}",
    )
    return "".join(diff)


_SKIP_DIRS = {".git", ".hg", ".svn", "node_modules", "__pycache__", ".venv", "venv", ".mypy_cache"}


_OFF_LIMITS = ("secret_read", "sealed_home", "isolated")
_SEALED = _OFF_LIMITS[1:]


def _walk(bound: RunContext, root: Path) -> Iterator[Path]:
    """The files under `root`, past the folders a search skips and those this agent may not read."""
    confined = bound.agent_folder is not None or bound.isolated
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(
            d
            for d in dirs
            if d not in _SKIP_DIRS
            and not (confined and _judge(bound, os.path.join(folder, d), "read").verdict.key in _SEALED)
        )
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


def _off_limits(bound: RunContext, file: Path) -> bool:
    """A file a search walks past without opening: a link (as ripgrep does), a pipe or device (which
    could block the search), or a place of secrets."""
    if file.is_symlink() or not file.is_file():
        return True
    return _judge(bound, str(file), "read").verdict.key in _OFF_LIMITS


def _reaches_sealed_places(bound: RunContext, root: Path) -> bool:
    """Whether a search from `root` would pass through parts of the home this agent may not read
    (ripgrep cannot be told which, so the search walks itself)."""
    if bound.agent_folder is None or bound.home is None:
        return False
    home = Path(os.path.realpath(bound.home))
    return str(home).startswith(str(root).rstrip("/") + "/")


def _capped(lines: list[str], cap: int) -> str:
    if not lines:
        return "no matches"
    more = f"\n... {len(lines) - cap} more matches (narrow the search)" if len(lines) > cap else ""
    return "\n".join(lines[:cap]) + more


@tool(
    toolset="core",
    max_result_chars=60_000,
    dangerous=_policy("read"),
    subject=_subject("search_files", "read"),
)
def search_files(
    ctx: RunContext, pattern: str = "", path: str = ".", glob: str | None = None, max_results: int = 200
) -> str:
    """Search file contents with a regular expression, or find files by name with a glob.

    With `pattern`, returns matching lines as path:line:text. With only `glob`, returns matching file paths.
    Skips .git, node_modules, virtual environments and binary files.

    Args:
        pattern: a regular expression to look for in file contents (Python / ripgrep syntax).
        path: the directory (or file) to search in.
        glob: only files whose name matches this glob, such as "*.py".
        max_results: how many matches to return at most.
    """
    resolved = _resolve(ctx, path)
    given = _given(ctx, path)
    # results name files the way the model wrote the path, unless it leads through a link
    root = given if os.path.realpath(given) == str(resolved) and not given.is_symlink() else resolved
    if not root.exists():
        raise ToolError(f"no such path: {path}")
    if not pattern:
        if not glob:
            raise ToolError("give a pattern to search contents, or a glob to find files")
        names = [str(p) for p in _walk(ctx, root) if fnmatch.fnmatch(p.name, glob)]
        return _capped(names, max_results)
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise ToolError(f"invalid regular expression: {exc}") from None
    fast = (
        None
        if _reaches_sealed_places(ctx, resolved)
        else _search_with_ripgrep(pattern, str(root), glob, max_results)
    )
    if fast is not None:
        return fast
    hits: list[str] = []
    for file in [root] if root.is_file() else _walk(ctx, root):
        if glob and not fnmatch.fnmatch(file.name, glob):
            continue
        if file != root and _off_limits(ctx, file):
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
