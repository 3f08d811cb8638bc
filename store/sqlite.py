"""The SQLite backend: one file, WAL, FTS5. Every SQLite-only spelling the store uses is here or in
store/sqlite_schema.py (PRAGMAs, `BEGIN IMMEDIATE`, `sqlite_master`, `MATCH`, `bm25`, `snippet`).

One database, `$MIBYAN_HOME/state.db` (the home 0700, the file 0600), in WAL mode so a REPL and a
one-shot run can write at once; another process's write lock is waited for, retried with jitter, and
then a clear StoreError, never a hang.
"""

from __future__ import annotations

import logging
import os
import random
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from mibyan.config.paths import private_dir
from mibyan.store import sqlite_schema
from mibyan.store.database import Connection, Dialect, StoreError, search_filters
from mibyan.store.migrations import APPLIED_NAMES, CREATE_APPLIED_TABLE, RECORD_APPLIED
from mibyan.store.notices import Listening, Subscribers, Wake

DEFAULT_BUSY_TIMEOUT = 5.0


class SqliteDialect:
    """FTS5's spellings: `MATCH`, `bm25()` ranking, `snippet()`, and `sqlite_master`."""

    name = "sqlite"

    def words_query(self, text: str) -> str:
        words = re.findall(r"\w+", text, flags=re.UNICODE)
        if not words:
            return ""
        quoted = [f'"{w}"' for w in words]
        quoted[-1] += "*"
        return " ".join(quoted)

    def any_words_query(self, words: Sequence[str]) -> str:
        return " OR ".join(f'"{w}"' for w in words)

    def message_search(self, *, role: bool, since: bool, sessions: int) -> str:
        sql = (
            "SELECT m.session_id, m.seq, m.role, m.created_at, s.title, s.source,"
            " snippet(messages_fts, 0, ?, ?, '…', 12) AS snippet, bm25(messages_fts) AS rank"
            " FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid"
            " JOIN sessions s ON s.id = m.session_id WHERE messages_fts MATCH ?"
        )
        sql += search_filters(role=role, since=since, sessions=sessions)
        return sql + " ORDER BY rank LIMIT ?"

    def snippets(self, hits: list[dict[str, Any]], text: str, marks: tuple[str, str]) -> list[dict[str, Any]]:
        return hits

    def fact_search(self) -> str:
        return (
            "SELECT f.text FROM facts_fts JOIN facts f ON f.id = facts_fts.rowid"
            " WHERE facts_fts MATCH ? AND f.owner IS ? ORDER BY bm25(facts_fts) LIMIT ?"
        )

    def table_exists(self) -> str:
        return "SELECT 1 FROM sqlite_master WHERE name = ?"


def busy_timeout_from_environment() -> float:
    """`$MIBYAN_BUSY_TIMEOUT` in seconds (0 to 3600), else 5."""
    raw = os.environ.get("MIBYAN_BUSY_TIMEOUT")
    if not raw:
        return DEFAULT_BUSY_TIMEOUT
    try:
        seconds = float(raw)
    except ValueError:
        raise StoreError(f"MIBYAN_BUSY_TIMEOUT: {raw!r} is not a number of seconds") from None
    if not 0 <= seconds <= 3600:
        raise StoreError(f"MIBYAN_BUSY_TIMEOUT: {raw!r} is not between 0 and 3600 seconds")
    return seconds


_SHARED: dict[tuple[str, float, int], SqliteDatabase] = {}
_SHARED_LOCK = threading.Lock()


def open_sqlite(path: Path, *, busy_timeout: float) -> SqliteDatabase:
    """The writable database at `path`, shared by every store of this process that opens it (a gateway's
    runs, an agent's subagents): one connection, opened and migrated once; each user closes it.

    A file that is no longer the one opened (a home removed and made again) is opened anew, and a
    child process (fork) never uses its parent's connection.

    Raises:
        StoreError: as SqliteDatabase.
    """
    key = (str(path), busy_timeout, os.getpid())
    with _SHARED_LOCK:
        database = _SHARED.get(key)
        if database is not None and database._is_at(path):
            database._users += 1
            return database
        database = _SHARED[key] = SqliteDatabase(path, read_only=False, busy_timeout=busy_timeout)
        database._shared_as = key
        return database


def _busy(exc: sqlite3.OperationalError) -> bool:
    """Another process holds a lock this one needs (a try later may find it free)."""
    return "locked" in str(exc) or "busy" in str(exc)


