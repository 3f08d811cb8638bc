"""The `xmpp` connector: the agent as an XMPP account (slixmpp), in direct chats and group rooms (MUC).

XMPP pushes messages instead of letting us read from a cursor, and a gateway that dies leaves them with
the server: queued in its old session, or stored offline, where a new session may never see them. So on
every session start (the first, and each after a reconnect) the server's archive (MAM) is read from the
stanza-id of the last admitted message, for the account's own archive and each room's; each message is
admitted to the ledger before that cursor moves, and live and archived copies of one message are one by
their stanza-id. On the first start each archive's position is taken and nothing older is answered.
XMPP has no send idempotency: a message already in the ledger is never admitted again, and a reply whose
send was unknown is looked up in the archive (by its origin-id) before it is sent again. A run's status
message is edited by last message correction (XEP-0308), which Prosody passes on as it is.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from slixmpp import JID, ClientXMPP
from slixmpp.exceptions import IqError, IqTimeout
from slixmpp.stanza import Message

from mibyan.config.gateway import Connector as ConnectorSettings
from mibyan.core.errors import ConfigError
from mibyan.gateway.connectors.base import Destination, InboundEvent, Limits, SendResult, SendStatus
from mibyan.gateway.connectors.chat import ChatCore
from mibyan.gateway.connectors.xmpp_files import attachment_text, oob_url
from mibyan.gateway.connectors.xmpp_setup import Cursors, ca_path, check_xmpp
from mibyan.gateway.ledger import Reply
from mibyan.gateway.runner import Gateway
from mibyan.gateway.work import ShuttingDown

log = logging.getLogger("mibyan.gateway")
#: UTF-8 bytes of one reply part: well under the stanza limits servers set (Prosody: 256 KiB), with
#: room for the envelope; a longer reply goes out in parts, in order.
PART_BYTES = 16_000
_SID = "{urn:xmpp:sid:0}stanza-id"
_PAGE = 50
_MAX_PAGES = 200
_CONNECT_TIMEOUT = 30.0


class XmppConnector:
    """One XMPP account answering for one agent."""

    kind = "xmpp"
    # edits: a run's status message is corrected in place (XEP-0308, last message correction)
    limits = Limits(text_length=PART_BYTES, unit="bytes", typing=True, edits=True, attachments=True)

    def __init__(self, settings: ConnectorSettings, gateway: Gateway) -> None:
        self.settings = settings
        self.name = settings.name
        self.gateway = gateway
        self._secret = check_xmpp(settings, os.environ)
        assert settings.jid is not None
        self.jid = settings.jid
        local, _, domain = self.jid.partition("@")
        self.domain = domain
        self.ca_file = ca_path(settings, gateway.home)
        self.address = (settings.server.host, settings.server.port) if settings.server else (domain, 5222)
        self.nick = settings.nick or local
        self.rooms = [room.lower() for room in settings.rooms]
        self.core = ChatCore(settings, gateway, self)
        self.cursors = Cursors(gateway.home, settings.name, self.jid)
        self.client: ClientXMPP | None = None
        self._locks: dict[str, asyncio.Lock] = {}
        self._seen: set[str] = set()  # stanza-ids handled by this run
        self._uncertain: set[str] = set()  # reply keys whose earlier send may have arrived
        self._connected = asyncio.Event()
        self._online = asyncio.Event()  # connected and caught up
        self._first: asyncio.Future[None] | None = None
        self._stopping = False
        self._reconnecting = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.notice = "answers anyone who writes to it (allow: *)" if "*" in (settings.allow or []) else None

    @property
    def url(self) -> str:
        return self.jid

    # -- connection -------------------------------------------------------------------------------------

    def _make_client(self) -> ClientXMPP:
        client = ClientXMPP(f"{self.jid}/mibyan-{self.name}", self._secret)
        client.enable_plaintext = False  # TLS always: STARTTLS (or direct TLS), never a clear stream
        client.enable_direct_tls = False
        client.enable_starttls = True
        if self.ca_file is not None:
            client.ca_certs = self.ca_file
        client.auto_authorize = None  # subscription requests: answered below, by `allow`
        client.auto_subscribe = False
        for plugin in (
            "xep_0030",
            "xep_0045",
            "xep_0085",
            "xep_0199",
            "xep_0313",
            "xep_0359",
            "xep_0066",
            "xep_0308",
        ):
            client.register_plugin(plugin)
        client["xep_0199"].enable_keepalive(interval=60, timeout=20)  # a half-open connection is noticed
        client.add_event_handler("session_start", lambda _e: self._spawn(self._session()))
        client.add_event_handler("failed_auth", self._refused)
        client.add_event_handler("connection_failed", self._unreachable)
        client.add_event_handler("disconnected", self._disconnected)
        client.add_event_handler("message", lambda m: self._spawn(self._live(m)))
        client.add_event_handler("presence_subscribe", self._subscription)
        return client

    async def start(self) -> None:
        """Connect, join the rooms, catch up from the archives; returns once all that is done."""
        self.core.follow_resumed(lambda chat, message_key: Destination(chat, None, message_key))
        self._first = asyncio.get_running_loop().create_future()
        self.client = self._make_client()
        self.client.connect(*self.address)
        try:
            await asyncio.wait_for(asyncio.shield(self._first), _CONNECT_TIMEOUT)
        except TimeoutError as exc:
            await self._close()
            raise ConfigError(
                f"connector '{self.name}': no session with {self.address[0]}:{self.address[1]} within "
                f"{_CONNECT_TIMEOUT:.0f} s"
            ) from exc
        except ConfigError:
            await self._close()
            raise

    def _refused(self, _event: Any) -> None:
        message = f"connector '{self.name}': the server refused the login of {self.jid}"
        if self._first is not None and not self._first.done():
            self._first.set_exception(ConfigError(message))
        else:
            log.error("%s; reconnecting until it accepts it", message)

    def _unreachable(self, reason: Any) -> None:
        if self._first is not None and not self._first.done():
            where = f"{self.address[0]}:{self.address[1]}"
            self._first.set_exception(ConfigError(f"connector '{self.name}': cannot reach {where}: {reason}"))

    def _disconnected(self, _reason: Any) -> None:
        self._connected.clear()
        self._online.clear()
        if not self._stopping and self._first is not None and self._first.done():
            self._spawn(self._reconnect())

    async def _reconnect(self) -> None:
        """The server went away (restarted, the network cut): connect again with back-off, for as long as
        it takes; slixmpp does not do it by itself."""
        if self._reconnecting:
            return
        self._reconnecting = True
        log.warning("%s: the server went away; reconnecting", self.name)
        backoff = 0.5
        try:
            while not self._stopping and not self._connected.is_set():
                await asyncio.sleep(backoff)
                assert self.client is not None
                self.client.cancel_connection_attempt()  # ours paces the attempts, not slixmpp's
                self.client.connect(*self.address)
                try:
                    await asyncio.wait_for(self._connected.wait(), 10)
                except TimeoutError:
                    backoff = min(backoff * 2, 5.0)
        finally:
            self._reconnecting = False

    async def _session(self) -> None:
        """A new session: be present, join the rooms, catch up on every archive, then answer live."""
        client = self.client
        assert client is not None
        self._connected.set()
        if client.transport is None or client.transport.get_extra_info("ssl_object") is None:
            log.error("%s: the stream is not encrypted; disconnecting", self.name)
            self._stopping = True
            client.disconnect()
            return
        client.send_presence()
        for room in self.rooms:
            try:
                await client["xep_0045"].join_muc_wait(JID(room), self.nick, maxstanzas=0, timeout=30)
            except Exception as exc:  # a room refusing us must not keep the DMs from working
                log.warning("%s: could not join %s: %s", self.name, room, exc)
        try:
            for archive in [self.jid, *self.rooms]:
                await self._catch_up(archive)
        except ShuttingDown:
            return
        except (IqError, IqTimeout, ConnectionError) as exc:
            log.warning("%s: catching up failed (%s); trying again on the next session", self.name, exc)
            client.disconnect()
            return
        self._online.set()
        if self._first is not None and not self._first.done():
            self._first.set_result(None)

    def _subscription(self, presence: Any) -> None:
        """Someone asks to see the bot's presence: allowed senders get it, others a refusal."""
        assert self.client is not None
        sender = str(presence["from"].bare)
        allowed = self.core.allowed(sender)
        self.client.send_presence(pto=sender, ptype="subscribed" if allowed else "unsubscribed")
        if allowed:
            self.client.send_presence(pto=sender)
        log.info("%s: subscription from %s %s", self.name, sender, "accepted" if allowed else "declined")

    def _spawn(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        self._stopping = True
        await self.core.stop()
        await self._close()

    async def _close(self) -> None:
        self._stopping = True
        if self.client is not None:
            self.client.cancel_connection_attempt()
            if self.client.transport is not None:
                await self.client.disconnect(wait=2.0)
        for task in list(self._tasks):
            task.cancel()

    # -- messages in --------------------------------------------------------------------------------------

    def _lock(self, archive: str) -> asyncio.Lock:
        return self._locks.setdefault(archive, asyncio.Lock())

    async def _catch_up(self, archive: str) -> None:
        """The archive's messages after its cursor, admitted in order (its first read: only its end)."""
        assert self.client is not None
        mam = self.client["xep_0313"]
        target = None if archive == self.jid else JID(archive)
        async with self._lock(archive):
            cursor = self.cursors.get(archive)
            if cursor is None:  # history from before the first start is never answered
                last = [item async for item in mam.iterate(jid=target, reverse=True, rsm={"max": 1}, total=1)]
                self.cursors.advance(archive, str(last[0]["mam_result"]["id"]) if last else "")
                return
            rsm: dict[str, Any] = {"max": _PAGE, **({"after": cursor} if cursor else {})}
            count = 0
            async for item in mam.iterate(jid=target, rsm=rsm):
                stanza = item["mam_result"]["forwarded"]["stanza"]
                await self._handle(stanza, archive, str(item["mam_result"]["id"]), advance=True)
                count += 1
                if count >= _PAGE * _MAX_PAGES:
                    break
            if count:
                log.info("%s: caught up on %d archived message(s) in %s", self.name, count, archive)

    async def _live(self, message: Message) -> None:
        """A message as the server pushed it: handled after its archive's catch-up, once by stanza-id."""
        kind = message["type"]
        if kind == "error" or (not message["body"] and not oob_url(message)):
            return
        archive = str(message["from"].bare).lower() if kind == "groupchat" else self.jid
        if kind == "groupchat" and archive not in self.rooms:
            return
        stanza_id = _stanza_id(message, archive)
        if message["delay"]["stamp"] is not None:
            # a copy stored while we were away (offline storage): it arrived before this session, so
            # the archive's catch-up has it, and from before the first start it must not be answered
            return
        async with self._lock(archive):
            try:
                own = f"{message['from']}#{message['id']}"  # no archive: the sender's id, never a cursor
                await self._handle(message, archive, stanza_id or own, advance=stanza_id is not None)
            except ShuttingDown:
                return

    async def _handle(self, message: Message, archive: str, stanza_id: str, advance: bool) -> None:
        """Admit one message (unless it is ours, not addressed to the agent, or already admitted), then
        move the archive's cursor past it."""
        if stanza_id not in self._seen:
            found = self._inbound(message, archive, stanza_id)
            if found is not None:
                event, where = found
                key = self.core.key(event.channel)
                ledger = self.gateway.ledger
                known = await asyncio.to_thread(ledger.has_message, key, stanza_id)
                if not known:
                    if oob_url(message):
                        text = await attachment_text(self, event, oob_url(message) or "")
                        event = InboundEvent(**{**event.__dict__, "text": text})
                    await self.core.admit(event, where)
            self._seen.add(stanza_id)
        if advance:
            self.cursors.advance(archive, stanza_id)

    def _inbound(
        self, message: Message, archive: str, stanza_id: str
    ) -> tuple[InboundEvent, Destination] | None:
        """The event of a message for the agent, or None (ours, a stranger's, a room not mentioning us)."""
        body = str(message["body"] or "")
        if message["type"] == "error" or (not body and not oob_url(message)):
            return None
        sender_jid = message["from"]
        if archive == self.jid:  # a direct chat: the conversation is the sender's bare JID
            if message["type"] == "groupchat":
                return None
            sender = str(sender_jid.bare).lower()
            if sender == self.jid or sender in self.rooms:  # our own (archived) replies; room PMs
                return None
            conversation, text = sender, body.strip()
        else:
            nick = sender_jid.resource
            if nick == self.nick:
                return None
            muc = self.client["xep_0045"] if self.client else None
            real = muc.get_jid_property(JID(archive), nick, "jid") if muc else None
            sender = str(JID(real).bare).lower() if real else f"{archive}/{nick}"
            conversation, text = archive, body.strip()
            mentioned = self._unmentioned(text)
            event = InboundEvent(self.name, conversation, None, sender, stanza_id, mentioned or text, 0.0)
            if mentioned is None and not self.core.answers_question(event):
                return None
            text = mentioned or text
        if not self.core.allowed(sender):
            log.info("%s: ignored a message from %s in %s (not on allow)", self.name, sender, conversation)
            return None
        stamp = message["delay"]["stamp"]
        when = stamp.timestamp() if stamp is not None else 0.0
        event = InboundEvent(self.name, conversation, None, sender, stanza_id, text, when)
        return event, Destination(conversation, None, stanza_id)

    def _unmentioned(self, text: str) -> str | None:
        """A room message's text without the leading `nick:` (or `nick,`) mention; None without one."""
        lowered, nick = text.lower(), self.nick.lower()
        if lowered.startswith(nick) and lowered[len(nick) : len(nick) + 1] in (":", ","):
            return text[len(nick) + 1 :].strip()
        return None

    # -- replies out --------------------------------------------------------------------------------------

    async def deliver(self, reply: Reply) -> bool:
        """A reply recorded before a restart but not marked sent: its parts may have gone out already."""
        entry = self.gateway.ledger.entry(reply.inbox_id)
        if entry is None or entry.message_key is None:
            return False
        conversation = entry.channel.split("/", 2)[2]
        self._uncertain.add(entry.message_key)
        return await self.core.resend(reply, Destination(conversation, None, entry.message_key))

    async def edit_part(self, where: Destination, sent_id: str, text: str, key: str) -> SendResult:
        """Correct the message sent as `sent_id` (XEP-0308: a new message naming the one it replaces;
        clients without it show the correction as a message of its own)."""
        return await self._send(where, text, key, replaces=sent_id)

    async def send_part(self, where: Destination, text: str, key: str, first: bool) -> SendResult:
        """Send one part (its id and origin-id: `key`); delivered once the server answers a ping sent
        after it on the same stream (it has the message then)."""
        return await self._send(where, text, key)

    async def _send(self, where: Destination, text: str, key: str, replaces: str | None = None) -> SendResult:
        if not self._online.is_set() or self.client is None:
            await asyncio.sleep(0)
            return SendResult(SendStatus.UNKNOWN, detail="not connected")
        group = where.conversation in self.rooms
        try:
            if where.reply_to in self._uncertain and await self._in_archive(where.conversation, key, group):
                return SendResult(SendStatus.DELIVERED, sent_id=key)
            message = self.client.make_message(
                mto=where.conversation, mbody=text, mtype="groupchat" if group else "chat"
            )
            message["id"] = key
            message["origin_id"]["id"] = key
            message["chat_state"] = "active"
            if replaces is not None:
                message["replace"]["id"] = replaces  # always the first message's id, as XEP-0308 asks
            message.send()
            await self.client["xep_0199"].ping(JID(self.domain), timeout=20)
        except (IqError, IqTimeout, ConnectionError) as exc:
            self._uncertain.add(where.reply_to)
            return SendResult(SendStatus.UNKNOWN, detail=str(exc) or type(exc).__name__)
        return SendResult(SendStatus.DELIVERED, sent_id=key)

    async def _in_archive(self, conversation: str, key: str, group: bool) -> bool:
        """Whether a message with origin-id `key` is among the conversation's latest archived ones."""
        assert self.client is not None
        mam = self.client["xep_0313"]
        target = JID(conversation) if group else None
        with_jid = None if group else JID(conversation)
        latest = mam.iterate(jid=target, with_jid=with_jid, reverse=True, rsm={"max": 50}, total=200)
        async for item in latest:
            stanza = item["mam_result"]["forwarded"]["stanza"]
            if stanza["origin_id"]["id"] == key or stanza["id"] == key:
                return True
        return False

    async def typing(self, conversation: str, on: bool) -> None:
        if not self._online.is_set() or self.client is None:
            return
        group = conversation in self.rooms
        message = self.client.make_message(mto=conversation, mtype="groupchat" if group else "chat")
        message["chat_state"] = "composing" if on else "active"
        message.send()


def _stanza_id(message: Message, archive: str) -> str | None:
    """The stanza-id the archive `archive` gave the message (ids claimed by others are ignored)."""
    for element in message.xml.findall(_SID):
        if str(element.get("by", "")).lower() == archive and element.get("id"):
            return str(element.get("id"))
    return None
