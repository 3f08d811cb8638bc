"""--yolo needs a working sandbox: without one, what the judge could not read still asks (and with
nobody to ask it does not run), and the start says so."""

from __future__ import annotations

from pathlib import Path

import pytest
from loopback import Reply, ScriptedServer

from mibyan.tools.approval import YOLO_UNCONFINED

#: A command whose program is only known when it runs: the judge cannot read what it does.
UNREAD = "x=$(cat program.txt); $x"


def _tool_results(result: dict) -> list[str]:
    return [m["content"] for m in result["messages"] if m["role"] == "tool"]


def test_yolo_without_a_sandbox_still_refuses_what_the_judge_cannot_read(
    server: ScriptedServer, make_agent, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (home / "config.yaml").write_text("agent: {api_max_retries: 0}\nsandbox: {mode: 'off'}\n")
    project = tmp_path / "project"
    (project / "build").mkdir(parents=True)
    (project / "program.txt").write_text("touch ran\n")
    monkeypatch.chdir(project)
    calls = [("terminal", {"command": UNREAD}), ("terminal", {"command": "rm -r build"})]
    server.add(Reply(tool_calls=calls), Reply(text="ok"))
    said: list[tuple[str, str]] = []

    agent = make_agent(yolo=True, status_callback=lambda kind, text: said.append((kind, text)))
    result = agent.run_conversation("go")

    unread, _ = _tool_results(result)
    assert unread.startswith("refused") and not (project / "ran").exists()
    assert not (project / "build").exists()  # what the judge reads, --yolo still approves
    assert ("sandbox", YOLO_UNCONFINED) in said


def test_yolo_with_a_sandbox_approves_what_the_judge_cannot_read(
    server: ScriptedServer, make_agent, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "program.txt").write_text("true\n")
    monkeypatch.chdir(project)
    server.add(Reply(tool_calls=[("terminal", {"command": UNREAD})]), Reply(text="ok"))
    said: list[tuple[str, str]] = []

    agent = make_agent(yolo=True, status_callback=lambda kind, text: said.append((kind, text)))
    if not agent.sandbox.active:
        pytest.skip("no sandbox backend on this machine")
    result = agent.run_conversation("go")

    assert not _tool_results(result)[0].startswith(("refused", "blocked"))
    assert ("sandbox", YOLO_UNCONFINED) not in said
