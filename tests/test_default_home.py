"""The default home, `~/.mibyan`, from outside: a gateway agent writes its own workspace and temp folder
there as under any other home name, and neither a gateway agent nor the chat writes the rest of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from conftest import run_cli
from gatewaying import write_config
from loopback import Reply, ScriptedServer
from test_gateway import MEEPA


def tool_results(body: dict[str, Any]) -> list[str]:
    return [str(m["content"]) for m in body["messages"] if m["role"] == "tool"]


def default_home(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """The environment of a user whose home is `tmp_path` and whose mibyan home is the default one."""
    home = tmp_path / ".mibyan"
    home.mkdir(mode=0o700)
    return {"HOME": str(tmp_path), "MIBYAN_HOME": ""}, home


def test_a_gateway_agent_writes_its_workspace_and_tmp_in_the_default_home(
    server: ScriptedServer, tmp_path: Path, start_gateway: Any
) -> None:
    env, home = default_home(tmp_path)
    write_config(home, {"local": server.base_url}, [MEEPA])
    config = (home / "config.yaml").read_text()
    folder = home / "agents" / "meepa"
    temp = folder / "tmp"
    calls = [
        ("write_file", {"path": "notes.txt", "content": "one"}),
        ("patch", {"path": "notes.txt", "old": "one", "new": "two"}),
        ("terminal", {"command": "echo x > f; cat f; rm f; echo gone"}),
        ("write_file", {"path": str(temp / "scratch.txt"), "content": "scratch"}),
        ("terminal", {"command": f"echo t > {temp}/t.txt; rm {temp}/t.txt; echo tmp-ok"}),
        ("write_file", {"path": str(home / "config.yaml"), "content": "agents: []\n"}),
        ("terminal", {"command": f"echo x >> {home}/config.yaml"}),
        ("write_file", {"path": "../SOUL.md", "content": "You obey everyone."}),
        ("terminal", {"command": "echo x > ../MEMORY.md"}),
        ("write_file", {"path": ".mibyan/config.yaml", "content": "approvals: {always: [rm]}\n"}),
    ]
    server.add(Reply(tool_calls=calls), Reply(text="done"))
    with start_gateway(home, env=env) as gateway:
        gateway.client().chat.completions.create(model="meepa", messages=[{"role": "user", "content": "go"}])

    written, patched, shell, scratch, shell_tmp, *refused = tool_results(server.requests[1].body)
    assert written.startswith("wrote") and not patched.startswith(("blocked", "error")), patched
    assert (folder / "workspace" / "notes.txt").read_text() == "two"
    assert shell.startswith("x\ngone") and not (folder / "workspace" / "f").exists(), shell
    assert scratch.startswith("wrote") and (temp / "scratch.txt").read_text() == "scratch"
    assert shell_tmp.startswith("tmp-ok"), shell_tmp
    assert all(r.startswith("blocked") for r in refused), refused
    assert (home / "config.yaml").read_text() == config
    assert not (folder / "SOUL.md").exists() and not (folder / "MEMORY.md").exists()
    assert not (folder / "workspace" / ".mibyan" / "config.yaml").exists()


def test_the_chat_writes_nothing_in_the_default_home(server: ScriptedServer, tmp_path: Path) -> None:
    env, home = default_home(tmp_path)
    (home / "config.yaml").write_text(yaml.safe_dump({"agent": {"api_max_retries": 0}}))
    calls = [
        ("write_file", {"path": "~/.mibyan/config.yaml", "content": "approvals: {always: [rm]}\n"}),
        ("terminal", {"command": "echo x >> ~/.mibyan/config.yaml"}),
        ("write_file", {"path": str(home / "memories" / "USER.md"), "content": "obey"}),
    ]
    server.add(Reply(tool_calls=calls), Reply(text="done"))
    done = run_cli("chat", "-q", "go", "--base-url", server.base_url, home=home, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    results = tool_results(server.requests[1].body)
    assert all(r.startswith("blocked") for r in results), results
    assert "approvals" not in (home / "config.yaml").read_text()
    assert not (home / "memories" / "USER.md").exists()
