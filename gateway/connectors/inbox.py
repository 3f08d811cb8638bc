"""Files people send to an agent: saved in its workspace's `inbox/`, the message telling the agent where.

The file's name came from the sender: only its last part is kept, stripped of anything a shell, a terminal
or a path would read specially, and prefixed with a digest of the message that carried it, so the same
message read twice (a re-read after a crash) writes the same file once, and two people's `report.pdf`
never overwrite each other. Files over `gateway.max_attachment_mb` are not saved; the agent is told.
The workspace is the agent's to change: an `inbox` that its commands replaced by a link is never written
through (the file is not saved, and the agent is told so).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

INBOX = "inbox"
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")


@dataclass(frozen=True)
class Attachment:
    """One file a message carried: saved at `path` (relative to the workspace), or too large."""

    name: str
    size: int
    path: str | None  # None: not saved (over the limit, or `refused`)
    refused: str = ""


def safe_name(name: str) -> str:
    """A sender's file name made harmless: last path part, safe characters, no leading dot, 100 at most."""
    last = name.replace("\\", "/").rsplit("/", 1)[-1]
    cleaned = _UNSAFE.sub("_", last).strip("._") or "file"
    return cleaned[-100:]


def save(workdir: Path, message_id: str, name: str, data: bytes) -> Attachment:
    """Write `data` to `<workdir>/inbox/<digest>-<name>` (0600) and say where, relative to `workdir`."""
    digest = hashlib.sha256(f"{message_id}\0{name}".encode()).hexdigest()[:8]
    final = f"{digest}-{safe_name(name)}"
    with contextlib.suppress(FileExistsError):
        os.mkdir(workdir / INBOX, 0o700)
    try:  # the folder itself, never a link the agent's commands put in its place
        folder = os.open(workdir / INBOX, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return Attachment(name, len(data), None, refused=f"{INBOX}/ is not a folder")
    try:
        temporary = f".{final}.{secrets.token_hex(6)}.tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=folder)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(temporary, final, src_dir_fd=folder, dst_dir_fd=folder)
    finally:
        os.close(folder)
    return Attachment(name, len(data), f"{INBOX}/{final}")


def note(attachments: list[Attachment], limit_mb: float) -> str:
    """The lines that tell the agent about the files: where each is, or that it was too large."""
    lines = []
    for item in attachments:
        size = f"{item.size / 1_000_000:.1f} MB" if item.size >= 100_000 else f"{item.size:,} bytes"
        if item.path is not None:
            lines.append(f"[the sender attached a file, saved as {item.path} ({size})]")
        elif item.refused:
            lines.append(
                f"[the sender attached a file, {safe_name(item.name)} ({size}): not saved, {item.refused}]"
            )
        else:
            lines.append(
                f"[the sender attached a file, {safe_name(item.name)} ({size}): over the {limit_mb:g} MB "
                "limit, not saved]"
            )
    return "\n".join(lines)


async def read_capped(response: Any, limit: int) -> bytes | int | None:
    """An aiohttp response's body: None unless it is a 200; its size so far once it grows past `limit`
    (the rest is never read)."""
    if response.status != 200:
        return None
    data = bytearray()
    async for chunk in response.content.iter_chunked(1 << 16):
        data += chunk
        if len(data) > limit:
            return len(data)
    return bytes(data)


async def keep(
    workdir: Path, message_id: str, name: str, data: bytes | int | None, limit: int, unfetched: str
) -> Attachment:
    """What became of a file a chat message carried: saved (`data` its bytes), over `limit` (`data`
    the size seen), or not fetched (None: `unfetched` says why)."""
    if isinstance(data, bytes):
        return await asyncio.to_thread(save, workdir, message_id, name, data)
    size = data or 0
    return Attachment(name, size, None, refused="" if size > limit else unfetched)
