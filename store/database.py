"""What the repositories need of a database backend, and what a backend's dialect must spell.

The repositories (store/sessions.py, messages.py, search.py, facts.py, todos.py, events.py, ledger.py)
write portable SQL with `?` placeholders, read rows by column name, and get every spelling one SQL
engine has and another has not from the backend's `Dialect`: full-text matching and ranking, snippets,
asking whether a table exists. A backend (store/sqlite.py today; PostgreSQL next, DESIGN §16) owns the
connection, its transactions and its migrations, and turns the `?` placeholders into its driver's own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from mibyan.core.errors import MibyanError
from mibyan.store.notices import Listening, Wake


class StoreError(MibyanError):
    """The session database cannot be used (corrupt, unreadable, locked for too long) or an id is unknown."""


class LeaseLost(StoreError):
    """A run's write was refused: its gateway no longer holds the channel (another took it over)."""


class Row(Protocol):
    """One result row, read by column name (a sqlite3.Row, or a driver's dict row)."""

    def keys(self) -> Iterable[str]: ...

    def __getitem__(self, key: str, /) -> Any: ...


class Cursor(Protocol):
    """The result of one statement run inside a transaction."""

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    @property
    def rowcount(self) -> int: ...


class Connection(Protocol):
    """The connection a transaction hands out: statements run on it commit together or not at all."""

    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Cursor: ...

    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]], /) -> Cursor: ...


class Dialect(Protocol):
    """The SQL a backend spells its own way; the repositories ask it rather than spelling it."""

    #: The backend's name ("sqlite", "postgresql"), as migrations and errors name it.
    name: str

    def words_query(self, text: str) -> str:
        """A user's words as this engine's full-text query, every word required (the last one as a
        prefix); "" when `text` has no words."""
        ...

    def any_words_query(self, words: Sequence[str]) -> str:
        """A full-text query any of `words` matches."""
        ...

    def message_search(self, *, role: bool, since: bool, sessions: int) -> str:
        """The search over messages: parameters (open mark, close mark, query), then the role, the
        earliest time and `sessions` session ids when asked for, then the limit. Columns: session_id,
        seq, role, created_at, title, source, snippet, rank; best first."""
        ...

    def snippets(self, hits: list[dict[str, Any]], text: str, marks: tuple[str, str]) -> list[dict[str, Any]]:
        """The hits of `message_search` for the words `text`, with their snippets made where the SQL
        could not make them as SQLite does (SQLite's come made: it returns `hits` as they are)."""
        ...

    def fact_search(self) -> str:
        """The search over facts: parameters (query, owner or None, limit); column text, best first."""
        ...

    def table_exists(self) -> str:
        """A query with one parameter (a table's name) that returns a row when the table exists."""
        ...


class Database(Protocol):
    """One open database: reads, write transactions, and the dialect its SQL needs."""

    dialect: Dialect
    #: Where it is (a file's path, a URL without its password): what names it in this process.
    name: str
    #: Read only (a home that cannot be written): writes fail with a StoreError.
    read_only: bool

    def query(self, sql: str, params: Sequence[Any] = ()) -> Sequence[Row]:
        """The rows of one read; StoreError when the database fails."""
        ...

    def transaction(self) -> AbstractContextManager[Connection]:
        """A write transaction: all of it is saved, or none of it and a StoreError."""
        ...

    def fenced(self, channel: str, owner: str, epoch: int) -> AbstractContextManager[None]:
        """While inside, every write transaction of this thread first checks that `owner` still holds
        `channel` at `epoch` (the lease of store/leases.py), else it is refused whole with LeaseLost.
        A backend that one machine owns (SQLite) needs no check."""
        ...

    def announce(self, db: Connection, topic: str, key: str) -> None:
        """Within the transaction `db`: wake the listeners of `topic` and `key` once it commits (never if
        it rolls back). Topics are store/notices.py's."""
        ...

    def listen(self, topic: str, key: str | None, wake: Wake) -> Listening:
        """Call `wake()` (on another thread) at each notice of `topic` for `key` (None: any key) until the
        returned Listening is closed; subscribe before looking at what you wait for. PostgreSQL hears
        every process's notices; SQLite only this process's, so a waiter also looks again now and then."""
        ...

    def hold_alive(self, owner: str) -> Listening:
        """Hold, until the returned handle is closed, a mark that this process (`owner`) is alive, which
        the others see gone the moment it dies (PostgreSQL: a session advisory lock on a connection of
        its own, let go by the server when the connection drops; see store/leases.py). SQLite: none."""
        ...

    def close(self) -> None: ...


def search_filters(*, role: bool, since: bool, sessions: int) -> str:
    """The clauses a search adds after its dialect's match, in the order of their parameters: the
    message's role, the earliest time, and the sessions it is limited to (`sessions` of them)."""
    sql = " AND m.role = ?" if role else ""
    sql += " AND m.created_at >= ?" if since else ""
    if sessions:
        sql += f" AND m.session_id IN ({', '.join('?' * sessions)})"
    return sql


def row_dict(row: Row) -> dict[str, Any]:
    """A row as a plain dict (what the store's callers get)."""
    return dict(row)
