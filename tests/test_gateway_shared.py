"""Several `mibyan gateway` processes on one PostgreSQL store (DESIGN §16): one run per channel across
all of them, in arrival order per gateway, each message answered once."""

from __future__ import annotations

import itertools
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest
from conftest import wait_until
from gatewaying import RunningGateway, write_config
from loopback import Reply, ScriptedServer, echo, user_texts

from agent_state import SessionStore

pytestmark = pytest.mark.postgres

MEEPA = {"id": "meepa", "default": True, "provider": "local", "model": "meepa-model"}


def _home(tmp_path: Path, name: str, server: ScriptedServer, pg_url: str, **gateway: Any) -> Path:
    home = tmp_path / name
    home.mkdir(mode=0o700)
    write_config(home, {"local": server.base_url}, [MEEPA], gateway=gateway, extra={"store": {"url": pg_url}})
    return home


def _say_in_order(gateway: RunningGateway, texts: list[str]) -> list[str]:
    client = gateway.client()
    replies = []
    for text in texts:  # each after the previous one's reply: this gateway's arrival order
        done = client.chat.completions.create(
            model="meepa",
            messages=[{"role": "user", "content": text}],
            extra_headers={"X-Mibyan-Channel": "team"},
        )
        replies.append(str(done.choices[0].message.content))
    return replies


def test_two_gateways_answer_fifty_messages_on_one_channel_once_each_never_overlapping(
    server: ScriptedServer, tmp_path: Path, pg_url: str
) -> None:
    server.default = (
        echo  # "echo N: text", N the user messages its session holds: overlapping turns repeat an N
    )
    texts = [f"message {i}" for i in range(50)]
    sent = {"a": texts[0::2], "b": texts[1::2]}  # alternately, to both at once
    homes = {name: _home(tmp_path, name, server, pg_url) for name in sent}
    with RunningGateway(homes["a"]) as a, RunningGateway(homes["b"]) as b, ThreadPoolExecutor(2) as pool:
        answered = {
            name: pool.submit(_say_in_order, gateway, sent[name]) for name, gateway in (("a", a), ("b", b))
        }
        replies = {name: future.result(timeout=300) for name, future in answered.items()}

    for name, texts_sent in sent.items():  # each reply answers its own message
        assert [reply.split(": ", 1)[1] for reply in replies[name]] == texts_sent
    turns = sorted(int(reply.split(":")[0].split()[1]) for reply in [*replies["a"], *replies["b"]])
    assert turns == list(range(1, 51))  # each turn saw every earlier one whole, and no turn ran twice
    assert len(server.requests) == 50
    with SessionStore.at_url(pg_url) as store:
        (session,) = [row for row in store.list_sessions() if row["source"] == "gateway"]
        history: list[Any] = store.load_messages(session["id"])
    assert [m["role"] for m in history] == ["user", "assistant"] * 50
    said = [m["content"] for m in history if m["role"] == "user"]
    for texts_sent in sent.values():  # the order each gateway got its messages in is kept
        assert [text for text in said if text in texts_sent] == texts_sent
    assert user_texts({"messages": history}) == said


def test_a_gateway_killed_mid_call_has_its_message_answered_once_by_the_other(
    server: ScriptedServer, tmp_path: Path, pg_url: str
) -> None:
    first_call, calls = threading.Event(), itertools.count()

    def model(body: dict[str, Any]) -> Reply:
        if next(calls) == 0:  # the doomed gateway's call: in flight until it has been killed
            first_call.wait(120)
        return echo(body)

    server.default = model
    homes = [_home(tmp_path, name, server, pg_url, lease_seconds=2) for name in ("doomed", "other")]
    with RunningGateway(homes[0]) as doomed, RunningGateway(homes[1]) as other:
        asked = threading.Thread(target=_ask_ignoring_failure, args=(doomed, "who takes this over?"))
        asked.start()
        assert server.wait_for_requests(1)
        doomed.kill()
        first_call.set()
        asked.join(60)

        def answered() -> list[Any] | None:
            with SessionStore.at_url(pg_url) as store:
                sessions = [row for row in store.list_sessions() if row["source"] == "gateway"]
                history = store.load_messages(sessions[0]["id"]) if sessions else []
            return history if any(m["role"] == "assistant" for m in history) else None

        history = wait_until(answered, timeout=120)
        assert [(m["role"], m["content"]) for m in history or []] == [
            ("user", "who takes this over?"),
            ("assistant", "echo 1: who takes this over?"),
        ]
        assert _say_in_order(other, ["and now?"]) == ["echo 2: and now?"]
    assert len(server.requests) == 3  # the killed gateway's call, the other's for that message, the next


