"""The PostgreSQL backend (DESIGN §16): psycopg 3 with its connection pool, chosen by `store.url`.

Every PostgreSQL-only spelling the store uses is here or in store/postgres_schema.py: `%s` placeholders
(the repositories' `?` are turned into them), `pg_advisory_xact_lock`, tsvector and tsquery, `ts_rank`,
`ts_headline`. Migrations run in one transaction under an advisory lock, so several processes starting at
once on an empty database migrate it once. Full-text search folds accents and splits words the way the
SQLite index does: the database folds stored text (postgres_schema's `mibyan_search_words`) and
`fold()` here folds the words of a query the same way.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

import psycopg
import psycopg_pool
from psycopg import sql
from psycopg.rows import dict_row

from mibyan.store import postgres_schema
from mibyan.store.database import Connection, Dialect, LeaseLost, StoreError, search_filters
from mibyan.store.leases import ALIVE_LOCKS
from mibyan.store.migrations import APPLIED_NAMES, APPLIED_TABLE, RECORD_APPLIED
from mibyan.store.notices import TOPICS, Listening, Subscribers, Wake

log = logging.getLogger("mibyan.store")

#: The advisory lock migrations run under (any fixed number; "mibyan" in ASCII).
MIGRATION_LOCK = 0x6D696279616E
_COMBINING = re.compile("[\u0300-\u036f]")
_LITERAL_OR_MARK = re.compile(r"'(?:[^']|'')*'|\?|%")
#: Words around the hits a snippet shows (SQLite's snippet(..., 12)), and what marks a cut.
_SNIPPET_WORDS = 12
#: The lease this thread's writes are fenced by, in every store of the process (a gateway's run writes
#: through the agent's own store as well as the gateway's).
_FENCED = threading.local()
_FENCE = "SELECT 1 FROM gateway_leases WHERE channel = %s AND owner = %s AND epoch = %s FOR SHARE"
_ELLIPSIS = "…"
#: Seconds the first subscriber waits for LISTEN to be in place (after that it relies on its polling).
_LISTEN_WITHIN = 5.0
#: Seconds the listening thread waits for notices between two looks at whether it should stop.
_LISTEN_TICK = 0.25
#: Seconds between two attempts to listen again after the connection was lost.
_RELISTEN_AFTER = 2.0
#: Seconds between two looks at whether the connection holding the alive mark is still up.
_ALIVE_TICK = 2.0


def is_postgres_url(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))


def shown_url(url: str) -> str:
    """The URL without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rpartition("@")[2]
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit(parts._replace(netloc=user + netloc))


def fold(text: str) -> str:
    """Lower case without accents, as `mibyan_search_words` folds stored text."""
    return _COMBINING.sub("", unicodedata.normalize("NFD", text.lower()))


def _word_groups(text: str) -> list[list[str]]:
    """The query's words (what SQLite's tokenizer would take as a quoted word), each split into the
    index's words (`a_b` is `a` then `b`)."""
    groups = [re.findall(r"[^\W_]+", chunk) for chunk in re.findall(r"\w+", fold(text))]
    return [group for group in groups if group]


def _hits(tokens: list[re.Match[str]], groups: list[list[str]]) -> list[tuple[int, int, int]]:
    """Where each query phrase stands, by position: (first token, last token, phrase number). A phrase is a
    word of the query, or the words of `a_b` in a row; the query's last word may start a token."""
    folded = [fold(token.group()) for token in tokens]
    hits = []
    for number, group in enumerate(groups):
        prefix = number == len(groups) - 1
        for first in range(len(tokens) - len(group) + 1):
            window = folded[first : first + len(group)]
            if window[:-1] == group[:-1] and (
                window[-1] == group[-1] or (prefix and window[-1].startswith(group[-1]))
            ):
                hits.append((first, first + len(group) - 1, number))
    return sorted(hits)


def _score(hits: list[tuple[int, int, int]], begin: int, size: int) -> tuple[int, int]:
    """FTS5's score of the window of `size` tokens from `begin` (1000 a phrase, 1 each repeat), and
    where it would start the window to centre those hits."""
    seen: set[int] = set()
    score, first, last = 0, -1, 0
    for start, stop, number in hits:
        if begin <= start < begin + size:
            score += 1 if number in seen else 1000
            seen.add(number)
            first = start if first < 0 else first
            last = stop + 1
    return score, first - (size - (last - first)) // 2


