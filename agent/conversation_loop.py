"""The body of run_conversation(): it sequences the turn phases and matches on what each returns."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import assert_never

from mibyan.agent.adapters.base import NormalizedResponse
from mibyan.agent.budget import IterationBudget
from mibyan.agent.messages import (
    InvalidMessage,
    Message,
    assistant_message,
    check_messages,
    user_message,
)
from mibyan.agent.protocol import AgentBase, AgentCore
from mibyan.agent.turn_api_error import failover_cause
from mibyan.agent.turn_state import (
    BudgetExhausted,
    Continue,
    ConversationResult,
    Failed,
    Final,
    Interrupted,
    NextStep,
    PreparedRequest,
    TurnState,
)
from mibyan.core.errors import AgentBusyError

_SUMMARY_REQUEST = (
    "[You have used all {limit} model calls this task may make, so no more tools can run. "
    "Summarize for the user what you did, what you found, and what is left to do.]"
)


class ConversationLoopMixin(AgentBase):
    """run_conversation(): begin the turn, loop over iterations, end the turn with a result."""

    def interrupt(self) -> None:
        """Stop the running turn (and any subagents it started) as soon as possible. Safe from any thread."""
        self._signal.set()
        with self._children_lock:
            children = list(self._children)
        for child in children:
            child.interrupt()

    def adopt_child(self, child: AgentCore) -> None:
        """Register a subagent, so that interrupting this agent interrupts it too."""
        with self._children_lock:
            self._children.add(child)
        if self._signal.is_set():
            child.interrupt()

    def release_child(self, child: AgentCore) -> None:
        with self._children_lock:
            self._children.discard(child)

    def run_conversation(
        self,
        user_message: str,
        system_message: str | None = None,
        conversation_history: list[Message] | None = None,
        task_id: str | None = None,
    ) -> ConversationResult:
        """Run one user turn to its end: tool rounds until an answer, the budget, an interrupt or an error.

        Args:
            user_message: what the user says.
            system_message: a system prompt to use instead of the built one (kept for the session).
            conversation_history: a history to continue; it becomes this session's stored history. An
                entry that is not a message (unknown role, content that is not text, tool_calls that
                are not a list of calls, no tool_call_id on a tool result) raises InvalidMessage, a
                ValueError naming the entry and field (`conversation_history[0].tool_calls: ...`).
            task_id: an id for this task's tools to share state by; generated when omitted.

        Returns:
            final_response, messages, session_id, task_id, api_calls, completed, interrupted,
            exit_reason ("completed" | "budget_exhausted" | "interrupted" | "error"), usage, error.

        Raises:
            AgentBusyError: this agent is running a conversation on another thread already, or is closed.
        """
        with self._one_run_at_a_time():
            turn = self._begin_turn(user_message, system_message, conversation_history, task_id)
            step = self._loop(turn)
            return self._end_turn(turn, step)

    def continue_turn(self, task_id: str | None = None) -> ConversationResult:
        """Run the session's last turn on from its stored history, without a new user message.

        For a turn cut off by a crash or a stop: the calls and results it stored stay as they are (a call
        that was running has been answered "interrupted: no result" by the repair on open, and is never
        run again), and the model is asked to go on from there. A turn whose answer is already stored
        ends with that answer, without a model call. The model calls the cut turn made count against
        this one's budget.

        Returns:
            What run_conversation returns.

        Raises:
            AgentBusyError: as run_conversation.
            InvalidMessage: the session has no user message to go on from.
        """
        with self._one_run_at_a_time():
            turn = self._resume_turn(task_id)
            messages = turn.history.messages
            last = messages[-1]
            if last.get("role") == "assistant" and not last.get("tool_calls"):
                step: NextStep = Final(str(last.get("content") or ""))
            else:
                step = self._loop(turn)
            return self._end_turn(turn, step)

    def _resume_turn(self, task_id: str | None) -> TurnState:
        self._signal.clear()
        self._restore_primary()
        history = self.session.history
        for note in history.close_open_calls():
            self.callbacks.emit("status_callback", "repaired", note)
        messages = history.messages
        start = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "user"), None)
        if start is None:
            raise InvalidMessage("the session has no turn to continue: it holds no user message")
        said = messages[start].get("content")
        budget = IterationBudget(self.settings.agent.max_turns)
        for _ in range(sum(m.get("role") == "assistant" for m in messages[start:])):
            if budget.remaining > 1:  # the cut turn's calls count; one is always left to answer with
                budget.consume()
        return TurnState(
            task_id=task_id or f"task_{uuid.uuid4().hex[:12]}",
            session=self.session,
            system_prompt=self._session_system_prompt(),
            message_layers=self._message_layers(said if isinstance(said, str) else ""),
            budget=budget,
        )

    @contextmanager
    def _one_run_at_a_time(self) -> Iterator[None]:
        if self._closed:
            raise AgentBusyError("this agent is closed; create a new AIAgent")
        if not self._running.acquire(blocking=False):
            raise AgentBusyError(
                "this agent is already running a conversation on another thread; "
                "wait for it to finish, or use one AIAgent per conversation"
            )
        try:
            yield
        finally:
            self._running.release()

    def _adopt_history(self, messages: list[Message]) -> None:
        """Make `messages` this session's history (stored as such).

        A leading system message is the session's prompt; a system message later in the history (legal
        in Chat Completions) is system context too: its text is added to the prompt, in order, rather
        than dropped or turned into a turn nobody said.
        """
        check_messages(messages)
        messages = list(messages)
        if messages and messages[0].get("role") == "system":
            self.prompt.text = _system_text(messages[0])
            self.prompt.custom = True
            messages = messages[1:]
        later = [_system_text(m) for m in messages if m.get("role") == "system"]
        if later:
            self.prompt.text = "\n\n".join([self._session_system_prompt(), *later])
            self.prompt.custom = True
            messages = [m for m in messages if m.get("role") != "system"]
        self.session.adopt(messages)

    def _begin_turn(
        self,
        user_message: str,
        system_message: str | None,
        conversation_history: list[Message] | None,
        task_id: str | None,
    ) -> TurnState:
        self._signal.clear()
        self._restore_primary()
        if conversation_history is not None:
            self._adopt_history(conversation_history)
        if system_message is not None:
            self.prompt.text = system_message
            self.prompt.custom = True
        for note in self.session.history.start_turn(user_message):
            self.callbacks.emit("status_callback", "repaired", note)
        return TurnState(
            task_id=task_id or f"task_{uuid.uuid4().hex[:12]}",
            session=self.session,
            system_prompt=self._session_system_prompt(),
            message_layers=self._message_layers(user_message),
            budget=IterationBudget(self.settings.agent.max_turns),
        )

    def _loop(self, turn: TurnState) -> NextStep:
        while True:
            step = self._run_iteration(turn)
            match step:
                case Continue():
                    continue
                case BudgetExhausted():
                    turn.exit_reason = "budget_exhausted"
                    return self._summarize_spent_budget(turn)
                case Final() | Interrupted() | Failed():
                    return step
                case _:
                    assert_never(step)

    def _run_iteration(self, turn: TurnState) -> NextStep:
        prepared = self._prepare_iteration(turn)
        if not isinstance(prepared, PreparedRequest):
            return prepared
        reply = self._call_with_retries(turn, prepared)
        if not isinstance(reply, NormalizedResponse):
            return reply
        checked = self._handle_truncation(turn, reply, prepared)
        if not isinstance(checked, NormalizedResponse):
            return checked
        usable = self._check_empty_reply(turn, checked)
        stalled = failover_cause(usable)
        if stalled is not None and self._fail_over(stalled):
            turn.empty_replies = 0
            if turn.budget.remaining == 0:
                turn.budget.grant_grace_call()
            return Continue()
        if not isinstance(usable, NormalizedResponse):
            return usable
        reply = usable
        turn.history.append(reply.as_message())
        step: NextStep = (
            self._execute_tool_calls(turn, reply.tool_calls)
            if reply.tool_calls
            else Final(reply.content or "")
        )
        self.callbacks.emit(
            "step_callback",
            {
                "api_calls": turn.api_calls,
                "finish_reason": reply.finish_reason,
                "tools": [call["function"]["name"] for call in reply.tool_calls],
            },
        )
        return step

    def _summarize_spent_budget(self, turn: TurnState) -> NextStep:
        """One last call without tools, asking the model to sum up; its tool calls (if any) are not run."""
        if self._signal.is_set():
            return Interrupted()
        note = _SUMMARY_REQUEST.format(limit=turn.budget.limit)
        reply = self._call_without_tools(turn, (user_message(note),), ())
        if not isinstance(reply, NormalizedResponse):
            return reply
        text = reply.content or f"Stopped after {turn.budget.limit} model calls without a final answer."
        turn.history.append(assistant_message(text, reasoning=reply.reasoning))
        return Final(text)

    def _end_turn(self, turn: TurnState, step: NextStep) -> ConversationResult:
        match step:
            case Final(text):
                turn.final_response = text
            case Interrupted():
                turn.exit_reason = "interrupted"
                self.callbacks.emit("status_callback", "interrupted", "the turn was interrupted")
            case Failed(error):
                turn.exit_reason = "error"
                turn.error = str(error)
            case Continue() | BudgetExhausted():
                raise AssertionError(f"the loop ended on {step!r}")
            case _:
                assert_never(step)
        if turn.api_calls:
            self.session.store.sessions.add_usage(
                self.session.session_id, turn.usage.input_tokens, turn.usage.output_tokens
            )
        if isinstance(step, Final) and self.compress_between_turns:
            # Between turns: a long session is compressed before it gets near the window.
            self._compress_if_needed(turn, self.settings.compression.gateway_threshold, "between turns")
        return {
            "final_response": turn.final_response,
            "messages": list(turn.history.messages),
            "session_id": self.session.session_id,
            "task_id": turn.task_id,
            "api_calls": turn.api_calls,
            "completed": turn.exit_reason == "completed",
            "interrupted": turn.exit_reason == "interrupted",
            "exit_reason": turn.exit_reason,
            "usage": turn.usage.as_dict(),
            "error": turn.error,
        }


def _system_text(message: Message) -> str:
    """A system message's text: its string, or the text of its content parts."""
    content = message.get("content")
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") for p in content if p.get("type") == "text")
    return str(content or "")
