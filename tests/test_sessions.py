"""Sessions: stored as they happen, resumed, searched, and safe against crashes and concurrent writers."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import ROOT, run_cli, wait_until
from loopback import Reply, ScriptedServer

from agent_state import SessionStore
from mibyan.agent.messages import INTERRUPTED_RESULT, repair_history


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The test runs on SQLite in the home, then (`pytest -m postgres`) on a PostgreSQL database named by
    MIBYAN_STORE_URL, which the agents made in this process and the commands run by run_cli both use."""
    if request.param == "postgres":
        monkeypatch.setenv("MIBYAN_STORE_URL", request.getfixturevalue("pg_url"))
    return str(request.param)


def stored(home: Path, session_id: str) -> list[dict]:
    store = SessionStore.open(home)
    try:
        return store.load_messages(session_id)
    finally:
        store.close()


@pytest.mark.usefixtures("backend")
def test_every_message_is_stored_as_it_becomes_final(server: ScriptedServer, make_agent, home: Path) -> None:
    server.add(Reply(tool_calls=[("list_directory", {})]), Reply(text="listed"))
    agent = make_agent()

    result = agent.run_conversation("list please")

    assert stored(home, result["session_id"]) == result["messages"]
    row = SessionStore.open(home).get_session(result["session_id"])
    assert row["title"] == "list please"
    assert row["message_count"] == 4
    assert row["input_tokens"] == 20


@pytest.mark.usefixtures("backend")
def test_resume_continues_the_history_with_the_stored_system_prompt(
    server: ScriptedServer, make_agent
) -> None:
    server.add(Reply(text="first answer"), Reply(text="second answer"))
    first = make_agent().run_conversation(
        "remember the word teapot", system_message="You are a careful agent."
    )

    again = make_agent(session_id=first["session_id"])
    result = again.run_conversation("what was the word?")

    sent = server.requests[1].body["messages"]
    assert sent[0] == {"role": "system", "content": "You are a careful agent."}
    assert [m["content"] for m in sent[1:]] == [
        "remember the word teapot",
        "first answer",
        "what was the word?",
    ]
    assert result["session_id"] == first["session_id"]


@pytest.mark.usefixtures("backend")
def test_a_passed_history_becomes_the_stored_history(server: ScriptedServer, make_agent, home: Path) -> None:
    server.add(Reply(text="continued"))
    history = [
        {"role": "system", "content": "imported prompt"},
        {"role": "user", "content": "old question"},
        {"role": "assistant", "content": "old answer"},
    ]

    result = make_agent().run_conversation("new question", conversation_history=history)

    assert [m["content"] for m in stored(home, result["session_id"])] == [
        "old question",
        "old answer",
        "new question",
        "continued",
    ]
    assert server.requests[0].body["messages"][0]["content"] == "imported prompt"


def test_secrets_are_masked_before_they_are_stored(server: ScriptedServer, make_agent, home: Path) -> None:
    server.add(Reply(text="noted"))
    key = "sk-proj-" + "a1B2c3D4e5" * 4

    result = make_agent().run_conversation(f"my key is {key}, keep it safe")

    assert key in server.requests[0].body["messages"][-1]["content"]  # the model still sees it
    text = (home / "state.db").read_bytes()
    assert key.encode() not in text
    assert key not in stored(home, result["session_id"])[0]["content"]


def test_the_home_and_database_are_private(server: ScriptedServer, make_agent, tmp_path: Path) -> None:
    server.add(Reply(text="hi"))
    home = tmp_path / "fresh-home"
    make_agent(home=home).chat("hello")
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE((home / "state.db").stat().st_mode) == 0o600


@pytest.mark.usefixtures("backend")
def test_model_can_search_past_sessions(server: ScriptedServer, make_agent) -> None:
    server.add(Reply(text="The deploy command is make ship-it."))
    make_agent().chat("how do we deploy the flamingo service?")
    server.add(Reply(tool_calls=[("session_search", {"query": "flamingo deploy"})]), Reply(text="found it"))

    result = make_agent().run_conversation("what did we say about flamingo?")

    tool_result = next(m for m in result["messages"] if m["role"] == "tool")
    assert "[flamingo]" in tool_result["content"]
    assert "how do we [deploy] the [flamingo] service?" in tool_result["content"]


