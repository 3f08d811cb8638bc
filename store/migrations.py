"""Schema migrations, one ordered set per backend, each applied once and recorded by its name.

A backend's schema module (store/sqlite_schema.py; a PostgreSQL one beside it) registers its migrations
with `@SCHEMA.register`; the backend applies, under its own write lock, those a database has not had,
and records each in the table `_mibyan_migrations` by the function's name. Recording by name, not by
number, means a migration inserted between two others in a later release still runs on an old database.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Generic, TypeVar

#: The table every backend records its applied migrations in (name, applied_at).
APPLIED_TABLE = "_mibyan_migrations"
CREATE_APPLIED_TABLE = f"CREATE TABLE {APPLIED_TABLE} (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)"
RECORD_APPLIED = f"INSERT INTO {APPLIED_TABLE} (name, applied_at) VALUES (?, ?)"
APPLIED_NAMES = f"SELECT name FROM {APPLIED_TABLE}"

C = TypeVar("C")


class Migrations(Generic[C]):
    """One backend's migrations, in the order they run; each takes that backend's connection.

    Args:
        dialect: the backend's name ("sqlite").
    """

    def __init__(self, dialect: str) -> None:
        self.dialect = dialect
        #: In order. Never rename one: its name is what a database records.
        self.steps: list[Callable[[C], None]] = []

    def register(self, fn: Callable[[C], None]) -> Callable[[C], None]:
        """Add a migration after the others (a decorator)."""
        self.steps.append(fn)
        return fn

    def pending(self, applied: Collection[str]) -> list[Callable[[C], None]]:
        """The migrations not among `applied` (names), in their order."""
        return [step for step in self.steps if step.__name__ not in applied]
