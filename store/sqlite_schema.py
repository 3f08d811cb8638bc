"""The SQLite schema: each migration once per database, recorded by name (store/migrations.py).

The SQLite backend (store/sqlite.py) applies, in order, those a database has not had. The first four
were once numbered by `PRAGMA user_version`; a database numbered that way is recorded by name when it
is first opened. The full-text index is FTS5, kept in sync by triggers.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from mibyan.store.migrations import APPLIED_TABLE, Migrations

Migration = Callable[[sqlite3.Connection], None]
SCHEMA: Migrations[sqlite3.Connection] = Migrations("sqlite")
#: The migrations in order (the list itself: a test inserts one, as a later release might).
MIGRATIONS = SCHEMA.steps
migration = SCHEMA.register

#: The migrations that were numbered by `PRAGMA user_version` before they were recorded by name, in the
#: order that numbered them: a database at user_version N has the first N of these.
NUMBERED = ("_create_tables", "_create_session_events", "_create_todos", "_create_facts")
__all__ = ["APPLIED_TABLE", "MIGRATIONS", "NUMBERED", "SCHEMA", "Migration", "migration"]


@migration
def _create_tables(db: sqlite3.Connection) -> None:
    # One statement per execute(): executescript() would commit the migration's transaction early.
    for statement in (
        """CREATE TABLE sessions (
            id TEXT PRIMARY KEY,
            parent_id TEXT REFERENCES sessions(id),
            title TEXT,
            source TEXT NOT NULL DEFAULT 'cli',
            model TEXT, provider TEXT, api_mode TEXT,
            system_prompt TEXT,
            cwd TEXT,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            ended_at REAL,
            end_reason TEXT,
            message_count INTEGER NOT NULL DEFAULT 0,
            input_tokens INTEGER NOT NULL DEFAULT 0,
            output_tokens INTEGER NOT NULL DEFAULT 0
        )""",
        "CREATE INDEX sessions_parent ON sessions(parent_id)",
        "CREATE INDEX sessions_updated ON sessions(updated_at)",
        """CREATE TABLE messages (
            id INTEGER PRIMARY KEY,
            session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            seq INTEGER NOT NULL,
            role TEXT NOT NULL,
            content TEXT,
            tool_calls TEXT,
            tool_call_id TEXT,
            name TEXT,
            reasoning TEXT,
            provider_data TEXT,
            created_at REAL NOT NULL,
            UNIQUE (session_id, seq)
        )""",
        """CREATE VIRTUAL TABLE messages_fts USING fts5(
            content, content='messages', content_rowid='id', tokenize='unicode61 remove_diacritics 2'
        )""",
        """CREATE TRIGGER messages_ai AFTER INSERT ON messages BEGIN
            INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
        END""",
        """CREATE TRIGGER messages_ad AFTER DELETE ON messages BEGIN
            INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
        END""",
        """CREATE TRIGGER messages_au AFTER UPDATE OF content ON messages BEGIN
            INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
            INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
        END""",
    ):
        db.execute(statement)


@migration
def _create_session_events(db: sqlite3.Connection) -> None:
    db.execute(
        """CREATE TABLE session_events (
            id INTEGER PRIMARY KEY,
            session_id TEXT NOT NULL,
            created_at REAL NOT NULL,
            kind TEXT NOT NULL,
            detail TEXT
        )"""
    )
    db.execute("CREATE INDEX session_events_session ON session_events(session_id)")


@migration
def _create_todos(db: sqlite3.Connection) -> None:
    db.execute(
        """CREATE TABLE todos (
            session_id TEXT NOT NULL,
            position INTEGER NOT NULL,
            text TEXT NOT NULL,
            status TEXT NOT NULL,
            PRIMARY KEY (session_id, position)
        )"""
    )


@migration
def _create_facts(db: sqlite3.Connection) -> None:
    for statement in (
        "CREATE TABLE facts (id INTEGER PRIMARY KEY, text TEXT NOT NULL, created_at REAL NOT NULL)",
        "CREATE VIRTUAL TABLE facts_fts USING fts5(text, content='facts', content_rowid='id')",
        """CREATE TRIGGER facts_ai AFTER INSERT ON facts BEGIN
            INSERT INTO facts_fts(rowid, text) VALUES (new.id, new.text);
        END""",
        """CREATE TRIGGER facts_ad AFTER DELETE ON facts BEGIN
            INSERT INTO facts_fts(facts_fts, rowid, text) VALUES ('delete', old.id, old.text);
        END""",
    ):
        db.execute(statement)


@migration
def _create_gateway_ledger(db: sqlite3.Connection) -> None:
    # The gateway's delivery ledger: what arrived on a channel (before it was acknowledged) and what was
    # answered (before it was sent), so a restart resumes pending work and delivers nothing twice.
    for statement in (
        "ALTER TABLE sessions ADD COLUMN channel TEXT",
        "CREATE INDEX sessions_channel ON sessions(channel)",
        """CREATE TABLE gateway_inbox (
            id INTEGER PRIMARY KEY,
            channel TEXT NOT NULL,
            message_key TEXT,
            request TEXT NOT NULL,
            status TEXT NOT NULL DEFAULT 'pending',
            session_id TEXT,
            history_length INTEGER,
            received_at REAL NOT NULL,
            UNIQUE (channel, message_key)
        )""",
        "CREATE INDEX gateway_inbox_status ON gateway_inbox(status)",
        """CREATE TABLE gateway_outbox (
            id INTEGER PRIMARY KEY,
            inbox_id INTEGER NOT NULL UNIQUE REFERENCES gateway_inbox(id),
            channel TEXT NOT NULL,
            reply TEXT NOT NULL,
            status TEXT NOT NULL DEFAULT 'pending',
            created_at REAL NOT NULL,
            sent_at REAL
        )""",
    ):
        db.execute(statement)


@migration
def _facts_have_an_owner(db: sqlite3.Connection) -> None:
    # NULL: the home's own facts; a gateway agent's are its workspace's, so agents never share them.
    db.execute("ALTER TABLE facts ADD COLUMN owner TEXT")


@migration
def _create_model_calls(db: sqlite3.Connection) -> None:
    # The tokens of each model call, for the viewer's chart; `seq` is the seq the call's reply got (the
    # session's message count when the reply came), so a call can be found beside its message.
    for statement in (
        """CREATE TABLE model_calls (
            id INTEGER PRIMARY KEY,
            session_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            model TEXT,
            input_tokens INTEGER NOT NULL DEFAULT 0,
            output_tokens INTEGER NOT NULL DEFAULT 0,
            cache_read_tokens INTEGER NOT NULL DEFAULT 0,
            cache_write_tokens INTEGER NOT NULL DEFAULT 0,
            reasoning_tokens INTEGER NOT NULL DEFAULT 0,
            created_at REAL NOT NULL
        )""",
        "CREATE INDEX model_calls_session ON model_calls(session_id)",
    ):
        db.execute(statement)


@migration
def _inbox_rows_name_their_gateway(db: sqlite3.Connection) -> None:
    # The gateway that admitted a message (its lease owner; NULL on a store no gateways share), so the
    # others answer the messages a killed gateway had queued but not started (store/leases.py).
    db.execute("ALTER TABLE gateway_inbox ADD COLUMN admitted_by TEXT")


@migration
def _outbox_rows_name_their_sender(db: sqlite3.Connection) -> None:
    # The gateway that sends a reply (its lease owner; NULL on a store no gateways share), so a gateway
    # starting beside it never sends again what that one is sending (store/leases.py).
    db.execute("ALTER TABLE gateway_outbox ADD COLUMN sender TEXT")
