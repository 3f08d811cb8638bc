"""The `email` connector: the agent as a mailbox, IMAP in and SMTP out (tested against Dovecot).

Each new mail of INBOX (UID above the cursor) is admitted to the ledger first, and only then does the
cursor (UIDVALIDITY, last UID) move past it, so a crash re-reads what was not admitted and the ledger's
per-Message-ID dedupe runs a re-read mail once. The first start takes UIDNEXT as it is and answers
nothing older. A new UIDVALIDITY (the mailbox rebuilt or restored) says nothing of which mails are
new, so the renumbered mails are judged by when they arrived (INTERNALDATE, against the cursor's
`since`) and by whether the ledger has their Message-ID: what came while down is answered, the rest not.
New mail is awaited with IDLE where the server has it, else asked for every `poll_seconds`.

Every mail gets exactly one reply (never progress mails), threaded under it, with a Message-ID derived
from the inbound Message-ID, so a resend after a crash is the same mail to the user's client; and one
marked `X-Mibyan-Possible-Repeat` when a crash or a timeout left the first sending unknown.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from email.message import EmailMessage
from typing import TypeVar

from mibyan.config.gateway import Connector as ConnectorSettings
from mibyan.core.errors import ConfigError
from mibyan.gateway.connectors import email_message as mail
from mibyan.gateway.connectors import inbox
from mibyan.gateway.connectors.base import Destination, InboundEvent, Limits, SendResult, SendStatus
from mibyan.gateway.connectors.chat import ChatCore
from mibyan.gateway.connectors.email_wire import GONE, Cursor, CursorFile, Mailbox, check_email, send_mail
from mibyan.gateway.connectors.xmpp_setup import ca_path
from mibyan.gateway.ledger import Reply
from mibyan.gateway.runner import Gateway
from mibyan.gateway.work import ShuttingDown

log = logging.getLogger("mibyan.gateway")
_T = TypeVar("_T")
_IDLE_REFRESH = 600.0  # seconds: IDLE is renewed well inside the 29 minutes servers keep it
_COMMANDS = ("/new", "/stop", "/status", "/approve", "/deny", "/help")


class EmailConnector:
    """One mailbox answering for one agent."""

    kind = "email"
    # one reply mail per mail, never a mail about a run's progress
    limits = Limits(text_length=1_000_000, unit="characters", attachments=True, status_messages=False)

    def __init__(self, settings: ConnectorSettings, gateway: Gateway) -> None:
        self.settings = settings
        self.name = settings.name
        self.gateway = gateway
        self._password = check_email(settings, os.environ)
        assert settings.address is not None and settings.imap is not None and settings.smtp is not None
        self.address = settings.address.lower()
        self.domain = self.address.rsplit("@", 1)[1]
        self.username = settings.username or settings.address
        self.core = ChatCore(settings, gateway, self)
        self.allow = [entry.lower() for entry in settings.allow or []]
        self.folder = gateway.home / "connectors" / settings.name
        self.cursor_file = CursorFile(self.folder)
        self.cursor: Cursor | None = None
        self.ca_file = ca_path(settings, gateway.home)
        self.box = Mailbox(settings.imap, self.username, self._password, self.ca_file)
        self._imap_thread = ThreadPoolExecutor(1, thread_name_prefix=f"mibyan-imap-{settings.name}")
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.notice = "answers anyone who writes to it (allow: *)" if "*" in self.allow else None

    @property
    def url(self) -> str:
        imap = self.settings.imap
        assert imap is not None
        return f"{imap.host}:{imap.port}"

    async def _imap(self, action: Callable[[], _T]) -> _T:
        """IMAP work on the connector's one IMAP thread (imaplib is blocking and not thread-safe)."""
        return await asyncio.get_running_loop().run_in_executor(self._imap_thread, action)

    async def start(self) -> None:
        """Log in, take (or check) the cursor, answer what arrived while down, then wait for mail."""
        try:
            await self._connect()
        except GONE as exc:
            raise ConfigError(
                f"connector '{self.name}': cannot reach the IMAP server {self.url}: {exc}"
            ) from exc
        except ConfigError as exc:
            raise ConfigError(f"connector '{self.name}': {exc}") from exc
        if not self.box.has_idle:
            log.info(
                "%s: %s offers no IDLE: asking for new mail every %g s",
                self.name,
                self.url,
                self.settings.poll_seconds,
            )
        self.core.follow_resumed(lambda thread, message_key: Destination(thread, None, message_key))
        await self._catch_up()
        self._task = asyncio.create_task(self._run())

    async def _connect(self) -> None:
        """Connect; the first start (or a new UIDVALIDITY) takes the mailbox as it is now."""
        await self._imap(self.box.connect)
        kept = self.cursor or self.cursor_file.read()
        if kept is not None and kept.uidvalidity == self.box.uidvalidity:
            self.cursor = kept
            return
        if kept is None:
            self.cursor = Cursor(self.box.uidvalidity, self.box.uidnext - 1, time.time())
        else:
            # renumbered (rebuilt, restored): the UIDs say nothing now; what arrived since the last
            # mail passed does, and the ledger knows what was admitted already
            log.warning(
                "%s: the mailbox's UIDVALIDITY changed (%s to %s): answering only the mails that arrived "
                "since %s and were not answered before",
                self.name,
                kept.uidvalidity,
                self.box.uidvalidity,
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(kept.since)),
            )
            self.cursor = Cursor(self.box.uidvalidity, 0, kept.since, self.box.uidnext)
        self.cursor_file.save(self.cursor)

    async def stop(self) -> None:
        self._stopping = True
        self.box.wake()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.core.stop()
        self.box.close()
        self._imap_thread.shutdown(wait=False)

    async def deliver(self, reply: Reply) -> bool:
        entry = self.gateway.ledger.entry(reply.inbox_id)
        if entry is None or entry.message_key is None:
            return False
        conversation = entry.channel.split("/", 2)[2]
        return await self.core.resend(reply, Destination(conversation, None, entry.message_key))

    async def _run(self) -> None:
        """Wait for mail and admit it until stopped; after the server goes away, reconnect with back-off."""
        backoff = 0.5
        while not self._stopping:
            try:
                if self.box.imap is None:
                    await self._connect()
                    log.info("%s: connected to %s again", self.name, self.url)
                    backoff = 0.5
                    await self._catch_up()  # what arrived while the server was away announces nothing
                if self.box.has_idle:
                    await self._imap(functools.partial(self.box.idle, _IDLE_REFRESH))
                else:
                    await asyncio.sleep(self.settings.poll_seconds)
                if not self._stopping:
                    await self._catch_up()
            except ShuttingDown:
                return
            except (*GONE, ConfigError) as exc:
                if self._stopping:
                    return
                if backoff == 0.5:
                    log.warning("%s: the IMAP server is unreachable (%s); reconnecting", self.name, exc)
                self.box.close()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _catch_up(self) -> None:
        """Admit every mail above the cursor, oldest first, moving the cursor after each."""
        assert self.cursor is not None
        for uid in await self._imap(functools.partial(self.box.uids_after, self.cursor.last_uid)):
            fetched = await self._imap(functools.partial(self.box.fetch, uid))
            cursor = self.cursor
            since = cursor.since
            try:
                if fetched is not None:
                    raw, since = fetched
                    renumbered = uid < cursor.renumbered_below
                    # an INTERNALDATE has whole seconds, the first start's time has not: a mail of the
                    # very second the last one passed (or the first start) counts as arrived since
                    if not renumbered or since >= math.floor(cursor.since):
                        await self._mail(uid, raw, once=renumbered)
                    since = max(since, cursor.since)
            except (ShuttingDown, *GONE):
                raise  # not admitted: the cursor stays before it
            except Exception:  # a mail we cannot read must not stop the mailbox for every later one
                log.exception("%s: mail UID %s could not be read; it is not answered", self.name, uid)
            self.cursor = Cursor(cursor.uidvalidity, uid, since, cursor.renumbered_below)
            self.cursor_file.save(self.cursor)  # only now: the mail is in the ledger (or never to be)
            await self._imap(functools.partial(self.box.mark_seen, uid))

    def allowed(self, sender: str) -> bool:
        domain = "@" + sender.rsplit("@", 1)[-1]
        return "*" in self.allow or sender in self.allow or domain in self.allow

    async def _mail(self, uid: int, raw: bytes, *, once: bool = False) -> None:
        """Admit one mail if a person on `allow` wrote it (`once`: unless the ledger has its Message-ID:
        a repeat would get the first one's reply mailed again)."""
        message = mail.parse(raw)
        fallback = f"uid{self.cursor.uidvalidity if self.cursor else 0}.{uid}@{self.url}"
        details = mail.inbound(message, fallback)
        robot = mail.automatic(message, self.address)
        if robot is not None:
            log.info("%s: not answering mail %s: %s", self.name, details.message_id, robot)
            return
        if not self.allowed(details.sender):
            log.info("%s: ignored a mail from %s (not on allow)", self.name, details.sender)
            return
        text = _command_or_text(mail.body_text(message))
        saved = self._attachments(message, details.message_id)
        if saved:
            text = "\n\n".join([text, *saved]).strip()
        if once and await asyncio.to_thread(
            self.gateway.ledger.has_message, self.core.key(details.root), details.message_id
        ):
            return
        details.save(self.folder)  # before admission: a reply after a restart must know where it goes
        date = message["Date"]
        when = date.datetime.timestamp() if date is not None and getattr(date, "datetime", None) else 0.0
        event = InboundEvent(
            self.name, details.root, None, details.sender, details.message_id, text or "(empty mail)", when
        )
        await self.core.admit(event, Destination(details.root, None, details.message_id))

    def _attachments(self, message: EmailMessage, message_id: str) -> list[str]:
        """Save the mail's files in the agent's workspace (`inbox/`, inbox.py), capped; the lines telling
        the agent."""
        files = mail.attachments(message)
        if not files:
            return []
        limit_mb = self.gateway.settings.gateway.max_attachment_mb
        workdir = self.gateway.agents[self.core.agent_id].workdir
        saved = [
            inbox.save(workdir, f"{message_id}#{number}", name, content)
            if len(content) <= limit_mb * 1_000_000
            else inbox.Attachment(name, len(content), None)
            for number, (name, content) in enumerate(files)
        ]
        return [inbox.note(saved, limit_mb)]

    async def edit_part(self, where: Destination, sent_id: str, text: str, key: str) -> SendResult:
        return SendResult(SendStatus.FAILED, detail="a sent mail cannot be changed")

    async def send_part(self, where: Destination, text: str, key: str, first: bool) -> SendResult:
        to = mail.Inbound.load(self.folder, where.reply_to)
        if to is None:
            return SendResult(SendStatus.FAILED, detail=f"nothing kept of the mail {where.reply_to}")
        attempted = self.folder / "sending" / key
        repeat = attempted.exists()  # sent before (a crash, a timeout): it may have arrived
        attempted.parent.mkdir(parents=True, exist_ok=True)
        attempted.touch()
        reply = mail.reply(
            to, text, sender=self.address, message_id=f"{key}@{self.domain}", possible_repeat=repeat
        )
        assert self.settings.smtp is not None
        send = functools.partial(
            send_mail, self.settings.smtp, self.username, self._password, reply, self.address, self.ca_file
        )
        return await asyncio.get_running_loop().run_in_executor(None, send)

    async def typing(self, conversation: str, on: bool) -> None:
        """Mail has no typing."""


def _command_or_text(text: str) -> str:
    """A reply whose first line is an in-chat command is that command (what follows is a signature, a
    greeting); any other mail is its text."""
    first = text.split("\n", 1)[0].strip()
    word = first.split(maxsplit=1)[0].lower() if first else ""
    return first if word in _COMMANDS else text
