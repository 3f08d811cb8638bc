"""What a channel of `gateway.approvals: ask` cannot reach, whatever it answers: the machine's secrets.

The commands a channel approves still run in the gateway's sandbox, and with bubblewrap that sandbox
masks the places of secrets the judge knows (`/etc/shadow`, `~/.ssh`, ...) and the home of the user
running the gateway; a command the judge sees reading a secret is refused without asking.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from gatewaying import RunningGateway, write_config
from loopback import Reply, ScriptedServer
from sandboxing import needs_bwrap
from test_gateway import MEEPA, ask

KEY = "-----BEGIN FAKE KEY----- the-secret-of-the-test\n"


@pytest.fixture(scope="module")
def user_home() -> Iterator[Path]:
    """The home of the user running the gateway ($HOME), holding a (fake) SSH key and a project's notes;
    outside the temporary directory, whose place the agent's own /tmp takes in its sandbox."""
    base = Path("/var/tmp")
    if not base.is_dir() or str(base).startswith(tempfile.gettempdir()):
        pytest.skip("needs /var/tmp outside the temporary directory")
    folder = Path(tempfile.mkdtemp(prefix="mibyan-user-home-", dir=base))
    (folder / ".ssh").mkdir()
    (folder / ".ssh" / "id_rsa").write_text(KEY)
    (folder / "project").mkdir()
    (folder / "project" / "notes.txt").write_text("the-user-notes\n")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def served(
    user_home: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunningGateway, ScriptedServer]]:
    """One gateway (approvals: ask) for the module's tests, each on a channel of its own."""
    home = tmp_path_factory.mktemp("gateway") / "home"
    home.mkdir(mode=0o700)
    with ScriptedServer() as server:
        write_config(home, {"local": server.base_url}, [MEEPA], gateway={"approvals": "ask"})
        with RunningGateway(home, env={"HOME": str(user_home)}) as running:
            yield running, server


@pytest.fixture
def gateway(served: tuple[RunningGateway, ScriptedServer]) -> RunningGateway:
    return served[0]


@pytest.fixture
def server(served: tuple[RunningGateway, ScriptedServer]) -> ScriptedServer:
    return served[1]


def text(raw: object) -> str:
    return str(raw.parse().choices[0].message.content)  # type: ignore[attr-defined]


def approved_result(
    gateway: RunningGateway, server: ScriptedServer, command: str, files: str, *, channel: str
) -> str:
    """The result of `command`, run after the model wrote `files` to p.txt and the channel approved it."""
    server.add(
        Reply(tool_calls=[("write_file", {"path": "p.txt", "content": files})]),
        Reply(tool_calls=[("terminal", {"command": command})]),
        Reply(text="done"),
    )
    question = text(ask(gateway, "look", channel=channel))
    assert "/approve" in question, question
    assert text(ask(gateway, "/approve", channel=channel)) == "done"
    result = server.requests[-1].body["messages"][-1]
    assert result["role"] == "tool"
    return str(result["content"])


def _shadow_start() -> str | None:
    try:
        return Path("/etc/shadow").read_text().split(":", 1)[0] + ":"
    except OSError:
        return None  # not readable by whoever runs the tests: the sandbox has nothing to hide then


@needs_bwrap
def test_an_approved_command_reading_etc_shadow_through_xargs_gets_nothing(
    gateway: RunningGateway, server: ScriptedServer
) -> None:
    result = approved_result(gateway, server, "xargs head -c 40 < p.txt", "/etc/shadow\n", channel="a")

    start = _shadow_start()
    assert start is None or start not in result, result


@needs_bwrap
def test_an_approved_command_sees_nothing_of_the_home_of_the_user_running_the_gateway(
    gateway: RunningGateway, server: ScriptedServer, user_home: Path
) -> None:
    files = f"{user_home}/.ssh/id_rsa\n{user_home}/project/notes.txt\n"

    result = approved_result(gateway, server, "xargs cat < p.txt", files, channel="b")

    assert "the-secret-of-the-test" not in result and "the-user-notes" not in result, result
    assert "No such file" in result


def test_a_command_the_judge_sees_reading_a_secret_is_refused_without_asking(
    gateway: RunningGateway, server: ScriptedServer, user_home: Path
) -> None:
    commands = ["head -c 40 /etc/shadow", f"cat < {user_home}/.ssh/id_rsa", "cp ~/.ssh/id_rsa k"]
    server.add(Reply(tool_calls=[("terminal", {"command": c}) for c in commands]), Reply(text="no luck"))

    assert text(ask(gateway, "look", channel="c")) == "no luck"  # nobody was asked

    results = [m["content"] for m in server.requests[-1].body["messages"] if m["role"] == "tool"]
    assert len(results) == 3
    assert all("mibyan never runs this" in r and "which holds" in r for r in results), results
