"""One run per channel across the gateways sharing a PostgreSQL store (DESIGN §16).

Before a channel's next message runs, this gateway claims the channel's lease (store/leases.py), waiting
while another live gateway holds it (woken by the notice of its release, else looking again every
`gateway.poll_seconds` for a lease that ran out); while the run goes on, a heartbeat renews it every third of
`gateway.lease_seconds`; after the run it is let go at once, so the other gateways' messages for the
channel run next. Every write of the run is fenced by the lease's owner and epoch: a gateway that lost
the channel (stopped, cut off) cannot write into it any more, and its run is interrupted. A channel whose
gateway stopped renewing is claimed by another after the lease ran out, at once when that gateway is
gone (killed: the mark it holds while alive is let go), and the claimer first finishes the message the
lost gateway left running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from agent_state import SessionStore
from mibyan.gateway.ledger import InboxEntry, inbox_entry
from mibyan.store.leases import Leases
from mibyan.store.notices import LEASES, Waker

log = logging.getLogger("mibyan.gateway")
_T = TypeVar("_T")


@contextlib.asynccontextmanager
async def notices(store: SessionStore, io: ThreadPoolExecutor, topic: str, key: str) -> AsyncIterator[Waker]:
    """While inside: the store's notices of `topic` for `key` wake the yielded Waker (subscribed before
    the block looks at anything, so none is missed between its look and its wait)."""
    waker = Waker(asyncio.get_running_loop())
    listening = await asyncio.get_running_loop().run_in_executor(
        io, lambda: store.database.listen(topic, key, waker)
    )
    try:
        yield waker
    finally:
        listening.close()


class ChannelLeases:
    """This gateway's leases on its channels.

    Args:
        store: the shared store (its `leases`).
        seconds: `gateway.lease_seconds`.
        io: the executor the gateway's ledger I/O runs on.
        poll: `gateway.poll_seconds`, between two claims of a channel held elsewhere when no notice came.
    """

    def __init__(
        self, store: SessionStore, leases: Leases, seconds: float, io: ThreadPoolExecutor, *, poll: float
    ) -> None:
        self.store = store
        self.leases = leases
        self.seconds = seconds
        self.poll = poll
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._io = io
        # marked alive before the first claim, so no other gateway reads this one's leases as left
        self._alive = store.database.hold_alive(self.owner)

    def close(self) -> None:
        self._alive.close()

    async def _call(self, action: Callable[[], _T]) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._io, action)

    async def claim(self, channel: str) -> int:
        """Wait until this gateway holds the channel; its epoch. Woken when its holder lets it go; a
        lease that ran out (its holder stopped) is seen at the next look."""
        epoch = await self._call(lambda: self.leases.claim(channel, self.owner, self.seconds))
        if epoch is not None:
            return epoch
        async with notices(self.store, self._io, LEASES, channel) as released:
            while True:  # claimed again once subscribed: a release just before is not missed
                epoch = await self._call(lambda: self.leases.claim(channel, self.owner, self.seconds))
                if epoch is not None:
                    return epoch
                await released.wait(self.poll)

    async def left_running(self, channel: str) -> list[int]:
        """The inbox ids a previous holder of the channel left running (it stopped mid-run)."""
        rows = await self._call(lambda: self.leases.running_on(channel))
        return [int(row["id"]) for row in rows]

    async def hold(self, channel: str, epoch: int, lost: Callable[[], object]) -> None:
        """Renew the lease until cancelled; `lost()` once if it was taken over meanwhile."""
        while True:
            await asyncio.sleep(self.seconds / 3)
            held = await self._call(lambda: self.leases.renew(channel, self.owner, epoch, self.seconds))
            if not held:
                log.warning("lost the channel %s to another gateway: its run is interrupted", channel)
                lost()
                return

    async def abandoned(self) -> list[InboxEntry]:
        """Messages left running on channels whose lease ran out, oldest first."""
        rows = await self._call(self.leases.abandoned)
        return [inbox_entry(row) for row in rows]

    async def release(self, channel: str, epoch: int) -> None:
        await self._call(lambda: self.leases.release(channel, self.owner, epoch))
