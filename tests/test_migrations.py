"""Schema migrations are recorded by name, so a database of any age gets exactly the ones it lacks."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import FIXTURES

import agent_state
from agent_state import SessionStore

#: Made by mibyan 0.1.0, whose migrations were numbered by PRAGMA user_version (it is at 4).
NUMBERED_DB = FIXTURES.parent / "state-numbered-v4.db"


def applied(path: Path) -> list[str]:
    with sqlite3.connect(path) as db:
        return [row[0] for row in db.execute("SELECT name FROM _mibyan_migrations ORDER BY name")]


@pytest.fixture
def numbered_db(tmp_path: Path) -> Path:
    path = tmp_path / "home" / "state.db"
    path.parent.mkdir()
    shutil.copy(NUMBERED_DB, path)
    return path


@pytest.fixture
def inserted_migration() -> Iterator[None]:
    """A migration added between two existing ones, as a later release might."""

    def _create_bookmarks(db: sqlite3.Connection) -> None:
        db.execute("CREATE TABLE bookmarks (session_id TEXT, seq INTEGER)")

    agent_state.MIGRATIONS.insert(1, _create_bookmarks)
    yield
    agent_state.MIGRATIONS.remove(_create_bookmarks)


def test_a_database_numbered_by_user_version_opens_with_its_data(numbered_db: Path) -> None:
    with SessionStore(numbered_db) as store:
        assert store.load_messages("s0ld000001")[-1]["content"] == "pg-stage-3"
        assert store.facts.relevant("staging") == ["Staging lives on pg-stage-3."]
        assert [hit["session_id"] for hit in store.search("staging")] == ["s0ld000001"]
    # the four it had, recorded by name, and the later ones applied
    assert applied(numbered_db) == sorted(step.__name__ for step in agent_state.MIGRATIONS)
    assert {"_create_tables", "_create_session_events", "_create_todos", "_create_facts"} <= set(
        applied(numbered_db)
    )


def test_a_migration_inserted_between_others_still_runs_on_an_old_database(
    numbered_db: Path, inserted_migration: None
) -> None:
    with SessionStore(numbered_db) as store:
        assert store.load_messages("s0ld000001")[0]["content"] == "where does staging live?"
    with sqlite3.connect(numbered_db) as db:
        assert db.execute("SELECT count(*) FROM bookmarks").fetchone() == (0,)
    assert "_create_bookmarks" in applied(numbered_db)


def test_a_new_database_records_every_migration_once(tmp_path: Path, inserted_migration: None) -> None:
    path = tmp_path / "state.db"
    SessionStore(path).close()
    SessionStore(path).close()  # the second open finds nothing to do
    assert applied(path) == sorted(step.__name__ for step in agent_state.MIGRATIONS)
