"""The `matrix` connector: the agent as a Matrix user, on any homeserver (tested against Synapse).

Our own sync loop over mautrix's HTTP client: each sync's events are admitted to the ledger first, and
only then is its `next_batch` saved as the cursor, so a crash re-reads what was not admitted (and the
ledger's per-message dedupe makes a re-read event run once). A `limited` sync is back-paginated to the
previous cursor, so nothing sent while the gateway was down is skipped. The first start takes the
current position and answers nothing older; in a room joined later, nothing from before the join.
Encrypted rooms are not supported: logged once, never answered in clear.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
from typing import Any
from urllib.parse import quote

from aiohttp import ClientError
from mautrix.api import Method
from mautrix.errors import MatrixConnectionError, MatrixRequestError

from mibyan.config.gateway import Connector as ConnectorSettings
from mibyan.core.errors import ConfigError
from mibyan.gateway.connectors import inbox
from mibyan.gateway.connectors.base import Destination, InboundEvent, Limits, SendResult, SendStatus
from mibyan.gateway.connectors.chat import ChatCore
from mibyan.gateway.connectors.chat_text import markdown_html
from mibyan.gateway.connectors.matrix_api import (
    CLIENT,
    ConnectorFiles,
    Login,
    MatrixHttp,
    RateLimited,
    check_matrix,
    log_in,
    room_path,
)
from mibyan.gateway.ledger import Reply
from mibyan.gateway.runner import Gateway
from mibyan.gateway.work import ShuttingDown

log = logging.getLogger("mibyan.gateway")
#: Events per room in one sync: more missed than this and the sync is `limited`, back-paginated.
TIMELINE_LIMIT = 10
_SYNC_FILTER = json.dumps(
    {
        "room": {"timeline": {"limit": TIMELINE_LIMIT}, "state": {"lazy_load_members": True}},
        "presence": {"types": []},
        "account_data": {"types": []},
    }
)
_GONE = (MatrixConnectionError, ClientError, asyncio.TimeoutError, ConnectionError)
_MAX_BACKFILL_PAGES = 50
_FILES = ("m.file", "m.image", "m.audio", "m.video")  # a file a user sends: saved in the agent's inbox/


class MatrixConnector:
    """One Matrix account answering for one agent."""

    kind = "matrix"
    limits = Limits(text_length=4000, unit="characters", threads=True, typing=True, edits=True)

    def __init__(self, settings: ConnectorSettings, gateway: Gateway) -> None:
        self.settings = settings
        self.name = settings.name
        self.gateway = gateway
        self._secret = check_matrix(settings, os.environ)
        assert settings.homeserver is not None and settings.user_id is not None
        self.homeserver = settings.homeserver.rstrip("/")
        self.user_id = settings.user_id
        self.core = ChatCore(settings, gateway, self)
        self.files = ConnectorFiles(gateway.home, settings.name)
        self.api = MatrixHttp(self.homeserver)
        self.login: Login | None = None
        self._since: str | None = None
        self._first_start = 0.0
        self._members: dict[str, int] = {}
        self._encrypted: dict[str, bool] = {}
        self._task: asyncio.Task[None] | None = None
        self.notice = "answers anyone who writes to it (allow: *)" if "*" in (settings.allow or []) else None

    @property
    def url(self) -> str:
        return self.homeserver

    async def start(self) -> None:
        """Log in (or reuse the kept login), catch up on what was missed, then sync in the background."""
        try:
            self.login = await log_in(self.api, self.settings, self.files, self._secret)
        except _GONE as exc:
            raise ConfigError(
                f"connector '{self.name}': cannot reach the homeserver {self.url}: {exc}"
            ) from exc
        self.user_id = self.login.user_id
        self._since, self._first_start = self.files.cursor()
        self.core.follow_resumed(self._destination)
        if self._since is None:  # first start: from here on, nothing older is ever answered
            answer = await self._sync(timeout_ms=0)
            await self._invites(answer)
            self._advance(str(answer["next_batch"]))
        else:
            await self._sync_once(timeout_ms=0)
        self._task = asyncio.create_task(self._run())

    @staticmethod
    def _destination(channel: str, message_key: str) -> Destination:
        """Where a message of a channel (`room` or `room/thread`) is answered."""
        room, _, thread = channel.partition("/")
        return Destination(room, thread or None, message_key)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.core.stop()
        await self.api.session.close()

    async def deliver(self, reply: Reply) -> bool:
        entry = self.gateway.ledger.entry(reply.inbox_id)
        if entry is None or entry.message_key is None:
            return False
        room, _, thread = entry.channel.split("/", 2)[2].partition("/")
        return await self.core.resend(reply, Destination(room, thread or None, entry.message_key))

    async def _run(self) -> None:
        """Sync until stopped; after the homeserver goes away, reconnect with back-off; after it ends the
        login, log in again once (a login refused at once again stops the connector)."""
        backoff, fresh_login = 0.5, False
        while True:
            try:
                await self._sync_once(timeout_ms=10_000)
                backoff, fresh_login = 0.5, False
            except RateLimited as limited:
                await asyncio.sleep(limited.retry_after)
            except ShuttingDown:
                return
            except (*_GONE, MatrixRequestError) as exc:
                if isinstance(exc, MatrixRequestError) and exc.http_status == 401:
                    if fresh_login:
                        log.error(
                            "%s: the homeserver refused a fresh login at once (%s); the connector "
                            "stopped: restart the gateway once the account works",
                            self.name,
                            exc,
                        )
                        return
                    if not await self._logged_in_again(exc):
                        return
                    fresh_login = True
                    continue
                if backoff == 0.5:
                    log.warning("%s: the homeserver is unreachable (%s); reconnecting", self.name, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _logged_in_again(self, refused: MatrixRequestError) -> bool:
        """The homeserver ended the login (its device logged out, the token revoked): log in again with
        the password; with a given access token, or a password it refuses now, the connector stops (one
        error line) instead of asking forever. Nothing is lost: the cursor has not moved, so a restart
        with new credentials catches up on what was sent meanwhile."""
        if not self.settings.access_token_env:
            self.files.forget_login()
            try:
                self.login = await log_in(self.api, self.settings, self.files, self._secret)
            except ConfigError as exc:
                log.error("%s; the connector stopped: restart the gateway once it is fixed", exc)
                return False
            except _GONE:
                return True  # the next sync finds the homeserver gone and backs off
            log.warning(
                "%s: the homeserver ended its login (%s); logged in again", self.name, refused.errcode
            )
            return True
        log.error(
            "%s: the homeserver refused its access token (%s: %s); the connector stopped: set a new token "
            "in %s and restart the gateway",
            self.name,
            refused.errcode,
            refused.message,
            self.settings.access_token_env,
        )
        return False

    async def _sync(self, timeout_ms: int) -> dict[str, Any]:
        query = {"timeout": str(timeout_ms), "filter": _SYNC_FILTER}
        if self._since is not None:
            query["since"] = self._since
        answer: dict[str, Any] = await self.api.request(Method.GET, f"{CLIENT}/sync", query_params=query)
        return answer

    async def _sync_once(self, timeout_ms: int) -> None:
        """One sync: invitations, then every joined room's new messages admitted, then the cursor saved."""
        answer = await self._sync(timeout_ms)
        await self._invites(answer)
        for room_id, room in answer.get("rooms", {}).get("join", {}).items():
            await self._room(room_id, room)
        for room_id in answer.get("rooms", {}).get("leave", {}):
            self._members.pop(room_id, None)
        self._advance(str(answer["next_batch"]))

    def _advance(self, since: str) -> None:
        """Every event up to `since` is admitted: only now does the cursor move past them."""
        self._since = since
        self.files.save_cursor(since, self._first_start)

    async def _invites(self, answer: dict[str, Any]) -> None:
        for room_id, room in answer.get("rooms", {}).get("invite", {}).items():
            inviter = next(
                (
                    event.get("sender")
                    for event in room.get("invite_state", {}).get("events", [])
                    if event.get("type") == "m.room.member" and event.get("state_key") == self.user_id
                ),
                None,
            )
            if inviter is not None and self.core.allowed(str(inviter)):
                await self.api.request(Method.POST, room_path(room_id, "join"), {})
                log.info("%s: joined %s, invited by %s", self.name, room_id, inviter)
            else:
                await self.api.request(Method.POST, room_path(room_id, "leave"), {})
                log.info("%s: declined %s, invited by %s (not on allow)", self.name, room_id, inviter)

    async def _room(self, room_id: str, room: dict[str, Any]) -> None:
        timeline = room.get("timeline", {})
        events: list[dict[str, Any]] = list(timeline.get("events", []))
        for event in [*room.get("state", {}).get("events", []), *events]:
            if event.get("type") == "m.room.member":
                self._members.pop(room_id, None)
            if event.get("type") == "m.room.encryption":
                self._encrypted[room_id] = True
        if timeline.get("limited") and timeline.get("prev_batch") and self._since is not None:
            gap = await self._backfill(room_id, str(timeline["prev_batch"]), self._since)
            seen = {event.get("event_id") for event in events}
            events = [event for event in gap if event.get("event_id") not in seen] + events
        joined = [i for i, event in enumerate(events) if self._is_own_join(event)]
        if joined:  # a room joined in this stretch: what was said before the join is history
            events = events[joined[-1] + 1 :]
        for event in events:
            await self._event(room_id, event)

    def _is_own_join(self, event: dict[str, Any]) -> bool:
        if event.get("type") != "m.room.member" or event.get("state_key") != self.user_id:
            return False
        before = event.get("unsigned", {}).get("prev_content", {}).get("membership")
        return bool(event.get("content", {}).get("membership") == "join" and before != "join")

    async def _backfill(self, room_id: str, start: str, until: str) -> list[dict[str, Any]]:
        """The events between the last cursor and a limited sync's timeline, oldest first."""
        found: list[dict[str, Any]] = []
        token = start
        for _ in range(_MAX_BACKFILL_PAGES):
            query = {"from": token, "to": until, "dir": "b", "limit": "100"}
            page = await self.api.request(Method.GET, room_path(room_id, "messages"), query_params=query)
            chunk = page.get("chunk", [])
            found.extend(chunk)
            end = page.get("end")
            if not chunk or not end or end == token or any(self._is_own_join(e) for e in chunk):
                break
            token = str(end)
        return list(reversed(found))

    async def _event(self, room_id: str, event: dict[str, Any]) -> None:
        """Admit one timeline event if it is a message the agent should answer."""
        kind, sender = event.get("type"), str(event.get("sender", ""))
        if sender == self.user_id or kind not in ("m.room.message", "m.room.encrypted"):
            return
        if kind == "m.room.encrypted" or await self._is_encrypted(room_id):
            if not self._encrypted.get(f"logged:{room_id}"):
                self._encrypted[f"logged:{room_id}"] = True
                log.warning("%s: %s is encrypted: not supported, never answered", self.name, room_id)
            return
        content = event.get("content", {})
        relation = content.get("m.relates_to") or {}
        kind = content.get("msgtype")
        if kind not in ("m.text", "m.emote", *_FILES) or relation.get("rel_type") == "m.replace":
            return
        if not self.core.allowed(sender):
            log.info("%s: ignored a message from %s in %s (not on allow)", self.name, sender, room_id)
            return
        thread = str(relation["event_id"]) if relation.get("rel_type") == "m.thread" else None
        text = _without_reply_fallback(str(content.get("body", "")), relation)
        inbound = InboundEvent(
            self.name,
            room_id,
            thread,
            sender,
            str(event["event_id"]),
            self._unmentioned(text),
            float(event.get("origin_server_ts", 0)) / 1000,
        )
        if not await self._addressed(room_id, content, text) and not self.core.answers_question(inbound):
            return
        if kind in _FILES:
            inbound = dataclasses.replace(inbound, text=await self._file(inbound, content))
        await self.core.admit(inbound, Destination(room_id, thread, inbound.message_id))

    async def _file(self, inbound: InboundEvent, content: dict[str, Any]) -> str:
        """A file message: the file saved in the agent's `inbox/` (if it is within the limit), and the
        text telling the agent where, with the caption the sender wrote."""
        name = str(content.get("filename") or content.get("body") or "file")
        caption = inbound.text if content.get("filename") and content.get("body") != name else ""
        limit_mb = self.gateway.settings.gateway.max_attachment_mb
        limit = int(limit_mb * 1_000_000)
        declared = (content.get("info") or {}).get("size")
        data: bytes | int | None = declared if isinstance(declared, int) and declared > limit else None
        if data is None:
            data = await self._download(str(content.get("url", "")), limit)
        workdir = self.gateway.route(self.settings, None).workdir
        saved = await inbox.keep(workdir, inbound.message_id, name, data, limit, "it could not be fetched")
        return "\n".join(part for part in (caption, inbox.note([saved], limit_mb)) if part)

    async def _download(self, url: str, limit: int) -> bytes | int | None:
        """The file at an `mxc://` URL; its size so far when it grows past `limit`; None when the
        homeserver has no such file. A homeserver gone away raises (the sync is read again later)."""
        server, _, media = url.removeprefix("mxc://").partition("/")
        if not url.startswith("mxc://") or not server or not media:
            return None
        path = f"/_matrix/client/v1/media/download/{quote(server, safe='')}/{quote(media, safe='')}"
        headers = {"Authorization": f"Bearer {self.api.token}"}
        async with self.api.session.get(self.homeserver + path, headers=headers) as response:
            return await inbox.read_capped(response, limit)

    async def _is_encrypted(self, room_id: str) -> bool:
        if room_id not in self._encrypted:
            try:
                await self.api.request(Method.GET, room_path(room_id, "state", "m.room.encryption", ""))
                self._encrypted[room_id] = True
            except MatrixRequestError as exc:
                if exc.http_status != 404:
                    raise
                self._encrypted[room_id] = False
        return self._encrypted[room_id]

    async def _addressed(self, room_id: str, content: dict[str, Any], text: str) -> bool:
        """A DM (two members) always; a group room as `groups:` says (mention: the bot is mentioned)."""
        if room_id not in self._members:
            members = await self.api.request(Method.GET, room_path(room_id, "joined_members"))
            self._members[room_id] = len(members.get("joined", {}))
        if self._members[room_id] <= 2 or self.settings.groups == "all":
            return True
        if self.settings.groups == "ignore":
            return False
        mentions = content.get("m.mentions", {}).get("user_ids", [])
        pill = f"matrix.to/#/{self.user_id}" in str(content.get("formatted_body", ""))
        return self.user_id in mentions or pill or self.user_id in text

    def _unmentioned(self, text: str) -> str:
        """The text without a leading mention of the bot (`@bot:server: /stop` is the command /stop)."""
        stripped = text.strip()
        local = self.user_id[1:].split(":", 1)[0]
        for name in (self.user_id, local):
            if stripped.lower().startswith(name.lower()):
                return stripped[len(name) :].lstrip(" :,").strip() or stripped
        return stripped

    async def send_part(self, where: Destination, text: str, key: str, first: bool) -> SendResult:
        content: dict[str, Any] = {
            "msgtype": "m.text",
            "body": text,
            "format": "org.matrix.custom.html",
            "formatted_body": markdown_html(text),
        }
        if where.thread is not None:
            content["m.relates_to"] = {
                "rel_type": "m.thread",
                "event_id": where.thread,
                "is_falling_back": True,
                "m.in_reply_to": {"event_id": where.reply_to},
            }
        elif first:
            content["m.relates_to"] = {"m.in_reply_to": {"event_id": where.reply_to}}
        return await self._put(where.conversation, content, key)

    async def edit_part(self, where: Destination, sent_id: str, text: str, key: str) -> SendResult:
        new = {"msgtype": "m.text", "body": text, "format": "org.matrix.custom.html"}
        new["formatted_body"] = markdown_html(text)
        content = {
            "msgtype": "m.text",
            "body": f"* {text}",  # what a client without edits shows
            "m.new_content": new,
            "m.relates_to": {"rel_type": "m.replace", "event_id": sent_id},
        }
        return await self._put(where.conversation, content, key)

    async def _put(self, room_id: str, content: dict[str, Any], key: str) -> SendResult:
        path = room_path(room_id, "send", "m.room.message", key)
        try:
            answer = await self.api.request(Method.PUT, path, content)
        except RateLimited as limited:
            return SendResult(SendStatus.RETRY_AFTER, limited.retry_after)
        except MatrixRequestError as exc:
            status = SendStatus.UNKNOWN if exc.http_status >= 500 else SendStatus.FAILED
            return SendResult(status, detail=str(exc))
        except _GONE as exc:
            return SendResult(SendStatus.UNKNOWN, detail=str(exc) or type(exc).__name__)
        return SendResult(SendStatus.DELIVERED, sent_id=str(answer.get("event_id", "")))

    async def typing(self, conversation: str, on: bool) -> None:
        body = {"typing": on, "timeout": 30_000} if on else {"typing": False}
        try:
            await self.api.request(Method.PUT, room_path(conversation, "typing", self.user_id), body)
        except (*_GONE, MatrixRequestError, RateLimited):
            pass  # typing is a courtesy: never worth failing a reply for


def _without_reply_fallback(body: str, relation: dict[str, Any]) -> str:
    """A reply's body quotes the message it answers in `> ` lines first; the agent needs only the reply."""
    if "m.in_reply_to" not in relation or relation.get("is_falling_back"):
        return body
    lines = body.split("\n")
    while lines and lines[0].startswith(">"):
        lines.pop(0)
    return "\n".join(lines).strip() or body
