"""Copy one store into another (`mibyan sessions import`: a home's SQLite store into PostgreSQL).

Sessions keep their ids, times, lineage and counters; messages their seq and every stored byte (provider
replay data included); their events, todos and model calls come along, and the facts not already there.
A session the target has already is left as it is, so an import run twice copies nothing twice. The
gateway's delivery ledger is not copied: it only matters to the gateway that wrote it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mibyan.store.database import Connection, Database, row_dict

_MESSAGE_COLUMNS = (
    "session_id",
    "seq",
    "role",
    "content",
    "tool_calls",
    "tool_call_id",
    "name",
    "reasoning",
    "provider_data",
    "created_at",
)

#: The other tables of a session: name, the order its rows are copied in, the column the target numbers.
_SESSION_TABLES = (("session_events", "id", "id"), ("todos", "position", ""), ("model_calls", "id", "id"))


@dataclass
class Copied:
    """What an import copied, and how many sessions the target had already."""

    sessions: int = 0
    messages: int = 0
    facts: int = 0
    skipped: int = 0


def _insert(db: Connection, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    if rows:
        marks = ", ".join("?" * len(columns))
        db.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})", rows)


def _copy_rows(source: Database, db: Connection, table: str, session_id: str, order: str, skip: str) -> None:
    """The session's rows of `table` in `order`, every column but `skip` (the target numbers its own)."""
    rows = source.query(f"SELECT * FROM {table} WHERE session_id = ? ORDER BY {order}", (session_id,))
    if rows:
        columns = [c for c in row_dict(rows[0]) if c != skip]
        _insert(db, table, columns, [[row[c] for c in columns] for row in rows])


def copy_store(source: Database, target: Database) -> Copied:
    """Copy every session of `source` that `target` lacks, with all it holds, in one transaction."""
    copied = Copied()
    known = {str(r["id"]) for r in target.query("SELECT id FROM sessions")}
    sessions = [row_dict(r) for r in source.query("SELECT * FROM sessions ORDER BY created_at, id")]
    new = [row for row in sessions if str(row["id"]) not in known]
    copied.skipped = len(sessions) - len(new)
    with target.transaction() as db:
        for row in new:
            # parents are linked once every session is in (a parent may sort after its child)
            columns = [c for c in row if c != "parent_id"]
            _insert(db, "sessions", columns, [[row[c] for c in columns]])
        for row in new:
            if row.get("parent_id"):
                db.execute("UPDATE sessions SET parent_id = ? WHERE id = ?", (row["parent_id"], row["id"]))
            messages = source.query(
                f"SELECT {', '.join(_MESSAGE_COLUMNS)} FROM messages WHERE session_id = ? ORDER BY seq",
                (row["id"],),
            )
            _insert(db, "messages", _MESSAGE_COLUMNS, [[m[c] for c in _MESSAGE_COLUMNS] for m in messages])
            copied.messages += len(messages)
            for table, order, skip in _SESSION_TABLES:
                _copy_rows(source, db, table, str(row["id"]), order, skip)
        copied.sessions = len(new)
        for fact in source.query("SELECT text, created_at, owner FROM facts ORDER BY id"):
            cursor = db.execute(
                "INSERT INTO facts (text, created_at, owner) SELECT ?, ?, ? WHERE NOT EXISTS"
                " (SELECT 1 FROM facts WHERE text = ? AND owner IS NOT DISTINCT FROM ?)",
                (fact["text"], fact["created_at"], fact["owner"], fact["text"], fact["owner"]),
            )
            copied.facts += max(cursor.rowcount, 0)
    return copied