def test_a_killed_gateways_message_without_an_idempotency_key_is_not_run_again_by_another(
    server: ScriptedServer, tmp_path: Path, pg_url: str
) -> None:
    """As at a restart: its client, cut off, repeats it as a new message; taken over, it would be asked
    of the model twice, its answer to nobody."""
    release = _held_first_call(server)
    homes = [_home(tmp_path, name, server, pg_url, lease_seconds=2) for name in ("doomed", "other")]
    with RunningGateway(homes[0]) as doomed, RunningGateway(homes[1]) as other:
        asked = threading.Thread(target=_ask_ignoring_failure, args=(doomed, "keyless", None, False))
        asked.start()
        assert server.wait_for_requests(1)
        with SessionStore.at_url(pg_url) as store:
            (cut,) = store.ledger.unfinished()
        doomed.kill()
        release.set()
        asked.join(60)

        def status() -> str:
            with SessionStore.at_url(pg_url) as store:
                return str((store.ledger.inbound(cut["id"]) or {}).get("status"))

        assert wait_until(lambda: status() in ("failed", "answered") or None, timeout=60)
        assert status() == "failed"
        assert _say_in_order(other, ["keyless"]) == ["echo 2: keyless"]  # the repeat, run once
    assert len(server.requests) == 2
    assert "without an Idempotency-Key" in _log(homes[1])


def test_a_killed_gateways_messages_running_and_queued_are_answered_at_once_by_another(
    server: ScriptedServer, tmp_path: Path, pg_url: str
) -> None:
    # an hour's lease: only the mark a live gateway holds, gone with the killed process, frees it sooner
    release = _held_first_call(server)
    homes = [_home(tmp_path, name, server, pg_url, lease_seconds=3600) for name in ("doomed", "other")]
    with RunningGateway(homes[0]) as doomed, RunningGateway(homes[1]) as other:
        asked = [
            threading.Thread(target=_ask_ignoring_failure, args=(doomed, text))
            for text in ("still there?", "and this one, queued behind it?")
        ]
        asked[0].start()
        assert server.wait_for_requests(1)
        asked[1].start()

        def unfinished() -> int:
            with SessionStore.at_url(pg_url) as store:
                return len(store.ledger.unfinished())

        assert wait_until(lambda: unfinished() == 2 or None, timeout=60)  # the second one is queued
        doomed.kill()
        release.set()
        for thread in asked:
            thread.join(60)
        # nobody asks the other gateway anything: it answers both on its own, in order, once each
        assert wait_until(lambda: len(_history(pg_url)) == 4 or None, timeout=60)
        assert _say_in_order(other, ["and after?"]) == ["echo 3: and after?"]
    assert _history(pg_url) == [
        ("user", "still there?"),
        ("assistant", "echo 1: still there?"),
        ("user", "and this one, queued behind it?"),
        ("assistant", "echo 2: and this one, queued behind it?"),
        ("user", "and after?"),
        ("assistant", "echo 3: and after?"),
    ]
    assert len(server.requests) == 4  # the killed gateway's call, then the other's three


def _ask_ignoring_failure(
    gateway: RunningGateway, text: str, outcomes: list[str] | None = None, keyed: bool = True
) -> None:
    """Ask on the channel (with the text as its Idempotency-Key, as a client that collects its reply by
    repeating it: unless not `keyed`); `outcomes` gets "answered" or "failed" (a killed gateway's fails)."""
    headers = {"X-Mibyan-Channel": "team", **({"Idempotency-Key": text} if keyed else {})}
    try:
        gateway.client().chat.completions.create(
            model="meepa", messages=[{"role": "user", "content": text}], extra_headers=headers
        )
        said = "answered"
    except openai.APIError:
        said = "failed"
    if outcomes is not None:
        outcomes.append(said)


def _held_first_call(server: ScriptedServer) -> threading.Event:
    """The server's first model call waits until the returned event is set; every call echoes."""
    release, calls = threading.Event(), itertools.count()

    def model(body: dict[str, Any]) -> Reply:
        if next(calls) == 0:
            release.wait(120)
        return echo(body)

    server.default = model
    return release


def _log(home: Path) -> str:
    path = home / "logs" / "gateway.log"
    return path.read_text() if path.exists() else ""


def _history(pg_url: str) -> list[tuple[str, Any]]:
    with SessionStore.at_url(pg_url) as store:
        sessions = [row for row in store.list_sessions() if row["source"] == "gateway"]
        history = store.load_messages(sessions[0]["id"]) if sessions else []
    return [(m["role"], m["content"]) for m in history]


