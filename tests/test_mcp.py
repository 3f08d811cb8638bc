"""MCP servers as tools: a test server over streamable HTTP (in this process) and over stdio (a program).

The model is the scripted loopback server; everything between it and the MCP servers is mibyan's.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from conftest import run_in_background
from loopback import Reply, ScriptedServer

if TYPE_CHECKING:
    from mcp_test_server import Record

SERVER_SCRIPT = str(Path(__file__).with_name("mcp_test_server.py"))
RAW_SERVER = str(Path(__file__).with_name("mcp_raw_server.py"))


@pytest.fixture(scope="module")
def record() -> Record:
    from mcp_test_server import Record  # the SDK, imported by the tests that use it only

    return Record()


@pytest.fixture(scope="module")
def mcp_url(record: Record) -> Iterator[str]:
    from mcp_test_server import serving_http

    with serving_http(record) as url:
        yield url


def tool_results(result: dict[str, Any]) -> list[str]:
    return [m["content"] for m in result["messages"] if m["role"] == "tool"]


def offered(server: ScriptedServer, index: int = 0) -> dict[str, Any]:
    return {t["function"]["name"]: t["function"] for t in server.requests[index].body.get("tools", [])}


def test_tools_run_and_their_results_reach_the_model(
    server: ScriptedServer, make_agent: Callable[..., Any], mcp_url: str
) -> None:
    server.add(
        Reply(
            tool_calls=[
                ("mcp__web__echo", {"text": "hello \x1b[2J"}),
                ("mcp__web__numbers", {}),
                ("mcp__web__picture", {}),
                ("mcp__web__fail", {"reason": "no such record"}),
            ]
        ),
        Reply(tool_calls=[("mcp__web__fail", {"reason": "still none"})]),
        Reply(text="done"),
    )
    with make_agent(mcp_servers={"web": {"url": mcp_url}}, max_tool_failures=2) as agent:
        result = agent.run_conversation("go")
    from mcp_test_server import PNG

    echo, numbers, picture, failed, failed_again = tool_results(result)
    assert echo == "hello \x1b[2J"  # the model gets the text as it is; terminals get it escaped
    assert json.loads(numbers) == {"sum": 3, "items": [1, 2]}
    assert picture == f"[image from the tool: image/png, about {len(PNG):,} bytes, not shown]"
    assert failed == "error: Error executing tool fail: no such record"
    assert (
        failed_again.startswith("error: Error executing tool fail: still none")
        and "has failed 2 times in a row" in failed_again
    )
    schema = offered(server)["mcp__web__echo"]
    assert schema["description"] == "Say the text back."
    assert schema["parameters"]["properties"]["text"]["type"] == "string"


def test_approval_is_per_server_and_read_only_tools_are_not_asked(
    server: ScriptedServer, make_agent: Callable[..., Any], mcp_url: str, tmp_path: Path, home: Path
) -> None:
    asked: list[tuple[str, str]] = []
    servers: dict[str, dict[str, str]] = {n: {"url": mcp_url, "approval": n} for n in ("allow", "deny")}
    servers["ask"] = {"url": mcp_url}  # ask, the default: nothing of the configured one below carries over
    with (home / "config.yaml").open("a") as config:
        config.write('mcp_servers:\n  ask: {url: "http://127.0.0.1:9/mcp", approval: allow}\n')
    calls = [
        ("mcp__ask__echo", {"text": "read-only"}),
        ("mcp__ask__note", {"path": str(tmp_path / "asked"), "text": "\x1b[2J"}),
        ("mcp__allow__note", {"path": str(tmp_path / "allowed"), "text": "yy"}),
        ("mcp__deny__echo", {"text": "even this"}),
    ]
    again = ("mcp__ask__note", {"path": str(tmp_path / "asked again"), "text": "x"})
    server.add(Reply(tool_calls=calls), Reply(tool_calls=[again]), Reply(text="done"))
    answers = iter(["deny", "session"])

    def approve(command: str, reason: str) -> str:
        asked.append((command, reason))
        return next(answers)

    with make_agent(mcp_servers=servers, approval_callback=approve) as agent:
        result = agent.run_conversation("go")
    echo, refused, allowed, denied, approved = tool_results(result)
    assert echo == "read-only"
    assert refused.startswith("denied by user") and not (tmp_path / "asked").exists()
    assert allowed == "wrote 2 characters"
    assert denied.startswith("error: not run: the tools of the MCP server 'deny' are denied")
    assert approved == "wrote 1 characters" and (tmp_path / "asked again").read_text() == "x"
    command, reason = asked[0]
    assert command.startswith("MCP server ask › mcp__ask__note\n") and str(tmp_path / "asked") in command
    assert reason == "runs mcp__ask__note, a tool of the MCP server 'ask'"
    from mibyan.cli.prompts import approval_question

    shown = approval_question(command, reason)  # what the terminal shows: no escape sequence acts
    assert "\x1b" not in shown and '"text": "\\u001b[2J"' in shown
    assert len(asked) == 2  # the "session" answer covers that tool from then on; read-only ones never ask


def test_include_exclude_and_names_a_provider_accepts(
    server: ScriptedServer, make_agent: Callable[..., Any], mcp_url: str
) -> None:
    filters = {"include": ["echo", "note", "odd*"], "exclude": ["note"]}
    server.add(Reply(tool_calls=[("mcp__web__note", {"path": "x", "text": "y"})]), Reply(text="done"))
    with make_agent(mcp_servers={"web": {"url": mcp_url, "tools": filters}}) as agent:
        result = agent.run_conversation("go")
    names = sorted(name for name in offered(server) if name.startswith("mcp__"))
    assert names[0] == "mcp__web__echo" and len(names) == 2
    odd = names[1]
    assert len(odd) == 64 and odd.startswith("mcp__web__odd_name_with_spacexxx")
    assert all(c.isalnum() or c in "_-" for c in odd)
    assert tool_results(result) == ["error: unknown tool 'mcp__web__note'"]


def test_a_broken_or_hanging_server_is_one_line_and_the_run_goes_on(
    server: ScriptedServer, make_agent: Callable[..., Any], mcp_url: str, home: Path
) -> None:
    (home / "config.yaml").write_text("agent: {api_max_retries: 0}\nmcp: {start_timeout: 2}\n")
    notes: list[str] = []
    servers = {
        "missing": {"command": "/nonexistent/mcp-server"},
        "hangs": {"command": "sh", "args": ["-c", "echo not json; exec sleep 60"]},
        "nokey": {"url": mcp_url, "headers": {"Authorization": "Bearer ${MIBYAN_UNSET_TOKEN}"}},
        "web": {"url": mcp_url},
    }
    server.add(Reply(tool_calls=[("mcp__web__echo", {"text": "fine"})]), Reply(text="done"))
    with make_agent(mcp_servers=servers, status_callback=lambda kind, text: notes.append(text)) as agent:
        result = agent.run_conversation("go")
        hung = agent.tools.mcp.connections.servers["hangs"].pid
    assert result["completed"] and tool_results(result) == ["fine"]
    assert sorted(n for n in notes if "MCP" in n) == [
        "MCP server 'hangs' is left out: did not start within 2 s",
        "MCP server 'missing' is left out: cannot start /nonexistent/mcp-server: not found",
        "MCP server 'nokey' is left out: mcp_servers.nokey.headers.Authorization: ${MIBYAN_UNSET_TOKEN} "
        "is not set in the environment",
    ]
    assert hung is not None and not process_alive(hung)


def test_a_tool_with_an_invalid_schema_is_left_out_and_named_and_the_others_work(
    server: ScriptedServer, make_agent: Callable[..., Any]
) -> None:
    from mibyan.cli.mcp import describe

    notes: list[str] = []
    server.add(Reply(tool_calls=[("mcp__raw__echo", {"text": "still works"})]), Reply(text="done"))
    servers = {"raw": {"command": sys.executable, "args": [RAW_SERVER], "approval": "allow"}}
    with make_agent(mcp_servers=servers, status_callback=lambda kind, text: notes.append(text)) as agent:
        result = agent.run_conversation("go")
        listed = describe(agent.tools.mcp.connections)  # what `mibyan mcp list` and /mcp show
    server.add(Reply(text="done"))
    with make_agent(mcp_servers=servers, status_callback=lambda kind, text: notes.append(text)) as agent:
        agent.run_conversation("again")  # its first request offers the tools from the cache
    assert tool_results(result) == ["still works"]
    assert {n for n in offered(server) if n.startswith("mcp__")} == {"mcp__raw__echo"}
    assert {n for n in offered(server, -1) if n.startswith("mcp__")} == {"mcp__raw__echo"}
    why = "inputSchema: Input should be a valid dictionary"
    assert [n for n in notes if "MCP" in n] == [
        f"MCP server 'raw': tools left out, not valid: 'broken' ({why})"
    ] * 2  # by each run, the next one from what the cache remembers
    assert listed[0].startswith("raw  [ready]")
    assert f"    broken  (left out, not a valid tool: {why})" in listed


def test_the_mcp_tools_offered_are_capped_and_what_is_left_out_is_named(
    server: ScriptedServer, make_agent: Callable[..., Any], home: Path
) -> None:
    (home / "config.yaml").write_text("mcp: {max_tools: 3}\n")

    def listing(count: int) -> dict[str, Any]:
        return {"command": sys.executable, "args": [RAW_SERVER], "env": {"MIBYAN_RAW_TOOLS": str(count)}}

    notes: list[str] = []
    server.add(Reply(text="done"))
    servers = {"a": listing(4), "b": listing(300)}  # b lists more than a server's tools that are read
    with make_agent(mcp_servers=servers, status_callback=lambda k, m: notes.append(m)) as agent:
        agent.run_conversation("go")
    mcp_tools = {n for n in offered(server) if n.startswith("mcp__")}
    assert mcp_tools == {"mcp__a__echo", "mcp__a__echo0", "mcp__a__echo1"}
    assert [n for n in notes if "max_tools" in n] == [
        "258 MCP tools left out, past mcp.max_tools (3): 2 of 'a', 256 of 'b' (and what it lists past its "
        "first 256)"
    ]


def test_without_the_sdk_a_configured_server_is_one_line(
    server: ScriptedServer, make_agent: Callable[..., Any], mcp_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "mcp", None)  # as if `mibyan[mcp]` was not installed
    notes: list[str] = []
    server.add(Reply(text="done"))
    with make_agent(
        mcp_servers={"web": {"url": mcp_url}}, status_callback=lambda k, m: notes.append(m)
    ) as agent:
        result = agent.run_conversation("go")
    assert result["completed"] and not any(name.startswith("mcp__") for name in offered(server))
    assert notes == [
        "MCP servers configured (web) but the mcp package is not installed (pip install 'mibyan[mcp]'): "
        "going on without them"
    ]


def test_a_call_times_out_or_is_interrupted_and_the_server_stays_usable(
    server: ScriptedServer, make_agent: Callable[..., Any], mcp_url: str, record: Record
) -> None:
    servers = {"web": {"url": mcp_url}, "quick": {"url": mcp_url, "timeout": 0.3}}
    server.add(Reply(tool_calls=[("mcp__quick__wait", {"seconds": 30})]), Reply(text="timed out"))
    server.add(Reply(tool_calls=[("mcp__web__wait", {"seconds": 30})]))
    server.add(Reply(tool_calls=[("mcp__web__echo", {"text": "still here"})]), Reply(text="done"))
    with make_agent(mcp_servers=servers) as agent:
        timed_out = agent.run_conversation("first")
        assert record.cancelled.wait(30)  # a call that timed out is cancelled on the server too
        record.waiting.clear()
        record.cancelled.clear()
        worker, outcome = run_in_background(agent, "second")
        assert record.waiting.wait(30)
        agent.interrupt()
        worker.join(30)
        after = agent.run_conversation("third")
    assert tool_results(timed_out) == ["error: MCP server 'quick' did not answer within 0.3 s"]
    assert outcome["interrupted"]
    assert record.cancelled.wait(30)  # the server was told the call was cancelled
    assert tool_results(after)[-1] == "still here"


def test_subagents_share_the_parents_server_approvals_and_denials_and_a_server_that_exits_is_left_out(
    server: ScriptedServer, make_agent: Callable[..., Any], tmp_path: Path
) -> None:
    def note(name: str) -> tuple[str, dict[str, Any]]:
        return ("mcp__py__note", {"path": str(tmp_path / name), "text": name})

    parent = [note("parent"), ("mcp__py__instance", {}), ("delegate_task", {"goal": "note, then who"})]
    parent += [("mcp__py__quit", {}), ("mcp__py__instance", {})]
    child = [note("child"), ("mcp__py__instance", {})]

    def reply(body: dict[str, Any]) -> Reply:
        results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
        users = [str(m.get("content")) for m in body["messages"] if m["role"] == "user"]
        script = child if users[0].startswith("Task: ") else parent
        if len(results) < len(script):
            return Reply(tool_calls=[script[len(results)]])
        return Reply(text=f"child: {results}" if script is child else "done")

    server.default = reply
    asked: list[str] = []
    notes: list[str] = []
    servers = {"py": {"command": sys.executable, "args": [SERVER_SCRIPT]}}
    with make_agent(
        mcp_servers=servers,
        denied_tools=["mcp__py__echo"],
        approval_callback=lambda command, reason: asked.append(command) or "session",
        status_callback=lambda kind, text: notes.append(text),
    ) as agent:
        result = agent.run_conversation("go")
        pid = agent.tools.mcp.connections.servers["py"].pid
    _wrote, parent_saw, report, crashed, after = tool_results(result)
    child_request = next(i for i, r in enumerate(server.requests) if "Task: " in str(r.body["messages"]))
    assert {"mcp__py__note", "mcp__py__instance"} <= set(offered(server, child_request))
    assert "mcp__py__echo" not in offered(server, 0) | offered(server, child_request)  # denied to both
    assert f"'{parent_saw}'" in report  # one process served both agents
    assert (tmp_path / "child").read_text() == "child" and len(asked) == 1  # the session's answer held
    assert crashed == "error: MCP server 'py': MCPError: Connection closed"
    assert after == "error: unknown tool 'mcp__py__instance'"  # offered no more
    assert "MCP server 'py' is left out: the server exited" in notes
    assert not process_alive(pid)


def test_mcp_list_shows_each_server_its_state_and_its_tools(
    mcp_url: str, home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from mibyan.cli.main import run_command

    servers = {
        "web": {"url": mcp_url, "tools": {"exclude": ["odd*"]}},
        "missing": {"command": "/nonexistent/mcp-server"},
    }
    (home / "config.yaml").write_text(json.dumps({"mcp_servers": servers}))
    monkeypatch.setenv("MIBYAN_HOME", str(home))
    log = logging.getLogger("mibyan")  # the command sets up its log file: undone after the test
    for attribute in ("handlers", "propagate", "level"):
        monkeypatch.setattr(log, attribute, copy.copy(getattr(log, attribute)))
    assert run_command(["mcp", "list"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[0] == f"web  [ready]  {mcp_url}  (approval: ask)"
    assert "    mcp__web__echo  (read-only)  Say the text back." in shown
    assert "    mcp__web__note  Write the text into the file at path." in shown
    assert "    (1 more left out by tools.include/exclude)" in shown
    assert shown[-2:] == [
        "missing  [failed]  /nonexistent/mcp-server  (approval: ask)",
        "    cannot start /nonexistent/mcp-server: not found",
    ]


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead, only not reaped yet
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ")[-1][:1] != "Z"


def test_a_command_dressed_as_an_mcp_call_does_not_borrow_its_approval() -> None:
    from mibyan.tools.approval import (
        ApprovalPolicy,
        ApprovalRequest,
        classify_command,
        mcp_subject,
        mcp_verdict,
    )

    def mcp_call(name: str) -> ApprovalRequest:
        return ApprovalRequest("call_1", name, mcp_subject("a", name, "{}"), mcp_verdict("a", name))

    policy = ApprovalPolicy(
        ask=None, yolo=False, always=["mcp__a__b"], timeout=1, save_always=lambda key: None
    )
    assert policy.answer_from_session(mcp_call("mcp__a__b")) == "once"
    assert policy.answer_from_session(mcp_call("mcp__a__c")) == "deny"
    disguised = "MCP server a › mcp__a__b\nrm -rf ~/work"
    command = ApprovalRequest("call_2", "terminal", disguised, classify_command(disguised))
    assert policy.answer_from_session(command) == "deny"


def test_connections_without_servers_start_nothing_and_never_load_the_sdk(tmp_path: Path) -> None:
    # a gateway agent that names no server shares such connections: its first run must not pay for
    # importing the SDK (a third of a second), so it is checked in a fresh interpreter
    import subprocess

    code = (
        "import sys; from pathlib import Path; from mibyan.tools.mcp_connections import McpConnections; "
        "c = McpConnections({}, home=Path(sys.argv[1]), start_timeout=1); c.start(); c.close(); "
        "print(sorted(m for m in sys.modules if m == 'mcp' or m.startswith('mcp.')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_a_servers_stderr_reaches_the_log_with_its_escapes_made_visible(home: Path) -> None:
    from conftest import wait_until

    from mibyan.config.mcp import McpServerSettings
    from mibyan.tools.mcp_connections import McpConnections

    hostile = "printf 'boom \\033[2J\\033]0;owned\\007\\n' >&2; exit 1"
    flood = "yes 0123456789 | head -c 9000000 >&2; exit 1"  # 9 MB: more than is logged of one start
    servers = {
        "loud": McpServerSettings(command="sh", args=["-c", hostile]),
        "flood": McpServerSettings(command="sh", args=["-c", flood]),
    }
    with McpConnections(servers, home=home, start_timeout=10) as connections:
        assert connections.wait_settled(timeout=30)
    log = home / "logs" / "mcp.log"
    assert wait_until(
        lambda: log.exists() and b"not logged" in log.read_bytes() and b"boom" in log.read_bytes()
    )
    lines = log.read_bytes().splitlines()
    assert b"loud: boom \\x1b[2J\\x1b]0;owned\\x07" in lines and b"\x1b" not in log.read_bytes()
    assert b"flood: (the rest of its stderr is not logged: past 8 MB)" in lines
    assert 8_000_000 < log.stat().st_size < 8_500_000


def test_a_failure_at_the_last_start_is_named_once_by_the_runs_sharing_a_servers_connections(
    home: Path,
) -> None:
    # a gateway agent's runs and a subagent share their owner's connections: the owner says it
    from mibyan.config.mcp import McpServerSettings
    from mibyan.core.interruptible import InterruptSignal
    from mibyan.tools.mcp_connections import McpConnections
    from mibyan.tools.mcp_tools import McpToolset

    servers = {"gone": McpServerSettings(command="/nonexistent/mcp-server")}
    said: list[list[str]] = []
    for _start in ("first", "next"):
        with McpConnections(servers, home=home, start_timeout=10) as connections:
            owner = McpToolset(connections, owned=True, signal=InterruptSignal(), default_timeout=5)
            owner.refresh()
            said.append(owner.notices())
            shared = McpToolset(connections, owned=False, signal=InterruptSignal(), default_timeout=5)
            assert connections.wait_settled(timeout=30)
            assert shared.notices() == [] and owner.notices() == []  # failed again, as it was named
    assert said == [
        ["MCP server 'gone' is left out: cannot start /nonexistent/mcp-server: not found"],
        [
            "MCP server 'gone' is left out: cannot start /nonexistent/mcp-server: not found (at its last "
            "start; it is started again, and its tools are offered if it comes up)"
        ],
    ]
