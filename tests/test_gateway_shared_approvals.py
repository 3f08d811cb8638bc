"""Approvals across `mibyan gateway` processes on one PostgreSQL store (DESIGN §16): the answer to a run's
question reaches that run whichever gateway it arrives at, once, and never another channel's run.

Both gateways look at the store only every hour (`gateway.poll_seconds`), so the answer can only reach the
asking gateway, and its reply the answering one, through LISTEN/NOTIFY.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from gatewaying import TOKEN, RunningGateway, write_config
from loopback import Reply, ScriptedServer

pytestmark = pytest.mark.postgres

MEEPA = {"id": "meepa", "default": True, "provider": "local", "model": "meepa-model"}
CLEAN = Reply(tool_calls=[("terminal", {"command": "rm -rf build"})])
ONLY_NOTICES = 3600.0  # seconds between two looks at the store: no test waits that long


def _home(tmp_path: Path, name: str, server: ScriptedServer, pg_url: str, **gateway: Any) -> Path:
    home = tmp_path / name
    home.mkdir(mode=0o700)
    gateway = {"approvals": "ask", "poll_seconds": ONLY_NOTICES, **gateway}
    write_config(home, {"local": server.base_url}, [MEEPA], gateway=gateway, extra={"store": {"url": pg_url}})
    build = home / "agents" / "meepa" / "workspace" / "build"  # where the agent's commands run
    build.mkdir(parents=True)
    (build / "out.o").write_text("object code")
    return home


def _say(gateway: RunningGateway, text: str, channel: str = "lee", key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {TOKEN}", "X-Mibyan-Channel": channel}
    if key is not None:
        headers["Idempotency-Key"] = key
    return httpx.post(
        f"{gateway.url}/chat/completions",
        json={"model": "meepa", "messages": [{"role": "user", "content": text}]},
        headers=headers,
        timeout=120,
    )


def _text(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["message"]["content"])


@pytest.fixture
def two(server: ScriptedServer, tmp_path: Path, pg_url: str) -> Any:
    homes = [_home(tmp_path, name, server, pg_url) for name in ("a", "b")]
    with RunningGateway(homes[0]) as a, RunningGateway(homes[1]) as b:
        yield a, b


def test_an_approval_answered_at_the_other_gateway_reaches_the_run_that_asked(
    two: tuple[RunningGateway, RunningGateway], server: ScriptedServer
) -> None:
    a, b = two
    server.add(CLEAN, Reply(text="The build folder is gone."))
    question = _text(_say(a, "clean the build folder"))
    assert "rm -rf build" in question and "/approve" in question

    answered = _say(b, "/approve", key="answer-1")

    assert _text(answered) == "The build folder is gone."
    for gateway in (b, a):  # the answer repeated, at either gateway: its first reply, nothing run again
        assert _text(_say(gateway, "/approve", key="answer-1")) == "The build folder is gone."
    assert not (a.home / "agents/meepa/workspace/build").exists()  # it ran on the gateway that asked
    assert (b.home / "agents/meepa/workspace/build").exists()
    assert len(server.requests) == 2
    tool_result = server.requests[1].body["messages"][-1]
    assert tool_result["role"] == "tool" and "denied" not in tool_result["content"]


def test_an_answer_is_taken_once_and_a_second_one_is_refused_at_either_gateway(
    two: tuple[RunningGateway, RunningGateway], server: ScriptedServer
) -> None:
    a, b = two
    server.add(CLEAN, Reply(text="I left it alone."))
    _text(_say(a, "clean the build folder"))

    with ThreadPoolExecutor(2) as pool:  # /deny at one gateway, /approve at the other, at once
        answers = list(pool.map(lambda pair: _say(*pair), [(a, "/deny"), (b, "/approve")]))

    statuses = sorted(response.status_code for response in answers)
    assert statuses == [200, 409], [r.text for r in answers]
    (taken,) = [r for r in answers if r.status_code == 200]
    assert _text(taken) == "I left it alone."
    (refused,) = [r for r in answers if r.status_code == 409]
    assert refused.json()["error"]["code"] == "nothing_to_answer"
    assert len(server.requests) == 2  # the run went on once
    for gateway in (a, b):  # answered: nothing waits for an answer any more
        again = _say(gateway, "/approve")
        assert again.status_code == 409 and "nothing" in again.json()["error"]["message"]


def test_an_answer_on_another_channel_is_refused_and_the_asking_run_still_waits(
    two: tuple[RunningGateway, RunningGateway], server: ScriptedServer
) -> None:
    a, b = two
    server.add(CLEAN, Reply(text="The build folder is gone."))
    _text(_say(a, "clean the build folder", channel="lee"))

    elsewhere = _say(b, "/approve", channel="kim")

    assert elsewhere.status_code == 409
    assert (a.home / "agents/meepa/workspace/build").exists()
    assert _text(_say(b, "/approve", channel="lee")) == "The build folder is gone."
    assert not (a.home / "agents/meepa/workspace/build").exists()


def test_another_message_at_the_other_gateway_is_told_to_answer_first(
    two: tuple[RunningGateway, RunningGateway], server: ScriptedServer
) -> None:
    a, b = two
    server.add(CLEAN, Reply(text="done"))
    _text(_say(a, "clean the build folder"))

    reminder = _text(_say(b, "what is the weather?"))

    assert reminder.startswith("Answer /approve or /deny first") and "rm -rf build" in reminder
    assert len(server.requests) == 1
    assert _text(_say(b, "/approve")) == "done"


def test_an_answer_after_the_asking_gateway_was_killed_is_refused_and_the_command_never_runs(
    server: ScriptedServer, tmp_path: Path, pg_url: str
) -> None:
    # a gateway killed sends no notice: the answering one sees it gone when it looks again (each second)
    homes = [_home(tmp_path, name, server, pg_url, lease_seconds=2, poll_seconds=1) for name in ("a", "b")]
    server.add(CLEAN, Reply(text="I did not clean it."))  # the second: the taken-over run's
    with RunningGateway(homes[0]) as a, RunningGateway(homes[1]) as b:
        _text(_say(a, "clean the build folder"))
        a.kill()

        refused = _say(b, "/approve")

        assert refused.status_code == 409, refused.text
        assert "no longer waits" in refused.json()["error"]["message"]
    for home in homes:
        assert (home / "agents/meepa/workspace/build").exists()
