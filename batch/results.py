"""The batch directory: its manifest, its lock, and the append-only result and trajectory parts.

Each run writes its own files, `results/part-<run>-<worker>.jsonl` (created exclusively, so no file is
ever appended by two runs), one whole line per finished task, written in one `write()` as soon as the
task ends. A reader takes the last line of a file only when it is whole: a run killed mid-write leaves a
torn line that nothing reads, and the next run writes elsewhere.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mibyan.core.errors import MibyanError

MANIFEST_VERSION = 1
#: Dispositions after which a task is not run again.
FINAL = frozenset({"ok", "failed", "invalid"})
_PART = re.compile(r"^part-(\d+)-(\d+)\.jsonl$")


class BatchDirError(MibyanError):
    """The batch directory cannot be used as asked (other settings, another run in it, unreadable)."""


def read_lines(path: Path) -> Iterator[dict[str, Any]]:
    """The whole JSON lines of a part file; a last line without its newline (a torn write) is skipped."""
    data = path.read_bytes()
    lines = data.split(b"\n")
    if lines and lines[-1]:
        lines.pop()  # torn: the writer died before the line's end
    for raw in lines:
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except ValueError:
            continue  # a line a crash left half-written in the middle (a full disk): not a result
        if isinstance(record, dict):
            yield record


def parts(folder: Path) -> list[Path]:
    """The part files of a folder, oldest run first."""
    if not folder.is_dir():
        return []
    found = [(int(m[1]), int(m[2]), p) for p in folder.iterdir() if (m := _PART.match(p.name))]
    return [path for _, _, path in sorted(found)]


def latest_results(out: Path) -> dict[str, dict[str, Any]]:
    """Each task id's latest result line over all runs (a later run's line replaces an earlier one)."""
    latest: dict[str, dict[str, Any]] = {}
    for path in parts(out / "results"):
        for record in read_lines(path):
            task_id = record.get("task_id")
            if isinstance(task_id, str):
                latest[task_id] = record
    return latest


def trajectory_ids(out: Path) -> set[str]:
    """The task ids that have a trajectory already."""
    return {str(record.get("task_id")) for path in parts(out / "trajectories") for record in read_lines(path)}


def next_run_number(out: Path, manifest: dict[str, Any] | None) -> int:
    """One more than any run the manifest or a part file knows (a run killed before it updated the
    manifest has written parts all the same)."""
    numbers = [int(run.get("run", 0)) for run in (manifest or {}).get("runs", [])]
    for folder in ("results", "trajectories"):
        numbers.extend(int(_PART.match(p.name)[1]) for p in parts(out / folder))  # type: ignore[index]
    return max(numbers, default=0) + 1


@dataclass
class PartWriter:
    """The part files of one run: one per worker and kind, created on its first line, never reopened."""

    out: Path
    run: int
    _files: dict[tuple[str, int], int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def write(self, kind: str, worker: int, record: dict[str, Any]) -> None:
        """Append `record` as one line to `<kind>/part-<run>-<worker>.jsonl`, in a single write."""
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8", errors="surrogatepass")
        key = (kind, worker)
        with self._lock:
            fd = self._files.get(key)
            if fd is None:
                folder = self.out / kind
                folder.mkdir(parents=True, exist_ok=True)
                path = folder / f"part-{self.run:04d}-{worker:03d}.jsonl"
                # O_EXCL: a file another run made is never written into
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
                self._files[key] = fd
        os.write(fd, line)

    def close(self) -> None:
        with self._lock:
            for fd in self._files.values():
                os.close(fd)
            self._files.clear()


def read_manifest(out: Path) -> dict[str, Any] | None:
    """DIR/manifest.json, or None when there is none yet.

    Raises:
        BatchDirError: it is there but not a manifest.
    """
    path = out / "manifest.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise BatchDirError(f"{path}: not a batch manifest ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("settings"), dict):
        raise BatchDirError(f"{path}: not a batch manifest (no settings)")
    return data


def write_manifest(out: Path, manifest: dict[str, Any]) -> None:
    """Replace the manifest whole (written aside, then renamed: a crash leaves the old one or the new)."""
    path = out / "manifest.json"
    aside = out / ".manifest.json.tmp"
    aside.write_text(json.dumps(manifest, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    os.replace(aside, path)


def check_settings(out: Path, recorded: dict[str, Any], wanted: dict[str, Any]) -> None:
    """Refuse to resume a batch with other settings than those its results were made with.

    Raises:
        BatchDirError: naming the first setting that differs.
    """
    for key in sorted(set(recorded) | set(wanted)):
        if recorded.get(key) != wanted.get(key):
            raise BatchDirError(
                f"{out} was run with {key} {json.dumps(recorded.get(key))}, "
                f"not {json.dumps(wanted.get(key))}: run it with the same settings, or use another --out"
            )


@contextlib.contextmanager
def locked(out: Path) -> Iterator[None]:
    """Hold DIR/.lock for a run: a second run of the same directory at once is refused.

    Raises:
        BatchDirError: another process holds it.
    """
    fd = os.open(out / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "another process"
            raise BatchDirError(f"{out} is being run now (by process {holder})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)
