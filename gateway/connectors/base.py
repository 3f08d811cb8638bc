"""The one small interface every connector has: start, stop, deliver; and what chat platforms add."""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass
from typing import Literal, Protocol

from mibyan.gateway.ledger import Reply


class Connector(Protocol):
    """A source of messages for the gateway, and the way its replies go back."""

    name: str
    kind: str

    @property
    def url(self) -> str:
        """Where the connector listens (printed at start)."""
        ...

    async def start(self) -> None:
        """Begin accepting messages; returns once the connector is ready."""
        ...

    async def stop(self) -> None:
        """Stop accepting; return once replies in progress are handed over."""
        ...

    async def deliver(self, reply: Reply) -> bool:
        """Send a reply recorded before a restart; False when the connector cannot push replies
        (the client collects it by repeating its request)."""
        ...


# The chat platforms' side of the contract (matrix now; email and xmpp fit the same shape): a connector
# owns its connection, hands every inbound event to the gateway's admission (gateway/connectors/chat.py)
# before it advances its platform cursor, and sends each reply part under an idempotency key.


@dataclass(frozen=True)
class InboundEvent:
    """One message as a chat platform delivered it.

    Attributes:
        connector: the connector's name.
        conversation: the platform's conversation (a Matrix room, an email thread root, an XMPP JID).
        thread: a thread inside it that is its own channel (a Matrix `m.thread` root), else None.
        sender: the platform's id of who wrote it (checked against `allow`).
        message_id: the platform's id of the message (Matrix event id, Message-ID, stanza-id).
        text: what it says.
        time: when the platform says it was sent (seconds since the epoch).
        attachments: paths of files it carried, saved in the agent's workspace.
    """

    connector: str
    conversation: str
    thread: str | None
    sender: str
    message_id: str
    text: str
    time: float
    attachments: tuple[str, ...] = ()

    @property
    def channel(self) -> str:
        """The channel id on this connector: the conversation, or `<conversation>/<thread>`."""
        return self.conversation if self.thread is None else f"{self.conversation}/{self.thread}"


class SendStatus(enum.Enum):
    """How sending one reply part went."""

    DELIVERED = "delivered"  # the platform has it
    RETRY_AFTER = "retry-after"  # rate-limited: send again (the same key) after `retry_after` seconds
    FAILED = "failed"  # refused for good (the room is gone, the event too large): do not send again
    UNKNOWN = "unknown"  # no answer (a timeout, the server went away): it may or may not have arrived


@dataclass(frozen=True)
class SendResult:
    status: SendStatus
    retry_after: float = 0.0
    detail: str = ""
    sent_id: str = ""  # the platform's id of the message sent (to edit it later), where it gives one


@dataclass(frozen=True)
class Limits:
    """What a platform takes: a reply longer than `text_length` (in `unit`) is sent in parts."""

    text_length: int
    unit: Literal["characters", "bytes"] = "characters"
    threads: bool = False
    typing: bool = False
    edits: bool = False
    attachments: bool = False
    status_messages: bool = True  # False: only replies go out, never a message about a run's progress


@dataclass(frozen=True)
class Destination:
    """Where a reply goes: the inbound message's conversation and thread, in reply to that message."""

    conversation: str
    thread: str | None
    reply_to: str


def idempotency_key(message_id: str, part: int) -> str:
    """The key a reply part is sent under: the same inbound message and part always give the same key,
    so a part sent again after a crash or a timeout is recognised by the platform (Matrix txn id)."""
    digest = hashlib.sha256(message_id.encode()).hexdigest()[:32]
    return f"mibyan.{digest}.{part}"


class ChatPlatform(Protocol):
    """What a chat connector does for the shared chat logic (chat.py): send, show typing."""

    limits: Limits

    async def send_part(self, where: Destination, text: str, key: str, first: bool) -> SendResult:
        """Send one part of a reply under `key` (`first`: the part that quotes the inbound message)."""
        ...

    async def typing(self, conversation: str, on: bool) -> None:
        """Show (or stop showing) that the agent is working; a platform without typing does nothing."""
        ...

    async def edit_part(self, where: Destination, sent_id: str, text: str, key: str) -> SendResult:
        """Replace the text of a message sent earlier (`sent_id`); a platform without edits fails."""
        ...
