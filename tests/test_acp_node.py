"""`mibyan acp` with an editor written against the official TypeScript ACP SDK (tests/node/acp_client.mjs)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from loopback import Reply, ScriptedServer

from agent_state import SessionStore
from mibyan.agent.messages import repair_history

ROOT = Path(__file__).resolve().parent.parent
CLIENT = ROOT / "tests" / "node" / "acp_client.mjs"
SDK = ROOT / "tests" / "node" / "node_modules" / "@agentclientprotocol" / "sdk"


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
@pytest.mark.skipif(
    not SDK.is_dir(), reason="@agentclientprotocol/sdk is not installed (npm ci --prefix tests/node)"
)
def test_an_editor_on_the_typescript_sdk_sees_ordered_tool_calls_a_rejection_a_cancel_and_a_load(
    server: ScriptedServer, home: Path, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    (project / "victim").mkdir(parents=True)
    (project / "a.txt").write_text("alpha\n")
    server.add(
        Reply(tool_calls=[("terminal", {"command": "echo one"})]),
        Reply(tool_calls=[("read_file", {"path": "a.txt"})]),
        Reply(text="Both rounds are done.", chunks=3),
        Reply(tool_calls=[("terminal", {"command": "rm -r victim"})]),
        Reply(text="I left it."),
        Reply(text="A long answer that is cancelled", chunks=6, stall=30),
        *[Reply(tool_calls=[("terminal", {"command": "true"})])] * 3,
        Reply(text="Out of model calls: here is where I got to."),
    )
    environment = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    environment.update({"MIBYAN_HOME": str(home), "PYTHONPATH": str(ROOT)})
    agent = [
        sys.executable,
        "-m",
        "mibyan.cli.main",
        "acp",
        "--base-url",
        server.base_url,
        "--max-turns",
        "3",
    ]
    done = subprocess.run(
        ["node", str(CLIENT), str(project), "--", *agent],
        capture_output=True,
        text=True,
        env=environment,
        cwd=project,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)

    assert report["loadSession"] is True
    call = ["tool_call:pending", "tool_call_update:in_progress", "tool_call_update:completed"]
    assert report["first"] == {
        "stopReason": "end_turn",
        "tags": [*call, *call, "agent_message_chunk", "agent_message_chunk", "agent_message_chunk"],
    }
    assert report["answer"] == "Both rounds are done." and report["kinds"] == ["execute", "read"]

    assert report["rejected"]["stopReason"] == "end_turn"
    assert report["rejected"]["tags"][:3] == [*call[:2], "tool_call_update:failed"]
    assert report["permissions"] == report["rejectCallIds"]
    assert (project / "victim").is_dir()

    assert report["cancel"]["stopReason"] == "cancelled"
    with SessionStore.open(home) as store:
        stored = store.load_messages(report["sessionId"])
        assert store.get_session(report["sessionId"])["source"] == "acp"  # type: ignore[index]
    assert repair_history(stored)[1] == []
    assert report["replayedUserText"] == ["two rounds", "reject", "cancel"]
    assert report["budget"] == "max_turn_requests"
    replayed_call = ["tool_call:in_progress", "tool_call_update:completed"]
    assert report["replay"][:6] == [
        "user_message_chunk",
        *replayed_call,
        *replayed_call,
        "agent_message_chunk",
    ]
