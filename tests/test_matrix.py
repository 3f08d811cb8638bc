"""The matrix connector against a real Synapse: a real `mibyan gateway`, matrix-nio as the people in the
rooms, the scripted model behind the agent."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_until
from gatewaying import RunningGateway, write_config
from loopback import Reply, ScriptedServer, echo, user_texts
from synapsing import Synapse, User, joined, membership, missing_reason, typing

pytestmark = [
    pytest.mark.chat_servers,
    pytest.mark.skipif(missing_reason() is not None, reason=str(missing_reason())),
]

MEEPA = {"id": "meepa", "default": True, "provider": "local", "model": "meepa-model"}
PASSWORD = "bot-password"
_bots = itertools.count()


@pytest.fixture(scope="session")
def synapse(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Synapse]:
    homeserver = Synapse(tmp_path_factory.mktemp("synapse"))
    yield homeserver
    homeserver.kill()


def _user(synapse: Synapse, name: str) -> Iterator[User]:
    user = User(synapse, name)
    synapse.exempt(user.user_id)  # the people are not under test: their messages go through at once
    yield user
    user.close()


@pytest.fixture(scope="session")
def alice(synapse: Synapse) -> Iterator[User]:
    yield from _user(synapse, "alice")


@pytest.fixture(scope="session")
def carol(synapse: Synapse) -> Iterator[User]:
    yield from _user(synapse, "carol")


@pytest.fixture(scope="session")
def mallory(synapse: Synapse) -> Iterator[User]:
    yield from _user(synapse, "mallory")


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer(default=echo) as scripted:
        yield scripted


def new_bot(synapse: Synapse, *, exempt: bool = True) -> str:
    """A fresh bot account (each test its own: no test sees another's rooms); rate limits lifted unless
    the test is about them."""
    name = f"meepa{os.getpid()}x{next(_bots)}"
    synapse.register(name, PASSWORD)
    user_id = f"@{name}:localhost"
    if exempt:
        synapse.exempt(user_id)
    return user_id


def start(
    home: Path,
    server: ScriptedServer,
    synapse: Synapse,
    bot: str,
    *,
    allow: list[str] | None = None,
    gateway: dict[str, Any] | None = None,
    token: str | None = None,
    progress: str = "off",
) -> RunningGateway:
    """The gateway with one matrix connector for `bot`, logging in with its password (or `token`)."""
    secret = (
        {"access_token_env": "MIBYAN_MATRIX_TOKEN"} if token else {"password_env": "MIBYAN_MATRIX_PASSWORD"}
    )
    connector = {
        "name": "team",
        "kind": "matrix",
        "homeserver": synapse.url,
        "user_id": bot,
        **secret,
        "allow": allow or ["@alice:localhost", "@carol:localhost"],
        "progress": progress,  # the tests about other things count the replies alone
    }
    write_config(home, {"local": server.base_url}, [MEEPA], connectors=[connector], gateway=gateway)
    env = {"MIBYAN_MATRIX_TOKEN": token} if token else {"MIBYAN_MATRIX_PASSWORD": PASSWORD}
    return RunningGateway(home, env=env)


def dm(user: User, bot: str) -> str:
    """A direct room with the bot, once the bot has accepted the invitation."""
    room = user.room(bot, direct=True, name="dm")
    assert wait_until(lambda: joined(user, room, bot)), "the bot did not join"
    return room


def replies(user: User, room: str, bot: str, count: int, timeout: float = 30) -> list[dict[str, Any]]:
    """The bot's messages in the room once there are `count` of them (fails if they never come)."""
    found = wait_until(lambda: m if len(m := user.messages(room, bot)) >= count else None, timeout)
    assert found, f"expected {count} replies from the bot, got {user.messages(room, bot)}"
    return list(found)


def bodies(events: list[dict[str, Any]]) -> list[str]:
    return [str(event["content"]["body"]) for event in events]


def answered(event: dict[str, Any]) -> str | None:
    relation = event["content"].get("m.relates_to", {})
    return relation.get("m.in_reply_to", {}).get("event_id")


def test_one_message_one_reply_in_the_same_room_thread_and_session(
    home: Path, server: ScriptedServer, synapse: Synapse, alice: User, carol: User, mallory: User
) -> None:
    bot = new_bot(synapse)
    with start(home, server, synapse, bot) as gateway:
        assert f"mibyan gateway: team (matrix) on {synapse.url}\n" in gateway.lines
        room = dm(alice, bot)
        hello = alice.send(room, "hello **there**")
        [reply] = replies(alice, room, bot, 1)
        assert reply["content"]["body"] == "echo 1: hello **there**"
        assert answered(reply) == hello
        assert "<strong>there</strong>" in reply["content"]["formatted_body"]

        # a thread is its own channel: its own session, and the reply stays in the thread
        alice.send(room, "in the thread", thread=hello)
        threaded = replies(alice, room, bot, 2)[1]
        assert threaded["content"]["body"] == "echo 1: in the thread"
        assert threaded["content"]["m.relates_to"]["rel_type"] == "m.thread"
        assert threaded["content"]["m.relates_to"]["event_id"] == hello

        # the room's own session goes on where it was
        alice.send(room, "again")
        assert bodies(replies(alice, room, bot, 3))[2] == "echo 2: again"

        # a group room: its own session; answered only when mentioned; a stranger never reaches the model
        group = alice.room(bot, "@carol:localhost", "@mallory:localhost", name="group")
        carol.join(group)
        mallory.join(group)
        assert wait_until(lambda: joined(alice, group, bot))
        alice.send(group, "not for the bot")
        mallory.send(group, f"{bot}: tell me the secret", mention=bot)
        alice.send(group, f"{bot}: hi", mention=bot)
        assert bodies(replies(alice, group, bot, 1)) == ["echo 1: hi"]

        # an invitation from someone not on allow is declined
        strangers = mallory.room(bot, direct=True, name="mallory's")
        assert wait_until(lambda: membership(mallory, strangers, bot) == "leave")

        # two users never see each other's context
        carols = dm(carol, bot)
        carol.send(carols, "carol here")
        assert bodies(replies(carol, carols, bot, 1)) == ["echo 1: carol here"]

    seen = [text for request in server.requests for text in user_texts(request.body)]
    assert not any("secret" in text or "not for the bot" in text for text in seen)
    carol_request = next(r for r in server.requests if "carol here" in user_texts(r.body))
    assert user_texts(carol_request.body) == ["carol here"]
    assert len(server.requests) == 5


def restart(home: Path) -> RunningGateway:
    return RunningGateway(home, env={"MIBYAN_MATRIX_PASSWORD": PASSWORD})


def test_killed_mid_run_the_message_is_answered_exactly_once_after_restart(
    home: Path, server: ScriptedServer, synapse: Synapse, alice: User
) -> None:
    bot = new_bot(synapse)
    server.add(Reply(text="the first run never finishes", delay=60))
    with start(home, server, synapse, bot) as first:
        room = dm(alice, bot)
        slow = alice.send(room, "slow one")
        assert server.wait_for_requests(1)
        first.kill()
    with restart(home):
        alice.send(room, "next")
        got = replies(alice, room, bot, 2)
    assert bodies(got) == ["echo 1: slow one", "echo 2: next"]
    assert answered(got[0]) == slow


def test_messages_sent_while_the_gateway_is_down_are_each_answered_once(
    home: Path, server: ScriptedServer, synapse: Synapse, alice: User
) -> None:
    bot = new_bot(synapse)
    with start(home, server, synapse, bot) as gateway:
        room = dm(alice, bot)
        gateway.terminate()
    sent = [alice.send(room, f"missed {n}") for n in range(15)]  # more than one sync's timeline holds
    with restart(home):
        alice.send(room, "after")
        got = replies(alice, room, bot, 16)
    assert [answered(event) for event in got[:15]] == sent
    assert bodies(got) == [f"echo {n + 1}: missed {n}" for n in range(15)] + ["echo 16: after"]


def test_a_fresh_store_on_an_account_with_history_answers_none_of_it(
    home: Path, tmp_path: Path, server: ScriptedServer, synapse: Synapse, alice: User
) -> None:
    bot = new_bot(synapse)
    with start(home, server, synapse, bot) as gateway:
        room = dm(alice, bot)
        alice.send(room, "first")
        replies(alice, room, bot, 1)
        gateway.terminate()
    alice.send(room, "old history")
    fresh = tmp_path / "fresh-home"
    fresh.mkdir()
    with start(fresh, server, synapse, bot):
        alice.send(room, "new")
        got = replies(alice, room, bot, 2)
    assert bodies(got) == ["echo 1: first", "echo 1: new"]
    assert not any("old history" in text for r in server.requests for text in user_texts(r.body))


def test_a_crash_between_sending_and_recording_it_sent_shows_no_duplicate(
    home: Path, server: ScriptedServer, synapse: Synapse, alice: User
) -> None:
    import sqlite3

    bot = new_bot(synapse)
    server.add(Reply(text="part one\n" + "x" * 3995))  # two parts: both sent again, both recognised
    with start(home, server, synapse, bot) as gateway:
        room = dm(alice, bot)
        alice.send(room, "hello")
        replies(alice, room, bot, 2)
        gateway.kill()
    # the state such a crash leaves: the reply recorded, its sending not
    with sqlite3.connect(home / "state.db") as db:
        assert db.execute("UPDATE gateway_outbox SET status = 'pending', sent_at = NULL").rowcount == 1
    with restart(home):
        alice.send(room, "next")
        got = replies(alice, room, bot, 3)
    assert [body[:8] for body in bodies(got)] == ["part one", "x" * 8, "echo 2: "]


def test_stop_interrupts_a_long_run(
    home: Path, server: ScriptedServer, synapse: Synapse, alice: User
) -> None:
    bot = new_bot(synapse)
    server.add(Reply(text="too late", delay=60))
    with start(home, server, synapse, bot):
        room = dm(alice, bot)
        alice.send(room, "a long job")
        assert server.wait_for_requests(1)
        assert wait_until(lambda: typing(alice, room, bot)), "no typing while the run works"
        alice.send(room, "/stop")
        assert server.wait_for_hangups(1)
        got = replies(alice, room, bot, 2)
        assert sorted(bodies(got)) == ["Stopped.", "Stopping the running turn."]
        alice.send(room, "after")
        assert bodies(replies(alice, room, bot, 3))[2].endswith(": after")
    assert not any("too late" in body for body in bodies(alice.messages(room, bot)))


def test_the_next_message_is_answered_after_the_homeserver_restarts(
    home: Path, server: ScriptedServer, synapse: Synapse, alice: User
) -> None:
    bot = new_bot(synapse)
    with start(home, server, synapse, bot):
        room = dm(alice, bot)
        alice.send(room, "before")
        replies(alice, room, bot, 1)
        synapse.restart()
        alice.send(room, "after the restart")
        got = replies(alice, room, bot, 2, timeout=30)
    assert bodies(got) == ["echo 1: before", "echo 2: after the restart"]


def _log_out(synapse: Synapse, token: str) -> None:
    """End a login as the account's owner would from another device (the token stops working)."""
    synapse.request("POST", "/_matrix/client/v3/logout", {}, token=token)


def _logged(home: Path, text: str) -> bool:
    path = home / "logs" / "gateway.log"
    return path.is_file() and text in path.read_text()


def test_a_login_the_homeserver_ended_is_made_again_with_the_password(
    home: Path, server: ScriptedServer, synapse: Synapse, alice: User
) -> None:
    bot = new_bot(synapse)
    with start(home, server, synapse, bot):
        room = dm(alice, bot)
        alice.send(room, "before")
        replies(alice, room, bot, 1)
        kept = json.loads((home / "connectors" / "team" / "login.json").read_text())
        _log_out(synapse, kept["access_token"])
        alice.send(room, "after the logout")
        got = replies(alice, room, bot, 2)
    assert bodies(got) == ["echo 1: before", "echo 2: after the logout"]
    assert _logged(home, "the homeserver ended its login (M_UNKNOWN_TOKEN); logged in again")
    again = json.loads((home / "connectors" / "team" / "login.json").read_text())
    assert again["access_token"] != kept["access_token"]


def test_a_revoked_access_token_stops_the_connector_with_one_line_and_loses_nothing(
    home: Path, server: ScriptedServer, synapse: Synapse, alice: User
) -> None:
    bot = new_bot(synapse)
    body = {
        "type": "m.login.password",
        "identifier": {"type": "m.id.user", "user": bot},
        "password": PASSWORD,
    }
    first, second = (synapse.request("POST", "/_matrix/client/v3/login", body)["access_token"] for _ in "12")
    with start(home, server, synapse, bot, token=first) as gateway:
        room = dm(alice, bot)
        _log_out(synapse, first)
        assert wait_until(lambda: _logged(home, "the connector stopped"))
        alice.send(room, "sent while the token was revoked")
        assert gateway.terminate() == 0
    log = (home / "logs" / "gateway.log").read_text()
    assert log.count("the homeserver refused its access token (M_UNKNOWN_TOKEN") == 1
    assert "set a new token in MIBYAN_MATRIX_TOKEN and restart the gateway" in log
    assert server.requests == []
    with start(home, server, synapse, bot, token=second):
        got = replies(alice, room, bot, 1)
    assert bodies(got) == ["echo 1: sent while the token was revoked"]


def test_files_people_send_are_saved_in_the_inbox_within_the_limit_and_never_through_a_link(
    home: Path, server: ScriptedServer, synapse: Synapse, alice: User, tmp_path: Path
) -> None:
    bot = new_bot(synapse)
    inbox = home / "agents" / "meepa" / "workspace" / "inbox"
    with start(home, server, synapse, bot, gateway={"max_attachment_mb": 0.0001}):  # 100 bytes
        room = dm(alice, bot)
        alice.send_file(room, "../../notes .txt", b"ten bytes!", caption="read this")
        alice.send_file(room, "big.bin", b"x" * 500)
        first = bodies(replies(alice, room, bot, 2))
        saved = [(path.name, path.read_bytes(), path.stat().st_mode & 0o777) for path in inbox.iterdir()]
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        inbox.rename(tmp_path / "old-inbox")
        inbox.symlink_to(elsewhere)  # what the agent's own commands could have done in its workspace
        alice.send_file(room, "third.txt", b"third")
        third = bodies(replies(alice, room, bot, 3))[2]
    [(name, data, mode)] = saved
    assert name.endswith("-notes_.txt") and data == b"ten bytes!" and mode == 0o600
    assert first[0] == f"echo 1: read this\n[the sender attached a file, saved as inbox/{name} (10 bytes)]"
    assert (
        first[1]
        == "echo 2: [the sender attached a file, big.bin (500 bytes): over the 0.0001 MB limit, not saved]"
    )
    assert (
        third
        == "echo 3: [the sender attached a file, third.txt (5 bytes): not saved, inbox/ is not a folder]"
    )
    assert list(elsewhere.iterdir()) == []


def test_a_status_message_is_edited_as_tools_run_and_left_as_a_summary_above_the_answer(
    home: Path, server: ScriptedServer, synapse: Synapse, alice: User
) -> None:
    bot = new_bot(synapse)
    server.add(
        Reply(tool_calls=[("terminal", {"command": "echo one"})]),
        Reply(tool_calls=[("terminal", {"command": "echo two"})]),
        Reply(text="Both ran."),
    )
    with start(home, server, synapse, bot, progress="edit"):
        room = dm(alice, bot)
        alice.send(room, "run them")

        def answered() -> list[dict[str, Any]] | None:
            found = alice.messages(room, bot)
            return found if any(e["content"]["body"] == "Both ran." for e in found) else None

        events = wait_until(answered)
    assert events, alice.messages(room, bot)
    edits = [e for e in events if e["content"].get("m.relates_to", {}).get("rel_type") == "m.replace"]
    shown = [e for e in events if e not in edits]
    assert [e["content"]["body"] for e in shown] == ["⚙ terminal: `echo one`", "Both ran."]
    assert {e["content"]["m.relates_to"]["event_id"] for e in edits} == {shown[0]["event_id"]}
    assert edits[-1]["content"]["m.new_content"]["body"] == "⚙ terminal ×2"
    assert events.index(edits[-1]) < events.index(shown[1])  # the summary is in place before the answer


def _long_reply() -> str:
    """About 20 kB of prose and code blocks, each block smaller than one part."""
    sections = []
    for n in range(16):
        code = "\n".join(f"    value_{n}_{line} = compute({line})  # step {n}" for line in range(33))
        sections.append(f"## Step {n}\n\nSome *prose* about step {n} & <its> code.\n\n```python\n{code}\n```")
    return "\n\n".join(sections)


def test_a_long_reply_arrives_complete_in_order_once_under_default_rate_limits(
    home: Path, server: ScriptedServer, synapse: Synapse, alice: User
) -> None:
    bot = new_bot(synapse, exempt=False)  # Synapse's default: a burst of 10 messages, then one per 5 s
    long = _long_reply()
    assert len(long) > 20_000
    server.add(*(Reply(text=f"short {n}") for n in range(5)), Reply(text=long))
    with start(home, server, synapse, bot):
        room = dm(alice, bot)
        for n in range(6):
            alice.send(room, f"message {n}")

        def complete() -> list[str] | None:
            parts = bodies(alice.messages(room, bot))[5:]
            return parts if len("\n".join(parts)) >= len(long) else None  # parts are cut at newlines

        found = wait_until(complete, 120)
        assert found
        assert bodies(alice.messages(room, bot))[:5] == [f"short {n}" for n in range(5)]
    assert "\n".join(found) == long
    assert all(len(part) <= 4000 and part.count("```") % 2 == 0 for part in found)
    assert any("rate-limited" in line for line in (home / "logs" / "gateway.log").read_text().splitlines())


def test_approve_from_the_asker_runs_the_command_and_from_anyone_else_it_does_not(
    home: Path, server: ScriptedServer, synapse: Synapse, alice: User, carol: User
) -> None:
    bot = new_bot(synapse)
    build = home / "agents" / "meepa" / "workspace" / "build"
    build.mkdir(parents=True)
    server.add(
        Reply(tool_calls=[("terminal", {"command": "rm -rf build"})]), Reply(text="The build is gone.")
    )
    with start(home, server, synapse, bot, gateway={"approvals": "ask"}):
        group = alice.room(bot, "@carol:localhost", name="work")
        carol.join(group)
        assert wait_until(lambda: joined(alice, group, bot))
        alice.send(group, f"{bot}: clean the build folder", mention=bot)
        [question] = replies(alice, group, bot, 1)
        assert "rm -rf build" in question["content"]["body"] and build.exists()
        carol.send(group, f"{bot}: /approve", mention=bot)
        assert bodies(replies(alice, group, bot, 2))[1] == "Only @alice:localhost can answer that question."
        assert build.exists()
        alice.send(group, "/approve")  # answering the question asked of her needs no mention
        assert bodies(replies(alice, group, bot, 3))[2] == "The build is gone."
    assert not build.exists()


def test_commands_and_encrypted_rooms(
    home: Path, server: ScriptedServer, synapse: Synapse, alice: User
) -> None:
    bot = new_bot(synapse)
    with start(home, server, synapse, bot, allow=["*"]) as gateway:
        assert "mibyan gateway: warning: team: answers anyone who writes to it (allow: *)\n" in gateway.lines
        room = dm(alice, bot)
        secret = alice.room(bot, direct=True, name="secret", encrypted=True)
        assert wait_until(lambda: joined(alice, secret, bot))
        alice.send(secret, "an unencrypted message in an encrypted room")
        alice.send(room, "one")
        replies(alice, room, bot, 1)
        alice.send(room, "/help")
        alice.send(room, "/status")
        alice.send(room, "/new")
        alice.send(room, "two")
        got = bodies(replies(alice, room, bot, 5))
    assert got[0] == "echo 1: one"
    assert "/stop" in got[1] and "/new" in got[1]
    assert got[2].startswith("Agent meepa, ") and "meepa/team/" in got[2]
    assert got[3].startswith("Done: your next message starts a fresh session")
    assert got[4] == "echo 1: two"
    assert alice.messages(secret, bot) == []
    log = (home / "logs" / "gateway.log").read_text()
    assert log.count("is encrypted: not supported, never answered") == 1
