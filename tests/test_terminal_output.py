"""Nothing from the model or the store reaches a terminal with a working escape sequence in it."""

from __future__ import annotations

import json
import sys
import unicodedata
from pathlib import Path

from conftest import run_cli
from hypothesis import given
from hypothesis import strategies as st
from loopback import Reply, ScriptedServer

from mibyan.cli.prompts import approval_question
from mibyan.core.sanitize import visible, visible_json

UNSAFE_CATEGORIES = {"Cc", "Cf", "Zl", "Zp", "Cs"}
HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x9b31m hello \u202egnp.exe\u200b\U000e0041 done\x08"


def unsafe_characters(text: str) -> list[str]:
    return [c for c in text if unicodedata.category(c) in UNSAFE_CATEGORIES and c not in "\n\t"]


@given(st.text(alphabet=st.characters(codec=None)))
def test_visible_leaves_no_control_format_or_bidi_character(text: str) -> None:
    shown = visible(text)
    assert unsafe_characters(shown) == []
    assert not any(0x80 <= ord(c) <= 0x9F or c == "\x7f" for c in shown)
    shown.encode("utf-8")  # lone surrogates are escaped too, so the terminal's encoder never fails


def test_every_unsafe_code_point_is_escaped() -> None:
    missed = [
        hex(code)
        for code in range(sys.maxunicode + 1)
        if unicodedata.category(chr(code)) in UNSAFE_CATEGORIES
        and chr(code) not in "\n\t"
        and visible(chr(code)) == chr(code)
    ]
    assert missed == []


def test_ordinary_text_in_any_script_is_left_alone() -> None:
    text = "Hello, مرحبا, 你好, Привет — café ✓ 🙂\n\tindented"
    assert visible(text) == text
    assert visible("a\x1bb\r\nc") == "a\\x1bb\nc"


@given(st.recursive(st.text(), lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner)))
def test_visible_json_keeps_the_data_and_is_safe(data: object) -> None:
    document = visible_json(json.dumps(data, ensure_ascii=False))
    assert json.loads(document) == data
    assert unsafe_characters(document.replace("\n", "")) == []


def test_the_approval_question_shows_the_whole_command_and_its_escapes() -> None:
    command = "rm -rf ./x # \x1b[1A\x1b[2K\r ... ls -la\necho second line"
    question = approval_question(command, "deletes recursively")
    assert "\x1b" not in question and "\r" not in question
    assert "      rm -rf ./x # \\x1b[1A\\x1b[2K\\x0d ... ls -la\n      echo second line\n" in question
    assert "This command deletes recursively.\n" in question


def test_blanks_cannot_push_the_start_of_a_command_out_of_the_approval_question() -> None:
    command = "rm -rf ./victim #" + " " * 6000 + "echo harmless" + "\n" * 500 + "ls"
    question = approval_question(command, "deletes a folder and everything in it (rm -r)")
    assert "      rm -rf ./victim #‹6000 blanks›echo harmless\n" in question
    assert "‹499 empty lines›" in question
    assert len(question.splitlines()) < 12 and max(map(len, question.splitlines())) < 80


def test_sessions_commands_never_print_a_raw_escape(server: ScriptedServer, make_agent, home: Path) -> None:
    server.add(Reply(text=HOSTILE))
    agent = make_agent()
    agent.run_conversation("say hello")
    agent.store.sessions.rename(agent.session_id, "title \x1b[2J\u202e")
    # Text shows an escape as \x1b; JSON (--json, and export's JSONL) writes it as \u001b.
    for args, escaped in (
        (("list",), "\\x1b"),
        (("show", agent.session_id), "\\x1b"),
        (("search", "hello"), "\\x1b"),
        (("export", agent.session_id), "\\u001b"),
        (("export", agent.session_id, "--format", "md"), "\\x1b"),
        (("list", "--json"), "\\u001b"),
        (("show", agent.session_id, "--json"), "\\u001b"),
        (("search", "hello", "--json"), "\\u001b"),
    ):
        done = run_cli("sessions", *args, home=home)
        assert done.returncode == 0, done.stderr
        assert unsafe_characters(done.stdout.replace("\n", "")) == [], args
        assert escaped in done.stdout, args
    exported = run_cli("sessions", "export", agent.session_id, home=home).stdout.splitlines()
    assert [json.loads(line)["content"] for line in exported][-1] == HOSTILE
    shown = json.loads(run_cli("sessions", "show", agent.session_id, "--json", home=home).stdout)
    assert shown["messages"][-1]["content"] == HOSTILE and shown["title"] == "title \x1b[2J\u202e"


def test_a_one_shot_answer_to_a_pipe_keeps_its_bytes_and_errors_are_made_visible(
    server: ScriptedServer, home: Path
) -> None:
    server.add(Reply(text=HOSTILE))
    done = run_cli("chat", "-q", "hi", "--base-url", server.base_url, home=home)
    assert done.stdout == HOSTILE + "\n"
    hostile_error = {
        "error": {"message": "bad \x1b[2J\x1b]0;pwned\x07 request", "type": "invalid_request_error"}
    }
    server.add(Reply(status=400, error_body=hostile_error))
    failed = run_cli("chat", "-q", "hi", "--base-url", server.base_url, home=home)
    assert failed.returncode == 1 and "\x1b" not in failed.stderr and "\\x1b[2J" in failed.stderr
