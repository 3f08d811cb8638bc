"""Channel leases: which gateway runs a channel now, when several share one database (DESIGN §16).

A lease row per channel: its owner (one gateway process), an epoch that rises at every claim, and when it
expires unless renewed; a lease whose owner is gone (the advisory lock its process holds while it lives is
free: it was killed, or cut off long enough for the server to drop it) is free at once. A claim is one
upsert whose condition is checked on the row it locks (free, expired, gone, or already the claimer's),
never on a snapshot read before: two gateways claiming at once get one lease between them. The backend
checks owner and epoch in every write transaction of a run (`Database.fenced`), so a gateway that lost
its channel can never write into it again.
"""

from __future__ import annotations

import time
from typing import Any

from mibyan.store.database import Database, row_dict
from mibyan.store.notices import LEASES

#: The first key of the advisory locks that mark a gateway alive ("mbyn"); the second is hashtext(owner).
ALIVE_LOCKS = 0x6D62796E

#: A lease whose holder is gone: the advisory lock its process holds while alive (store/postgres.py's
#: hold_alive) is not held by anyone. A hash shared by two owners only ever keeps a dead one "alive".
_GONE = (
    "NOT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2"
    f" AND classid = {ALIVE_LOCKS}::oid AND objid = hashtext({{owner}})::oid)"
)
_CLAIM = (
    "INSERT INTO gateway_leases (channel, owner, epoch, expires_at) VALUES (?, ?, 1, ?)"
    " ON CONFLICT (channel) DO UPDATE SET owner = excluded.owner, epoch = gateway_leases.epoch + 1,"
    " expires_at = excluded.expires_at WHERE gateway_leases.expires_at < ? OR gateway_leases.owner = ?"
    f" OR {_GONE.format(owner='gateway_leases.owner')} RETURNING epoch"
)


class Leases:
    """The `gateway_leases` table (PostgreSQL stores only)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def claim(self, channel: str, owner: str, seconds: float) -> int | None:
        """Take the channel for `seconds` unless another owner holds an unexpired lease; the new epoch,
        or None when it is held."""
        now = time.time()
        with self._db.transaction() as db:
            rows = db.execute(_CLAIM, (channel, owner, now + seconds, now, owner)).fetchall()
        return int(rows[0]["epoch"]) if rows else None

    def renew(self, channel: str, owner: str, epoch: int, seconds: float) -> bool:
        """Extend a lease still held; False when it was taken over."""
        with self._db.transaction() as db:
            cursor = db.execute(
                "UPDATE gateway_leases SET expires_at = ? WHERE channel = ? AND owner = ? AND epoch = ?",
                (time.time() + seconds, channel, owner, epoch),
            )
        return cursor.rowcount == 1

    def release(self, channel: str, owner: str, epoch: int) -> None:
        """Let the channel go at once (the next claim, by anyone, takes it), announced (LEASES) to
        the gateways waiting for it."""
        with self._db.transaction() as db:
            db.execute(
                "UPDATE gateway_leases SET expires_at = 0 WHERE channel = ? AND owner = ? AND epoch = ?",
                (channel, owner, epoch),
            )
            self._db.announce(db, LEASES, channel)

    def gone(self, owner: str) -> bool:
        """Whether the gateway `owner` is gone: its process no longer holds its alive mark."""
        rows = self._db.query(f"SELECT {_GONE.format(owner='?')} AS gone", (owner,))
        return bool(rows[0]["gone"])

    def holder(self, channel: str) -> dict[str, Any] | None:
        """The channel's lease row (owner, epoch, expires_at), or None when it was never claimed."""
        rows = self._db.query("SELECT * FROM gateway_leases WHERE channel = ?", (channel,))
        return row_dict(rows[0]) if rows else None

    def running_on(self, channel: str) -> list[dict[str, Any]]:
        """The channel's inbox rows marked running (by a holder that stopped before it finished)."""
        rows = self._db.query(
            "SELECT * FROM gateway_inbox WHERE channel = ? AND status = 'running' ORDER BY id", (channel,)
        )
        return [row_dict(r) for r in rows]

    def take_undelivered(self, owner: str, recorded_before: float) -> list[dict[str, Any]]:
        """The replies still pending, recorded before `recorded_before` (`owner`'s start: what it records,
        it sends), whose sender is gone, made `owner`'s to send, oldest first. A reply whose gateway
        lives is that gateway's to send (it may be sending it now); of gateways taking at once, each
        reply goes to one: the update locks its row and checks its sender again once it has it."""
        with self._db.transaction() as db:
            rows = db.execute(
                "UPDATE gateway_outbox SET sender = ? WHERE status = 'pending' AND created_at < ?"
                f" AND (sender IS NULL OR {_GONE.format(owner='sender')}) RETURNING *",
                (owner, recorded_before),
            ).fetchall()
        return sorted((row_dict(r) for r in rows), key=lambda row: row["id"])

    def abandoned(self) -> list[dict[str, Any]]:
        """Inbox rows left running on a channel whose lease ran out or whose holder is gone (its gateway
        died, was stopped or cut off), and rows waiting their turn whose gateway is gone (killed with
        them queued), oldest first."""
        rows = self._db.query(
            "SELECT i.* FROM gateway_inbox i LEFT JOIN gateway_leases l ON l.channel = i.channel WHERE"
            " (i.status = 'running' AND l.owner IS NOT NULL"
            f" AND (l.expires_at < ? OR {_GONE.format(owner='l.owner')}))"
            " OR (i.status = 'pending' AND i.admitted_by IS NOT NULL"
            f" AND {_GONE.format(owner='i.admitted_by')}) ORDER BY i.id",
            (time.time(),),
        )
        return [row_dict(r) for r in rows]