def _window(text: str, tokens: list[re.Match[str]], hits: list[tuple[int, int, int]]) -> int:
    """The first token of the snippet, chosen as SQLite's fts5 snippet() chooses it: the best-scoring
    window around a hit, or one starting a sentence (after `.` or `:` and a space) near it."""
    size, count = _SNIPPET_WORDS, len(tokens)
    sentences = [0] + [
        i
        for i in range(1, count)
        if re.search(r"[.:][ \t\n\r]+$", text[tokens[i - 1].end() : tokens[i].start()])
    ]
    best_score, best_start = 0, 0
    for start, _stop, _number in hits:
        score, adjusted = _score(hits, start, size)
        if score > best_score:
            best_score, best_start = score, max(0, min(adjusted, count - size))
        before = [i for i in sentences if i <= start]
        if before and before[-1] < start:
            score = _score(hits, before[-1], size)[0] + (120 if before[-1] == 0 else 100)
            if score > best_score:
                best_score, best_start = score, before[-1]
    return best_start


def snippet(text: str, groups: list[list[str]], marks: tuple[str, str]) -> str:
    """The text around the hits with each one marked, as SQLite's FTS5 snippet() makes it: the whole text
    when it has at most 12 words, else 12 words chosen as it chooses them (cuts marked with …)."""
    tokens = list(re.finditer(r"[^\W_]+", text))
    hits = _hits(tokens, groups)
    start, stop = 0, len(tokens)
    if len(tokens) > _SNIPPET_WORDS:
        start = _window(text, tokens, hits)
        stop = start + _SNIPPET_WORDS
    out = [_ELLIPSIS] if start > 0 else []
    cursor = tokens[start].start() if start > 0 else 0
    end = tokens[stop - 1].end() if stop < len(tokens) else len(text)
    merged: list[tuple[int, int]] = []
    for first, last, _number in hits:
        if first >= start and last < stop:
            if merged and first <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(last, merged[-1][1]))
            else:
                merged.append((first, last))
    for first, last in merged:
        a, b = tokens[first].start(), tokens[last].end()
        out += [text[cursor:a], marks[0], text[a:b], marks[1]]
        cursor = b
    out.append(text[cursor:end])
    if stop < len(tokens):
        out.append(_ELLIPSIS)
    return "".join(out)


@functools.lru_cache(maxsize=512)
def driver_sql(sql: str) -> str:
    """The repositories' portable SQL with psycopg's placeholders: `?` becomes `%s`, a `%` becomes `%%`
    (inside string literals too, which keep their `?`)."""

    def spell(match: re.Match[str]) -> str:
        token = match.group()
        if token == "?":
            return "%s"
        return token.replace("%", "%%")

    return _LITERAL_OR_MARK.sub(spell, sql)


class PostgresDialect:
    """tsquery (`simple` configuration, folded words, `:*` prefixes), `ts_rank` and `ts_headline`."""

    name = "postgresql"

    def words_query(self, text: str) -> str:
        groups = _word_groups(text)
        if not groups:
            return ""
        groups[-1][-1] += ":*"
        return " & ".join(f"({' <-> '.join(group)})" for group in groups)

    def any_words_query(self, words: Sequence[str]) -> str:
        groups = [group for word in words for group in _word_groups(word)]
        return " | ".join(f"({' <-> '.join(group)})" for group in groups)

    def message_search(self, *, role: bool, since: bool, sessions: int) -> str:
        sql = (
            "SELECT m.session_id, m.seq, m.role, m.created_at, s.title, s.source,"
            " m.content AS snippet, -ts_rank(m.search, q.q) AS rank"
            " FROM (SELECT ?::text AS open, ?::text AS close, to_tsquery('simple', ?) AS q) q"
            " JOIN messages m ON m.search @@ q.q JOIN sessions s ON s.id = m.session_id WHERE true"
        )
        sql += search_filters(role=role, since=since, sessions=sessions)
        return sql + " ORDER BY rank, m.id LIMIT ?"

    def snippets(self, hits: list[dict[str, Any]], text: str, marks: tuple[str, str]) -> list[dict[str, Any]]:
        groups = _word_groups(text)
        return [{**hit, "snippet": snippet(hit["snippet"] or "", groups, marks)} for hit in hits]

    def fact_search(self) -> str:
        return (
            "SELECT f.text FROM facts f, to_tsquery('simple', ?) q WHERE f.search @@ q"
            " AND f.owner IS NOT DISTINCT FROM ? ORDER BY ts_rank(f.search, q) DESC, f.id LIMIT ?"
        )

    def table_exists(self) -> str:
        return "SELECT 1 WHERE to_regclass(?::text) IS NOT NULL"


