"""The sandbox's backends and its own interface (as the gateway uses it): Landlock where bubblewrap is
missing, what each says it cannot do, and no path a command can name that escapes bubblewrap."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loopback import Reply, ScriptedServer
from sandboxing import (
    Places,
    configure,
    fetch,
    needs_bwrap,
    needs_landlock,
    run_command,
)

from mibyan.tools import landlock
from mibyan.tools.sandbox import UNCONFINED_WARNING, Sandbox

SEGMENTS = ("a", "b", "..", ".", ".git", ".mibyan", "home", "link", "elsewhere")


@needs_landlock
def test_landlock_keeps_writes_in_the_working_directory(
    server: ScriptedServer, make_agent: Callable[..., Any], places: Places, home: Path
) -> None:
    configure(home, "{backend: landlock}")
    result = run_command(server, make_agent, f"echo one > made.txt; rm -rf {places.elsewhere}", yolo=True)

    assert (places.workdir / "made.txt").read_text() == "one\n"
    assert (places.elsewhere / "keep.txt").exists()
    assert "perhaps the sandbox (workspace-write) blocked writing outside" in result


@needs_landlock
def test_landlock_without_network_cannot_reach_a_loopback_server(
    server: ScriptedServer, make_agent: Callable[..., Any], places: Places, home: Path, host_server: str
) -> None:
    if not landlock.takes_network_away():
        pytest.skip("this kernel's Landlock cannot forbid TCP connections (ABI < 4)")
    configure(home, "{backend: landlock, network: false}")
    assert "hello-from-the-host" not in run_command(server, make_agent, fetch(host_server))


@needs_landlock
def test_cli_says_once_what_landlock_cannot_protect(server: ScriptedServer, places: Places) -> None:
    home = places.workdir / "home"
    home.mkdir()
    configure(home, "{backend: landlock}")
    server.add(Reply(tool_calls=[("terminal", {"command": f"rm -rf {places.elsewhere}"})]), Reply(text="ok"))

    done = run_cli("chat", "-q", "clean up", "--yolo", "--base-url", server.base_url, home=home)

    assert (places.elsewhere / "keep.txt").exists()
    warnings = [line for line in done.stderr.splitlines() if "Landlock" in line]
    assert len(warnings) == 1 and str(home) in warnings[0]
    assert warnings[0].startswith("mibyan: the sandbox (Landlock) cannot protect")


@needs_landlock
def test_a_library_caller_hears_what_landlock_cannot_protect_once_per_process(
    server: ScriptedServer, places: Places
) -> None:
    home = places.workdir / "home"
    home.mkdir()
    configure(home, "{backend: landlock}")
    program = (
        "import sys\nfrom run_agent import AIAgent\n"
        "for _ in range(2):\n"
        f"    AIAgent(base_url={server.base_url!r}, home={str(home)!r},"
        " status_callback=lambda kind, text: print(kind, text))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )

    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("sandbox the sandbox (Landlock) cannot protect")
    assert str(home) in lines[0]


def test_without_a_backend_the_sandbox_says_commands_run_unconfined(places: Places) -> None:
    sandbox = Sandbox("workspace-write", places.workdir, backend="none")

    assert sandbox.warning() == UNCONFINED_WARNING
    assert not sandbox.active and sandbox.wrap(["true"]) == ["true"]
    assert UNCONFINED_WARNING in sandbox.describe()


@needs_bwrap
def test_a_fresh_sandbox_rooted_at_a_workspace_confines_what_it_wraps(places: Places) -> None:
    workspace = places.workdir / "workspace"
    workspace.mkdir()
    sandbox = Sandbox("workspace-write", workspace, network=False, protected=[places.workdir])
    command = f"echo one > made.txt; echo two > {places.elsewhere}/x; echo three > ../beside.txt"

    done = subprocess.run(
        sandbox.wrap(["bash", "-c", command], cwd=workspace), capture_output=True, check=False
    )

    assert (workspace / "made.txt").read_text() == "one\n"
    assert not (places.elsewhere / "x").exists() and not (places.workdir / "beside.txt").exists()
    assert done.stderr.count(b"Read-only file system") == 2
    assert sandbox.describe().startswith(f"sandbox workspace-write (bubblewrap): writes in {workspace}")


@needs_bwrap
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(paths=st.lists(st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=5), min_size=1, max_size=4))
def test_no_path_a_command_can_name_lets_it_write_outside_the_allowed_places(
    places: Places, paths: list[list[str]]
) -> None:
    """Whatever mix of `..`, links, `.git`, `.mibyan` and the home a path holds, a write lands only where
    the sandbox allows: in the working directory but not in its `.git`, `.mibyan` or the mibyan home."""
    workdir = places.workdir
    (workdir / ".git").mkdir(exist_ok=True)
    (workdir / "home").mkdir(exist_ok=True)
    if not (workdir / "link").is_symlink():
        (workdir / "link").symlink_to(places.elsewhere)
    sandbox = Sandbox("workspace-write", workdir, protected=[workdir / "home"])
    targets = ["/".join([*segments, "written.txt"]) for segments in paths]
    script = "; ".join(
        f"mkdir -p \"$(dirname '{t}')\" 2>/dev/null; echo x > '{t}' 2>/dev/null" for t in targets
    )

    subprocess.run(sandbox.wrap(["bash", "-c", script], cwd=workdir), capture_output=True, check=False)

    allowed = workdir.resolve()
    kept = [allowed / ".git", allowed / ".mibyan", allowed / "home"]
    root = workdir.parent
    for written in root.rglob("written.txt"):
        where = written.resolve()
        assert allowed in where.parents, f"{where} was written outside the working directory"
        assert not any(k in where.parents for k in kept), f"{where} was written in a read-only place"
        written.unlink()


@needs_bwrap
def test_a_sandbox_rooted_at_the_root_says_it_confines_nothing() -> None:
    assert "write everywhere" in str(Sandbox("workspace-write", "/").warning())
    assert Sandbox("read-only", "/").warning() is None
