"""SessionStore: every session and message, with lineage and full-text search, behind one interface.

The store is a few repositories on one database connection, each a small class of its own module in
store/: `store.sessions` (the session rows), `store.lineage` (compression and subagent descent),
`store.messages`, `store.search` (full text, best first), `store.facts`, `store.todos`, `store.events`
(events and model calls), `store.ledger` and `store.channels` (the gateway's). Every query a command,
the viewer, the editor bridge or the gateway makes is a method of one of them. The backend is SQLite
(`$MIBYAN_HOME/state.db`, store/sqlite.py, WAL and FTS5); what SQL it spells its own way is its dialect's,
so a second backend goes beside it (DESIGN §16). Each message is one INSERT when it becomes final;
nothing rewrites a session except an explicit history repair. Everything stored has its secrets masked.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mibyan.config.paths import private_dir
from mibyan.core.redact import mask_secrets
from mibyan.store.database import Database, StoreError
from mibyan.store.events import Events
from mibyan.store.facts import Facts
from mibyan.store.leases import Leases
from mibyan.store.ledger import Channels, GatewayLedger
from mibyan.store.messages import Messages
from mibyan.store.questions import Questions
from mibyan.store.search import Search
from mibyan.store.sessions import Lineage, Sessions
from mibyan.store.sqlite import SqliteDatabase, busy_timeout_from_environment, open_sqlite
from mibyan.store.sqlite_schema import MIGRATIONS
from mibyan.store.todos import Todos

if TYPE_CHECKING:
    from mibyan.agent.messages import Message

__all__ = [
    "MIGRATIONS",
    "SessionSink",
    "SessionStore",
    "StoreError",
    "mask_secrets",
    "store_url",
    "title_from",
]


def store_url(home: Path, env: Mapping[str, str] | None = None) -> str | None:
    """The configured PostgreSQL store: `$MIBYAN_STORE_URL`, else `store.url` of the home's config.yaml;
    None: SQLite in the home."""
    url: object = (os.environ if env is None else env).get("MIBYAN_STORE_URL")
    source = "MIBYAN_STORE_URL"
    if not url:
        config = home / "config.yaml"
        url = _configured_url(config)
        source = f"{config}: store.url"
    if not url:
        return None
    if not isinstance(url, str) or not url.startswith(("postgresql://", "postgres://")):
        raise StoreError(f"{source}: {url!r} is not a postgresql:// URL (omit it for SQLite in the home)")
    return url


def _configured_url(config: Path) -> object:
    """`store.url` of a config file, read without the configuration's validation (which `mibyan sessions`
    does not load): YAML is parsed only when the file mentions a store at all."""
    try:
        data = config.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StoreError(f"{config}: cannot read it ({exc.strerror or exc})") from None
    if b"store" not in data:
        return None
    import yaml

    try:
        layer = yaml.safe_load(data)
    except yaml.YAMLError as exc:
        raise StoreError(f"{config}: not valid YAML ({str(exc).splitlines()[0]})") from None
    section = layer.get("store") if isinstance(layer, dict) else None
    return section.get("url") if isinstance(section, dict) else None


class SessionStore:
    """The session database. Thread-safe; several processes may use one file at once.

    Args:
        path: the database file (created 0600, its folder 0700).
        read_only: open for reading only (a home that cannot be written).
        busy_timeout: seconds one attempt waits for another process's write lock (three attempts, then
            a StoreError); `$MIBYAN_BUSY_TIMEOUT`, else 5, when omitted.

    Raises:
        StoreError: the file is corrupt, not a database, or cannot be opened; it is never overwritten.
    """

    def __init__(
        self,
        path: Path,
        *,
        read_only: bool = False,
        busy_timeout: float | None = None,
        database: Database | None = None,
    ) -> None:
        self.path = path
        self.read_only = read_only
        if database is None:
            wait = busy_timeout if busy_timeout is not None else busy_timeout_from_environment()
            if read_only:
                database = SqliteDatabase(path, read_only=True, busy_timeout=wait)
            else:
                database = open_sqlite(path, busy_timeout=wait)
        self.database: Database = database
        self._closed = False
        db = self.database
        self.sessions = Sessions(db)
        self.lineage = Lineage(db)
        self.messages = Messages(db)
        self.search = Search(db)
        self.facts = Facts(db)
        self.todos = Todos(db)
        self.events = Events(db)
        self.ledger = GatewayLedger(db)
        self.channels = Channels(db)
        shared = db.dialect.name == "postgresql"
        #: Channel leases, when gateways on several machines share this store (PostgreSQL); else None.
        self.leases = Leases(db) if shared else None
        #: The questions runs ask their channels, on such a store (an answer may reach another gateway).
        self.questions = Questions(db) if shared else None

    @classmethod
    def at_url(cls, url: str) -> SessionStore:
        """The PostgreSQL store at `url` (postgresql://...; needs the extra `mibyan[postgres]`)."""
        try:
            from mibyan.store.postgres import open_database
        except ImportError:
            raise StoreError(
                "store.url names PostgreSQL, but psycopg is not installed: pip install 'mibyan[postgres]'"
            ) from None
        database = open_database(url)
        return cls(Path(database.name), database=database)

    @classmethod
    def open(cls, home: Path, *, busy_timeout: float | None = None) -> SessionStore:
        """The home's store: the configured PostgreSQL one (`store_url`), else `state.db` in the home."""
        url = store_url(home)
        if url is not None:
            return cls.at_url(url)
        private_dir(home)
        return cls(home / "state.db", busy_timeout=busy_timeout)

    @classmethod
    def open_for_reading(cls, home: Path) -> SessionStore:
        """The store for commands that only read: read-only when the home or the database is not writable."""
        if store_url(home) is not None:
            return cls.open(home)
        path = home / "state.db"
        if not home.exists() or (
            os.access(home, os.W_OK) and (not path.exists() or os.access(path, os.W_OK))
        ):
            return cls.open(home)
        return cls(path, read_only=True)

    def fenced(self, channel: str, owner: str, epoch: int) -> AbstractContextManager[None]:
        """This thread's writes are refused (LeaseLost) unless `owner` still holds `channel` at `epoch`."""
        return self.database.fenced(channel, owner, epoch)

    def close(self) -> None:
        if not self._closed:  # once: a database shared in the process counts its users
            self._closed = True
            self.database.close()

    def __enter__(self) -> SessionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- raw SQL, in the backend's own dialect: for tests and migrations, never for the faces ---------

    def transaction(self) -> AbstractContextManager[Any]:
        """A write transaction on the backend's connection (SQLite: BEGIN IMMEDIATE)."""
        return self.database.transaction()

    def query(self, sql: str, params: Sequence[Any] = ()) -> Sequence[Any]:
        """Rows of one read query; StoreError when the database fails."""
        return self.database.query(sql, params)

    # -- the few methods kept from before the repositories, for scripts and tests that use them ----------

    def get_session(self, session_id: str) -> dict[str, Any] | None:
        """`store.sessions.get`."""
        return self.sessions.get(session_id)

    def list_sessions(
        self, limit: int = 50, *, offset: int = 0, source: str | None = None
    ) -> list[dict[str, Any]]:
        """`store.sessions.newest_first`."""
        return self.sessions.newest_first(limit, offset=offset, source=source)

    def load_messages(self, session_id: str) -> list[Message]:
        """`store.messages.load`."""
        return self.messages.load(session_id)

    def append_message(
        self, session_id: str, message: Message, *, create: dict[str, Any] | None = None
    ) -> None:
        """`store.messages.append`."""
        self.messages.append(session_id, message, create=create)


class SessionSink:
    """Persists one session's history changes; creates the session row with the first message."""

    def __init__(
        self,
        store: SessionStore,
        session_id: str,
        meta: Callable[[], dict[str, Any]],
        *,
        stored: bool | None = None,
    ) -> None:
        """`stored`: whether the session's row exists, when the caller knows (else it is read here)."""
        self.store = store
        self.session_id = session_id
        self._meta = meta
        self._created = store.sessions.get(session_id) is not None if stored is None else stored

    def _creation(self, first: Message | None) -> dict[str, Any] | None:
        """The new session's row, to create with its first write; None once it exists."""
        if self._created:
            return None
        meta = self._meta()
        if first is not None and first["role"] == "user" and isinstance(first["content"], str):
            meta.setdefault("title", title_from(first["content"]))
        return meta

    def append_message(self, message: Message) -> None:
        self.store.messages.append(self.session_id, message, create=self._creation(message))
        self._created = True

    def replace_messages(self, messages: list[Message]) -> None:
        first = next((m for m in messages if m.get("role") == "user"), None)
        self.store.messages.replace(self.session_id, messages, create=self._creation(first))
        self._created = True


def title_from(text: str, width: int = 60) -> str:
    """A session title from its first user message: one line, shortened at a word boundary."""
    line = " ".join(mask_secrets(text).split())
    if len(line) <= width:
        return line
    cut = line[:width].rsplit(" ", 1)[0]
    return (cut if len(cut) > width // 2 else line[:width]) + "…"
