"""`mibyan batch status DIR`: the tasks by disposition, what is left, and the tokens spent."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from mibyan.batch.results import BatchDirError, latest_results, parts, read_lines, read_manifest
from mibyan.batch.runner import pending
from mibyan.batch.tasks import TaskFileError, read_tasks
from mibyan.core.exit_codes import EXIT_OK

DISPOSITIONS = ("ok", "failed", "interrupted", "invalid")


def status_of(out: Path) -> dict[str, Any]:
    """The counts of a batch directory (`pending` is None when its tasks file is gone).

    Raises:
        BatchDirError: DIR is not a batch directory.
    """
    manifest = read_manifest(out)
    if manifest is None:
        raise BatchDirError(
            f"{out}: not a batch directory (no manifest.json); start one with 'mibyan batch run'"
        )
    latest = latest_results(out)
    counts = dict.fromkeys(DISPOSITIONS, 0)
    for record in latest.values():
        counts[str(record.get("disposition"))] = counts.get(str(record.get("disposition")), 0) + 1
    tokens = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
    for path in parts(out / "results"):  # every attempt's spend, an interrupted one's too
        for record in read_lines(path):
            for key in tokens:
                tokens[key] += int((record.get("usage") or {}).get(key, 0))
    left: int | None = None
    tasks_file = Path(str(manifest.get("tasks_file", "")))
    try:
        tasks, _ = read_tasks(tasks_file, repeat=int(manifest.get("repeat", 1)), skip_invalid=True)
        left = len(pending(tasks, latest, retry_failed=False))
    except TaskFileError:
        pass
    return {
        "dir": str(out),
        "settings": manifest["settings"],
        "runs": len(manifest.get("runs", [])),
        "tasks_file": str(tasks_file),
        "dispositions": counts,
        "pending": left,
        "tokens": tokens,
    }


def show_status(out: Path, *, as_json: bool) -> int:
    """Print the status of `out` (a table, or JSON)."""
    status = status_of(out.expanduser().resolve())
    if as_json:
        sys.stdout.write(json.dumps(status, indent=2) + "\n")
        return EXIT_OK
    settings = status["settings"]
    counts = status["dispositions"]
    lines = [
        f"{status['dir']}: {settings['provider']}/{settings['model']}, {status['runs']} run(s)",
        *(f"  {name:<12} {counts[name]}" for name in counts),
        f"  {'pending':<12} {'?' if status['pending'] is None else status['pending']}",
        f"  tokens       {status['tokens']['total_tokens']} "
        f"(in {status['tokens']['input_tokens']}, out {status['tokens']['output_tokens']})",
    ]
    sys.stdout.write("\n".join(lines) + "\n")
    return EXIT_OK
