"""A run's tools, shown in the conversation while it works (`connectors[].progress`).

`edit` (the default where the platform edits messages): one status message, sent when the first tool
starts ("⚙ terminal: `pytest -q`") and edited in place as the next ones start, at most once every
`EDIT_EVERY` seconds (the latest wins; homeservers rate-limit edits like any message), then left as a
one-line summary of what ran (each tool once, with a count) above the answer. `messages`: a message
per tool call. `off`: nothing. A platform that sends only replies (email) shows nothing whatever is set.

Status messages are a courtesy: they are not in the ledger, a failed one is not retried, and the answer
waits for the summary only as long as its one send takes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import Counter
from typing import Any

from mibyan.gateway.connectors.base import ChatPlatform, Destination, SendStatus, idempotency_key

log = logging.getLogger("mibyan.gateway")
EDIT_EVERY = 1.5  # seconds between two edits of one status message
_PREVIEW = 80


def tool_line(name: str, arguments: Any) -> str:
    """`⚙ name: first argument` in one short line (the command, the path, the query)."""
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        parsed = arguments
    first = next(iter(parsed.values()), "") if isinstance(parsed, dict) and parsed else ""
    text = " ".join(str(first).split())
    if len(text) > _PREVIEW:
        text = text[: _PREVIEW - 1] + "…"
    return f"⚙ {name}: `{text.replace('`', chr(39))}`" if text else f"⚙ {name}"


def summary_line(names: list[str]) -> str:
    """`⚙ terminal x2, read_file` (a multiplication sign for the x): what ran, in the order first used."""
    counts = Counter(names)
    return "⚙ " + ", ".join(f"{name} ×{n}" if n > 1 else name for name, n in counts.items())


class ProgressNote:
    """The status of one run in its conversation.

    Args:
        platform: where it is shown.
        where: the conversation (and thread) of the message being answered.
        message_id: the inbound message's id: the status messages' idempotency keys come from it.
        mode: "edit" or "messages".
        lock: the conversation's send lock, so no status message lands inside a reply's parts.
    """

    def __init__(
        self, platform: ChatPlatform, where: Destination, message_id: str, mode: str, lock: asyncio.Lock
    ) -> None:
        self.platform = platform
        self.where = where
        self.mode = mode
        self._lock = lock
        self._key = f"{message_id}#progress"
        self._sends = 0
        self._names: list[str] = []
        self._latest = ""
        self._sent_id: str | None = None
        self._changed = asyncio.Event()
        self._finished = asyncio.Event()
        self._pump: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[str]] = set()

    def tool_started(self, name: str, arguments: Any) -> None:
        """On the loop: a tool of the run starts."""
        self._names.append(name)
        self._latest = tool_line(name, arguments)
        if self.mode == "messages":
            task = asyncio.ensure_future(self._send(self._latest))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
            return
        self._changed.set()
        if self._pump is None:
            self._pump = asyncio.ensure_future(self._show_changes())

    async def _show_changes(self) -> None:
        """Show the latest line, then wait at least EDIT_EVERY before the next (never cut mid-send)."""
        while not self._finished.is_set():
            await self._changed.wait()
            self._changed.clear()
            if self._finished.is_set():
                return
            await self._show(self._latest)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._finished.wait(), EDIT_EVERY)

    async def _show(self, text: str) -> None:
        if self._sent_id is None:
            self._sent_id = await self._send(text) or None
        else:
            self._sends += 1
            async with self._lock:
                key = idempotency_key(self._key, self._sends)
                result = await self.platform.edit_part(self.where, self._sent_id, text, key)
            if result.status is not SendStatus.DELIVERED:
                log.info("a progress edit was not shown: %s", result.detail or result.status.value)

    async def _send(self, text: str) -> str:
        self._sends += 1
        async with self._lock:
            result = await self.platform.send_part(
                self.where, text, idempotency_key(self._key, self._sends), False
            )
        if result.status is not SendStatus.DELIVERED:
            log.info("a progress message was not shown: %s", result.detail or result.status.value)
        return result.sent_id

    async def finish(self) -> None:
        """The run is over: the status message becomes the summary of what ran (before the answer)."""
        self._finished.set()
        self._changed.set()
        if self._pump is not None:
            await asyncio.gather(self._pump, return_exceptions=True)
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        if self.mode == "edit" and self._names:
            summary = summary_line(self._names)
            if self._sent_id is None:
                await self._send(summary)
            else:
                await self._show(summary)
