"""The gateway runner: routing, one FIFO per channel, a global limit, and the ledger around each run.

A message is recorded in the ledger, queued on its channel, and run when the channel's previous message
is done and fewer than `gateway.max_concurrent` runs are going. Each run is a core `AIAgent` in a worker
thread (the agent is synchronous); the event loop only routes and waits. A repeated message id gets the
first run's reply (or waits for that run), never a second run. With a store shared by several gateways
(DESIGN §16), a message another gateway runs is waited for there, and an answer to another gateway's
question is handed to it (gateway/elsewhere.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from agent_state import SessionStore, mask_secrets
from mibyan.agent.session_lock import SessionLock, build_holding
from mibyan.config.gateway import Connector
from mibyan.config.loader import AgentSettings
from mibyan.core.errors import MibyanError
from mibyan.gateway.agents import AgentInstance, prepare_workspace
from mibyan.gateway.approvals import (
    ANSWERS,
    DENIED_BY_POLICY,
    NO_CHANNEL_TO_ASK,
    ChannelApprovals,
    ChannelAsker,
    PendingApproval,
    answer_first_text,
    answers,
)
from mibyan.gateway.elsewhere import Elsewhere
from mibyan.gateway.leasing import ChannelLeases
from mibyan.gateway.ledger import InboxEntry, Ledger, Reply
from mibyan.gateway.resumption import cut_turn_start, not_to_resume
from mibyan.gateway.streaming import AnswerStream
from mibyan.gateway.work import (
    Delta,
    Inbound,
    Job,
    NothingToAnswer,
    Outcome,
    RunFailed,
    RunRequest,
    ShuttingDown,
    ToolProgress,
    UnknownAgent,
    channel_key,
)
from mibyan.store.database import LeaseLost
from mibyan.tools.approval import Approver

if TYPE_CHECKING:
    from mibyan.agent.turn_state import ConversationResult
    from run_agent import AIAgent

log = logging.getLogger("mibyan.gateway")
_T = TypeVar("_T")
EMAIL_APPROVAL_TIMEOUT = 1800.0  # seconds: email's default `connectors[].approval_timeout`
_INTERRUPTED_WITHIN = 10.0  # seconds interrupted runs get to return their valid histories at a stop


@dataclass
class _ChannelQueue:
    jobs: deque[Job] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None


class Gateway:
    """The configured agents, their channels and the ledger; connectors hand messages to `submit`.

    Args:
        settings: the resolved configuration (its `agents:`, `connectors:` and `gateway:` sections).
        home: the mibyan home whose state.db holds the sessions and the ledger.
    """

    def __init__(self, settings: AgentSettings, home: Path) -> None:
        self.settings = settings
        self.home = home
        self.agents = {entry.id: AgentInstance(entry, settings, home) for entry in settings.agents}
        #: when this run began: the replies recorded before it, and not sent, are a previous run's
        self.started = time.time()
        self.store = SessionStore.open(home)
        self.ledger = Ledger(self.store)
        limit = settings.gateway.max_concurrent
        self._pool = ThreadPoolExecutor(limit, thread_name_prefix="mibyan-agent")
        self._io = ThreadPoolExecutor(1, thread_name_prefix="mibyan-ledger")
        self._limit = asyncio.Semaphore(limit)
        self._channels: dict[str, _ChannelQueue] = {}
        self._waiting: dict[int, asyncio.Future[Outcome]] = {}
        self._running: set[AIAgent] = set()
        self._accepting = True
        self._loop: asyncio.AbstractEventLoop | None = None
        # a channel is asked the model's clarify questions always, its dangerous commands with `ask`
        self._asking = settings.gateway.approvals == "ask"
        self.approvals = ChannelApprovals(settings.approvals.timeout)
        # a store shared by gateways on several machines: a channel runs where its lease is held
        leases, questions = self.store.leases, self.store.questions
        seconds, poll = settings.gateway.lease_seconds, settings.gateway.poll_seconds
        self.leases = (
            None if leases is None else ChannelLeases(self.store, leases, seconds, self._io, poll=poll)
        )
        if self.leases is not None:
            self.ledger.sender = self.leases.owner
        self.elsewhere = None
        if self.leases is not None and leases is not None and questions is not None:
            self.elsewhere = Elsewhere(
                self.store, questions, leases, self.ledger, self._io, owner=self.leases.owner, poll=poll
            )
        self._watching: set[asyncio.Task[None]] = set()  # questions of runs here that others may answer

    def default_agent(self) -> AgentInstance | None:
        for instance in self.agents.values():
            if instance.entry.default:
                return instance
        return next(iter(self.agents.values()), None)

    def route(self, connector: Connector, model: str | None) -> AgentInstance:
        """The agent a message on `connector` asking for `model` goes to (UnknownAgent if none)."""
        wanted = connector.agent or model
        if wanted is None:
            instance = self.default_agent()
            if instance is None:
                raise UnknownAgent("no agent is configured")
            return instance
        if connector.agent is not None and model is not None and model != connector.agent:
            raise UnknownAgent(f"this endpoint serves the agent '{connector.agent}', not '{model}'")
        if wanted not in self.agents:
            raise UnknownAgent(f"no agent '{wanted}' (known: {', '.join(sorted(self.agents))})")
        return self.agents[wanted]

    async def _ledger(self, action: Callable[[], _T]) -> _T:
        """Ledger I/O off the event loop (SQLite may wait for another writer's lock)."""
        return await asyncio.get_running_loop().run_in_executor(self._io, action)

    async def resume(self) -> int:
        """Queue the messages a previous run recorded but did not answer; returns how many."""
        await self._ledger(self.ledger.forget_finished)
        pending = await self._ledger(self.ledger.unfinished)
        queued = 0
        for entry in pending:
            instance = self.agents.get(entry.channel.split("/", 1)[0])
            if await self._refused_again(entry, instance):
                continue
            assert instance is not None
            self._enqueue(entry, RunRequest.from_record(entry.request), instance)
            queued += 1
        return queued

    async def _refused_again(self, entry: InboxEntry, instance: AgentInstance | None) -> bool:
        """A message a stopped run left that is not to run again (`not_to_resume`): logged, marked
        failed, True. The same at a restart, at a take-over and for a channel's lost run."""
        refused = not_to_resume(entry, instance)
        if refused is None:
            return False
        log.warning("message %s on %s is not run again: %s", entry.id, entry.channel, refused)
        await self._ledger(functools.partial(self.ledger.set_status, entry.id, "failed"))
        return True

    async def take_over_abandoned(self) -> None:
        """With a shared store, until cancelled: queue the messages left running on channels whose
        gateway stopped renewing their lease (killed, stopped, cut off), to answer them here."""
        leases = self.leases
        if leases is None:
            return
        while True:
            # a gateway that died is seen at once (its alive mark is gone), one stopped at its lease's end
            await asyncio.sleep(min(leases.seconds / 3, leases.poll))
            try:
                entries = await leases.abandoned()
            except MibyanError as exc:  # the database away for a moment: look again next time
                log.warning("looking for abandoned channels failed: %s", exc)
                continue
            for entry in entries:
                instance = self.agents.get(entry.channel.split("/", 1)[0])
                if instance is None or entry.id in self._waiting or not self._accepting:
                    continue
                if await self._refused_again(entry, instance):  # as at a restart: the same cut-off message
                    continue
                log.info("channel %s: its gateway stopped; taking message %s over", entry.channel, entry.id)
                self._enqueue(entry, RunRequest.from_record(entry.request), instance)

    async def undelivered(self) -> list[Reply]:
        """Replies recorded but not sent before the last stop; older ones are marked stale, not returned.
        A reply this run recorded is not among them, sent or not: its own run is sending it."""
        window = self.settings.gateway.redeliver_within
        return await self._ledger(lambda: self.ledger.undelivered(window, self.started))

    async def submit(
        self,
        message: Inbound,
        *,
        on_delta: Delta | None = None,
        on_start: Delta | None = None,
        on_tool: ToolProgress | None = None,
    ) -> Outcome:
        """Record, queue and run a message (or return the reply a repeat of it already got).

        Args:
            message: what arrived.
            on_delta: called (on a worker thread) with each piece of the answer's text, in order.
            on_start: called (on a worker thread) with the session id when the run begins.
            on_tool: called (on a worker thread) before and after each tool call of the run.
        """
        if not self._accepting:
            raise ShuttingDown("the gateway is shutting down")
        instance = self.agents[message.agent_id]
        key = channel_key(message)
        pending = self.approvals.pending(key)
        elsewhere = self.elsewhere
        asked_elsewhere = None  # another gateway's run asked this channel
        if pending is None and elsewhere is not None and message.channel is not None:
            asked_elsewhere = await elsewhere.asked_elsewhere(key)
        if pending is None and asked_elsewhere is None and message.channel is not None:
            await self._refuse_stray_answer(key, message)
        history = tuple(message.history) if message.history is not None else None
        asked = pending is not None or asked_elsewhere is not None
        request = RunRequest(message.text, history, message.channel is None, asked)
        record = request.as_record()
        admitter = self.leases.owner if self.leases is not None else None
        entry, new = await self._ledger(
            lambda: self.ledger.record_inbound(key, message.message_key, record, admitter)
        )
        if not new:
            reply = await self._ledger(lambda: self.ledger.reply_for(entry.id))
            if reply is not None:
                return Outcome(entry.id, reply.text, reply.session_id, reply.usage)
            if pending is not None and pending.inbox_id == entry.id:  # the asking message, again
                return Outcome(entry.id, pending.asking_text(), pending.session_id, {})
            if entry.id in self._waiting:
                return await asyncio.shield(self._waiting[entry.id])
            # another gateway runs it, or it answered a question (whose run records its reply)
            if elsewhere is not None and (entry.status == "running" or entry.request.get("approval_answer")):
                return await elsewhere.reply(entry, self._waiting.get)
        if pending is not None:
            return await self._answer(entry, key, message.text, pending)
        if asked_elsewhere is not None and elsewhere is not None:
            return await self._answer_elsewhere(elsewhere, entry, message.text, asked_elsewhere)
        return await asyncio.shield(self._enqueue(entry, request, instance, on_delta, on_start, on_tool))

    async def _refuse_stray_answer(self, key: str, message: Inbound) -> None:
        """/approve or /deny on a channel where no question waits: NothingToAnswer, unless it repeats a
        message recorded before (its first reply is returned)."""
        if message.text.strip().lower() not in ANSWERS:
            return
        repeated = message.message_key
        if repeated is not None and await self._ledger(lambda: self.ledger.has_message(key, repeated)):
            return
        raise NothingToAnswer(f"nothing on the channel {message.channel!r} is waiting for an answer")

    async def _answer_elsewhere(
        self, elsewhere: Elsewhere, entry: InboxEntry, text: str, question: dict[str, Any]
    ) -> Outcome:
        """A message on a channel whose run, on another gateway, waits for an answer: taken as the
        answer there (once), and its reply is that run's next one; or a reminder to answer first."""
        session_id = str(question["session_id"])
        if not answers(str(question["kind"]), text):
            reminder = answer_first_text(str(question["subject"]))
            await self._ledger(lambda: self.ledger.record_reply(entry, reminder, session_id, {}))
            return Outcome(entry.id, reminder, session_id, {})
        if not await elsewhere.take_answer(int(question["id"]), text, entry.id):
            await self._ledger(functools.partial(self.ledger.set_status, entry.id, "failed"))
            raise NothingToAnswer("the question on this channel was answered already")
        return await elsewhere.reply(entry, self._waiting.get, asked_by=question)

    async def _answer(self, entry: InboxEntry, key: str, text: str, pending: PendingApproval) -> Outcome:
        """A message on a channel whose run waits for approval: the answer, or a reminder to give one.
        A question other gateways may answer too is answered here only if this answer is taken first."""
        if answers(pending.kind, text) and self.elsewhere is not None and pending.question_id is not None:
            pending.answering = True
            taken = await self.elsewhere.take_answer(pending.question_id, text, entry.id)
            pending.answering = False
            if not taken:
                await self._ledger(functools.partial(self.ledger.set_status, entry.id, "failed"))
                self._watch_question(key, pending)  # the answer taken first goes to the run
                raise NothingToAnswer("the question on this channel was answered already, at another gateway")
        answered = self.approvals.answer(key, text)
        if answered is None or answered.result is None:
            reminder = answer_first_text(pending.command)
            await self._ledger(lambda: self.ledger.record_reply(entry, reminder, pending.session_id, {}))
            return Outcome(entry.id, reminder, pending.session_id, {})
        return await self._answered(entry, answered)

    async def _answered(self, entry: InboxEntry, answered: PendingApproval) -> Outcome:
        """The answering message's reply: the run's next (its next question, or its final answer)."""
        assert answered.result is not None
        final: Outcome = await asyncio.shield(answered.result)
        if final.error is None and not final.interrupted:
            await self._ledger(
                lambda: self.ledger.record_reply(entry, final.text, final.session_id, final.usage)
            )
            await self.delivered(final.inbox_id)  # the asking message's reply goes out as this one's
        else:
            await self._ledger(functools.partial(self.ledger.set_status, entry.id, "failed"))
        return dataclasses.replace(final, inbox_id=entry.id)

    def _asker(self, job: Job) -> ChannelAsker:
        """The run's questions to its channel (approvals, clarify), asked from the run's threads."""
        loop = self._loop
        assert loop is not None

        def new(
            kind: Literal["approval", "clarify"], text: str, reason: str, choices: tuple[str, ...]
        ) -> PendingApproval:
            said = job.stream.cut() if job.stream is not None else ""
            pending = PendingApproval(job.entry.id, job.session_id, text, reason, said, kind, choices)
            if self.elsewhere is not None:  # an answer may reach another gateway: it finds the question
                self.elsewhere.record_question(job.entry.channel, pending)
            return pending

        return ChannelAsker(
            self.approval_timeout(job.entry.channel),
            new=new,
            post=lambda pending: loop.call_soon_threadsafe(self._post_question, job, pending),
            expire=lambda pending: loop.call_soon_threadsafe(self._expire_question, job, pending),
        )

    def approval_timeout(self, channel: str) -> float:
        """Seconds a question in `channel` waits: its connector's `approval_timeout`, else half an hour
        for email (a mail is answered in its own time), else `approvals.timeout`."""
        name = channel.split("/", 2)[1] if channel.count("/") >= 2 else ""
        for connector in self.settings.connectors:
            if connector.name == name:
                if connector.approval_timeout is not None:
                    return connector.approval_timeout
                if connector.kind == "email":
                    return EMAIL_APPROVAL_TIMEOUT
        return self.approvals.timeout

    def _post_question(self, job: Job, pending: PendingApproval) -> None:
        """Event loop: the question is the reply to the asking message; the run's answer goes to whoever
        answers the question."""
        asker = job.future
        job.future = self._new_future()
        pending.result = job.future
        self._waiting[job.entry.id] = job.future
        self.approvals.ask(job.entry.channel, pending)
        self._watch_question(job.entry.channel, pending)
        if not asker.done():
            asker.set_result(Outcome(job.entry.id, pending.asking_text(), job.session_id, {}))

    def _watch_question(self, key: str, pending: PendingApproval) -> None:
        """Event loop: with a shared store, hand the run an answer another gateway takes for `pending`."""
        elsewhere = self.elsewhere
        if elsewhere is None or pending.question_id is None:
            return

        async def watch() -> None:
            def asked() -> bool:
                return self.approvals.pending(key) is pending

            row = await elsewhere.answer_taken_elsewhere(key, pending, asked)
            if row is None or pending.answering or not asked():
                return
            answered = self.approvals.answer(key, str(row["answer"]))
            entry = await self._ledger(lambda: self.ledger.entry(int(row["answer_inbox_id"])))
            if answered is None or answered.result is None or entry is None:
                return
            log.info("channel %s: the answer that reached another gateway goes to the run here", key)
            await self._answered(entry, answered)

        task = asyncio.create_task(watch())
        self._watching.add(task)
        task.add_done_callback(self._watched)

    def _watched(self, task: asyncio.Task[None]) -> None:
        self._watching.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("an answer from another gateway was not handed over: %s", task.exception())

    def _expire_question(self, job: Job, pending: PendingApproval) -> None:
        """Event loop: nobody answered in time; once the run ends, the channel's next reply says so."""
        approvals = self.approvals
        approvals.expire(job.entry.channel, pending)
        self._close_question(pending)

        def told(done: asyncio.Future[Outcome]) -> None:
            if not done.cancelled() and done.exception() is None:
                timeout = self.approval_timeout(job.entry.channel)
                approvals.note_timeout(job.entry.channel, pending, done.result().text, timeout)

        job.future.add_done_callback(told)

    def _close_question(self, pending: PendingApproval) -> None:
        """Event loop: nobody may answer `pending` any more, at any gateway; an answer taken meanwhile
        elsewhere fails (its gateway says so) rather than wait for a run that no longer asks."""
        elsewhere, question_id = self.elsewhere, pending.question_id
        if elsewhere is None or question_id is None:
            return

        async def close() -> None:
            if await elsewhere.close_question(question_id):
                return
            row = await elsewhere.question(question_id)
            if row is not None and row["answer_inbox_id"] is not None:
                late = int(row["answer_inbox_id"])
                await self._ledger(functools.partial(self.ledger.set_status, late, "failed"))

        task = asyncio.create_task(close())
        self._watching.add(task)
        task.add_done_callback(self._watched)

    async def delivered(self, inbox_id: int) -> None:
        """The connector has handed the reply over."""
        await self._ledger(lambda: self.ledger.mark_sent(inbox_id))

    async def admit(self, message: Inbound, *, on_tool: ToolProgress | None = None) -> asyncio.Task[Outcome]:
        """Record a chat message in the ledger, then queue it; returns once it is recorded.

        A chat connector advances its platform cursor only after this returns, so a crash loses no
        message; the task is the run's outcome (a repeat of the message id gets the first one's).
        """
        if not self._accepting:
            raise ShuttingDown("the gateway is shutting down")
        key = channel_key(message)
        pending = self.approvals.pending(key) if self.approvals is not None else None
        record = RunRequest(message.text, approval_answer=bool(pending)).as_record()
        await self._ledger(lambda: self.ledger.record_inbound(key, message.message_key, record))
        return asyncio.create_task(self.submit(message, on_tool=on_tool))

    def interrupt(self, channel: str) -> bool:
        """Interrupt the run working on `channel` (in-chat /stop); False when none is."""
        stopped = False
        for agent in list(self._running):
            if agent.session_scope == channel:
                agent.interrupt()
                stopped = True
        return stopped

    def queued(self, channel: str) -> int:
        """How many of the channel's messages wait behind the running one."""
        queue = self._channels.get(channel)
        return len(queue.jobs) if queue is not None else 0

    def waiting_on(self, inbox_id: int) -> asyncio.Future[Outcome] | None:
        """The outcome of a message queued or running in this process (a resumed one, say)."""
        return self._waiting.get(inbox_id)

    def _new_future(self) -> asyncio.Future[Outcome]:
        self._loop = asyncio.get_running_loop()
        future: asyncio.Future[Outcome] = self._loop.create_future()
        # a resumed message may have nobody waiting for it: its failure is logged, not left dangling
        future.add_done_callback(lambda done: done.cancelled() or done.exception())
        return future

    def _enqueue(
        self,
        entry: InboxEntry,
        request: RunRequest,
        instance: AgentInstance,
        on_delta: Delta | None = None,
        on_start: Delta | None = None,
        on_tool: ToolProgress | None = None,
    ) -> asyncio.Future[Outcome]:
        future = self._new_future()
        self._waiting[entry.id] = future
        queue = self._channels.setdefault(entry.channel, _ChannelQueue())
        queue.jobs.append(Job(entry, request, instance, future, on_delta, on_start, on_tool))
        if queue.task is None:
            queue.task = asyncio.create_task(self._drain(entry.channel, queue))
        return future

    async def _drain(self, key: str, queue: _ChannelQueue) -> None:
        """Run a channel's messages one at a time, in arrival order."""
        while queue.jobs:
            job = queue.jobs.popleft()
            try:
                if not self._accepting:
                    raise ShuttingDown("the gateway is shutting down")
                async with self._limit:
                    if not self._accepting:
                        raise ShuttingDown("the gateway is shutting down")
                    # a question of the previous run timed out: say so
                    job.preface = self.approvals.take_notice(key) or ""
                    outcome = await self._run_leased(key, job)
                _resolve(job, outcome)
            except Exception as exc:  # the job's failure belongs to whoever waits for it
                if not isinstance(exc, ShuttingDown):  # else left pending: the next start runs it
                    exc = await self._failed(job, exc)
                if not job.future.done():  # a compression after delivery fails after the answer went out
                    job.future.set_exception(exc)
            finally:
                self._waiting.pop(job.entry.id, None)
        queue.task = None
        if self._channels.get(key) is queue:
            del self._channels[key]

    async def _run_leased(self, key: str, job: Job) -> Outcome:
        """Run the job in a worker thread; with a shared store, holding the channel's lease throughout,
        after the message a lost holder left running there."""
        loop = asyncio.get_running_loop()
        if self.leases is None:
            return await loop.run_in_executor(self._pool, self._run_job, job)
        leases = self.leases
        epoch = await leases.claim(key)
        holding = asyncio.create_task(leases.hold(key, epoch, lambda: self.interrupt(key)))
        try:
            # read again under the lease: another gateway may have answered it meanwhile (a message
            # resumed by two gateways starting, or one taken over)
            fresh = await self._ledger(lambda: self.ledger.entry(job.entry.id))
            if fresh is not None and fresh.status in ("answered", "failed"):
                reply = await self._ledger(lambda: self.ledger.reply_for(fresh.id))
                if reply is None:
                    raise RunFailed("this message failed on another gateway")
                return Outcome(fresh.id, reply.text, reply.session_id, reply.usage)
            job.entry = fresh or job.entry
            for inbox_id in await leases.left_running(key):
                if inbox_id != job.entry.id and inbox_id not in self._waiting:
                    await self._finish_left(key, epoch, inbox_id)
            return await loop.run_in_executor(self._pool, self._run_fenced, job, key, epoch)
        finally:
            holding.cancel()
            await leases.release(key, epoch)

    async def _finish_left(self, key: str, epoch: int, inbox_id: int) -> None:
        """Run, once, the message another gateway was running on the channel when it lost it."""
        entry = await self._ledger(lambda: self.ledger.entry(inbox_id))
        if entry is None:
            return
        instance = self.agents.get(entry.channel.split("/", 1)[0])
        if await self._refused_again(entry, instance):
            return
        assert instance is not None
        log.info("taking over message %s on %s from a gateway that lost the channel", entry.id, key)
        job = Job(entry, RunRequest.from_record(entry.request), instance, self._new_future())
        try:
            outcome = await asyncio.get_running_loop().run_in_executor(
                self._pool, self._run_fenced, job, key, epoch
            )
            _resolve(job, outcome)
        except Exception as exc:
            await self._failed(job, exc)

    def _run_fenced(self, job: Job, key: str, epoch: int) -> Outcome:
        """Worker thread: `_run_job` with every write checked against this gateway's lease."""
        assert self.leases is not None
        with self.store.fenced(key, self.leases.owner, epoch):
            return self._run_job(job)

    async def _failed(self, job: Job, exc: Exception) -> Exception:
        """A run that raised: logged once, here, and marked failed, so no restart runs it again (a
        message that fails every time would otherwise fail at every start). Returns what its waiter gets."""
        entry = job.entry
        if isinstance(exc, LeaseLost):  # the message is the new holder's now: its state is not ours
            log.warning("message %s on %s: %s", entry.id, entry.channel, exc)
            return exc
        if isinstance(exc, MibyanError):
            log.warning("message %s on %s failed: %s", entry.id, entry.channel, exc)
        else:
            log.exception("message %s on %s failed", entry.id, entry.channel)
            exc = RunFailed("the gateway failed on this request (its log has the cause)")
        if not job.future.done():  # not after an answer that went out, then a compression that failed
            await self._ledger(functools.partial(self.ledger.set_status, entry.id, "failed"))
        return exc

    def _run_job(self, job: Job) -> Outcome:
        """Worker thread: build the channel's AIAgent, run the turn, record the reply."""
        entry, instance = job.entry, job.agent
        prepare_workspace(instance.workspace)
        stream = job.stream = AnswerStream(job.on_delta, job.preface)
        one_off = job.request.one_off
        if one_off:  # a keyed one-off cut off mid-turn goes on in the session it began
            session_id = entry.session_id if entry.status in ("running", "failed") else None
        else:
            session_id = entry.session_id or self.ledger.channel_session(entry.channel)
        callbacks = stream.callbacks()
        if job.on_tool is not None:
            callbacks["tool_progress_callback"] = job.on_tool
        # asking needs a channel to answer in: a one-off conversation can never send its /approve
        if not one_off:
            asker = self._asker(job)
            callbacks["clarify_callback"] = asker.clarify
            if self._asking:
                callbacks["approval_callback"] = Approver(asker.approve)
        unasked = NO_CHANNEL_TO_ASK if self._asking else DENIED_BY_POLICY
        # held before the session is opened, so its repair never touches a run of another process
        lock = None if session_id is None else SessionLock.for_session(self.home, self.store, session_id)
        agent = build_holding(  # its close() lets the session go
            self.home,
            lock,
            lambda: instance.build(
                session_id=session_id, unasked=unasked, channel=entry.channel, one_off=one_off, **callbacks
            ),
        )
        self._running.add(agent)
        try:
            if not one_off:
                self._open_channel_session(agent, entry, session_id, instance)
            stored = agent.session.history.messages  # only read here: not worth a copy of the session
            cut = cut_turn_start(entry, agent.session_id, stored)
            started = len(stored) if cut is None else cut
            self.ledger.mark_running(entry.id, agent.session_id, started)
            job.session_id = agent.session_id
            if job.on_start is not None:
                job.on_start(agent.session_id)
            if cut is not None:  # what the cut turn stored stays; nothing it ran runs again
                result = agent.continue_turn()
            else:
                history = list(job.request.history) if one_off and job.request.history is not None else None
                result = agent.run_conversation(job.request.text, conversation_history=history)
            outcome = self._settle(job, result, stream)
            if outcome.error is None and not outcome.interrupted:
                self._compress_after_delivery(job, agent, outcome)
            return outcome
        finally:
            self._running.discard(agent)
            agent.close()

    def _compress_after_delivery(self, job: Job, agent: AIAgent, outcome: Outcome) -> None:
        """Hand the answer over, then compress the session if it is past the gateway threshold.

        The channel's next message still waits: it must see the compressed session.
        """
        loop = self._loop
        assert loop is not None
        loop.call_soon_threadsafe(_resolve, job, outcome)
        if not self._accepting:
            return  # stopping: a compression call would outlast shutdown_grace; the next start compresses
        try:
            compressed = agent.compress_if_needed()
        except MibyanError as exc:  # the answer is out and the history intact: the next turn tries again
            log.warning("compressing %s after delivery failed: %s", job.entry.channel, exc)
            return
        if compressed and not job.request.one_off:
            self.ledger.tag_session(agent.session_id, job.entry.channel)

    def _settle(self, job: Job, result: ConversationResult, stream: AnswerStream) -> Outcome:
        """Record what the run came to: the reply (before it is sent), or the failure."""
        entry = job.entry
        one_off = job.request.one_off
        session = result["session_id"]
        if not one_off and session != job.session_id:  # compressed during the turn: a child to tag
            self.ledger.tag_session(session, entry.channel)
        if result["interrupted"]:
            return Outcome(entry.id, "", session, result["usage"], interrupted=True)
        if result["exit_reason"] == "error":
            log.warning("message %s on %s failed: %s", entry.id, entry.channel, result["error"])
            self.ledger.set_status(entry.id, "failed")
            return Outcome(entry.id, "", session, result["usage"], error=mask_secrets(result["error"] or ""))
        final = stream.reply(result["final_response"] or "")
        reply = self.ledger.record_reply(entry, final, session, result["usage"])
        return Outcome(entry.id, reply.text, session, reply.usage)

    def _open_channel_session(
        self, agent: AIAgent, entry: InboxEntry, session_id: str | None, instance: AgentInstance
    ) -> None:
        """A new channel gets its session row (source gateway, the channel's key)."""
        if session_id is None or self.store.sessions.get(agent.session_id) is None:
            runtime = agent.runtime
            self.store.sessions.create(
                agent.session_id,
                source="gateway",
                channel=entry.channel,
                title=entry.channel,
                model=runtime.model,
                provider=runtime.provider,
                api_mode=runtime.api_mode,
                cwd=str(instance.workdir),
            )
            agent.reload_prompt()

    def warm(self) -> Awaitable[object]:
        """Each agent's runs prepared (AgentInstance.warm), on the threads its runs and the ledger use,
        which so are there for the first message."""
        loop = asyncio.get_running_loop()
        warming = [loop.run_in_executor(self._pool, instance.warm) for instance in self.agents.values()]
        return asyncio.gather(*warming, loop.run_in_executor(self._io, lambda: None))

    async def drain(self) -> None:
        """Take no new work; let running turns finish within shutdown_grace, then interrupt them."""
        self._accepting = False
        for pending in self.approvals.pending_questions():
            self._close_question(pending)
        self.approvals.deny_all()  # a run waiting for an answer would hold the stop up
        running = [f for f in self._waiting.values() if not f.done()]
        if running:
            _, late = await asyncio.wait(running, timeout=self.settings.gateway.shutdown_grace)
            if late:
                for agent in list(self._running):
                    agent.interrupt()
                await asyncio.wait(late, timeout=_INTERRUPTED_WITHIN)
        for agent in list(self._running):  # answered, but still compressing after delivery
            agent.interrupt()
        if self._watching:  # a closed question wakes its watcher at once; a handed-over answer's is quick
            await asyncio.wait(list(self._watching), timeout=_INTERRUPTED_WITHIN)
        for task in list(self._watching):
            task.cancel()

    def close(self) -> None:
        """Release the worker threads, the agents' MCP servers and the store (after `drain` and the
        connectors' stop)."""
        self._pool.shutdown(wait=True)
        self._io.shutdown(wait=True)
        for instance in self.agents.values():
            instance.close()
        if self.leases is not None:
            self.leases.close()
        self.store.close()


def _resolve(job: Job, outcome: Outcome) -> None:
    """Event loop: give whoever waits for the job its outcome (once: it may have had it already)."""
    if not job.future.done():
        job.future.set_result(outcome)