def test_a_corrupt_database_is_one_clear_error_and_left_untouched(home: Path) -> None:
    garbage = b"this is not a database" * 100
    (home / "state.db").write_bytes(garbage)
    (home / "state.db").chmod(0o600)

    done = run_cli("chat", "-q", "hi", "--base-url", "http://127.0.0.1:9/v1", home=home)

    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert str(home / "state.db") in done.stderr
    assert (home / "state.db").read_bytes() == garbage


def test_kill_during_a_tool_round_then_resume(server: ScriptedServer, home: Path, tmp_path: Path) -> None:
    server.add(
        Reply(
            text="Let me read it.",
            # a tool that hangs (read_file refuses a pipe at once, so it cannot be the one)
            tool_calls=[("terminal", {"command": "sleep 10"}), ("list_directory", {"path": str(tmp_path)})],
        )
    )
    env = {**os.environ, "MIBYAN_HOME": str(home), "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mibyan.cli.main",
            "chat",
            "-q",
            "read the pipe",
            "--base-url",
            server.base_url,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:

        def stored_roles() -> list[tuple[str]]:
            if not (home / "state.db").exists():
                return []
            db = sqlite3.connect(home / "state.db")
            try:
                return db.execute("SELECT role FROM messages ORDER BY id").fetchall()
            except sqlite3.OperationalError:  # the schema is still being created
                return []
            finally:
                db.close()

        wait_until(lambda: len(stored_roles()) >= 2, timeout=20)
        process.send_signal(signal.SIGKILL)
        process.wait(10)
    finally:
        process.kill()
    server.add(Reply(text="resumed fine"))

    done = run_cli("chat", "--resume", "-q", "are you still there?", "--base-url", server.base_url, home=home)

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("resumed fine")
    sent = server.requests[-1].body["messages"][1:]
    assert repair_history(sent)[1] == []
    assert sent[0]["content"] == "read the pipe"
    assert sent[1]["content"] == "Let me read it."
    assert next(m["content"] for m in sent if m["role"] == "tool") == INTERRUPTED_RESULT


@pytest.mark.usefixtures("backend")
def test_two_processes_write_to_one_store_at_once(server: ScriptedServer, home: Path) -> None:
    def script(body: dict) -> Reply:
        tools = sum(1 for m in body["messages"] if m["role"] == "tool")
        return Reply(text="done") if tools >= 8 else Reply(tool_calls=[("list_directory", {})])

    server.default = script
    results: list[subprocess.CompletedProcess[str]] = []
    threads = [
        threading.Thread(
            target=lambda i=i: results.append(
                run_cli("chat", "-q", f"writer {i}", "--base-url", server.base_url, "-Q", home=home)
            )
        )
        for i in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
    store = SessionStore.open(home)
    sessions = store.list_sessions()
    assert len(sessions) == 2
    for row in sessions:
        assert row["message_count"] == len(store.load_messages(row["id"])) == 18


@pytest.mark.usefixtures("backend")
def test_sessions_cli_lists_shows_searches_exports_renames_and_deletes(
    server: ScriptedServer, make_agent, home: Path
) -> None:
    server.add(Reply(text="Pelicans can hold three gallons."), Reply(text="Herons are patient."))
    for said in ("tell me about pelicans", "tell me about herons"):  # two sessions to work on
        with make_agent() as agent:
            agent.chat(said)
    store = SessionStore.open(home)
    newest, oldest = (row["id"] for row in store.list_sessions())

    listing = run_cli("sessions", "list", home=home)
    assert listing.returncode == 0
    assert listing.stdout.index("herons") < listing.stdout.index("pelicans")

    found = run_cli("sessions", "search", "gallons", home=home)
    assert found.returncode == 0 and oldest in found.stdout and "[gallons]" in found.stdout
    assert run_cli("sessions", "search", "gallons", "--role", "user", home=home).returncode == 1

    shown = run_cli("sessions", "show", oldest[:6], home=home)
    assert "Pelicans can hold" in shown.stdout

    exported = run_cli("sessions", "export", oldest, home=home)
    assert [line.count('"role"') for line in exported.stdout.splitlines()] == [1, 1]

    assert run_cli("sessions", "rename", newest, "Bird", "notes", home=home).returncode == 0
    assert "Bird notes" in run_cli("sessions", "list", home=home).stdout

    deleted = run_cli("sessions", "delete", oldest, "--yes", home=home)
    assert deleted.returncode == 0
    assert store.get_session(oldest) is None and store.load_messages(oldest) == []
    assert run_cli("sessions", "show", oldest, home=home).returncode == 2


@pytest.mark.usefixtures("backend")
def test_resume_of_an_unknown_session_is_a_clear_error(home: Path) -> None:
    done = run_cli("chat", "--resume", "nosuch", "-q", "hi", "--base-url", "http://127.0.0.1:9/v1", home=home)
    assert done.returncode == 2
    assert "no session 'nosuch'" in done.stderr


@pytest.mark.parametrize("flag", [["--resume"], ["-c"]])
@pytest.mark.usefixtures("backend")
def test_continue_picks_the_most_recent_chat_session_never_a_gateways(
    server: ScriptedServer, make_agent, home: Path, flag: list[str]
) -> None:
    server.add(*(Reply(text=text) for text in ("one", "two", "private", "by a script", "three")))
    # earlier sessions, made in-process: two chats, then a gateway's channel and a script's run, later
    for said, source in (("first", "cli"), ("second", "cli"), ("my diagnosis", "gateway"), ("x", "python")):
        with make_agent(source=source) as agent:
            agent.chat(said)
    done = run_cli("chat", *flag, "-q", "third", "--base-url", server.base_url, home=home)
    assert done.returncode == 0
    assert [m["content"] for m in server.requests[-1].body["messages"][1:]] == ["second", "two", "third"]


@pytest.mark.usefixtures("backend")
def test_a_finished_one_shot_is_listed_ended_and_ends_again_when_resumed(
    server: ScriptedServer, make_agent, home: Path
) -> None:
    server.add(Reply(text="one"), Reply(text="going on"), Reply(text="two"))
    url = ["--base-url", server.base_url]

    def listed() -> dict:
        [row] = json.loads(run_cli("sessions", "list", "--json", home=home).stdout)
        return row

    assert run_cli("chat", "-q", "first", *url, home=home).returncode == 0
    ended = listed()
    assert ended["end_reason"] == "completed" and ended["ended_at"] >= ended["created_at"]
    with make_agent(session_id=ended["id"]) as agent:  # going on in a chat that has not ended
        agent.chat("more")
    assert (listed()["ended_at"], listed()["end_reason"]) == (None, None)
    assert run_cli("chat", "-c", "-q", "second", *url, home=home).returncode == 0
    again = listed()
    assert again["id"] == ended["id"] and again["ended_at"] > ended["ended_at"]


def test_a_new_home_is_private_from_the_cli(server: ScriptedServer, tmp_path: Path) -> None:
    server.add(Reply(text="hi"))
    home = tmp_path / "brand" / "new-home"
    done = run_cli("chat", "-q", "hello", "--base-url", server.base_url, home=home)
    assert done.returncode == 0, done.stderr
    for folder in (home, home / "logs"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    assert stat.S_IMODE((home / "state.db").stat().st_mode) == 0o600


def test_a_locked_database_is_one_clear_error_not_a_hang(
    server: ScriptedServer, make_agent, home: Path
) -> None:
    server.add(Reply(text="first"), Reply(text="second"))
    with make_agent(source="cli") as agent:  # a chat to continue
        agent.chat("first")
    holder = sqlite3.connect(home / "state.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        done = run_cli(
            "chat",
            "-c",
            "-q",
            "second",
            "--base-url",
            server.base_url,
            "-Q",
            home=home,
            env={"MIBYAN_BUSY_TIMEOUT": "0.1"},  # three attempts of 0.1 s, not of 5 s
        )
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert done.returncode == 1  # a runtime failure: the turn could not be stored
    assert done.stderr.strip().splitlines()[-1].endswith("database is locked")
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["list", "-n", "-1"], "argument -n/--limit: must be at least 1, not -1"),
        (["search", "x", "-n", "0"], "argument -n/--limit: must be at least 1, not 0"),
        (["show", ""], "argument id: the session id is empty"),
        (["export", " "], "argument id: the session id is empty"),
        (["search", ""], "the search query '' has no words to search for"),
        (["search", "!?"], "the search query '!?' has no words to search for"),
    ],
)
def test_sessions_commands_refuse_input_that_means_nothing(
    home: Path, args: list[str], expected: str
) -> None:
    done = run_cli("sessions", *args, home=home)
    assert done.returncode == 2
    assert done.stderr.startswith(f"mibyan: error: {expected}")
    assert len(done.stderr.splitlines()) == 1 and done.stdout == ""


