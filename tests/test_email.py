"""The email connector against a real Dovecot: a real `mibyan gateway`, a real SMTP relay into Dovecot's
LMTP, a real second mail client as the user, the scripted model behind the agent."""

from __future__ import annotations

import imaplib
import itertools
import json
import os
import re
from collections.abc import Iterator
from datetime import datetime
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli, wait_until
from dovecoting import Dovecot, MailUser, Relay, missing_reason
from gatewaying import RunningGateway, write_config
from loopback import Reply, ScriptedServer, echo, user_texts

pytestmark = [
    pytest.mark.chat_servers,
    pytest.mark.skipif(missing_reason() is not None, reason=str(missing_reason())),
]

MEEPA = {"id": "meepa", "default": True, "provider": "local", "model": "meepa-model"}
PASSWORD = "bot-password"
_bots = itertools.count()


@pytest.fixture(scope="session")
def dovecot() -> Iterator[Dovecot]:
    server = Dovecot()
    yield server
    server.remove()


@pytest.fixture(scope="session")
def relay(dovecot: Dovecot) -> Iterator[Relay]:
    smtp = Relay(dovecot)
    yield smtp
    smtp.stop()


@pytest.fixture(scope="session")
def alice(dovecot: Dovecot, relay: Relay) -> MailUser:
    return MailUser(dovecot, relay, "alice")


@pytest.fixture(scope="session")
def smtps(dovecot: Dovecot) -> Iterator[Relay]:
    smtp = Relay(dovecot, tls="ssl")
    yield smtp
    smtp.stop()


@pytest.fixture(scope="session")
def smtp_starttls(dovecot: Dovecot) -> Iterator[Relay]:
    smtp = Relay(dovecot, tls="starttls")
    yield smtp
    smtp.stop()


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer(default=echo) as scripted:
        yield scripted


def new_bot(dovecot: Dovecot) -> str:
    """A fresh mailbox for the agent (each test its own: no test sees another's mail)."""
    return dovecot.add_user(f"meepa{os.getpid()}x{next(_bots)}", PASSWORD)


def start(
    home: Path,
    server: ScriptedServer,
    dovecot: Dovecot,
    relay: Relay,
    bot: str,
    *,
    allow: list[str] | None = None,
    gateway: dict[str, Any] | None = None,
    approval_timeout: float | None = None,
    imap: dict[str, Any] | None = None,
    smtp: str = "none",
    **keys: Any,
) -> RunningGateway:
    write_mail_config(home, server, dovecot, relay, bot, allow, gateway, approval_timeout, imap, smtp, keys)
    return restart(home)


def write_mail_config(
    home: Path,
    server: ScriptedServer,
    dovecot: Dovecot,
    relay: Relay,
    bot: str,
    allow: list[str] | None = None,
    gateway: dict[str, Any] | None = None,
    approval_timeout: float | None = None,
    imap: dict[str, Any] | None = None,
    smtp: str = "none",
    keys: dict[str, Any] | None = None,
) -> None:
    connector: dict[str, Any] = {
        "name": "mail",
        "kind": "email",
        "address": bot,
        "imap": imap or {"host": "127.0.0.1", "port": dovecot.imap_port, "tls": "none"},
        "smtp": {"host": "127.0.0.1", "port": relay.port, "tls": smtp},
        "password_env": "MIBYAN_MAIL_PASSWORD",
        "allow": allow or ["alice@localhost"],
        **(keys or {}),
    }
    if approval_timeout is not None:
        connector["approval_timeout"] = approval_timeout
    write_config(home, {"local": server.base_url}, [MEEPA], connectors=[connector], gateway=gateway)


def restart(home: Path) -> RunningGateway:
    return RunningGateway(home, env={"MIBYAN_MAIL_PASSWORD": PASSWORD})


def replies_to(user: MailUser, bot: str) -> list[EmailMessage]:
    return [mail for mail in user.inbox() if bot in str(mail["From"])]


def wait_replies(user: MailUser, bot: str, count: int, timeout: float = 30) -> list[EmailMessage]:
    found = wait_until(lambda: m if len(m := replies_to(user, bot)) >= count else None, timeout)
    assert found, f"expected {count} replies from {bot}, got {len(replies_to(user, bot))}"
    return list(found)


def text(mail: EmailMessage) -> str:
    body = mail.get_body(preferencelist=("plain",))
    assert body is not None
    return str(body.get_content()).strip()