def test_a_gateway_stopped_past_its_lease_and_resumed_writes_nothing_more(
    server: ScriptedServer, tmp_path: Path, pg_url: str
) -> None:
    release = _held_first_call(server)
    homes = [_home(tmp_path, name, server, pg_url, lease_seconds=2) for name in ("stopped", "other")]
    with RunningGateway(homes[0]) as stopped, RunningGateway(homes[1]):
        outcomes: list[str] = []
        asked = threading.Thread(target=_ask_ignoring_failure, args=(stopped, "who answers?", outcomes))
        asked.start()
        assert server.wait_for_requests(1)
        stopped.process.send_signal(signal.SIGSTOP)
        answer = [("user", "who answers?"), ("assistant", "echo 1: who answers?")]
        assert wait_until(lambda: _history(pg_url) == answer, timeout=120)  # taken over
        release.set()  # the stopped gateway's call gets its answer too, once it runs again
        stopped.process.send_signal(signal.SIGCONT)
        asked.join(120)
        assert not asked.is_alive()
        assert _history(pg_url) == answer
        assert outcomes == ["failed"]  # its run was refused the channel, so its client has no answer


def test_one_idempotency_key_sent_to_two_gateways_makes_one_model_call(
    server: ScriptedServer, tmp_path: Path, pg_url: str
) -> None:
    release = _held_first_call(server)
    # looking at the store once an hour: the second gateway can only hear of the reply through NOTIFY
    homes = [_home(tmp_path, name, server, pg_url, poll_seconds=3600) for name in ("a", "b")]
    with RunningGateway(homes[0]) as a, RunningGateway(homes[1]) as b, ThreadPoolExecutor(2) as pool:

        def ask(gateway: RunningGateway) -> str:
            done = gateway.client().chat.completions.create(
                model="meepa",
                messages=[{"role": "user", "content": "only once, please"}],
                extra_headers={"Idempotency-Key": "key-1"},
            )
            return str(done.choices[0].message.content)

        first = pool.submit(ask, a)
        assert server.wait_for_requests(1)
        second = pool.submit(ask, b)  # sent while the first run's model call is in flight
        assert wait_until(lambda: "waiting for its reply" in _log(homes[1]), timeout=60)
        release.set()  # the reply is recorded only now, while the second gateway waits
        assert first.result(timeout=120) == second.result(timeout=120) == "echo 1: only once, please"
    assert len(server.requests) == 1


def test_three_gateways_starting_at_once_on_an_empty_database_migrate_it_once(
    server: ScriptedServer, tmp_path: Path, pg_url: str
) -> None:
    server.default = echo
    homes = [_home(tmp_path, name, server, pg_url) for name in ("a", "b", "c")]
    with ThreadPoolExecutor(3) as pool:
        gateways = list(pool.map(RunningGateway, homes))  # each waits until its gateway says ready
    try:
        assert [_say_in_order(gateway, [f"hello {i}"])[0] for i, gateway in enumerate(gateways)] == [
            "echo 1: hello 0",
            "echo 2: hello 1",
            "echo 3: hello 2",
        ]
        for gateway in gateways:
            assert not [line for line in gateway.lines if "error" in line.lower() or "Traceback" in line]
    finally:
        for gateway in gateways:
            gateway.kill()
    from mibyan.store.postgres_schema import MIGRATIONS

    with SessionStore.at_url(pg_url) as store:
        names = [row["name"] for row in store.query("SELECT name FROM _mibyan_migrations ORDER BY name")]
    assert names == sorted(step.__name__ for step in MIGRATIONS)


def test_a_reply_left_unsent_is_sent_by_one_gateway_and_never_while_its_own_lives(pg_url: str) -> None:
    """A gateway starting beside another resends none of the replies that one recorded (it may be
    sending them now); once it is gone, of the gateways starting at once, one takes each reply."""
    import time

    from mibyan.gateway.ledger import Ledger

    with SessionStore.at_url(pg_url) as store:
        owners = ("sender", *(f"gw{i}" for i in range(6)))
        alive = {owner: store.database.hold_alive(owner) for owner in owners}
        sender = Ledger(store)
        sender.sender = "sender"
        entry, _ = sender.record_inbound("meepa/mail/alice", "m-1", {"text": "hi"}, admitted_by="sender")
        sender.record_reply(entry, "hello alice", "s1", {})
        started = time.time()  # the later gateways start now

        def undelivered(owner: str) -> list[str]:
            ledger = Ledger(store)
            ledger.sender = owner
            return [reply.text for reply in ledger.undelivered(within=600, before=started)]

        assert undelivered("gw0") == []  # its sender lives: it is that one's to send
        alive.pop("sender").close()  # killed before it sent it
        with ThreadPoolExecutor(6) as pool:
            taken = list(pool.map(undelivered, [f"gw{i}" for i in range(6)]))
        assert sorted(taken) == [[], [], [], [], [], ["hello alice"]]
        assert undelivered("late") == []  # the one that took it lives: it sends it
        for mark in alive.values():
            mark.close()
