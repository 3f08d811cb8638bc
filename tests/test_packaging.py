"""The installed wheel: one namespace, data files inside, and no clash with a user's own modules."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT
from loopback import Reply, ScriptedServer

USERS_PROJECT = {
    "config.py": "raise SystemExit('the user config.py was imported')\n",
    "cli.py": "raise SystemExit('the user cli.py was imported')\n",
    "tools/__init__.py": "raise SystemExit('the user tools/ was imported')\n",
    "agent/__init__.py": "raise SystemExit('the user agent/ was imported')\n",
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("setuptools", reason="building the wheel needs setuptools (in the dev extra)")
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", f"-w{out}", "."],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("mibyan-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the wheel alone; its dependencies come from this venv (no network)."""
    target = tmp_path_factory.mktemp("venv")
    venv.create(target, with_pip=False)
    python = target / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    # The dependencies, without this checkout's editable mibyan: a plain path entry runs no .pth file.
    (site / "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    bin_dir = target / "bin"
    script = f"#!{python}\nfrom mibyan.cli.main import main\nraise SystemExit(main())\n"
    (bin_dir / "mibyan").write_text(script)
    (bin_dir / "mibyan").chmod(0o755)
    return target


def test_the_wheel_installs_four_top_level_names_and_the_defaults(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"mibyan", "run_agent.py", "model_tools.py", "agent_state.py"}
    assert "mibyan/config/defaults.yaml" in names
    assert {
        "mibyan/gateway/runner.py",
        "mibyan/gateway/connectors/http.py",
        "mibyan/editors/server.py",
        "mibyan/web/templates/session.html",
        "mibyan/web/static/web.js",
        "mibyan/web/static/web.css",
    } <= set(names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    with zipfile.ZipFile(wheel) as archive:
        assert "mibyan = mibyan.cli.main:main" in archive.read(entry_points).decode()


def _users_project(folder: Path) -> None:
    for relative, text in USERS_PROJECT.items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_text(text)


def _run_in_project(
    command: list[Any], project: Path, home: Path, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run `command` from the user's project, as its own environment would: nothing of this checkout."""
    environment = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "PYTHONPATH"}
    environment.update(MIBYAN_HOME=str(home), **env)
    return subprocess.run(command, cwd=project, env=environment, capture_output=True, text=True, timeout=60)


def test_a_project_with_its_own_config_and_tools_imports_and_runs_mibyan(
    installed: Path, server: ScriptedServer, home: Path, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    _users_project(project)
    (project / "my_script.py").write_text(
        "import sys\n"
        "from run_agent import AIAgent\n"
        "from mibyan import AIAgent as Same\n"
        "assert AIAgent is Same\n"
        "agent = AIAgent(model='m', base_url=sys.argv[1])\n"
        "print(agent.chat('hi'))\n"
    )
    server.add(Reply(text="hello from the wheel"))

    done = _run_in_project([installed / "bin" / "python", "my_script.py", server.base_url], project, home)

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "hello from the wheel"
    assert str(ROOT) not in done.stderr


def test_the_console_script_from_the_wheel_answers_in_a_users_project(
    installed: Path, server: ScriptedServer, home: Path, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    _users_project(project)
    server.add(Reply(text="one-shot answer"))

    done = _run_in_project(
        [installed / "bin" / "mibyan", "chat", "-q", "hi", "--base-url", server.base_url], project, home
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "one-shot answer"
    where = _run_in_project(
        [installed / "bin" / "python", "-c", "import mibyan.config.loader as m; print(m.__file__)"],
        project,
        home,
    ).stdout
    assert where.startswith(str(installed))


def test_the_version_is_the_installed_packages(installed: Path, home: Path) -> None:
    (metadata,) = installed.glob("lib/python*/site-packages/mibyan-*.dist-info/METADATA")
    original = metadata.read_text()
    # As if a release had bumped pyproject.toml: the command must report that, not a copy of its own.
    metadata.write_text(original.replace("\nVersion: ", "\nVersion: 7.7.7.dev0+", 1))
    try:
        done = _run_in_project([installed / "bin" / "mibyan", "--version"], home, home)
    finally:
        metadata.write_text(original)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("mibyan 7.7.7.dev0+")


def test_the_gateway_from_the_wheel_checks_its_configuration(
    installed: Path, server: ScriptedServer, home: Path, tmp_path: Path
) -> None:
    agents = "agents: [{id: meepa, provider: local}]\nconnectors: [{name: api, kind: http, port: 0}]\n"
    local = f"providers: {{local: {{api_mode: chat_completions, base_url: '{server.base_url}'}}}}\n"
    (home / "config.yaml").write_text(local + agents)

    done = _run_in_project(
        [installed / "bin" / "mibyan", "gateway", "--check"], tmp_path, home, MIBYAN_GATEWAY_TOKEN="t"
    )

    assert done.returncode == 0, done.stderr
    assert "configuration is valid: 1 agent(s), 1 connector(s)" in done.stderr
