"""MCP servers from the command line: `mibyan mcp list`, a one-shot run through the npm reference servers,
and no server process left behind when the CLI is killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, run_cli, wait_until
from gatewaying import out_of_an_agents_sight
from gatewaying import write_config as write_gateway_config
from loopback import Reply, ScriptedServer

BIN = ROOT / "tests" / "node" / "node_modules" / ".bin"
FILESYSTEM, EVERYTHING = BIN / "mcp-server-filesystem", BIN / "mcp-server-everything"
SERVER_SCRIPT = Path(__file__).with_name("mcp_test_server.py")


def tagged_processes(tag: str) -> list[int]:
    """The live processes whose environment holds MIBYAN_TEST_TAG=tag (the servers of one test)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().split(") ")[-1][:1]
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if f"MIBYAN_TEST_TAG={tag}".encode() in environ.split(b"\0") and state != "Z":
            found.append(int(entry.name))
    return found


def tagged_servers(tag: str) -> list[int]:
    """The tagged processes that are servers, not the bubblewrap each runs in."""
    return [pid for pid in tagged_processes(tag) if _program_of(pid) != "bwrap"]


def _program_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def write_config(home: Path, servers: dict[str, Any]) -> None:
    config = {"agent": {"api_max_retries": 0}, "mcp_servers": servers}
    (home / "config.yaml").write_text(json.dumps(config))  # JSON is YAML


