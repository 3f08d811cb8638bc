"""What every chat connector shares, whatever the platform: admission, in-chat commands, replies.

A platform module (matrix.py; email and xmpp next) turns its events into `InboundEvent`s and calls
`ChatCore.admit`, which returns once the message is in the ledger (or was a command, handled ahead of
the channel's queue): only then may the platform advance its cursor. The run's outcome is followed in
a task: typing while it works, then (once the channel's previous reply has gone, so replies keep the
order of their messages) the reply split under the platform's limit and each part sent with an
idempotency key derived from the inbound message id and the part number, retried after a rate limit
or an unknown result under the same key, and marked sent in the ledger once every part is delivered.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from mibyan.config.gateway import Connector as ConnectorSettings
from mibyan.gateway.connectors.base import (
    ChatPlatform,
    Destination,
    InboundEvent,
    SendStatus,
    idempotency_key,
)
from mibyan.gateway.connectors.chat_progress import ProgressNote
from mibyan.gateway.connectors.chat_text import split_reply
from mibyan.gateway.ledger import Reply
from mibyan.gateway.work import Inbound, Outcome, ShuttingDown, ToolProgress

if TYPE_CHECKING:
    from mibyan.gateway.runner import Gateway

log = logging.getLogger("mibyan.gateway")

HELP = (
    "Commands: /new (start a fresh session here), /stop (interrupt the running turn), /status, "
    "/approve or /deny (answer my question before a command), /help."
)
_TYPING_EVERY = 20.0  # seconds between typing notices (each lasts 30 s on Matrix)
_GIVE_UP_AFTER = 600.0  # seconds a reply part is retried while the platform cannot take it


class ChatCore:
    """Admission and replies for one chat connector.

    Args:
        settings: the connector's entry.
        gateway: the gateway whose ledger, queues and agents run the messages.
        platform: the connector's sending side.
    """

    def __init__(self, settings: ConnectorSettings, gateway: Gateway, platform: ChatPlatform) -> None:
        self.name = settings.name
        self.gateway = gateway
        self.platform = platform
        self.agent_id = gateway.route(settings, None).id
        self.allow = list(settings.allow or [])
        self.progress = settings.progress
        self._askers: dict[str, str] = {}  # channel key → the sender the pending question was asked
        self._tasks: set[asyncio.Task[object]] = set()
        self._sending: dict[str, asyncio.Lock] = {}
        self._last_reply: dict[str, asyncio.Future[None]] = {}  # channel key → its latest reply sent

    def allowed(self, sender: str) -> bool:
        return "*" in self.allow or sender in self.allow

    def key(self, channel: str) -> str:
        return f"{self.agent_id}/{self.name}/{channel}"

    def answers_question(self, event: InboundEvent) -> bool:
        """Whether the event is /approve or /deny from the sender the channel's question was asked."""
        word = event.text.strip().lower()
        key = self.key(event.channel)
        approvals = self.gateway.approvals
        if word not in ("/approve", "/deny") or approvals is None or approvals.pending(key) is None:
            return False
        return self._askers.get(key, event.sender) == event.sender

    async def admit(self, event: InboundEvent, where: Destination) -> None:
        """Handle a command or record the message and follow its run; returns once it is recorded.

        Raises:
            ShuttingDown: the gateway takes no more messages (the cursor must not move past this one).
        """
        text = event.text.strip()
        word = text.split(maxsplit=1)[0].lower() if text else ""
        key = self.key(event.channel)
        answer = await self._command(word, key, event)
        if answer is not None:
            self._spawn(self._send_all(where, answer, event.message_id, inbox_id=None))
            return
        message = Inbound(self.agent_id, self.name, event.channel, text, message_key=event.message_id)
        note, on_tool = self._progress(where, event.message_id)
        run = await self.gateway.admit(message, on_tool=on_tool)
        self._spawn(self._follow(run, where, event.message_id, key, event.sender, note, self._in_turn(key)))

    def _progress(
        self, where: Destination, message_id: str
    ) -> tuple[ProgressNote | None, ToolProgress | None]:
        """The run's status in the conversation, as `progress:` says (chat_progress.py), and the
        callback that feeds it from the run's worker thread."""
        limits = self.platform.limits
        mode = self.progress or ("edit" if limits.edits else "off")
        if mode == "off" or not limits.status_messages or (mode == "edit" and not limits.edits):
            return None, None
        lock = self._sending.setdefault(where.conversation, asyncio.Lock())
        note = ProgressNote(self.platform, where, message_id, mode, lock)
        loop = asyncio.get_running_loop()

        def on_tool(phase: str, name: str, detail: dict[str, Any]) -> None:
            if phase == "start":
                loop.call_soon_threadsafe(note.tool_started, name, detail.get("arguments"))

        return note, on_tool

    async def _command(self, word: str, key: str, event: InboundEvent) -> str | None:
        """The reply of an in-chat command, or None when the message is for the agent."""
        approvals = self.gateway.approvals
        if word in ("/approve", "/deny"):
            if approvals is None or approvals.pending(key) is None:
                return "Nothing is waiting for an answer."
            if not self.answers_question(event):
                asker = self._askers.get(key, "the person I asked")
                return f"Only {asker} can answer that question."
            return None  # the gateway's approval path answers it
        if word == "/new":
            ledger = self.gateway.ledger
            await asyncio.get_running_loop().run_in_executor(
                None, functools.partial(ledger.end_channel_session, key)
            )
            return "Done: your next message starts a fresh session."
        if word == "/stop":
            return "Stopping the running turn." if self.gateway.interrupt(key) else "Nothing is running."
        if word == "/status":
            return self._status(key)
        if word == "/help":
            return HELP
        return None

    def _status(self, key: str) -> str:
        running = any(agent.session_scope == key for agent in self.gateway._running)
        queued = self.gateway.queued(key)
        session = self.gateway.ledger.channel_session(key) or "none yet"
        state = "working on a message" if running else "idle"
        return f"Agent {self.agent_id}, {state}, {queued} queued. Channel {key}, session {session}."

    def _spawn(self, work: Coroutine[Any, Any, object]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def follow_resumed(self, destination: Callable[[str, str], Destination]) -> None:
        """The messages of this connector the last run admitted but did not answer, running again at
        start: their replies go out like any other's, where `destination(channel, message_key)` says."""
        prefix = f"{self.agent_id}/{self.name}/"
        for entry in self.gateway.ledger.unfinished():
            run = self.gateway.waiting_on(entry.id)
            if run is None or not entry.channel.startswith(prefix) or entry.message_key is None:
                continue
            where = destination(entry.channel.removeprefix(prefix), entry.message_key)
            turn = self._in_turn(entry.channel)
            self._spawn(self._follow(run, where, where.reply_to, entry.channel, None, None, turn))

    def _in_turn(self, key: str) -> tuple[asyncio.Future[None] | None, asyncio.Future[None]]:
        """The reply before this one in the channel (None if all went) and this reply's own place.

        Taken when the message is admitted, in the order messages come: two runs of a channel that end
        moments apart (the second while the first is still clearing its typing notice) answer in that
        order. Keyed by channel, not conversation: a slow thread never holds up another thread's reply.
        """
        previous = self._last_reply.get(key)
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._last_reply[key] = mine
        return (previous if previous is not None and not previous.done() else None), mine

    async def _follow(
        self,
        run: asyncio.Future[Outcome],
        where: Destination,
        message_id: str,
        key: str,
        sender: str | None,
        note: ProgressNote | None,
        turn: tuple[asyncio.Future[None] | None, asyncio.Future[None]],
    ) -> None:
        previous, mine = turn
        try:
            typing = asyncio.create_task(self._keep_typing(where.conversation))
            try:
                outcome = await run
            except ShuttingDown:
                return  # left pending in the ledger: the next start runs it
            except Exception as exc:  # the runner logged it; the user hears it failed
                outcome = Outcome(0, "", "", {}, error=str(exc) or type(exc).__name__)
            finally:
                typing.cancel()
                await self.platform.typing(where.conversation, False)
                if note is not None:
                    await note.finish()  # the summary of what ran goes above the answer
            if previous is not None:
                await asyncio.shield(previous)  # the channel's earlier message is answered first
            if outcome.interrupted:
                if outcome.inbox_id and self.gateway._accepting:  # a /stop, not the gateway stopping
                    await self.gateway._ledger(
                        functools.partial(self.gateway.ledger.set_status, outcome.inbox_id, "failed")
                    )
                    await self._send_all(where, "Stopped.", message_id, inbox_id=None)
                return
            approvals = self.gateway.approvals
            pending = approvals.pending(key) if approvals is not None else None
            if pending is not None and pending.inbox_id == outcome.inbox_id and sender is not None:
                self._askers[key] = sender
            text = outcome.text if outcome.error is None else f"Sorry, that failed: {outcome.error}"
            await self._send_all(where, text or "(no answer)", message_id, outcome.inbox_id or None)
        finally:
            mine.set_result(None)  # the channel's next reply may go
            if self._last_reply.get(key) is mine:
                del self._last_reply[key]

    async def _keep_typing(self, conversation: str) -> None:
        while True:
            await self.platform.typing(conversation, True)
            await asyncio.sleep(_TYPING_EVERY)

    async def _send_all(self, where: Destination, text: str, message_id: str, inbox_id: int | None) -> bool:
        """Send every part in order, one reply at a time per conversation (a rate-limited reply is not
        overtaken, nor its parts interleaved with the next one's); the ledger marks the reply sent once
        all are delivered."""
        limits = self.platform.limits
        parts = split_reply(text, limits.text_length, limits.unit)
        async with self._sending.setdefault(where.conversation, asyncio.Lock()):
            for number, part in enumerate(parts):
                if not await self._send_part(where, part, idempotency_key(message_id, number), number == 0):
                    return False
        if inbox_id is not None:
            await self.gateway.delivered(inbox_id)
        return True

    async def _send_part(self, where: Destination, part: str, key: str, first: bool) -> bool:
        """One part, again under the same key after a rate limit or an unknown result (the platform's
        idempotency makes a repeat of a part that did arrive invisible)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _GIVE_UP_AFTER
        backoff = 0.5
        while True:
            result = await self.platform.send_part(where, part, key, first)
            if result.status is SendStatus.DELIVERED:
                return True
            if result.status is SendStatus.FAILED or loop.time() > deadline:
                log.warning("%s: a reply to %s not sent: %s", self.name, where.reply_to, result.detail)
                return False
            if result.status is SendStatus.RETRY_AFTER:
                log.info("%s: rate-limited, sending again in %.1f s", self.name, result.retry_after)
                await asyncio.sleep(result.retry_after)
            else:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)

    async def resend(self, reply: Reply, where: Destination) -> bool:
        """A reply recorded before a restart but not marked sent: sent again under the same keys."""
        return await self._send_all(where, reply.text, where.reply_to, inbox_id=None)

    async def stop(self) -> None:
        """Let replies in progress finish (the gateway has drained its runs)."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=self.gateway.settings.gateway.shutdown_grace)