class _Connection:
    """One transaction's connection, spoken to in the repositories' portable SQL."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> psycopg.Cursor[Any]:
        return self._conn.execute(driver_sql(sql), list(parameters))

    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]], /) -> psycopg.Cursor[Any]:
        cursor = self._conn.cursor()
        cursor.executemany(driver_sql(sql), [list(row) for row in parameters])
        return cursor


_OPEN: dict[str, PostgresDatabase] = {}
_OPEN_LOCK = threading.Lock()


def open_database(url: str) -> PostgresDatabase:
    """The database at `url`, shared by every store of this process that opens it (a gateway opens one
    per run): one pool and one listening connection, connected and migrated once; each user closes it.

    Raises:
        StoreError: as PostgresDatabase.
    """
    with _OPEN_LOCK:
        database = _OPEN.get(url)
        if database is not None:
            database._users += 1
            return database
        database = _OPEN[url] = PostgresDatabase(url)
        return database


class PostgresDatabase:
    """A PostgreSQL database through a pool of connections; thread-safe, any number of processes.

    Args:
        url: a postgresql:// URL (libpq's; the password may be in it or in ~/.pgpass).
        pool_size: the most connections this process opens.

    Raises:
        StoreError: the server cannot be reached or refuses, or the migrations fail.
    """

    dialect: Dialect = PostgresDialect()
    read_only = False

    def __init__(self, url: str, *, pool_size: int = 8) -> None:
        self.url = url
        self.name = shown_url(url)
        self._users = 1  # the stores using it (`open_database` shares one per URL in a process)
        try:
            with psycopg.connect(url, connect_timeout=10) as conn:
                self._migrate(conn)
            self._pool = psycopg_pool.ConnectionPool(
                url,
                min_size=1,
                max_size=pool_size,
                kwargs={"row_factory": dict_row, "connect_timeout": 10},
                timeout=30,
                open=True,
            )
        except psycopg.Error as exc:
            raise StoreError(f"{self.name}: cannot use the session database ({_reason(exc)})") from None
        self._listener = _Listener(url, self.name)

    @staticmethod
    def _migrate(conn: psycopg.Connection[Any]) -> None:
        with conn.transaction():
            # One process at a time; the others wait here, then find nothing left to do.
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {APPLIED_TABLE}"
                " (name TEXT PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
            )
            applied = {row[0] for row in conn.execute(APPLIED_NAMES).fetchall()}
            for step in postgres_schema.SCHEMA.pending(applied):
                step(conn)
                conn.execute(driver_sql(RECORD_APPLIED), (step.__name__, time.time()))

    def close(self) -> None:
        """Let it go; the last of its users closes its pool and its listening connection."""
        with _OPEN_LOCK:
            self._users -= 1
            if self._users > 0:
                return
            if _OPEN.get(self.url) is self:
                del _OPEN[self.url]
        self._listener.close()
        self._pool.close()

    def announce(self, db: Connection, topic: str, key: str) -> None:
        """NOTIFY in the transaction `db`: the server delivers it at the commit, to every listener."""
        db.execute("SELECT pg_notify(?, ?)", (topic, key))

    def listen(self, topic: str, key: str | None, wake: Wake) -> Listening:
        return self._listener.listen(topic, key, wake)

    def hold_alive(self, owner: str) -> Listening:
        alive = _Alive(self.url, owner)
        return Listening(alive.close)

    @contextmanager
    def fenced(self, channel: str, owner: str, epoch: int) -> Iterator[None]:
        _FENCED.lease = (channel, owner, epoch)
        try:
            yield
        finally:
            _FENCED.lease = None

    @contextmanager
    def _transaction(self) -> Iterator[_Connection]:
        lease = getattr(_FENCED, "lease", None)
        try:
            with self._pool.connection() as conn, conn.transaction():
                if lease is not None and not conn.execute(_FENCE, lease).fetchone():
                    # FOR SHARE: a takeover's claim waits for this transaction, then raises the epoch
                    raise LeaseLost(f"{lease[0]}: another gateway took this channel over; nothing was saved")
                yield _Connection(conn)
        except psycopg.Error as exc:
            raise StoreError(f"{self.name}: {_reason(exc)}; nothing was saved") from None

    def transaction(self) -> AbstractContextManager[_Connection]:
        """A write transaction: committed when the block ends, rolled back whole when it raises."""
        return self._transaction()

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """Rows of one read query (dicts); StoreError when the database fails."""
        try:
            with self._pool.connection() as conn:
                rows = conn.execute(driver_sql(sql), list(params)).fetchall()
                return cast("list[dict[str, Any]]", rows)
        except psycopg.Error as exc:
            raise StoreError(f"{self.name}: {_reason(exc)}") from None


class _Listener:
    """One connection of this process that LISTENs to every topic, on a thread of its own, and wakes the
    subscribers of each notice. Started by the first subscriber; when the connection is lost it listens
    again, and wakes everyone then (notices sent meanwhile were missed: each waiter looks again)."""

    def __init__(self, url: str, name: str) -> None:
        self._url, self._name = url, name
        self.subscribers = Subscribers()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._tried = threading.Event()  # set once the first attempt to listen succeeded or failed
        self._stop = threading.Event()
        #: Whether notices are heard now (False: the waiters' polling is all there is).
        self.listening = False

    def listen(self, topic: str, key: str | None, wake: Wake) -> Listening:
        listening = self.subscribers.add(topic, key, wake)
        with self._lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="mibyan-listen", daemon=True)
                self._thread.start()
        self._tried.wait(_LISTEN_WITHIN)
        return listening

    def _run(self) -> None:
        def setup(conn: psycopg.Connection[Any]) -> None:
            for topic in TOPICS:
                conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(topic)))
            self.listening = True
            self.subscribers.wake_all()

        def hold(conn: psycopg.Connection[Any]) -> None:
            while not self._stop.is_set():
                for notice in conn.notifies(timeout=_LISTEN_TICK):
                    self.subscribers.deliver(notice.channel, notice.payload)

        def lost() -> None:
            self.listening = False
            self.subscribers.wake_all()

        _keep_connected(
            self._url,
            self._stop,
            self._tried,
            setup,
            hold,
            lost,
            failing=lambda reason: log.warning(
                "%s: not listening for notices (%s); looking again now and then", self._name, reason
            ),
        )

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(_LISTEN_TICK * 4)


class _Alive:
    """A connection of its own holding `pg_advisory_lock(ALIVE_LOCKS, hashtext(owner))` while this process
    lives: the server lets it go when the process dies, and store/leases.py reads a holder whose lock is
    gone as gone. Taken before the constructor returns (or once tried); again if the connection drops."""

    def __init__(self, url: str, owner: str) -> None:
        self._url, self._owner = url, owner
        self._stop = threading.Event()
        self._tried = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mibyan-alive", daemon=True)
        self._thread.start()
        self._tried.wait(_LISTEN_WITHIN)

    def _run(self) -> None:
        def setup(conn: psycopg.Connection[Any]) -> None:
            conn.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", (ALIVE_LOCKS, self._owner))

        def hold(conn: psycopg.Connection[Any]) -> None:
            while not self._stop.wait(_ALIVE_TICK):
                conn.execute("SELECT 1")  # a dropped connection is found out, and taken again

        _keep_connected(
            self._url,
            self._stop,
            self._tried,
            setup,
            hold,
            lambda: None,
            failing=lambda reason: log.warning("not marked alive (%s): trying again now and then", reason),
        )

    def close(self) -> None:
        self._stop.set()
        self._thread.join(_ALIVE_TICK * 2)


def _keep_connected(
    url: str,
    stop: threading.Event,
    tried: threading.Event,
    setup: Callable[[psycopg.Connection[Any]], None],
    hold: Callable[[psycopg.Connection[Any]], None],
    lost: Callable[[], None],
    *,
    failing: Callable[[str], None],
) -> None:
    """A connection of its own, until `stop`: `setup` once connected, then `hold` while it lasts; when it
    is lost (or cannot be made) `lost()`, and connected again a moment later. `tried` is set once the
    first attempt succeeded or failed; a failure is told (`failing(reason)`) once until one works."""
    failures = 0
    while not stop.is_set():
        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
                setup(conn)
                failures = 0
                tried.set()
                hold(conn)
        except psycopg.Error as exc:
            if failures == 0:
                failing(_reason(exc))
            failures += 1
        tried.set()
        lost()
        stop.wait(_RELISTEN_AFTER)


def _reason(exc: psycopg.Error) -> str:
    """The first line of the server's or libpq's message."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
