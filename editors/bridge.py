"""One editor session's view of its agent: the agent's callbacks turned into ACP updates and requests.

The callbacks run on the agent's threads (the model call's, each tool's, the approval question's); they
post to the connection's `Outbox`, which sends in order. Tool calls are tracked from the moment the
model names one (`tool_gen_callback`: "pending") through its start ("in_progress") to its end
("completed" or "failed"). A streamed call is only named at first, so its start claims the oldest
announcement of the same name; a call that was announced but never ran (the turn was cancelled, the
reply was cut short) is closed as failed, so no card is left spinning in the editor.

Approvals become `session/request_permission` about the call that asked (the tool's context names it);
a cancelled turn withdraws its open questions, which counts as a refusal.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from acp.schema import AllowedOutcome, PermissionOption, ToolCallUpdate

from mibyan.core.sanitize import visible
from mibyan.editors import updates
from mibyan.tools import context
from mibyan.tools.approval import Answer, ApprovalRequest, Approver

if TYPE_CHECKING:
    from mibyan.editors.outbox import Outbox
    from mibyan.editors.updates import ToolContent, Update

log = logging.getLogger("mibyan.editors")
#: The status changes an editor shows: no confinement for commands, a switch to a fallback provider,
#: an answer streamed again from its start (what was shown cannot be taken back), an MCP server left out.
_SHOWN_STATUS = ("sandbox", "failover", "stream_restart", "mcp")

#: The answers an editor offers for an approval, as mibyan's approval policy names them.
PERMISSION_OPTIONS = (
    PermissionOption(option_id="once", name="Allow once", kind="allow_once"),
    PermissionOption(option_id="always", name="Always allow this kind", kind="allow_always"),
    PermissionOption(option_id="deny", name="Reject", kind="reject_once"),
)


@dataclass
class _Call:
    acp_id: str
    name: str
    args: dict[str, Any] = field(default_factory=dict)
    diff: list[ToolContent] = field(default_factory=list)


class TurnBridge:
    """The callbacks of one session's agent, and the tool calls of the turn running now."""

    def __init__(
        self, session_id: str, outbox: Outbox, cwd: Path, todos: Callable[[], list[dict[str, Any]]]
    ) -> None:
        self.session_id = session_id
        self.cwd = cwd
        self._outbox = outbox
        self._todos = todos
        self._lock = threading.Lock()
        self._active = False
        self._announced: list[_Call] = []  # named by the model in this round, in order
        self._calls: dict[str, _Call] = {}  # started, by the model's call id
        self._open: dict[str, _Call] = {}  # announced or started, not finished, by ACP id
        self._questions: set[Future[Any]] = set()
        self.notices: list[str] = []  # for the user, shown when the next turn begins
        # seconds a question stays open (`approvals.timeout`): then it is withdrawn, and the answer is no
        self.question_timeout: float | None = None

    # -- the turn ------------------------------------------------------------------------------------

    def begin(self) -> None:
        with self._lock:
            self._active = True
            self._announced.clear()
            self._calls.clear()
            self._open.clear()

    def end(self, *, cancelled: bool) -> None:
        """The turn is over: withdraw its questions, close its unfinished calls, ignore what comes late."""
        self.withdraw_questions()
        with self._lock:
            self._active = False
            left = list(self._open.values())
            self._open.clear()
        why = "cancelled" if cancelled else "not run"
        for call in left:
            self._outbox.post(self.session_id, updates.call_abandoned(call.acp_id, why))

    def withdraw_questions(self) -> None:
        with self._lock:
            questions = list(self._questions)
        for question in questions:
            question.cancel()

    def _post(self, update: Update) -> None:
        if self._active:
            self._outbox.post(self.session_id, update)

    # -- the agent's callbacks -------------------------------------------------------------------------

    def callbacks(self) -> dict[str, Any]:
        return {
            "stream_delta_callback": self.on_text,
            "reasoning_callback": self.on_reasoning,
            "tool_gen_callback": self.on_tool_named,
            "tool_progress_callback": self.on_tool_progress,
            "step_callback": self.on_step,
            "status_callback": self.on_status,
            "approval_callback": Approver(self.ask_permission),
        }

    def on_text(self, text: str) -> None:
        self._post(updates.agent_text(text))

    def on_reasoning(self, text: str) -> None:
        self._post(updates.agent_thought(text))

    def on_status(self, kind: str, message: str) -> None:
        """State changes go to the log; the few the user must know of are shown as the agent's thought."""
        log.info("session %s: %s: %s", self.session_id, kind, visible(message))
        if kind in _SHOWN_STATUS:
            with self._lock:
                self.notices.append(message)
            self.flush_notices()

    def flush_notices(self) -> None:
        """Show the notices kept while no turn ran (a sandbox warning comes as the agent is built)."""
        with self._lock:
            if not self._active:
                return
            shown, self.notices = self.notices, []
        for notice in shown:
            self._post(updates.agent_thought(f"mibyan: {notice}\n"))

    def on_tool_named(self, name: str) -> None:
        with self._lock:
            if not self._active:
                return
            call = _Call(acp_id=f"call-{secrets.token_hex(6)}", name=name)
            self._announced.append(call)
            self._open[call.acp_id] = call
        self._post(updates.call_start(call.acp_id, name, None, self.cwd))

    def on_tool_progress(self, phase: str, name: str, detail: dict[str, Any]) -> None:
        call_id = str(detail.get("call_id") or "")
        if phase == "start":
            index = detail.get("index")
            self._tool_started(
                name, call_id, detail.get("arguments"), index if isinstance(index, int) else -1
            )
        elif phase == "end":
            self._tool_ended(name, call_id, detail)

    def _tool_started(self, name: str, call_id: str, raw_args: Any, index: int) -> None:
        args = updates.arguments_of(raw_args)
        diff = updates.edit_content(name, args, self.cwd)  # before the write: the file as it is now
        with self._lock:
            if not self._active:
                return
            # the reply's calls were named in their order; calls run concurrently, so match by place
            named = self._announced[index] if 0 <= index < len(self._announced) else None
            announced = named is not None and named.name == name and named.acp_id in self._open
            call = named if announced and named is not None else _Call(f"call-{secrets.token_hex(6)}", name)
            call.args, call.diff = args, diff
            self._calls[call_id] = call
            self._open[call.acp_id] = call
        if announced:
            self._post(updates.call_running(call.acp_id, name, args, self.cwd, diff))
        else:
            self._post(updates.call_start(call.acp_id, name, raw_args, self.cwd, status="in_progress"))

    def _tool_ended(self, name: str, call_id: str, detail: dict[str, Any]) -> None:
        with self._lock:
            call = self._calls.get(call_id) if self._active else None
            if call is None or self._open.pop(call.acp_id, None) is None:
                return  # a call of a turn that is over
        result = str(detail.get("result") or detail.get("preview") or "")
        ok = bool(detail.get("ok")) and not detail.get("interrupted")  # a stopped command did not finish
        self._post(updates.call_finished(call.acp_id, ok=ok, result=result, diff=call.diff))
        if name == "todo":
            self._post(updates.plan_update(self._todos()))

    def on_step(self, info: dict[str, Any]) -> None:
        """After a round of tools: calls named in it that never started did not run."""
        with self._lock:
            started = {call.acp_id for call in self._calls.values()}
            left = [call for call in self._announced if call.acp_id not in started]
            self._announced = []
            for call in left:
                self._open.pop(call.acp_id, None)
        for call in left:
            self._post(updates.call_abandoned(call.acp_id, "not run"))

    # -- approvals -------------------------------------------------------------------------------------

    def ask_permission(self, request: ApprovalRequest) -> Answer:
        """The approval callback: ask the editor; "once", "always" or "deny" (also when withdrawn)."""
        if context.stop_requested():  # the turn is being cancelled: nobody is asked any more
            return "deny"
        command, reason = request.subject, request.reason
        with self._lock:
            call = self._calls.get(request.call_id)
        acp_id = call.acp_id if call is not None else f"call-{secrets.token_hex(6)}"
        because = " ".join(reason.split()).rstrip(". ")
        shown = [*(call.diff if call is not None else []), updates.text_content(f"This {because}.")]
        asked = ToolCallUpdate(
            tool_call_id=acp_id,
            title=updates.tool_title(call.name, call.args) if call is not None else updates.one_line(command),
            kind=updates.tool_kind(call.name) if call is not None else "other",
            status="pending",
            content=shown,
            raw_input={"command": command, "reason": reason},
        )
        client = self._outbox.client
        question = self._outbox.call(
            lambda: client.request_permission(
                session_id=self.session_id, tool_call=asked, options=list(PERMISSION_OPTIONS)
            )
        )
        with self._lock:
            self._questions.add(question)
            # a cancel that came since the check above withdrew the questions it saw, not this one
            if not self._active or context.stop_requested():
                question.cancel()
        try:
            answer = question.result(timeout=self.question_timeout)
        except (CancelledError, Exception):  # withdrawn, unanswered in time, or failed: not approved
            question.cancel()
            log.info("the permission question was withdrawn or failed", exc_info=True)
            return "deny"
        finally:
            with self._lock:
                self._questions.discard(question)
        outcome = answer.outcome
        if isinstance(outcome, AllowedOutcome) and outcome.option_id == "always":
            return "always"
        return "once" if isinstance(outcome, AllowedOutcome) and outcome.option_id == "once" else "deny"