class SqliteDatabase:
    """One SQLite file, thread-safe; several processes may use it at once.

    Args:
        path: the database file (created 0600, its folder 0700).
        read_only: open for reading only (a home that cannot be written): nothing is created or migrated.
        busy_timeout: a third of the seconds a write waits for another process's write lock (tried again
            with back-off, then a StoreError).

    Raises:
        StoreError: the file is corrupt, not a database, or cannot be opened; it is never overwritten.
    """

    dialect: Dialect = SqliteDialect()

    def __init__(self, path: Path, *, read_only: bool, busy_timeout: float) -> None:
        self.path = path
        self.name = str(path)
        self.read_only = read_only
        self._busy_timeout = busy_timeout
        self._lock = threading.RLock()
        self._subscribers = Subscribers()
        self._announced: list[tuple[str, str]] = []  # by the transaction going on, to deliver at its commit
        self._users = 1  # the stores using it (`open_sqlite` shares one per file in a process)
        self._shared_as: tuple[str, float, int] | None = None
        try:
            self._db = self._connect_read_only() if read_only else self._connect()
        except sqlite3.DatabaseError as exc:
            raise StoreError(
                f"{path}: cannot use the session database ({exc}); it was left untouched"
            ) from None
        except OSError as exc:
            raise StoreError(f"{path}: cannot open the session database ({exc.strerror or exc})") from None

    def _connect(self) -> sqlite3.Connection:
        private_dir(self.path.parent)
        if not self.path.exists():
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        wait = self._busy_timeout
        self._db = sqlite3.connect(self.path, timeout=wait, check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute(f"PRAGMA busy_timeout = {int(wait * 1000)}")
        self._db.execute("PRAGMA synchronous = NORMAL")
        self._db.execute("PRAGMA foreign_keys = ON")
        self._when_unlocked(self._enable_wal)
        self._migrate()
        # from now on no busy timeout of SQLite's: the stores of the process share the connection, and a
        # try that finds another process's lock waits with the connection's lock let go (_tries)
        self._db.execute("PRAGMA busy_timeout = 0")
        opened = os.stat(self.path)
        self._file = (opened.st_dev, opened.st_ino)
        return self._db

    def _connect_read_only(self) -> sqlite3.Connection:
        """Open for reading only: nothing is created, migrated or changed.

        A WAL database needs its -shm file to be read; where none can be created (a read-only file
        system), the file is opened as immutable, which is safe because nothing can write it either.
        """
        if not self.path.is_file():
            raise StoreError(f"{self.path}: there is no session database yet, and the home is read-only")
        last: sqlite3.DatabaseError | None = None
        for options in ("mode=ro", "immutable=1"):
            uri = f"{self.path.resolve().as_uri()}?{options}"
            db = sqlite3.connect(uri, uri=True, timeout=5.0, check_same_thread=False, isolation_level=None)
            db.row_factory = sqlite3.Row
            try:
                db.execute("SELECT count(*) FROM sessions").fetchone()
                return db
            except sqlite3.DatabaseError as exc:
                db.close()
                last = exc
        assert last is not None
        raise last

    def _is_at(self, path: Path) -> bool:
        """The file at `path` is still the one this connection opened."""
        try:
            now = os.stat(path)
        except OSError:
            return False
        return (now.st_dev, now.st_ino) == self._file

    def close(self) -> None:
        """Let it go; the last of its users closes the connection."""
        with _SHARED_LOCK:
            self._users -= 1
            if self._users > 0:
                return
            if self._shared_as is not None and _SHARED.get(self._shared_as) is self:
                del _SHARED[self._shared_as]
        with self._lock:
            self._db.close()

    def _enable_wal(self) -> None:
        # Switching a new database to WAL takes a lock that the busy timeout does not cover, so two
        # processes starting at once on a fresh home would see "database is locked" without retries.
        if self._db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            self._db.execute("PRAGMA journal_mode = WAL")

    def _migrate(self) -> None:
        if not self._pending_migrations(self._db):
            return
        with self._transaction() as db:
            # Read again under the write lock: another process may have migrated meanwhile.
            for step in self._pending_migrations(db):
                step(db)
                db.execute(RECORD_APPLIED, (step.__name__, time.time()))
            # Older mibyan versions read user_version: tell them the numbered migrations are all there.
            db.execute(f"PRAGMA user_version = {len(sqlite_schema.NUMBERED)}")

    @staticmethod
    def _pending_migrations(db: sqlite3.Connection) -> list[sqlite_schema.Migration]:
        """The registered migrations this database has not had, in their order."""
        try:
            applied = {row[0] for row in db.execute(APPLIED_NAMES)}
        except sqlite3.OperationalError:  # no table yet: a new database, or one numbered by user_version
            if not db.in_transaction:
                return list(sqlite_schema.MIGRATIONS)
            db.execute(CREATE_APPLIED_TABLE)
            numbered = db.execute("PRAGMA user_version").fetchone()[0]
            applied = set(sqlite_schema.NUMBERED[:numbered])
            db.executemany(RECORD_APPLIED, [(name, time.time()) for name in sorted(applied)])
        return sqlite_schema.SCHEMA.pending(applied)

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE, waiting with back-off while another process holds the write lock (three
        busy timeouts at most, then one clear StoreError, never a hang).

        Whatever fails inside (or at COMMIT: a full disk, an I/O error) rolls the whole transaction back
        and is one StoreError: nothing is ever written half.
        """
        self._begin()
        try:
            try:
                yield self._db
                self._db.execute("COMMIT")
            except sqlite3.DatabaseError as exc:
                self._rollback()
                raise StoreError(self._write_failure(exc)) from None
            except BaseException:
                self._rollback()
                raise
            finally:
                announced, self._announced = self._announced, []
            for topic, key in announced:  # committed: now they may look
                self._subscribers.deliver(topic, key)
        finally:
            self._lock.release()

    def _begin(self) -> None:
        """Open a write transaction and return holding the connection's lock.

        The stores of a process share the connection (open_sqlite), and SQLite is asked once per try (no
        busy timeout of its own): while another process holds the write lock, the lock is let go between
        tries, so this process's other stores read (and its other writers queue) meanwhile.
        """
        failure: sqlite3.OperationalError | None = None
        for _ in self._tries():
            self._lock.acquire()
            try:
                self._db.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                self._lock.release()
                if not _busy(exc):
                    raise StoreError(self._write_failure(exc)) from None
                failure = exc
            except sqlite3.DatabaseError as exc:
                self._lock.release()
                raise StoreError(self._write_failure(exc)) from None
            except BaseException:
                self._lock.release()
                raise
        assert failure is not None
        raise StoreError(self._write_failure(failure))

    def _when_unlocked(self, action: Callable[[], object]) -> None:
        """`action()`, tried again (see _tries) while another process holds a lock SQLite won't wait on."""
        failure: sqlite3.OperationalError | None = None
        for _ in self._tries():
            try:
                action()
                return
            except sqlite3.OperationalError as exc:
                if not _busy(exc):
                    raise
                failure = exc
        assert failure is not None
        raise failure

    def _tries(self) -> Iterator[None]:
        """One try now, then more with back-off (1 ms, doubling to 50 ms, with jitter) until three busy
        timeouts have passed."""
        yield
        deadline = time.monotonic() + 3 * self._busy_timeout
        pause = 0.001
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(pause, left) + random.uniform(0, pause / 2))
            pause = min(pause * 2, 0.05)
            yield

    def _rollback(self) -> None:
        if not self._db.in_transaction:
            return  # SQLite already rolled back (it does on some I/O errors)
        try:
            self._db.execute("ROLLBACK")
        except sqlite3.DatabaseError as exc:  # the original failure is what the user needs to see
            logging.getLogger("mibyan.store").warning("rollback failed: %s", exc)

    def _write_failure(self, exc: sqlite3.DatabaseError) -> str:
        text = str(exc)
        if isinstance(exc, sqlite3.OperationalError) and ("disk" in text or "I/O" in text):
            return f"{self.path}: cannot save: the disk is full or not writable ({text}); nothing was saved"
        if "readonly" in text or self.read_only:
            return f"{self.path}: cannot save: the database is read-only ({text})"
        return f"{self.path}: {text}"

    def announce(self, db: Connection, topic: str, key: str) -> None:
        """Wake this process's listeners once the transaction commits (other processes look again)."""
        self._announced.append((topic, key))

    def listen(self, topic: str, key: str | None, wake: Wake) -> Listening:
        return self._subscribers.add(topic, key, wake)

    def hold_alive(self, owner: str) -> Listening:
        """Nothing to hold: no lease is kept in a SQLite store."""
        return Listening(lambda: None)

    def fenced(self, channel: str, owner: str, epoch: int) -> AbstractContextManager[None]:
        """No check: the gateways sharing a SQLite store are on one machine, ordered by its file locks."""
        return nullcontext()

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        """A write transaction (BEGIN IMMEDIATE)."""
        return self._transaction()

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        """Rows of one read query; StoreError when the database fails (or stays locked by another
        process, which a read in WAL mode sees only for a moment, as for three busy timeouts)."""
        failure: sqlite3.OperationalError | None = None
        for _ in self._tries():
            with self._lock:
                try:
                    return self._db.execute(sql, params).fetchall()
                except sqlite3.OperationalError as exc:
                    if not _busy(exc) or self._db.in_transaction:  # in our own transaction: no wait helps
                        raise StoreError(f"{self.path}: {exc}") from None
                    failure = exc
                except sqlite3.DatabaseError as exc:
                    raise StoreError(f"{self.path}: {exc}") from None
        raise StoreError(f"{self.path}: {failure}")
