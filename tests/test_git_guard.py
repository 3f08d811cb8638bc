"""A repository's own `.git/config` and hooks run nothing the agent's git commands did not ask for, unless
the user trusts the project: a real repository with a hostile config, commands run by the terminal tool."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from loopback import ScriptedServer
from sandboxing import run_command

from mibyan.config.trust import trust_folder

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A repository whose config and hooks each leave a marker file when git runs them."""
    (home / "config.yaml").write_text("agent: {api_max_retries: 0}\nsandbox: {mode: 'off'}\n")
    folder = tmp_path / "repo"
    folder.mkdir()
    git(folder, "init", "-q")
    git(folder, "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-q", "--allow-empty", "-m", "one")
    (folder / "notes.txt").write_text("notes\n")
    git(folder, "config", "core.fsmonitor", f"touch {folder}/FSMONITOR; false")
    git(folder, "config", "core.pager", f"touch {folder}/PAGER; cat")
    git(folder, "config", "core.sshCommand", f"touch {folder}/SSH; false")
    git(folder, "config", "alias.st", f"!touch {folder}/ALIAS")
    for hook in ("post-checkout", "pre-commit", "reference-transaction"):
        script = folder / ".git" / "hooks" / hook
        script.write_text(f"#!/bin/sh\ntouch {folder}/HOOK-{hook}\n")
        script.chmod(0o755)
    monkeypatch.chdir(folder)
    return folder


def markers(repo: Path) -> list[str]:
    return sorted(p.name for p in repo.iterdir() if p.name.isupper() or p.name.startswith("HOOK"))


COMMANDS = (
    "git status --short; git -p log --oneline; git checkout -q -b other; "
    "git -c user.name=a -c user.email=a@b commit -q --allow-empty -m two; "
    "git fetch -q ssh://example.invalid/x 2>/dev/null; git status --short"
)


def test_a_hostile_repository_config_runs_nothing_when_the_agent_runs_git(
    server: ScriptedServer, make_agent: Callable[..., Any], repo: Path
) -> None:
    result = run_command(server, make_agent, COMMANDS)

    assert "?? notes.txt" in result  # git itself ran
    assert markers(repo) == []


def test_a_repository_alias_that_runs_a_shell_command_is_asked_about(
    server: ScriptedServer, make_agent: Callable[..., Any], repo: Path
) -> None:
    result = run_command(server, make_agent, "git st")

    assert "not run" in result and "alias.st = !touch" in result
    assert markers(repo) == []


def test_a_trusted_project_runs_its_own_git_settings(
    server: ScriptedServer, make_agent: Callable[..., Any], repo: Path, home: Path
) -> None:
    (repo / ".mibyan").mkdir()
    (repo / ".mibyan" / "config.yaml").write_text("agent: {}\n")
    trust_folder(home, repo, (repo / ".mibyan" / "config.yaml").read_bytes())

    run_command(server, make_agent, "git status --short")

    assert markers(repo) == ["FSMONITOR"]