def test_a_mail_gets_one_reply_threaded_under_it_and_a_thread_is_one_session(
    home: Path, server: ScriptedServer, dovecot: Dovecot, relay: Relay, alice: MailUser
) -> None:
    bot = new_bot(dovecot)
    # in the mailbox before the connector's first start: history, never answered
    alice.send(bot, "Old", "from before the agent")
    assert wait_until(lambda: relay.sent_to(bot))
    with start(home, server, dovecot, relay, bot) as gateway:
        assert f"mibyan gateway: mail (email) on 127.0.0.1:{dovecot.imap_port}\n" in gateway.lines
        first = alice.send(bot, "Plans", "hello **there**\n\n-- \nAlice, sent from her phone")
        [reply] = wait_replies(alice, bot, 1)
        assert text(reply) == "echo 1: hello **there**"
        assert reply["Subject"] == "Re: Plans"
        assert reply["In-Reply-To"] == first["Message-ID"]
        assert str(reply["References"]).split() == [first["Message-ID"]]
        assert reply["Auto-Submitted"] == "auto-replied"
        assert str(reply["Message-ID"]).endswith("@localhost>")

        # a follow-up in the thread: the same session; the quoted history is context, not the message
        follow = f"and again\n\nOn Monday Meepa wrote:\n> {text(reply)}\n"
        alice.send(bot, "Re: Plans", follow, reply_to=reply)
        threaded = wait_replies(alice, bot, 2)[1]
        assert text(threaded) == "echo 2: and again"
        assert str(threaded["References"]).split()[0] == first["Message-ID"]

        # a new subject from the same sender: a thread of its own, a session of its own
        alice.send(bot, "Something else", "new topic")
        assert text(wait_replies(alice, bot, 3)[2]) == "echo 1: new topic"
    assert len(replies_to(alice, bot)) == 3  # exactly one reply per mail, no status mails
    assert not any("from before the agent" in t for r in server.requests for t in user_texts(r.body))


def test_killed_with_mails_waiting_each_is_answered_once_after_restart(
    home: Path, server: ScriptedServer, dovecot: Dovecot, relay: Relay, alice: MailUser
) -> None:
    bot = new_bot(dovecot)
    server.add(*(Reply(text="never finishes", delay=60) for _ in range(3)))
    with start(home, server, dovecot, relay, bot) as first:
        sent = [alice.send(bot, f"Job {n}", f"job {n}") for n in range(3)]
        assert server.wait_for_requests(3)  # all three admitted and running
        first.kill()
    sent += [alice.send(bot, f"Late {n}", f"late {n}") for n in range(2)]  # arrive while it is down
    with restart(home):
        got = wait_replies(alice, bot, 5)
        alice.send(bot, "After", "after")  # once this is answered, nothing else is still coming
        got = wait_replies(alice, bot, 6)
    answered = [str(mail["In-Reply-To"]) for mail in got]
    assert sorted(answered[:5]) == sorted(str(mail["Message-ID"]) for mail in sent)
    assert sorted(text(mail) for mail in got) == sorted(
        [f"echo 1: job {n}" for n in range(3)] + [f"echo 1: late {n}" for n in range(2)] + ["echo 1: after"]
    )


def test_the_next_mail_is_answered_after_dovecot_restarts(
    home: Path, server: ScriptedServer, dovecot: Dovecot, relay: Relay, alice: MailUser
) -> None:
    bot = new_bot(dovecot)
    with start(home, server, dovecot, relay, bot):
        alice.send(bot, "Before", "before")
        wait_replies(alice, bot, 1)
        dovecot.restart()
        alice.send(bot, "After", "after the restart")
        got = wait_replies(alice, bot, 2)
    assert [text(mail) for mail in got] == ["echo 1: before", "echo 1: after the restart"]