@pytest.mark.skipif(
    not (FILESYSTEM.exists() and EVERYTHING.exists()),
    reason="the npm reference servers are not installed (npm ci --prefix tests/node)",
)
def test_a_one_shot_run_lists_reads_and_writes_through_the_reference_servers(
    server: ScriptedServer, home: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "shared"
    folder.mkdir()
    (folder / "notes.txt").write_text("first line\n")
    tag = uuid.uuid4().hex
    env = {"MIBYAN_TEST_TAG": tag}
    files = {"command": str(FILESYSTEM), "args": [str(folder)], "env": env}
    write_config(
        home,
        {
            "files": {**files, "approval": "allow"},
            "guarded": {**files, "tools": {"include": ["write_file"]}},  # approval: ask, nobody to ask
            "everything": {"command": str(EVERYTHING), "env": env, "tools": {"include": ["echo"]}},
            "broken": {"command": str(tmp_path / "no-such-server")},
        },
    )
    written = str(folder / "answer.txt")
    server.add(
        Reply(
            tool_calls=[
                ("mcp__files__list_directory", {"path": str(folder)}),
                ("mcp__files__read_text_file", {"path": str(folder / "notes.txt")}),
                ("mcp__files__write_file", {"path": written, "content": "from mibyan"}),
                ("mcp__guarded__write_file", {"path": str(folder / "refused.txt"), "content": "no"}),
                ("mcp__everything__echo", {"message": "hi \x1b]0;title\x07"}),
            ]
        ),
        Reply(text="done"),
    )
    done = run_cli("chat", "-q", "use the servers", "--base-url", server.base_url, home=home)
    assert done.returncode == 0, done.stderr
    listed, read, wrote, refused, echoed = [
        m["content"] for m in server.requests[1].body["messages"] if m["role"] == "tool"
    ]
    assert "[FILE] notes.txt" in listed and read == "first line\n"
    assert "Successfully wrote" in wrote and Path(written).read_text() == "from mibyan"
    assert refused.startswith("refused: nobody could be asked") and not (folder / "refused.txt").exists()
    assert echoed == "Echo: hi \x1b]0;title\x07"
    assert "mcp__everything__echo(message='hi \\x1b]0;title\\x07') · ok" in done.stderr  # escaped on screen
    assert done.stderr.count("MCP server 'broken' is left out") == 1
    assert tagged_processes(tag) == []


def test_no_server_outlives_a_killed_cli(server: ScriptedServer, home: Path) -> None:
    tag = uuid.uuid4().hex
    env = {"MIBYAN_TEST_TAG": tag}
    write_config(
        home,
        {
            "py": {"command": sys.executable, "args": [str(SERVER_SCRIPT)], "env": env},
            # never answers and never reads its stdin: only the kernel's parent-death signal stops it
            "hangs": {"command": "sh", "args": ["-c", "exec sleep 60"], "env": env},
        },
    )
    environment = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    environment.update({"MIBYAN_HOME": str(home), "PYTHONPATH": str(ROOT)})
    cli = subprocess.Popen(
        [sys.executable, "-m", "mibyan.cli.main", "chat", "-q", "hi", "--base-url", server.base_url],
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group, killed whole below
    )
    try:
        servers = wait_until(lambda: len(tagged_servers(tag)) == 2)
    finally:
        os.killpg(cli.pid, signal.SIGKILL)
        cli.wait(30)
    assert servers and wait_until(lambda: not tagged_processes(tag))


def test_a_gateway_agents_runs_share_one_server_stopped_with_the_gateway(
    server: ScriptedServer, home: Path, start_gateway: Any
) -> None:
    tag = uuid.uuid4().hex
    mcp: dict[str, Any] = {
        "py": {"command": sys.executable, "args": [str(SERVER_SCRIPT)], "env": {"MIBYAN_TEST_TAG": tag}}
    }
    if out_of_an_agents_sight(Path(sys.executable).resolve(), SERVER_SCRIPT.resolve()):
        mcp["py"]["sandbox"] = "off"  # what this test is about is the sharing, not the confinement
    agent = {"id": "meepa", "default": True, "provider": "local", "mcp_servers": ["py"]}
    agent["tools"] = {"allow": ["read_file", "mcp__py__instance"]}  # all it is offered, MCP tools included
    write_gateway_config(home, {"local": server.base_url}, [agent], extra={"mcp_servers": mcp})
    for _ in ("ann", "ben"):
        server.add(Reply(tool_calls=[("mcp__py__instance", {})]), Reply(text="done"))
    with start_gateway(home) as gateway:
        for channel in ("ann", "ben"):
            gateway.client().chat.completions.create(
                model="meepa", messages=[{"role": "user", "content": "pid?"}], user=channel
            )
        running = tagged_servers(tag)
        assert gateway.terminate() == 0
    started = [m["content"] for r in server.requests for m in r.body["messages"] if m["role"] == "tool"]
    assert len(started) == 2 and started[0] == started[1] and len(running) == 1
    offered = [{tool["function"]["name"] for tool in r.body["tools"]} for r in server.requests]
    assert offered[0] == offered[2] == {"read_file", "mcp__py__instance"}
    assert wait_until(lambda: not tagged_processes(tag))


def test_a_server_that_cannot_start_is_named_by_every_run_not_only_the_first(
    server: ScriptedServer, home: Path, tmp_path: Path
) -> None:
    # the first run waits for it (its tools are not known); the next ones do not, as its cache says it
    # has none, and end before it fails again: they must still say it is left out
    write_config(home, {"broken": {"command": str(tmp_path / "no-such-server")}})
    for run in range(2):
        server.add(Reply(text="done"))
        done = run_cli("chat", "-q", "hi", "--base-url", server.base_url, home=home)
        assert done.returncode == 0, done.stderr
        named = [line for line in done.stderr.splitlines() if "MCP server 'broken' is left out" in line]
        assert len(named) == 1, (run, done.stderr)
        assert "no-such-server: not found" in named[0]


def _confined() -> bool:
    from mibyan.tools.sandbox import detect_backend

    return detect_backend() != "none"


needs_servers_and_a_sandbox = pytest.mark.skipif(
    not (FILESYSTEM.exists() and _confined()),
    reason="needs the npm reference servers (npm ci --prefix tests/node) and bubblewrap or Landlock",
)


@needs_servers_and_a_sandbox
def test_a_file_server_writes_where_the_agent_may_and_not_into_mibyans_home(
    server: ScriptedServer, home: Path, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    files = {"command": str(FILESYSTEM), "args": [str(project), str(home)], "approval": "allow"}
    # a server that must write where its sandbox does not let it (a cache, say) fails and is told why
    needy = {"command": "sh", "args": ["-c", f"mkdir {home}/cache && exec {FILESYSTEM} {project}"]}
    write_config(home, {"files": files, "loose": {**files, "sandbox": "off"}, "needy": needy})
    server.add(
        Reply(
            tool_calls=[
                ("mcp__files__write_file", {"path": str(project / "notes.md"), "content": "kept"}),
                ("mcp__files__write_file", {"path": str(home / "config.yaml"), "content": "yolo: true"}),
            ]
        ),
        Reply(text="done"),
    )
    done = run_cli("chat", "-q", "write", "--base-url", server.base_url, home=home, cwd=project)
    assert done.returncode == 0, done.stderr
    wrote, refused = [m["content"] for m in server.requests[1].body["messages"] if m["role"] == "tool"]
    assert "Successfully wrote" in wrote and (project / "notes.md").read_text() == "kept", done.stderr
    assert "Successfully" not in refused and "yolo" not in (home / "config.yaml").read_text()
    # the server that opted out is said to run unconfined, once, at the start
    assert done.stderr.count("MCP servers 'loose' run outside the sandbox (sandbox: off)") == 1
    [needy_line] = [line for line in done.stderr.splitlines() if "MCP server 'needy' is left out" in line]
    assert f"lets it write only in {project}" in needy_line and "writable: [...]" in needy_line


@needs_servers_and_a_sandbox
def test_a_gateway_agents_file_server_writes_its_workspace_only_and_sees_none_of_the_home(
    server: ScriptedServer, home: Path, start_gateway: Any
) -> None:
    workspace = home / "agents" / "meepa" / "workspace"
    files = {"command": str(FILESYSTEM), "args": [str(workspace), str(home)], "approval": "allow"}
    # a clone in the home or under /tmp is out of the agent's sight: the server's own folder is bound in
    files["writable"] = [str(BIN.parent)]
    agent = {"id": "meepa", "default": True, "provider": "local", "mcp_servers": ["files"]}
    write_gateway_config(home, {"local": server.base_url}, [agent], extra={"mcp_servers": {"files": files}})
    server.add(
        Reply(
            tool_calls=[
                ("mcp__files__write_file", {"path": str(workspace / "notes.md"), "content": "kept"}),
                ("mcp__files__write_file", {"path": str(home / "stolen.txt"), "content": "x"}),
                ("mcp__files__read_text_file", {"path": str(home / "config.yaml")}),
            ]
        ),
        Reply(text="done"),
    )
    with start_gateway(home) as gateway:
        gateway.client().chat.completions.create(
            model="meepa", messages=[{"role": "user", "content": "write"}], user="ann"
        )
        assert gateway.terminate() == 0
    wrote, written_outside, read = [
        m["content"] for m in server.requests[1].body["messages"] if m["role"] == "tool"
    ]
    assert "Successfully wrote" in wrote and (workspace / "notes.md").read_text() == "kept"
    assert "Successfully" not in written_outside and not (home / "stolen.txt").exists()
    assert "providers" not in read  # the home's config is out of the server's sight
