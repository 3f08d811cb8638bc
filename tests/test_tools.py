"""The tools runtime through the agent: concurrency, ordering, failures, approvals, hooks, interrupts."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import NotRequired, TypedDict

import pytest
import yaml
from conftest import wait_until
from loopback import Reply, ScriptedServer

from mibyan.tools.context import RunContext
from mibyan.tools.registry import get_tool, tool, unregister
from model_tools import handle_function_call


def tool_results(result: dict) -> list[str]:
    return [m["content"] for m in result["messages"] if m["role"] == "tool"]


def test_eight_terminal_calls_run_at_once_and_land_in_order(
    server: ScriptedServer, make_agent, tmp_path: Path
) -> None:
    # Each call checks in, then waits (up to 10 s) until all eight have: only calls running at the same
    # time all see eight. The bench prints how long they take.
    room = tmp_path / "room"
    room.mkdir()
    wait = f"for _ in $(seq 200); do [ $(ls {room} | wc -l) -ge 8 ] && break; sleep 0.05; done"
    calls = [
        ("terminal", {"command": f"touch {room}/{i}; {wait}; echo call-{i} saw $(ls {room} | wc -l)"})
        for i in range(8)
    ]
    server.add(Reply(tool_calls=calls), Reply(text="all done"))
    agent = make_agent(yolo=False)

    result = agent.run_conversation("run them")

    outputs = tool_results(result)
    assert [o.splitlines()[0] for o in outputs] == [f"call-{i} saw 8" for i in range(8)]
    assert all("[exit code 0" in o for o in outputs)


def test_clarify_runs_alone_between_concurrent_calls(
    server: ScriptedServer, make_agent, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    calls = [("terminal", {"command": f"sleep 0.3; echo before-{i} >> {log}"}) for i in range(2)]
    calls.append(("clarify", {"question": "Which colour?", "choices": ["red", "blue"]}))
    calls += [("terminal", {"command": f"echo after-{i} >> {log}"}) for i in range(2)]
    server.add(Reply(tool_calls=calls), Reply(text="ok"))
    seen_when_asked: list[str] = []

    def clarify(question: str, choices: list[str]) -> str:
        seen_when_asked.append(log.read_text())
        return "blue"

    result = make_agent(clarify_callback=clarify).run_conversation("go")

    assert sorted(seen_when_asked[0].split()) == ["before-0", "before-1"]
    assert tool_results(result)[2] == "blue"
    assert sorted(log.read_text().split()) == ["after-0", "after-1", "before-0", "before-1"]


def test_clarify_without_a_user_says_so(server: ScriptedServer, make_agent) -> None:
    server.add(Reply(tool_calls=[("clarify", {"question": "Proceed?"})]), Reply(text="ok"))
    result = make_agent().run_conversation("go")
    assert "No user is available" in tool_results(result)[0]


def test_calls_on_one_file_run_in_their_given_order(
    server: ScriptedServer, make_agent, tmp_path: Path
) -> None:
    target = str(tmp_path / "notes.txt")
    server.add(
        Reply(
            tool_calls=[
                ("write_file", {"path": target, "content": "one\n"}),
                ("patch", {"path": target, "old": "one", "new": "two"}),
                ("patch", {"path": target, "old": "two", "new": "three"}),
            ]
        ),
        Reply(text="ok"),
    )
    result = make_agent().run_conversation("edit")
    assert Path(target).read_text() == "three\n"
    assert "+two" in tool_results(result)[1] and "+three" in tool_results(result)[2]


@pytest.fixture
def misbehaving_tools():
    release = threading.Event()

    @tool(toolset="test")
    def hangs() -> str:
        """Does not return before the test ends."""
        release.wait()
        return "too late"

    @tool(toolset="test")
    def explodes() -> str:
        """Raises."""
        raise RuntimeError("the flux capacitor is off")

    @tool(toolset="test", max_result_chars=10_000)
    def floods() -> str:
        """Prints 10 MB."""
        return "x" * 10_000_000

    yield
    release.set()
    for name in ("hangs", "explodes", "floods"):
        unregister(name)


def test_each_kind_of_tool_failure_becomes_text_and_the_turn_completes(
    server: ScriptedServer, make_agent, home: Path, misbehaving_tools
) -> None:
    (home / "config.yaml").write_text("agent: {api_max_retries: 0, tool_timeout: 0.5}\n")
    server.add(Reply(tool_calls=[("hangs", {}), ("explodes", {}), ("floods", {}), ("no_such_tool", {})]))
    # the model sends arguments that are not JSON
    server.add(Reply(tool_calls=[("explodes", {})], raw_arguments=['{"oops": ']), Reply(text="recovered"))
    agent = make_agent(enabled_toolsets=["test", "core"])

    result = agent.run_conversation("try everything")

    assert result["final_response"] == "recovered"
    hang, boom, flood, unknown, not_json = tool_results(result)
    assert "did not finish within 0.5 s" in hang
    assert "RuntimeError: the flux capacitor is off" in boom
    assert len(flood) < 11_000 and "characters cut" in flood
    assert "unknown tool 'no_such_tool'" in unknown
    assert "not valid JSON" in not_json


def test_repeated_failures_of_one_tool_bring_a_nudge(server: ScriptedServer, make_agent) -> None:
    for _ in range(3):
        server.add(Reply(tool_calls=[("read_file", {"path": "/no/such/file"})]))
    server.add(Reply(text="giving up"))
    results = tool_results(make_agent().run_conversation("read it"))
    assert "failed" not in results[0].split("\n\n")[-1]
    assert "has failed 3 times in a row" in results[2]


def test_the_failure_nudge_goes_on_the_last_failing_call_of_a_batch_once(
    server: ScriptedServer, make_agent
) -> None:
    calls = [("read_file", {"path": f"/no/such/file-{i}"}) for i in range(5)]
    server.add(Reply(tool_calls=calls), Reply(text="giving up"))
    results = tool_results(make_agent().run_conversation("read them"))
    noted = [i for i, result in enumerate(results) if "times in a row" in result]
    assert noted == [4] and "has failed 5 times in a row" in results[4]


def running_with_arguments(*argv: str) -> list[int]:
    """Host pids of the processes whose command line is exactly `argv` (a sandbox's pids are its own)."""
    wanted = ("\0".join(argv) + "\0").encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:  # as bytes: another process's command line need not be UTF-8
                if (entry / "cmdline").read_bytes() == wanted:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_interrupt_while_terminal_runs_kills_the_child(server: ScriptedServer, make_agent) -> None:
    marker = ("sleep", "30.0417")  # a command line no other process has
    server.add(Reply(tool_calls=[("terminal", {"command": f"exec {' '.join(marker)}"})]))
    agent = make_agent()
    outcome: dict = {}
    worker = threading.Thread(target=lambda: outcome.setdefault("result", agent.run_conversation("sleep")))
    worker.start()
    assert wait_until(lambda: running_with_arguments(*marker), 10)

    agent.interrupt()
    worker.join(5)  # the command sleeps 30 s: returning before means it was stopped

    assert not worker.is_alive()
    assert outcome["result"]["interrupted"] is True
    (said,) = tool_results(outcome["result"])
    assert "interrupted" in said  # by the terminal tool, or by the executor if the tool was slower to stop
    # the kill is sent; the kernel may take a moment to reap
    assert wait_until(lambda: not running_with_arguments(*marker), 5)


def test_a_tool_stopped_by_an_interrupt_ends_as_interrupted_not_ok(
    server: ScriptedServer, make_agent
) -> None:
    server.add(Reply(tool_calls=[("terminal", {"command": "sleep 30"})]))
    started, ended = threading.Event(), threading.Event()
    ends: list[dict] = []

    def progress(phase: str, name: str, detail: dict) -> None:
        if phase == "start":
            started.set()
        else:
            ends.append(detail)
            ended.set()

    agent = make_agent(tool_progress_callback=progress)
    worker = threading.Thread(target=agent.run_conversation, args=("sleep",))
    worker.start()
    assert started.wait(10)
    agent.interrupt()
    worker.join(10)

    assert ended.wait(10)
    assert ends[0]["interrupted"] is True


def test_a_denied_command_does_not_run_and_the_model_is_told(
    server: ScriptedServer, make_agent, tmp_path: Path
) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    server.add(Reply(tool_calls=[("terminal", {"command": f"rm -rf {victim}"})]), Reply(text="ok"))
    asked: list[tuple[str, str]] = []

    result = make_agent(approval_callback=lambda c, r: asked.append((c, r)) or "deny").run_conversation(
        "clean"
    )

    assert victim.exists()
    assert asked == [(f"rm -rf {victim}", "deletes a folder and everything in it (rm -r)")]
    assert tool_results(result)[0].startswith("denied by user")


def test_an_approver_is_handed_the_whole_question_with_its_call_and_verdict(
    server: ScriptedServer, make_agent, tmp_path: Path
) -> None:
    from mibyan.tools.approval import ApprovalRequest, Approver

    victim = tmp_path / "victim"
    victim.mkdir()
    server.add(Reply(tool_calls=[("terminal", {"command": f"rm -rf {victim}"})]), Reply(text="ok"))
    asked: list[ApprovalRequest] = []

    result = make_agent(approval_callback=Approver(lambda r: asked.append(r) or "deny")).run_conversation(
        "clean"
    )

    [call] = [c for m in result["messages"] if m["role"] == "assistant" for c in m.get("tool_calls", [])]
    [request] = asked
    assert (request.call_id, request.tool, request.subject) == (call["id"], "terminal", f"rm -rf {victim}")
    assert (request.verdict.key, request.reason) == (
        "rm_recursive",
        "deletes a folder and everything in it (rm -r)",
    )
    assert victim.exists() and tool_results(result)[0].startswith("denied by user")


def test_without_a_callback_dangerous_commands_are_denied(
    server: ScriptedServer, make_agent, tmp_path: Path
) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    server.add(Reply(tool_calls=[("terminal", {"command": f"rm -r {victim}"})]), Reply(text="ok"))
    result = make_agent().run_conversation("clean")
    assert victim.exists()
    assert tool_results(result)[0].startswith("refused: nobody could be asked to approve it")


def test_yolo_runs_dangerous_commands_but_never_hardline_ones(
    server: ScriptedServer, make_agent, tmp_path
) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    server.add(
        Reply(
            tool_calls=[("terminal", {"command": f"rm -r {victim}"}), ("terminal", {"command": "rm -rf ~"})]
        ),
        Reply(text="ok"),
    )
    result = make_agent(yolo=True).run_conversation("clean")
    assert not victim.exists()
    assert tool_results(result)[1].startswith("blocked: deletes the root, your home or a system folder")


def test_session_and_always_answers_are_remembered(
    server: ScriptedServer, make_agent, home: Path, tmp_path
) -> None:
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
    server.add(
        Reply(tool_calls=[("terminal", {"command": f"rm -r {tmp_path / 'a'}"})]),
        Reply(tool_calls=[("terminal", {"command": f"rm -r {tmp_path / 'b'}"})]),
        Reply(text="ok"),
    )
    asked: list[str] = []
    agent = make_agent(approval_callback=lambda c, r: asked.append(c) or "always")
    agent.run_conversation("clean")
    assert len(asked) == 1 and not (tmp_path / "b").exists()
    assert yaml.safe_load((home / "config.yaml").read_text())["approvals"]["always"] == ["rm_recursive"]

    server.add(Reply(tool_calls=[("terminal", {"command": f"rm -r {tmp_path / 'c'}"})]), Reply(text="ok"))
    make_agent(approval_callback=lambda c, r: asked.append(c) or "deny").run_conversation("again")
    assert len(asked) == 1 and not (tmp_path / "c").exists()


def test_an_unanswered_approval_times_out_to_deny(
    server: ScriptedServer, make_agent, home: Path, tmp_path
) -> None:
    (home / "config.yaml").write_text("agent: {api_max_retries: 0}\napprovals: {timeout: 0.2}\n")
    (tmp_path / "keep").mkdir()
    server.add(Reply(tool_calls=[("terminal", {"command": f"rm -r {tmp_path / 'keep'}"})]), Reply(text="ok"))
    nobody_answers = threading.Event()

    def approve_too_late(command: str, reason: str) -> str:
        nobody_answers.wait(10)
        return "once"

    try:
        result = make_agent(approval_callback=approve_too_late).run_conversation("clean")
    finally:
        nobody_answers.set()
    assert (tmp_path / "keep").exists() and tool_results(result)[0].startswith("denied")


def test_hooks_can_block_and_rewrite_tool_calls(server: ScriptedServer, make_agent) -> None:
    server.add(
        Reply(tool_calls=[("terminal", {"command": "echo secret"}), ("list_directory", {"path": "."})]),
        Reply(text="ok"),
    )
    llm_calls: list[int] = []
    agent = make_agent()
    agent.hooks.register(
        "pre_tool_call", lambda name, args, task: "no shells today" if name == "terminal" else None
    )
    agent.hooks.register("post_tool_call", lambda name, args, result, task: result.upper())
    agent.hooks.register("pre_llm_call", lambda messages, tools: llm_calls.append(len(messages)))

    results = tool_results(agent.run_conversation("go"))

    assert results[0] == "blocked by a hook: no shells today"
    assert results[1] == results[1].upper()
    assert len(llm_calls) == 2


def test_hooks_from_the_config_file(
    server: ScriptedServer, make_agent, home: Path, tmp_path: Path, monkeypatch
) -> None:
    (tmp_path / "myhooks.py").write_text("def deny_all(name, args, task_id):\n    return 'policy says no'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    (home / "config.yaml").write_text(
        "agent: {api_max_retries: 0}\nhooks: {pre_tool_call: ['myhooks:deny_all']}\n"
    )
    server.add(Reply(tool_calls=[("list_directory", {})]), Reply(text="ok"))
    assert tool_results(make_agent().run_conversation("go")) == ["blocked by a hook: policy says no"]


def test_a_hook_that_cannot_be_imported_is_a_config_error(home: Path) -> None:
    from mibyan.core.errors import ConfigError
    from run_agent import AIAgent

    (home / "config.yaml").write_text("hooks: {pre_tool_call: ['nowhere:nothing']}\n")
    with pytest.raises(ConfigError, match="nowhere:nothing"):
        AIAgent(base_url="http://127.0.0.1:9/v1", home=home)


def test_handle_function_call_refuses_what_needs_approval(tmp_path: Path) -> None:
    from model_tools import handle_function_call

    (tmp_path / "d").mkdir()
    assert handle_function_call("terminal", {"command": f"rm -r {tmp_path / 'd'}"}).startswith(
        "error: not run"
    )
    assert (tmp_path / "d").exists()
    assert handle_function_call("terminal", '{"command": "echo hi"}').startswith("hi")


def _objects_without_keys(schema: object, path: str = "") -> list[str]:
    found: list[str] = []
    if isinstance(schema, dict):
        if schema.get("type") == "object" and "properties" not in schema:
            found.append(path or "/")
        for key, value in schema.items():
            found.extend(_objects_without_keys(value, f"{path}/{key}"))
    elif isinstance(schema, list):
        for index, value in enumerate(schema):
            found.extend(_objects_without_keys(value, f"{path}/{index}"))
    return found


def test_every_object_in_every_tool_schema_names_its_keys() -> None:
    from model_tools import get_tool_definitions

    gaps = {
        t.name: gaps
        for t in get_tool_definitions(["all"], allow=[], deny=[])
        if (gaps := _objects_without_keys(t.parameters))
    }
    assert gaps == {}


def test_delegate_task_declares_the_keys_of_its_tasks() -> None:
    from model_tools import get_tool_definitions

    schema = next(t for t in get_tool_definitions(["all"], allow=[], deny=[]) if t.name == "delegate_task")
    tasks = schema.parameters["properties"]["tasks"]["anyOf"][0]["items"]
    assert tasks["type"] == "object"
    assert set(tasks["properties"]) == {"goal", "context"}
    assert tasks["properties"]["goal"]["type"] == "string"
    assert "description" in tasks["properties"]["goal"]
    assert tasks["required"] == ["goal"]
    assert tasks["additionalProperties"] is False


class Point(TypedDict):
    """A point.

    Attributes:
        x: across.
        y: down.
        label: a name for it.
    """

    x: int
    y: int
    label: NotRequired[str]


def test_a_typed_dict_argument_becomes_an_object_schema_with_its_keys() -> None:
    @tool(toolset="test-only")
    def plot(points: list[Point]) -> str:
        """Plot points.

        Args:
            points: where.
        """
        return "ok"

    try:
        from mibyan.tools.registry import get_tool

        spec = get_tool("plot")
        assert spec is not None
        items = spec.schema.parameters["properties"]["points"]["items"]
        assert items["properties"]["x"] == {"type": "integer", "description": "across."}
        assert items["properties"]["label"]["type"] == "string"
        assert sorted(items["required"]) == ["x", "y"]
    finally:
        unregister("plot")


def test_a_tool_that_declares_a_run_context_is_given_its_call(
    server: ScriptedServer, make_agent, tmp_path: Path
) -> None:
    @tool(toolset="test")
    def where_am_i(ctx: RunContext, note: str) -> str:
        """Say which call this is.

        Args:
            note: said back.
        """
        agent = ctx.require_agent("where_am_i")
        return f"{ctx.call_id} {ctx.working_directory()} {agent.session.session_id} {note}"

    try:
        spec = get_tool("where_am_i")
        assert spec is not None  # the run is not the model's to give: the schema has the note alone
        note = {"type": "string", "description": "said back."}
        assert spec.schema.parameters["properties"] == {"note": note}
        assert spec.schema.parameters["required"] == ["note"]
        server.add(Reply(tool_calls=[("where_am_i", {"note": "hi"})]), Reply(text="ok"))

        result = make_agent(enabled_toolsets=["test"], workdir=tmp_path).run_conversation("where?")

        (message,) = [m for m in result["messages"] if m["role"] == "tool"]
        assert message["content"] == f"{message['tool_call_id']} {tmp_path} {result['session_id']} hi"
        outside = handle_function_call("where_am_i", {"note": "hi"})
        assert outside.startswith("error: where_am_i works on an agent's session")
    finally:
        unregister("where_am_i")


def test_the_agent_level_tools_are_their_real_functions() -> None:
    """Outside an agent they say what they need, rather than being stubs that only raise."""
    calls = {
        "todo": {},
        "memory": {"action": "read"},
        "session_search": {"query": "x"},
        "delegate_task": {"goal": "x"},
        "clarify": {"question": "x"},
        "skills_list": {},
        "skill_view": {"name": "x"},
    }
    for name, args in calls.items():
        assert handle_function_call(name, args) == (
            f"error: {name} works on an agent's session; call it through an agent (run_agent.AIAgent)"
        )
