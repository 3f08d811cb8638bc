"""The home on a full disk or a read-only file system, and a home whose permissions are too open.

Each is one clear line and the documented exit code, never a traceback, and never a half-written session.
"""

from __future__ import annotations

import resource
import shutil
import sqlite3
import stat
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli
from gatewaying import write_config
from loopback import Reply, ScriptedServer

FILE_SIZE_LIMIT = 200 * 1024


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, FILE_SIZE_LIMIT))


def _sessions(home: Path) -> list[tuple[str, int]]:
    with sqlite3.connect(home / "state.db") as db:
        return list(db.execute("SELECT id, message_count FROM sessions"))


def _first_session(server: ScriptedServer, home: Path) -> None:
    server.add(Reply(text="first answer"))
    done = run_cli("chat", "-q", "remember the word ostrich", "--base-url", server.base_url, home=home)
    assert done.returncode == 0, done.stderr


def test_a_full_disk_while_saving_is_one_line_and_leaves_no_empty_session(
    server: ScriptedServer, home: Path
) -> None:
    _first_session(server, home)
    done = run_cli(
        "chat",
        "-q",
        "-",
        "--base-url",
        server.base_url,
        home=home,
        stdin="word " * 60_000,  # 300 KB: more than any file may grow
        preexec_fn=_limit_file_size,
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("mibyan: ") and "disk" in lines[0]
    assert len(_sessions(home)) == 1  # nothing of the failed turn, not even an empty session
    with sqlite3.connect(home / "state.db") as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert server.requests[1:] == []  # nothing was sent that could not be kept


def _read_only(path: Path) -> list[str]:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is needed to mount the home read-only")
    return ["bwrap", "--dev-bind", "/", "/", "--ro-bind", str(path), str(path), "--"]


def test_sessions_list_and_search_work_on_a_read_only_home(server: ScriptedServer, home: Path) -> None:
    _first_session(server, home)
    wrapper = _read_only(home)

    listed = run_cli("sessions", "list", home=home, wrapper=wrapper)
    found = run_cli("sessions", "search", "ostrich", home=home, wrapper=wrapper)

    assert listed.returncode == 0, listed.stderr
    assert "remember the word ostrich" in listed.stdout
    assert found.returncode == 0, found.stderr
    assert "[ostrich]" in found.stdout
    assert "Traceback" not in listed.stderr + found.stderr


def test_a_chat_on_a_read_only_home_is_one_line(server: ScriptedServer, home: Path) -> None:
    _first_session(server, home)
    done = run_cli("chat", "-q", "hi", "--base-url", server.base_url, home=home, wrapper=_read_only(home))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("mibyan: ") and str(home) in lines[0] and "read-only" in lines[0]


def test_a_home_that_cannot_be_created_is_one_line(server: ScriptedServer, tmp_path: Path) -> None:
    parent = tmp_path / "locked"
    parent.mkdir()
    done = run_cli(
        "chat",
        "-q",
        "hi",
        "--base-url",
        server.base_url,
        home=parent / "home",
        wrapper=_read_only(parent),
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("mibyan: ") and str(parent / "home") in lines[0]


def test_a_home_and_database_open_to_others_are_made_private_and_the_user_told(
    server: ScriptedServer, home: Path
) -> None:
    _first_session(server, home)
    home.chmod(0o755)
    (home / "state.db").chmod(0o644)

    server.add(Reply(text="second"), Reply(text="third"))
    first = run_cli("chat", "-q", "hello", "--base-url", server.base_url, home=home)
    again = run_cli("chat", "-q", "hello", "--base-url", server.base_url, home=home)

    assert first.returncode == 0, first.stderr
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE((home / "state.db").stat().st_mode) == 0o600
    notes = [line for line in first.stderr.splitlines() if "only you can read" in line]
    assert len(notes) == 1, first.stderr
    assert str(home) in notes[0]
    assert "only you can read" not in again.stderr


def test_the_gateway_makes_a_home_open_to_others_private_and_says_so(
    server: ScriptedServer, home: Path, start_gateway: Any
) -> None:
    write_config(home, {"local": server.base_url}, [{"id": "meepa", "provider": "local"}])
    home.chmod(0o755)
    (home / "logs").mkdir(mode=0o755)
    (home / "logs" / "gateway.log").write_text("")
    (home / "logs" / "gateway.log").chmod(0o644)

    with start_gateway(home) as gateway:
        pass

    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE((home / "logs").stat().st_mode) == 0o700
    assert stat.S_IMODE((home / "logs" / "gateway.log").stat().st_mode) == 0o600
    notes = [line for line in gateway.lines if "only you can read" in line]
    assert len(notes) == 1 and str(home) in notes[0], gateway.lines


def test_a_log_folder_that_cannot_be_written_does_not_stop_a_chat(server: ScriptedServer, home: Path) -> None:
    _first_session(server, home)
    server.add(Reply(text="still here"))
    done = run_cli(
        "chat", "-q", "hi", "--base-url", server.base_url, home=home, wrapper=_read_only(home / "logs")
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "still here\n"
    assert "Traceback" not in done.stderr