@pytest.mark.usefixtures("backend")
def test_sessions_list_show_and_search_print_json(server: ScriptedServer, make_agent, home: Path) -> None:
    server.add(Reply(text="Pelicans can hold three gallons."))
    with make_agent() as agent:  # a session to show
        agent.chat("tell me about pelicans")
    listing = json.loads(run_cli("sessions", "list", "--json", home=home).stdout)
    assert [row["message_count"] for row in listing] == [2]
    assert {"id", "title", "source", "model", "created_at", "updated_at", "input_tokens"} <= set(listing[0])
    session_id = listing[0]["id"]

    shown = json.loads(run_cli("sessions", "show", session_id[:5], "--json", home=home).stdout)
    assert shown["id"] == session_id
    assert [(m["role"], m["content"]) for m in shown["messages"]] == [
        ("user", "tell me about pelicans"),
        ("assistant", "Pelicans can hold three gallons."),
    ]

    found = run_cli("sessions", "search", "gallons", "--json", home=home)
    hits = json.loads(found.stdout)
    assert found.returncode == 0 and [(h["session_id"], h["seq"], h["role"]) for h in hits] == [
        (session_id, 1, "assistant")
    ]
    assert "[gallons]" in hits[0]["snippet"]
    nothing = run_cli("sessions", "search", "zebras", "--json", home=home)
    assert nothing.returncode == 1 and json.loads(nothing.stdout) == []