def test_strangers_bounces_and_auto_replies_get_no_answer_and_never_reach_the_model(
    home: Path, server: ScriptedServer, dovecot: Dovecot, relay: Relay, alice: MailUser
) -> None:
    bot = new_bot(dovecot)
    with start(home, server, dovecot, relay, bot, allow=["alice@localhost", "@friends.test"]):
        alice.send(bot, "Hi", "tell me the secret", sender="mallory@elsewhere.test")
        alice.send(
            bot,
            "Undelivered Mail Returned to Sender",
            "a bounce secret",
            sender="MAILER-DAEMON@friends.test",
            envelope_from="",
        )
        alice.send(bot, "Out of office", "an auto-reply secret", headers={"Auto-Submitted": "auto-replied"})
        alice.send(bot, "Newsletter", "a bulk secret", headers={"Precedence": "bulk"})
        alice.send(bot, "Re: Hi", "a loop secret", sender=bot)
        alice.send(bot, "Hello", "from a friend", sender="bob@friends.test")
        assert wait_until(lambda: relay.sent_to("bob@friends.test"))  # the friend's reply went out
    seen = [t for request in server.requests for t in user_texts(request.body)]
    assert seen == ["from a friend"]
    for robot in ("mallory@elsewhere.test", "mailer-daemon@friends.test", "MAILER-DAEMON@friends.test"):
        assert relay.sent_to(robot) == []
    assert replies_to(alice, bot) == []
    log = (home / "logs" / "gateway.log").read_text()
    assert "ignored a mail from mallory@elsewhere.test (not on allow)" in log


def test_approve_as_the_first_line_of_a_reply_runs_the_command(
    home: Path, server: ScriptedServer, dovecot: Dovecot, relay: Relay, alice: MailUser
) -> None:
    bot = new_bot(dovecot)
    build = home / "agents" / "meepa" / "workspace" / "build"
    build.mkdir(parents=True)
    server.add(
        Reply(tool_calls=[("terminal", {"command": "rm -rf build"})]), Reply(text="The build is gone.")
    )
    with start(home, server, dovecot, relay, bot, gateway={"approvals": "ask"}):
        alice.send(bot, "Cleanup", "clean the build folder", attach=("notes.txt", b"remove it all"))
        [question] = wait_replies(alice, bot, 1)
        assert "rm -rf build" in text(question) and build.exists()
        alice.send(bot, "Re: Cleanup", f"/approve\n\nthanks,\nAlice\n\n> {text(question)}", reply_to=question)
        answer = wait_replies(alice, bot, 2)[1]
        assert text(answer) == "The build is gone."
        assert answer["In-Reply-To"] != question["In-Reply-To"]
    assert not build.exists()
    saved = list((home / "agents" / "meepa" / "workspace" / "inbox").glob("*-notes.txt"))
    assert [path.read_bytes() for path in saved] == [b"remove it all"]
    assert "inbox/" in user_texts(server.requests[0].body)[0]


def test_an_unanswered_question_times_out_after_the_connectors_approval_timeout(
    home: Path, server: ScriptedServer, dovecot: Dovecot, relay: Relay, alice: MailUser
) -> None:
    bot = new_bot(dovecot)
    server.add(Reply(tool_calls=[("terminal", {"command": "rm -rf build"})]), Reply(text="I left it."))
    write = {"approvals": "ask"}
    with start(home, server, dovecot, relay, bot, gateway=write, approval_timeout=1):
        alice.send(bot, "Cleanup", "clean the build folder")
        [question] = wait_replies(alice, bot, 1)
        assert "rm -rf build" in text(question)
        assert server.wait_for_requests(2)  # nobody answered: the run went on without the command
        alice.send(bot, "Re: Cleanup", "what happened?", reply_to=question)
        said = text(wait_replies(alice, bot, 2)[1])
    assert said.startswith("Nobody approved `rm -rf build` within 1 s, so it did not run.")


def test_a_crash_between_sending_and_recording_it_sent_resends_the_same_mail_marked(
    home: Path, server: ScriptedServer, dovecot: Dovecot, relay: Relay, alice: MailUser
) -> None:
    import sqlite3

    bot = new_bot(dovecot)
    with start(home, server, dovecot, relay, bot) as gateway:
        alice.send(bot, "Hello", "hello")
        [first] = wait_replies(alice, bot, 1)
        gateway.kill()
    # the state such a crash leaves: the reply recorded, its sending not
    with sqlite3.connect(home / "state.db") as db:
        assert db.execute("UPDATE gateway_outbox SET status = 'pending', sent_at = NULL").rowcount == 1
    with restart(home):
        again = wait_replies(alice, bot, 2)[1]
        alice.send(bot, "Next", "next")
        wait_replies(alice, bot, 3)
    assert again["Message-ID"] == first["Message-ID"]  # the user's client sees the same mail
    assert again["X-Mibyan-Possible-Repeat"] == "yes" and first["X-Mibyan-Possible-Repeat"] is None
    assert text(again) == text(first) == "echo 1: hello"
    assert len(server.requests) == 2  # the model ran once for "hello"


