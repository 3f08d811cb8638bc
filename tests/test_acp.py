"""`mibyan acp` as an editor sees it: a real process, the ACP SDK's client side, a scripted loopback model.

One process serves the whole module (several sessions in one process, as in an editor); each test opens
sessions of its own and scripts its own replies.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import run_cli
from editing import ROOT, EditorProcess, answer_text, kinds
from loopback import Reply, ScriptedServer

from agent_state import SessionStore
from mibyan.agent.messages import repair_history

NOISY_HOOK = """
import os, sys

def shout(name, args, result, task_id):
    print("a hook prints \\x1b[2J to stdout")
    sys.stdout.flush()
    os.write(1, b"and writes to fd 1 itself\\n")
"""


@pytest.fixture(scope="module")
def loopback() -> Iterator[ScriptedServer]:
    with ScriptedServer() as scripted:
        yield scripted


@pytest.fixture(scope="module")
def acp_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("acp") / "home"
    home.mkdir(mode=0o700)
    config = {"agent": {"api_max_retries": 0}, "hooks": {"post_tool_call": ["noisy_hook:shout"]}}
    (home / "config.yaml").write_text(yaml.safe_dump(config))
    return home


@pytest.fixture(scope="module")
def hooks(acp_home: Path) -> Path:
    """Where the hook that prints lives (the home's config names it)."""
    folder = acp_home.parent / "hooks"
    folder.mkdir()
    (folder / "noisy_hook.py").write_text(NOISY_HOOK)
    return folder


@pytest.fixture(scope="module")
def editor(loopback: ScriptedServer, acp_home: Path, hooks: Path) -> Iterator[EditorProcess]:
    with EditorProcess(
        acp_home, "--base-url", loopback.base_url, env={"PYTHONPATH": f"{ROOT}:{hooks}"}
    ) as process:
        yield process


@pytest.fixture
def project(tmp_path: Path, loopback: ScriptedServer) -> Path:
    loopback.script.clear()
    folder = tmp_path / "project"
    folder.mkdir()
    return folder


def _tool_calls(updates: list[object]) -> dict[str, list[object]]:
    """Each tool call's updates, by its id, in order."""
    calls: dict[str, list[object]] = {}
    for update in updates:
        if update.session_update in ("tool_call", "tool_call_update"):  # type: ignore[attr-defined]
            calls.setdefault(update.tool_call_id, []).append(update)  # type: ignore[attr-defined]
    return calls


def test_a_prompt_with_two_tool_rounds_streams_its_calls_in_order_through_the_editors_buffers(
    editor: EditorProcess, loopback: ScriptedServer, project: Path, acp_home: Path
) -> None:
    (project / "notes.txt").write_text("saved text\n")
    editor.editor.buffers[str(project / "notes.txt")] = "unsaved text in the editor\n"
    answer = "Done: \x1b]0;pwned\x07 both files are fine."
    loopback.add(
        Reply(text="Reading first.", tool_calls=[("read_file", {"path": "notes.txt"})]),
        Reply(
            tool_calls=[
                ("write_file", {"path": "out.txt", "content": "new content\n"}),
                ("write_file", {"path": str(acp_home / "config.yaml"), "content": "yolo: true\n"}),
                ("todo", {"action": "add", "items": ["check the notes", "write out.txt"]}),
                ("patch", {"path": "notes.txt", "old": "unsaved", "new": "edited"}),
            ]
        ),
        Reply(text=answer, chunks=4, reasoning="Both rounds went fine."),
    )
    session = editor.new_session(project)
    (project.parent / "elsewhere").mkdir()
    editor.new_session(project.parent / "elsewhere")  # a session of another project, opened since
    assert editor.prompt(session, "look at notes.txt") == "end_turn"

    updates = editor.editor.of(session)
    assert answer_text(updates) == "Reading first." + answer
    calls = list(_tool_calls(updates).values())
    assert [kinds(steps) for steps in calls] == [
        ["tool_call:pending", "tool_call_update:in_progress", "tool_call_update:completed"],
        ["tool_call:pending", "tool_call_update:in_progress", "tool_call_update:completed"],
        ["tool_call:pending", "tool_call_update:in_progress", "tool_call_update:failed"],
        ["tool_call:pending", "tool_call_update:in_progress", "tool_call_update:completed"],
        ["tool_call:pending", "tool_call_update:in_progress", "tool_call_update:completed"],
    ]
    read, write, protected, todo, patch = calls
    assert (read[1].kind, read[1].locations[0].path) == ("read", str(project / "notes.txt"))
    assert write[1].kind == "edit" and write[2].content[0].type == "diff"
    assert (write[2].content[0].path, write[2].content[0].new_text) == (
        str(project / "out.txt"),
        "new content\n",
    )
    assert "blocked" in protected[2].content[0].content.text
    assert (todo[1].kind, todo[1].title) == ("think", "todo")
    # the model read the editor's buffer; the write landed in the editor, not on disk
    tool_results = [m["content"] for m in loopback.requests[1].body["messages"] if m["role"] == "tool"]
    assert "unsaved text in the editor" in tool_results[0]
    assert editor.editor.buffers[str(project / "out.txt")] == "new content\n"
    assert not (project / "out.txt").exists()
    diff = patch[2].content[0]
    assert (diff.type, diff.old_text, diff.new_text) == ("diff", "unsaved", "edited")
    assert editor.editor.buffers[str(project / "notes.txt")] == "edited text in the editor\n"
    assert (project / "notes.txt").read_text() == "saved text\n"
    assert ("write", str(acp_home / "config.yaml")) not in editor.editor.file_requests
    assert "yolo" not in (acp_home / "config.yaml").read_text()
    # the plan came with the todo call; the order: the answer text after the last tool round
    plan = next(u for u in updates if u.session_update == "plan")
    assert [(e.content, e.status) for e in plan.entries] == [
        ("check the notes", "pending"),
        ("write out.txt", "pending"),
    ]
    tags = kinds(updates)
    assert tags.index("plan") < tags.index("agent_thought_chunk") < len(tags) - 1
    assert tags[-1] == "agent_message_chunk"
    thoughts = [u.content.text for u in updates if u.session_update == "agent_thought_chunk"]
    assert thoughts == ["Both rounds went fine."]
    # nothing but protocol messages on stdout, though a hook printed and the answer holds escapes
    assert editor.raw_lines and all(json.loads(line)["jsonrpc"] == "2.0" for line in editor.raw_lines)
    assert not any(b"\x1b" in line for line in editor.raw_lines)
    with SessionStore.open(acp_home) as store:
        assert store.get_session(session)["source"] == "acp"  # type: ignore[index]


def test_cancel_in_a_stream_and_in_a_tool_answers_cancelled_and_keeps_the_history_valid(
    editor: EditorProcess, loopback: ScriptedServer, project: Path, acp_home: Path
) -> None:
    loopback.add(Reply(text="This answer will be cut off right here", chunks=8, stall=30))
    session = editor.new_session(project)
    pending = editor.start_prompt(session, "talk")
    editor.editor.wait_for(lambda: answer_text(editor.editor.of(session)) != "")
    editor.cancel(session)
    assert pending.result(10) == "cancelled"

    loopback.add(Reply(tool_calls=[("terminal", {"command": "sleep 30"})]), Reply(text="Back."))
    before = len(editor.editor.of(session))
    pending = editor.start_prompt(session, "wait a while")
    editor.editor.wait_for(
        lambda: "tool_call_update:in_progress" in kinds(editor.editor.of(session)[before:])
    )
    editor.cancel(session)
    assert pending.result(10) == "cancelled"
    assert kinds(editor.editor.of(session))[-1] == "tool_call_update:failed"

    assert editor.prompt(session, "still there?") == "end_turn"
    with SessionStore.open(acp_home) as store:
        stored = store.load_messages(session)
    assert repair_history(stored)[1] == []
    assert [m["role"] for m in stored][-5:] == ["user", "assistant", "tool", "user", "assistant"]


def test_permissions_rejected_granted_always_and_withdrawn_by_a_cancel(
    editor: EditorProcess, loopback: ScriptedServer, project: Path, acp_home: Path
) -> None:
    for name in ("rejected", "granted", "withdrawn"):
        (project / name).mkdir()
        (project / name / "file").write_text("keep?")
    (project / "old.tmp").write_text("")
    loopback.add(
        Reply(tool_calls=[("terminal", {"command": "rm -r rejected"})]),
        Reply(tool_calls=[("terminal", {"command": "rm -r granted"})]),
        Reply(tool_calls=[("terminal", {"command": "find . -name '*.tmp' -delete"})]),
        Reply(text="Cleaned."),
    )
    editor.editor.answers = ["deny", "once", "always"]
    session = editor.new_session(project)
    assert editor.prompt(session, "clean up") == "end_turn"
    assert (project / "rejected" / "file").exists()
    assert not (project / "granted").exists() and not (project / "old.tmp").exists()
    asked = editor.editor.permission_requests[-3:]
    announced = [ids for ids in _tool_calls(editor.editor.of(session))]
    assert [question.tool_call_id for question in asked] == announced
    assert "deletes a folder" in asked[0].content[-1].content.text
    assert yaml.safe_load((acp_home / "config.yaml").read_text())["approvals"]["always"] == ["find_delete"]

    # "always" holds for the next session too; an unanswered question is withdrawn by a cancel
    (project / "older.tmp").write_text("")
    loopback.add(
        Reply(tool_calls=[("terminal", {"command": "find . -name '*.tmp' -delete"})]),
        Reply(tool_calls=[("terminal", {"command": "rm -r withdrawn"})]),
    )
    editor.editor.answers = ["hold"]
    questions = len(editor.editor.permission_requests)
    other = editor.new_session(project)
    pending = editor.start_prompt(other, "clean again")
    editor.editor.wait_for(lambda: len(editor.editor.permission_requests) == questions + 1)
    assert not (project / "older.tmp").exists()  # ran without asking
    editor.cancel(other)
    assert pending.result(10) == "cancelled"
    assert (project / "withdrawn" / "file").exists()
    with SessionStore.open(acp_home) as store:
        withdrawn = [m["content"] for m in store.load_messages(other) if m["role"] == "tool"][-1]
    assert withdrawn.startswith("not run: the turn was stopped before the question was answered")


def test_load_replays_an_editor_session_and_continues_it_but_refuses_other_sessions(
    editor: EditorProcess,
    loopback: ScriptedServer,
    project: Path,
    acp_home: Path,
    hooks: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from run_agent import AIAgent

    monkeypatch.syspath_prepend(str(hooks))

    (project / "a.txt").write_text("alpha\n")
    loopback.add(
        Reply(tool_calls=[("read_file", {"path": str(project / "a.txt")})]), Reply(text="It says alpha.")
    )
    with AIAgent(base_url=loopback.base_url, home=acp_home, source="acp") as earlier:
        earlier.chat("what is in a.txt?")
        stored_id = earlier.session_id
    with AIAgent(base_url=loopback.base_url, home=acp_home, source="cli") as chat:
        loopback.add(Reply(text="Private."))
        chat.chat("a chat of mine")
        chat_id = chat.session_id

    listed = editor.run(editor.conn.list_sessions()).sessions
    assert stored_id in [info.session_id for info in listed] and chat_id not in [i.session_id for i in listed]
    editor.load(stored_id, project)
    replayed = editor.editor.of(stored_id)
    assert kinds(replayed) == [
        "user_message_chunk",
        "tool_call:in_progress",
        "tool_call_update:completed",
        "agent_message_chunk",
    ]
    assert replayed[0].content.text == "what is in a.txt?" and answer_text(replayed) == "It says alpha."
    loopback.add(Reply(text="Still alpha."))
    assert editor.prompt(stored_id, "and now?") == "end_turn"
    assert [m["content"] for m in loopback.requests[-1].body["messages"] if m["role"] == "user"] == [
        "what is in a.txt?",
        "and now?",
    ]
    for refused in (chat_id, "no-such-session"):
        with pytest.raises(Exception, match="Invalid params"):
            editor.load(refused, project)
    assert editor.editor.of(chat_id) == []


def test_the_editors_mcp_servers_join_the_session_beside_the_users_own(
    editor: EditorProcess, loopback: ScriptedServer, project: Path, acp_home: Path
) -> None:
    from acp.schema import EnvVariable, McpServerStdio, SseMcpServer

    script = str(ROOT / "tests" / "mcp_test_server.py")
    literal = [EnvVariable(name="MIBYAN_SEEN", value="${HOME}")]  # the editor's words, not mibyan's $HOME
    server = McpServerStdio(name="py tools", command=sys.executable, args=[script], env=literal)
    streamed = SseMcpServer(type="sse", name="old-style", url="http://127.0.0.1:9/sse", headers=[])
    note = ("mcp__py-tools-2__note", {"path": str(project / "noted"), "text": "by the editor's server"})
    loopback.add(
        Reply(
            tool_calls=[
                ("mcp__py-tools-2__echo", {"text": "said by the editor's server"}),
                ("mcp__py-tools-2__variable", {"name": "MIBYAN_SEEN"}),
                note,
            ]
        ),
        Reply(tool_calls=[note]),
        Reply(text="Echoed."),
    )
    config = acp_home / "config.yaml"
    before = config.read_text()
    # the user's own server of the same name, trusted with `allow` and a secret: the editor's must not
    # take it over (it would run under that approval, with that env)
    own = {"command": sys.executable, "args": [script], "approval": "allow", "env": {"MIBYAN_SECRET": "x"}}
    # and an "always" given to another server of that name earlier is not the editor's server's
    earlier = {"always": ["mcp__py-tools-2__note"]}
    config.write_text(
        yaml.safe_dump({**yaml.safe_load(before), "mcp_servers": {"py-tools": own}, "approvals": earlier})
    )
    editor.editor.answers = ["always"]
    questions = len(editor.editor.permission_requests)
    try:
        session = editor.new_session(project, mcp_servers=[server, streamed])
    finally:
        config.write_text(before)
    assert editor.prompt(session, "echo it") == "end_turn"

    # asked once, "always" held for the session only: never saved for the next server of that name
    assert len(editor.editor.permission_requests) == questions + 1
    assert "mcp__py-tools-2" not in config.read_text() and (project / "noted").exists()
    offered = {tool["function"]["name"] for tool in loopback.requests[-2].body["tools"]}
    assert {"mcp__py-tools__echo", "mcp__py-tools-2__echo"} <= offered

    updates = editor.editor.of(session)
    call, *_ = _tool_calls(updates).values()
    assert kinds(call)[-1] == "tool_call_update:completed"
    assert "said by the editor's server" in call[-1].content[0].content.text
    results = [m["content"] for m in loopback.requests[-1].body["messages"] if m["role"] == "tool"]
    assert results[1] == "${HOME}"
    notices = [u.content.text for u in updates if u.session_update == "agent_thought_chunk"]
    assert any("old-style" in notice and "SSE" in notice for notice in notices)


def test_malformed_messages_are_answered_with_errors_and_the_process_lives(
    editor: EditorProcess, project: Path
) -> None:
    seen = len(editor.raw_lines)
    editor.send_raw(b"this is not json\n")
    editor.send_raw(b"[1, 2, 3]\n")
    editor.send_raw(b'{"jsonrpc": "2.0", "id": 7, "method": "session/prompt", "params": {"sessionId": 5}}\n')
    editor.editor.wait_for(lambda: len(editor.raw_lines) >= seen + 3)
    errors = [json.loads(line) for line in editor.raw_lines[seen:]]
    assert sorted((e["id"] is None, e["error"]["code"]) for e in errors) == [
        (False, -32602),
        (True, -32700),
        (True, -32600),
    ]
    assert editor.new_session(project)  # still answering


def test_without_a_key_mibyan_acp_says_so_in_one_line_before_any_message(home: Path) -> None:
    done = run_cli("acp", home=home, stdin='{"jsonrpc": "2.0", "id": 1, "method": "initialize"}\n')
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.count("\n") == 1 and "OPENAI_API_KEY" in done.stderr
