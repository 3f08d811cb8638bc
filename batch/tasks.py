"""The tasks file: one JSON object a line, every line validated before anything runs.

A task's id is its given `id`, else a hash of its canonical JSON (without `repeat`) and its occurrence
number, so three identical lines are three tasks, and raising a line's `repeat` later adds tasks without
renaming the ones that ran.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mibyan.core.errors import MibyanError

_KEYS = frozenset({"prompt", "id", "cwd", "repeat", "metadata"})
MAX_REPEAT = 10_000
_MAX_ID = 200


class TaskFileError(MibyanError):
    """The tasks file cannot be run as it is: one line naming the file and the line."""


@dataclass(frozen=True)
class Task:
    """One task to run: a prompt, where it works, and what to carry into its result.

    Attributes:
        task_id: its identity across runs.
        line: its line in the tasks file (1-based).
        prompt: the user message.
        cwd: the working directory the row names (resolved), or None for its own under DIR/work/.
        metadata: the row's `metadata`, copied into the result.
    """

    task_id: str
    line: int
    prompt: str
    cwd: Path | None = None
    metadata: Any = None


@dataclass(frozen=True)
class InvalidLine:
    """A line that is not a task, recorded (with --skip-invalid) with the disposition `invalid`."""

    task_id: str
    line: int
    reason: str


def canonical(value: Any) -> str:
    """The JSON text two equal rows share whatever their key order and spacing."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()[:16]


def _check_row(row: Any, folder: Path) -> str | None:
    """Why `row` is not a task, or None when it is one."""
    if not isinstance(row, dict):
        return f"expected a JSON object, not {type(row).__name__}"
    unknown = sorted(set(row) - _KEYS)
    if unknown:
        return f"unknown key {unknown[0]!r} (a task has prompt, and may have id, cwd, repeat, metadata)"
    prompt = row.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        return f"prompt must be a non-empty string, not {json.dumps(prompt, ensure_ascii=False)[:60]}"
    given = row.get("id")
    if given is not None and (not isinstance(given, str) or not given.strip() or len(given) > _MAX_ID):
        return f"id must be a non-empty string of at most {_MAX_ID} characters"
    repeat = row.get("repeat", 1)
    if isinstance(repeat, bool) or not isinstance(repeat, int) or not 1 <= repeat <= MAX_REPEAT:
        return f"repeat must be a whole number from 1 to {MAX_REPEAT}, not {json.dumps(repeat)}"
    cwd = row.get("cwd")
    if cwd is not None:
        if not isinstance(cwd, str) or not cwd.strip():
            return "cwd must be a non-empty string"
        if not (folder / cwd).expanduser().is_dir():
            return f"cwd {cwd!r} is not a directory"
    return None


class _Ids:
    """Hands out task ids, counting occurrences of equal rows, and refuses an id given twice."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}  # task id -> its line
        self.occurrences: dict[str, int] = {}

    def next(self, base: str, *, numbered: bool) -> str:
        number = self.occurrences.get(base, 0)
        self.occurrences[base] = number + 1
        return f"{base}#{number}" if numbered else base

    def claim(self, task_id: str, line: int) -> str | None:
        if task_id in self.seen:
            return f"id {task_id!r} is already the id of line {self.seen[task_id]}"
        self.seen[task_id] = line
        return None


def _tasks_of(row: dict[str, Any], line: int, repeat: int, folder: Path, ids: _Ids) -> list[Task]:
    count = row.get("repeat", repeat)
    given = row.get("id")
    base = given if given is not None else _digest(canonical({k: v for k, v in row.items() if k != "repeat"}))
    cwd = (folder / row["cwd"]).expanduser().resolve() if row.get("cwd") else None
    return [
        Task(
            ids.next(base, numbered=given is None or count > 1),
            line,
            row["prompt"],
            cwd,
            row.get("metadata"),
        )
        for _ in range(count)
    ]


def read_tasks(
    path: Path, *, repeat: int = 1, skip_invalid: bool = False
) -> tuple[list[Task], list[InvalidLine]]:
    """Every task of the file at `path`, in order; blank lines are skipped.

    `repeat`: how many times each row runs unless it says so itself. With `skip_invalid`, a bad line
    becomes an InvalidLine; without it, the first one stops everything.

    Raises:
        TaskFileError: the file cannot be read, has no task, or (without `skip_invalid`) a bad line.
    """
    try:
        raw_lines = path.read_bytes().split(b"\n")
    except OSError as exc:
        raise TaskFileError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    folder = path.resolve().parent
    ids, invalid_ids = _Ids(), _Ids()
    tasks: list[Task] = []
    invalid: list[InvalidLine] = []
    for number, raw in enumerate(raw_lines, start=1):
        if not raw.strip():
            continue
        reason, row = _parse(raw, folder)
        if reason is None:
            found = _tasks_of(row, number, repeat, folder, ids)
            reason = next((r for t in found if (r := ids.claim(t.task_id, number))), None)
            if reason is None:
                tasks.extend(found)
                continue
        invalid.append(
            InvalidLine(
                invalid_ids.next("invalid-" + _digest(raw.decode("utf-8", "replace")), numbered=True),
                number,
                reason,
            )
        )
    if invalid and not skip_invalid:
        first = invalid[0]
        more = (
            f" ({len(invalid) - 1} more invalid line(s); --skip-invalid runs the rest)"
            if len(invalid) > 1
            else ""
        )
        raise TaskFileError(f"{path}:{first.line}: {first.reason}{more}")
    if not tasks and not invalid:
        raise TaskFileError(f"{path}: no task in it (one JSON object a line, with a prompt)")
    return tasks, invalid


def _parse(raw: bytes, folder: Path) -> tuple[str | None, Any]:
    try:
        row = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return "not valid UTF-8", None
    except json.JSONDecodeError as exc:
        return f"not valid JSON ({exc.msg} at column {exc.colno})", None
    return _check_row(row, folder), row
