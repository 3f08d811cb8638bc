"""`mibyan sessions import` copies a home's SQLite store into PostgreSQL, after which `mibyan sessions
list | show | search | export` and `mibyan web` give the same output from either (DESIGN §16)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, run_cli
from loopback import Reply, ScriptedServer
from starlette.testclient import TestClient

from agent_state import SessionStore
from mibyan.web.app import create_app

pytestmark = pytest.mark.postgres

TOKEN = "same-token"
#: Everything the sessions commands print, on each backend.
COMMANDS = [
    ["list"],
    ["list", "--json"],
    ["search", "gallons"],
    ["search", "cafe", "--json"],
    ["search", "list", "--role", "user", "--json"],
    ["search", "zebras"],
]


def _sqlite_sessions(home: Path, server: ScriptedServer, make_agent: Callable[..., Any]) -> list[str]:
    server.add(
        Reply(text="Pelicans can hold three gallons."),
        Reply(tool_calls=[("list_directory", {})]),
        Reply(text="listed it: the café_menu.txt is there"),
    )
    for said in ("tell me about pelicans", "list the folder please"):
        with make_agent() as agent:
            agent.chat(said)
    with SessionStore(home / "state.db") as store:
        # days old, so the ages the commands print cannot change between the two runs
        with store.transaction() as db:
            db.execute("UPDATE sessions SET updated_at = updated_at - 3e5, created_at = created_at - 3e5")
        store.facts.add("Pelicans live by the sea.")
        return [row["id"] for row in store.list_sessions()]


def test_an_imported_store_lists_shows_searches_and_exports_the_same(
    server: ScriptedServer, make_agent: Callable[..., Any], home: Path, pg_url: str
) -> None:
    ids = _sqlite_sessions(home, server, make_agent)
    on_pg = {"MIBYAN_STORE_URL": pg_url}

    imported = run_cli("sessions", "import", home=home, env=on_pg)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.startswith("imported 2 session(s) (6 messages, 1 facts) from ")
    again = run_cli("sessions", "import", "--from", str(home / "state.db"), home=home, env=on_pg)
    assert again.stdout.startswith("imported 0 session(s) (0 messages, 0 facts)"), again.stderr
    assert again.stdout.endswith("; 2 were there already\n")

    commands = [*COMMANDS, *(["show", i] for i in ids), ["show", ids[0], "--json"], ["export", ids[1]]]
    for args in commands:
        sqlite, postgres = (run_cli("sessions", *args, home=home, env=env) for env in ({}, on_pg))
        assert (postgres.returncode, postgres.stdout, postgres.stderr) == (
            sqlite.returncode,
            sqlite.stdout,
            sqlite.stderr,
        ), args
    assert "[gallons]" in run_cli("sessions", "search", "gallons", home=home, env=on_pg).stdout
    with SessionStore.at_url(pg_url) as store:
        assert store.facts.relevant("where do pelicans live") == ["Pelicans live by the sea."]
        assert [row["id"] for row in store.list_sessions()] == ids


def test_import_needs_a_postgresql_store_and_a_sqlite_one_to_copy(home: Path, pg_url: str) -> None:
    nowhere = run_cli("sessions", "import", home=home)
    assert nowhere.returncode == 2
    assert nowhere.stderr == (
        "mibyan: error: nothing to import into: set store.url (or MIBYAN_STORE_URL) to a postgresql:// URL"
        " first\n"
    )
    missing = run_cli("sessions", "import", home=home, env={"MIBYAN_STORE_URL": pg_url})
    assert (missing.returncode, missing.stderr) == (
        2,
        f"mibyan: error: there is no SQLite store at {home / 'state.db'} to import\n",
    )


def _pages(store: SessionStore, ids: list[str]) -> list[str]:
    app = create_app(store, token=TOKEN, cookie="mibyan_web_test", poll_interval=0.01)
    with TestClient(app, base_url="http://127.0.0.1:8765") as browser:
        assert browser.get(f"/?token={TOKEN}").status_code == 200
        paths = ["/", "/?source=cli", "/search?q=gallons", "/search?q=caf%C3%A9"]
        paths += [f"/s/{i}" for i in ids] + [f"/s/{ids[0]}/export.md"]
        return [browser.get(path).text for path in paths]


def test_the_viewer_shows_the_same_pages_from_either_store(
    server: ScriptedServer, make_agent: Callable[..., Any], home: Path, pg_url: str
) -> None:
    ids = _sqlite_sessions(home, server, make_agent)
    assert run_cli("sessions", "import", home=home, env={"MIBYAN_STORE_URL": pg_url}).returncode == 0
    with SessionStore(home / "state.db", read_only=True) as sqlite:
        expected = _pages(sqlite, ids)
    with SessionStore.at_url(pg_url) as postgres:
        assert _pages(postgres, ids) == expected
    assert "Pelicans can hold three gallons." in expected[-2]  # the older session's page


def test_mibyan_web_serves_the_postgresql_store(
    server: ScriptedServer, make_agent: Callable[..., Any], home: Path, pg_url: str
) -> None:
    _sqlite_sessions(home, server, make_agent)
    assert run_cli("sessions", "import", home=home, env={"MIBYAN_STORE_URL": pg_url}).returncode == 0
    (home / "state.db").unlink()  # what it shows can only come from PostgreSQL
    (home / "config.yaml").write_text(f"store:\n  url: {pg_url}\n")
    web = subprocess.Popen(
        [sys.executable, "-m", "mibyan.cli.main", "web", "--port", "0"],
        cwd=ROOT,
        env={"MIBYAN_HOME": str(home), "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert web.stdout is not None
        line = web.stdout.readline()
        match = re.search(r"(http://127\.0\.0\.1:\d+/\?token=\S+)", line)
        assert match, (line, web.poll())
        import httpx

        with httpx.Client(follow_redirects=True, timeout=10) as browser:  # the token, then its cookie
            page = browser.get(match.group(1))
        assert page.status_code == 200
        assert "tell me about pelicans" in page.text and "list the folder please" in page.text
    finally:
        web.terminate()
        web.communicate(timeout=30)
