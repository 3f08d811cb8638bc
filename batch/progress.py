"""What a batch run shows: a rich progress bar on a terminal, one plain line per finished task otherwise."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from mibyan.batch.runner import Tally
from mibyan.core.sanitize import visible


def say(line: str) -> None:
    """One line of the batch on stderr."""
    sys.stderr.write(f"mibyan batch: {visible(line)}\n")
    sys.stderr.flush()


class BatchProgress:
    """The display of one run; `on_result` may be called from any thread, `tick` from the main one."""

    def __init__(self, *, quiet: bool, total: int, tally: Tally) -> None:
        self.quiet = quiet
        self.total = total
        self.tally = tally
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._bar: Any = None
        self._task: Any = None
        if not quiet and sys.stderr.isatty():
            self._open_bar()

    def _open_bar(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(
            TextColumn("batch"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self._task = self._bar.add_task("batch", total=self.total, detail="")
        self._bar.start()

    def on_result(self, result: dict[str, Any]) -> None:
        if self.quiet or self._bar is not None:
            return
        with self._lock:
            done = self.tally.done
            usage = result.get("usage") or {}
            tail = f" · {result['error']}" if result.get("error") and result["disposition"] != "ok" else ""
            say(
                f"[{done}/{self.total}] {result['disposition']} {result['task_id']} · "
                f"{result.get('seconds', 0):.1f}s · {usage.get('total_tokens', 0)} tokens{tail}"
            )

    def tick(self) -> None:
        if self._bar is None:
            return
        tally = self.tally
        elapsed = max(time.monotonic() - self._started, 1e-6)
        failed = tally.by_disposition.get("failed", 0)
        detail = (
            f"failed {failed} · running {tally.running} · {tally.tokens} tokens · "
            f"{tally.done / elapsed:.1f} tasks/s"
        )
        self._bar.update(self._task, completed=tally.done, detail=detail)

    def close(self) -> None:
        if self._bar is not None:
            self.tick()
            self._bar.stop()
            self._bar = None