def test_a_new_uidvalidity_answers_none_of_the_mailbox_again(
    home: Path, server: ScriptedServer, dovecot: Dovecot, relay: Relay, alice: MailUser
) -> None:
    bot = new_bot(dovecot)
    with start(home, server, dovecot, relay, bot) as gateway:
        alice.send(bot, "First", "first")
        wait_replies(alice, bot, 1)
        gateway.terminate()
    # the mailbox rebuilt (its UID list and indexes lost): Dovecot numbers it anew, a new UIDVALIDITY
    maildir = dovecot.folder / "mail" / bot
    for stale in [*maildir.glob("dovecot-uidlist"), *maildir.glob("dovecot.index*")]:
        stale.unlink()
    with restart(home):
        alice.send(bot, "Second", "second")
        got = wait_replies(alice, bot, 2)
    assert [text(mail) for mail in got] == ["echo 1: first", "echo 1: second"]
    assert len(server.requests) == 2
    assert "UIDVALIDITY changed" in (home / "logs" / "gateway.log").read_text()


@pytest.mark.parametrize("tls", ["ssl", "starttls"])
def test_a_mail_is_answered_over_tls_to_a_server_trusted_through_ca_file(
    home: Path,
    server: ScriptedServer,
    dovecot: Dovecot,
    relay: Relay,
    smtps: Relay,
    smtp_starttls: Relay,
    alice: MailUser,
    tls: str,
) -> None:
    bot = new_bot(dovecot)
    (home / "ca.pem").write_bytes(dovecot.ca_file.read_bytes())
    port = dovecot.imaps_port if tls == "ssl" else dovecot.imap_port
    sending = smtps if tls == "ssl" else smtp_starttls
    imap = {"host": "127.0.0.1", "port": port, "tls": tls}
    with start(home, server, dovecot, sending, bot, imap=imap, smtp=tls, ca_file="ca.pem"):
        alice.send(bot, "Secret", "over tls")
        [reply] = wait_replies(alice, bot, 1)
    assert text(reply) == "echo 1: over tls"
    assert [to for _, to, _ in sending.received if to == ["alice@localhost"]] == [["alice@localhost"]]


def test_a_server_whose_certificate_is_not_trusted_is_refused_with_one_line(
    home: Path, server: ScriptedServer, dovecot: Dovecot, relay: Relay
) -> None:
    bot = new_bot(dovecot)
    imap = {"host": "127.0.0.1", "port": dovecot.imaps_port, "tls": "ssl"}
    write_mail_config(home, server, dovecot, relay, bot, imap=imap)
    done = run_cli("gateway", home=home, env={"MIBYAN_MAIL_PASSWORD": PASSWORD})
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"the IMAP server 127.0.0.1:{dovecot.imaps_port} presented a certificate that is not trusted" in (
        done.stderr
    )
    assert "set ca_file:" in done.stderr
    assert server.requests == []


@pytest.fixture(scope="module")
def polled() -> Iterator[tuple[Dovecot, Relay, MailUser]]:
    """A Dovecot that offers no IDLE, its relay and its alice: the connector has to ask."""
    dovecot = Dovecot(idle=False)
    relay = Relay(dovecot)
    yield dovecot, relay, MailUser(dovecot, relay, "alice")
    relay.stop()
    dovecot.remove()


def test_a_server_without_idle_is_polled_and_each_mail_answered_once(
    home: Path, server: ScriptedServer, polled: tuple[Dovecot, Relay, MailUser]
) -> None:
    dovecot, relay, alice = polled
    bot = new_bot(dovecot)
    with start(home, server, dovecot, relay, bot, poll_seconds=0.2):
        alice.send(bot, "Polled", "are you there")
        wait_replies(alice, bot, 1)
        alice.send(bot, "Again", "still there")
        got = wait_replies(alice, bot, 2)
    assert [text(mail) for mail in got] == ["echo 1: are you there", "echo 1: still there"]
    assert len(server.requests) == 2
    log = (home / "logs" / "gateway.log").read_text()
    assert f"127.0.0.1:{dovecot.imap_port} offers no IDLE: asking for new mail every 0.2 s" in log


