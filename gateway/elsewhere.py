"""What a gateway sharing its store waits for of the others (DESIGN §16): the reply to a message another
gateway runs, and the answer to its own run's question that reached another gateway.

A repeated `Idempotency-Key` arriving while another gateway runs that message waits for the reply that
gateway records: woken by the ledger's notice (LISTEN/NOTIFY on PostgreSQL), else looking again every
`gateway.poll_seconds`. A question a run asks its channel is a row of the store (store/questions.py);
an answer arriving at another gateway is taken on that row, which wakes the asking gateway, whose run
goes on; the asking gateway records the run's next reply (its next question, or its final answer) as
the answering message's, which wakes the gateway that received it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from agent_state import SessionStore
from mibyan.core.errors import MibyanError
from mibyan.gateway.approvals import PendingApproval
from mibyan.gateway.leasing import notices
from mibyan.gateway.ledger import InboxEntry, Ledger
from mibyan.gateway.work import NothingToAnswer, Outcome, RunFailed
from mibyan.store.leases import Leases
from mibyan.store.notices import LEDGER, QUESTIONS
from mibyan.store.questions import Questions

log = logging.getLogger("mibyan.gateway")
_T = TypeVar("_T")


class Elsewhere:
    """This gateway's side of the questions and replies it shares with the others.

    Args:
        store: the shared store.
        questions: its questions table.
        leases: its leases (who runs a channel now).
        ledger: the gateway's ledger on that store.
        io: the executor the gateway's ledger I/O runs on.
        owner: this gateway's name in the leases.
        poll: `gateway.poll_seconds`.
    """

    def __init__(
        self,
        store: SessionStore,
        questions: Questions,
        leases: Leases,
        ledger: Ledger,
        io: ThreadPoolExecutor,
        *,
        owner: str,
        poll: float,
    ) -> None:
        self.store, self.questions, self.leases, self.ledger = store, questions, leases, ledger
        self._io = io
        self.owner = owner
        self.poll = poll

    async def _call(self, action: Callable[[], _T]) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._io, action)

    def record_question(self, channel: str, pending: PendingApproval) -> None:
        """The run's thread: the question it is about to post, in the store, so that an answer reaching
        another gateway finds it. A store that refuses it (the channel lost) leaves it asked here only."""
        try:
            pending.question_id = self.questions.ask(
                channel,
                pending.inbox_id,
                self.owner,
                kind=pending.kind,
                subject=pending.command,
                asking=pending.asking_text(),
                session_id=pending.session_id,
            )
        except MibyanError as exc:
            log.warning("the question on %s is not shared with the other gateways: %s", channel, exc)

    async def asked_elsewhere(self, channel: str) -> dict[str, Any] | None:
        """The channel's open question when another gateway's run asked it."""
        row = await self._call(lambda: self.questions.open_on(channel))
        return row if row is not None and row["owner"] != self.owner else None

    async def take_answer(self, question_id: int, text: str, inbox_id: int) -> bool:
        """Take `text`, the message `inbox_id`, as the question's answer; False: another was taken first."""
        return await self._call(lambda: self.questions.answer(question_id, text, inbox_id))

    async def question(self, question_id: int) -> dict[str, Any] | None:
        return await self._call(lambda: self.questions.get(question_id))

    async def close_question(self, question_id: int) -> bool:
        """Nobody may answer it any more; False when an answer was taken first."""
        return await self._call(lambda: self.questions.close(question_id))

    async def answer_taken_elsewhere(
        self, channel: str, pending: PendingApproval, asked: Callable[[], bool]
    ) -> dict[str, Any] | None:
        """While `asked()`: wait for an answer to `pending` taken by any gateway; its row, or None once
        the question was closed or is no longer asked here."""
        question_id = pending.question_id
        if question_id is None:
            return None
        async with notices(self.store, self._io, QUESTIONS, channel) as woken:
            while asked():
                row = await self.question(question_id)
                if row is None or row["status"] == "closed":
                    return None
                if row["status"] == "answered":
                    return row
                await woken.wait(self.poll)
        return None

    async def reply(
        self,
        entry: InboxEntry,
        running_here: Callable[[int], asyncio.Future[Outcome] | None],
        *,
        asked_by: dict[str, Any] | None = None,
    ) -> Outcome:
        """The reply to `entry`, which another gateway runs (or, with `asked_by`, the question whose
        answer it is: that question's run goes on there), once that gateway records it.

        Raises:
            RunFailed: it failed there.
            NothingToAnswer: the gateway whose run asked `asked_by` stopped before its run went on.
        """
        said = False
        async with notices(self.store, self._io, LEDGER, str(entry.id)) as woken:
            while True:
                outcome = await self._recorded(entry.id)
                if outcome is not None:
                    return outcome
                here = running_here(entry.id)  # taken over by this gateway meanwhile
                if here is not None:
                    return await asyncio.shield(here)
                if asked_by is None:
                    asking = await self._asking(entry)
                    if asking is not None:  # a repeat of the message whose run asks: the question again
                        return asking
                elif await self._asker_gone(entry.channel, asked_by):
                    outcome = await self._recorded(entry.id)  # answered just before it let go
                    if outcome is not None:
                        return outcome
                    await self._call(lambda: self.ledger.set_status(entry.id, "failed"))
                    raise NothingToAnswer(
                        "the gateway whose run asked this question stopped before it could go on; the"
                        " question no longer waits (ask again)"
                    )
                if not said:
                    log.info(
                        "message %s on %s runs on another gateway: waiting for its reply",
                        entry.id,
                        entry.channel,
                    )
                    said = True
                await woken.wait(self.poll)

    async def _recorded(self, inbox_id: int) -> Outcome | None:
        """The reply recorded for the message; None before one; RunFailed when the message failed."""
        reply = await self._call(lambda: self.ledger.reply_for(inbox_id))
        if reply is not None:
            return Outcome(inbox_id, reply.text, reply.session_id, reply.usage)
        fresh = await self._call(lambda: self.ledger.entry(inbox_id))
        if fresh is None or fresh.status == "failed":
            raise RunFailed("this message failed on the gateway that ran it")
        return None

    async def _asking(self, entry: InboxEntry) -> Outcome | None:
        row = await self._call(lambda: self.questions.open_on(entry.channel))
        if row is None or int(row["inbox_id"]) != entry.id:
            return None
        return Outcome(entry.id, str(row["asking"]), str(row["session_id"]), {})

    async def _asker_gone(self, channel: str, asked_by: dict[str, Any]) -> bool:
        """Whether the gateway whose run asked lost the channel: another holds it, its lease ran out
        unrenewed (one let go on purpose, at the run's end, is its own still), or it is gone (killed)."""
        holder = await self._call(lambda: self.leases.holder(channel))
        if holder is None or holder["owner"] != asked_by["owner"]:
            return True
        expires = float(holder["expires_at"])
        return 0 < expires < time.time() or await self._call(lambda: self.leases.gone(holder["owner"]))
