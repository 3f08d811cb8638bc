"""The one small interface every connector has: start, stop, deliver."""

from __future__ import annotations

from typing import Protocol

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