def test_a_mailbox_renumbered_while_down_answers_only_its_new_unanswered_mail_once(
    home: Path, server: ScriptedServer, dovecot: Dovecot, relay: Relay, alice: MailUser
) -> None:
    import imaplib
    import time

    bot = new_bot(dovecot)
    with start(home, server, dovecot, relay, bot) as gateway:
        first = alice.send(bot, "First", "first")
        wait_replies(alice, bot, 1)
        gateway.terminate()
    # the mailbox restored from a backup while the gateway is down: a new UIDVALIDITY, "First" (answered)
    # restored as arriving now, a mail from long ago, and then one that really arrives now
    maildir = dovecot.folder / "mail" / bot
    for stale in [*maildir.glob("dovecot-uidlist"), *maildir.glob("dovecot.index*"), *maildir.glob("*/*")]:
        stale.unlink()
    imap = imaplib.IMAP4("127.0.0.1", dovecot.imap_port, timeout=30)
    imap.login(bot, PASSWORD)
    now = imaplib.Time2Internaldate(time.time())
    assert imap.append("INBOX", "", now, bytes(first))[0] == "OK"
    old = (
        f"From: alice@localhost\r\nTo: {bot}\r\nSubject: Old\r\nMessage-ID: <old@client.test>\r\n\r\nold\r\n"
    )
    long_ago = imaplib.Time2Internaldate(time.time() - 86_400 * 30)
    assert imap.append("INBOX", "", long_ago, old.encode())[0] == "OK"
    imap.logout()
    alice.send(bot, "New", "new while down")
    assert wait_until(lambda: any("New" in str(m["Subject"]) for m in relay.sent_to(bot)))
    with restart(home) as again:
        alice.send(bot, "After", "after")  # admitted after what came while down: nothing else is coming
        wait_replies(alice, bot, 3)
        again.terminate()  # what it was sending is sent: a repeat would be in the mailbox now
    got = replies_to(alice, bot)
    assert sorted(text(mail) for mail in got) == ["echo 1: after", "echo 1: first", "echo 1: new while down"]
    assert len(server.requests) == 3
    assert "UIDVALIDITY changed" in (home / "logs" / "gateway.log").read_text()


def test_after_a_renumbering_a_mail_of_the_second_the_last_answered_one_came_in_is_answered(
    home: Path, server: ScriptedServer, dovecot: Dovecot, relay: Relay, alice: MailUser
) -> None:
    """A mailbox's arrival dates have whole seconds; a mail that came in the second the last answered
    one did (or the gateway first started in) came in since then, and is answered after a renumbering.
    (A mail of that second from before the start is answered too: a whole second cannot tell them.)"""
    bot = new_bot(dovecot)
    with start(home, server, dovecot, relay, bot) as gateway:
        first = alice.send(bot, "First", "first")
        wait_replies(alice, bot, 1)
        gateway.terminate()
    imap = imaplib.IMAP4("127.0.0.1", dovecot.imap_port, timeout=30)
    imap.login(bot, PASSWORD)
    imap.select("INBOX")
    _, fetched = imap.fetch("1", "(INTERNALDATE)")
    found = re.search(
        rb'INTERNALDATE "([^"]+)"', fetched[0] if isinstance(fetched[0], bytes) else fetched[0][0]
    )
    assert found is not None
    arrived = f'"{found.group(1).decode()}"'
    imap.logout()
    # the first start came in that very second, before "First": where the connector stood, to the letter
    started = datetime.strptime(found.group(1).decode(), "%d-%b-%Y %H:%M:%S %z").timestamp() + 0.5
    cursor_file = home / "connectors" / "mail" / "imap.json"
    cursor = json.loads(cursor_file.read_text())
    cursor_file.write_text(json.dumps({**cursor, "since": max(cursor["since"], started)}))
    maildir = dovecot.folder / "mail" / bot
    for stale in [*maildir.glob("dovecot-uidlist"), *maildir.glob("dovecot.index*"), *maildir.glob("*/*")]:
        stale.unlink()
    # restored from a backup: "First" (answered) and a mail that came in the same second, not answered
    same = f"From: alice@localhost\r\nTo: {bot}\r\nSubject: Same\r\n"
    same += "Message-ID: <same@client.test>\r\n\r\nsame\r\n"
    imap = imaplib.IMAP4("127.0.0.1", dovecot.imap_port, timeout=30)
    imap.login(bot, PASSWORD)
    assert imap.append("INBOX", "", arrived, bytes(first))[0] == "OK"
    assert imap.append("INBOX", "", arrived, same.encode())[0] == "OK"
    imap.logout()
    with restart(home) as again:
        wait_replies(alice, bot, 2)
        again.terminate()

    assert sorted(text(mail) for mail in replies_to(alice, bot)) == ["echo 1: first", "echo 1: same"]