@pytest.mark.parametrize("args", [["sessions", "list"], ["sessions", "search", "word"]])
def test_sessions_commands_import_no_configuration_or_sdk(home: Path, args: list[str]) -> None:
    code = (
        "import sys\nfrom mibyan.cli.main import main\nmain(sys.argv[1:])\n"
        "print(sorted(m for m in ('pydantic', 'yaml', 'openai', 'anthropic', 'rich', 'prompt_toolkit')"
        " if m in sys.modules))"
    )
    env = {**os.environ, "MIBYAN_HOME": str(home), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT, env=env
    )
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stderr


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"role": "robot", "content": "beep"}, "conversation_history[1]: unknown role 'robot'"),
        ({"content": "no role"}, "conversation_history[1]: unknown role None"),
        ("just text", "conversation_history[1]: a message must be a dict"),
        ({"role": "tool", "content": "x"}, "conversation_history[1].tool_call_id: a tool message needs"),
        (
            {"role": "assistant", "content": None, "tool_calls": "garbage"},
            "conversation_history[1].tool_calls: must be a list of tool calls, not str",
        ),
        (
            {"role": "assistant", "content": None, "tool_calls": [1, 2]},
            "conversation_history[1].tool_calls[0]: must be an object",
        ),
        (
            {"role": "assistant", "tool_calls": [{"function": {"name": "x", "arguments": "{}"}}]},
            "conversation_history[1].tool_calls[0].id: must be a non-empty string",
        ),
        ({"role": "assistant", "content": 5}, "conversation_history[1].content: must be a string"),
        ({"role": "user", "content": None}, "conversation_history[1].content: must be a string"),
    ],
)
def test_a_history_entry_that_is_not_a_message_is_refused_in_one_line(
    server: ScriptedServer, make_agent, entry: object, expected: str
) -> None:
    agent = make_agent()
    history = [{"role": "user", "content": "hi"}, entry]
    with pytest.raises(ValueError) as caught:
        agent.run_conversation("next", conversation_history=history)
    assert str(caught.value).startswith(expected)
    assert "\n" not in str(caught.value)
    assert server.requests == []


@pytest.mark.usefixtures("backend")
def test_continue_turn_goes_on_from_the_stored_turn_without_a_new_user_message(
    server: ScriptedServer, make_agent
) -> None:
    server.add(Reply(status=500, error_body={"error": {"message": "down"}}), Reply(text="there you are"))
    with make_agent() as cut:
        assert cut.run_conversation("are you there?")["exit_reason"] == "error"
        session = cut.session_id
    with make_agent(session_id=session) as resumed:
        result = resumed.continue_turn()
        assert result["final_response"] == "there you are"
        assert [m["content"] for m in resumed.history] == ["are you there?", "there you are"]
    with make_agent(session_id=session) as again:  # its answer is stored: nothing to ask the model
        assert again.continue_turn()["final_response"] == "there you are"
    assert len(server.requests) == 2
    assert [m["content"] for m in server.requests[1].body["messages"][1:]] == ["are you there?"]


