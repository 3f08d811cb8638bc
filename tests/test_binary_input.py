"""A prompt that is not valid UTF-8 is decoded with replacement characters, and the user is told once."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from conftest import run_cli
from loopback import Reply, ScriptedServer

REPLACEMENT = "\ufffd"


def _stored_user_messages(home: Path) -> list[str]:
    with sqlite3.connect(home / "state.db") as db:
        return [row[0] for row in db.execute("SELECT content FROM messages WHERE role = 'user'")]


def test_random_bytes_on_stdin_are_answered_with_a_note_on_stderr(server: ScriptedServer, home: Path) -> None:
    server.add(Reply(text="That looks like noise."))
    noise = bytes(range(256)) * 8 + os.urandom(4096)
    done = run_cli("chat", "-q", "-", "--base-url", server.base_url, home=home, stdin=noise)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "That looks like noise.\n"
    notes = [line for line in done.stderr.splitlines() if "not valid UTF-8" in line]
    assert len(notes) == 1
    assert notes[0].startswith("mibyan: the prompt was not valid UTF-8; ")
    assert notes[0].endswith(" were replaced")
    stored = _stored_user_messages(home)
    assert len(stored) == 1 and REPLACEMENT in stored[0]
    sent = server.requests[0].body["messages"][-1]["content"]
    assert REPLACEMENT in sent


def test_an_argument_with_invalid_bytes_names_how_many_were_replaced(
    server: ScriptedServer, home: Path
) -> None:
    server.add(Reply(text="ok"))
    prompt = os.fsdecode(b"hello \xff\xfe world")
    done = run_cli("chat", "-q", prompt, "--base-url", server.base_url, home=home)
    assert done.returncode == 0, done.stderr
    assert "mibyan: the prompt was not valid UTF-8; 2 bytes were replaced" in done.stderr
    assert _stored_user_messages(home) == [f"hello {REPLACEMENT}{REPLACEMENT} world"]


def test_a_valid_prompt_gets_no_note(server: ScriptedServer, home: Path) -> None:
    server.add(Reply(text="ok"))
    done = run_cli("chat", "-q", "-", "--base-url", server.base_url, home=home, stdin="héllo ✓\n")
    assert done.returncode == 0, done.stderr
    assert "UTF-8" not in done.stderr
    assert _stored_user_messages(home) == ["héllo ✓"]


def test_the_library_replaces_lone_surrogates_in_a_prompt(make_agent, server: ScriptedServer) -> None:
    server.add(Reply(text="ok"))
    result = make_agent().run_conversation("bad \udcff byte")
    assert result["exit_reason"] == "completed", result["error"]
    assert result["messages"][0]["content"] == f"bad {REPLACEMENT} byte"