_OTHER_PROCESS_WRITES = """
import sys
from agent_state import SessionStore
store = SessionStore.open(__import__("pathlib").Path(sys.argv[1]))
if sys.argv[2] == "append":
    store.messages.append("s-known", {"role": "assistant", "content": "from the other process"})
else:  # as many messages as before, other words: only the session's updated_at tells
    rewritten = [{"role": "user", "content": "rewritten"}, {"role": "assistant", "content": "too"}]
    store.messages.replace("s-known", rewritten)
store.close()
"""


@pytest.mark.usefixtures("backend")
def test_a_history_read_again_is_what_any_process_stored_since(home: Path) -> None:
    """A process keeps the histories it read (a gateway reads a channel's at each message): what another
    process appended, or rewrote to as many messages, is read, never the history kept from before."""
    store = SessionStore.open(home)
    try:
        store.messages.append("s-known", {"role": "user", "content": "hi"}, create={"source": "python"})
        assert [m["content"] for m in store.messages.load("s-known")] == ["hi"]
        for step, expected in (
            ("append", ["hi", "from the other process"]),
            ("replace", ["rewritten", "too"]),
        ):
            subprocess.run(
                [sys.executable, "-c", _OTHER_PROCESS_WRITES, str(home), step],
                cwd=ROOT,
                check=True,
                timeout=60,
            )
            assert [m["content"] for m in store.messages.load("s-known")] == expected
        # what this process appends is read back as stored (masked), and a copy the caller may change
        store.messages.append("s-known", {"role": "user", "content": "key sk-proj-abcdefghijklmnopqrstuvwx"})
        loaded = store.messages.load("s-known")
        assert "abcdefghijklmnopqrstuvwx" not in loaded[-1]["content"]
        loaded[0]["content"] = "changed by the caller"
        assert store.messages.load("s-known")[0]["content"] == "rewritten"
    finally:
        store.close()


def test_the_stores_of_one_process_share_one_connection_to_the_home(home: Path) -> None:
    """A gateway opens a store at each run: one connection in all, opened once, and still good for the
    stores open when another closes; a home removed and made again is opened anew."""

    def connections() -> int:
        return sum(
            1
            for fd in Path("/proc/self/fd").iterdir()
            if os.path.realpath(fd) == str((home / "state.db").resolve())
        )

    stores = [SessionStore.open(home) for _ in range(5)]
    assert connections() == 1
    stores[0].messages.append("s-shared", {"role": "user", "content": "hi"}, create={"source": "python"})
    for store in stores[:-1]:
        store.close()
    assert [m["content"] for m in stores[-1].messages.load("s-shared")] == ["hi"]
    (home / "state.db").unlink()
    again = SessionStore.open(home)
    try:
        assert again.messages.load("s-shared") == []
        assert again.sessions.get("s-shared") is None
    finally:
        again.close()
        stores[-1].close()
    assert connections() == 0


_HOLDS_THE_WRITE_LOCK = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
print("held", flush=True)
sys.stdin.readline()
db.execute("ROLLBACK")
"""


def test_a_write_waiting_for_another_processs_lock_holds_up_no_read_of_this_process(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stores of a process share one connection: a run waiting for another process's write lock
    lets the connection go between its tries, so every other run reads meanwhile (and then writes)."""
    monkeypatch.setenv("MIBYAN_BUSY_TIMEOUT", "5")
    reader, writer = SessionStore.open(home), SessionStore.open(home)
    reader.messages.append("s-waits", {"role": "user", "content": "hi"}, create={"source": "python"})
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDS_THE_WRITE_LOCK, str(home / "state.db")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        appended = threading.Thread(
            target=writer.messages.append, args=("s-waits", {"role": "assistant", "content": "later"})
        )
        appended.start()
        for _ in range(50):  # while the write waits (it cannot end before the lock is let go)
            assert [m["content"] for m in reader.messages.load("s-waits")] == ["hi"]
        assert appended.is_alive()
    finally:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.close()
        holder.wait(timeout=60)
    appended.join()
    assert [m["content"] for m in reader.messages.load("s-waits")] == ["hi", "later"]
    reader.close()
    writer.close()
