"""Which shell commands need the user's approval, and which never run at all.

`classify_command` judges a command line by reading it with bash's own grammar (tree-sitter-bash): every
command it would run is found and judged, wherever it sits and however it is spelled (tools/command_judge.py
explains how). Three tiers: "hardline" commands never run, even with --yolo (deleting the root or a home,
formatting disks, fork bombs, changing mibyan's own files); "dangerous" ones run only when approved; the
rest are "safe". A command the judge cannot read whole is dangerous, never safe.

`ApprovalPolicy` turns a verdict into a decision: --yolo, an earlier answer of the same kind, or the user.
Each verdict has a key naming its kind ("rm_recursive"); a command of several kinds has them all,
joined ("git_force_push+rm_recursive"), and is approved only when each of its kinds is. Whoever is asked
(the terminal, a gateway channel, an editor, a parent's session answers) is handed one `ApprovalRequest`:
the call, its tool, what it would do and the verdict, each a field, so nobody reads them back from text.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from mibyan.tools.judge_policy import JudgePolicy
from mibyan.tools.verdict import SAFE as SAFE  # what callers import from here
from mibyan.tools.verdict import Tier as Tier
from mibyan.tools.verdict import Verdict as Verdict

if TYPE_CHECKING:
    from mibyan.core.interruptible import InterruptSignal

_UNJUDGED = Verdict("hardline", "could not be judged by mibyan (see the log)", "unjudged")
log = logging.getLogger("mibyan.approval")
OUTSIDE_SANDBOX_REASON = "runs outside the sandbox"


@dataclass(frozen=True)
class ApprovalRequest:
    """One question: may this tool call run? Handed whole to whoever answers it.

    Attributes:
        call_id: the model's id of the call.
        tool: the tool's name (`terminal`, `read_file`, `mcp__<server>__<tool>`).
        subject: what the question shows: the command line, the file and what a write writes, or the MCP
            server, tool and arguments.
        verdict: why it asks (`verdict.reason`, a clause that reads after "This command ") and the kind
            of approval a "session" or "always" answer grants (`verdict.key`).
    """

    call_id: str
    tool: str
    subject: str
    verdict: Verdict

    @property
    def reason(self) -> str:
        return self.verdict.reason

    @property
    def what(self) -> str:
        """What was not run, for a refusal: a file tool's call is not a command."""
        return "the command" if self.tool == "terminal" else f"the {self.tool} call"


#: The end of the key of an editor's MCP server's tool: approved for a session at most, never saved, so
#: that a later server taking the same name (another editor's, another project's) inherits nothing.
EDITOR_KEY = "@editor"


def mcp_verdict(server: str, name: str, *, editor: bool = False) -> Verdict:
    """The verdict of a call of the MCP tool `name` (mibyan's name for it) of `server`: ask, keyed by
    the tool, so that a "session" answer covers that tool of that server. `editor`: the server is one
    an editor handed over (`mibyan acp`)."""
    if editor:
        reason = f"runs {name}, a tool of the editor's MCP server {server!r}"
        return Verdict("dangerous", reason, name + EDITOR_KEY)
    return Verdict("dangerous", f"runs {name}, a tool of the MCP server {server!r}", name)


def mcp_subject(server: str, name: str, arguments: str) -> str:
    """What the approval question shows of an MCP call: the server, the tool and the arguments."""
    return f"MCP server {server} › {name}\n{arguments}"


def outside_sandbox(verdict: Verdict) -> Verdict:
    """The verdict of a command that asks to run outside the sandbox: asked every time, own key."""
    also = f", and {verdict.reason}" if verdict.reason else ""
    return Verdict("dangerous", OUTSIDE_SANDBOX_REASON + also, "outside_sandbox", ask_every_time=True)


def classify_command(
    command: str, *, cwd: str | Path | None = None, policy: JudgePolicy | None = None
) -> Verdict:
    """Judge a shell command: "safe", "dangerous" (ask first) or "hardline" (never run).

    Args:
        command: the command line, as bash will receive it.
        cwd: the directory it runs in (the process's own when omitted).
        policy: what it is judged for (a run's `RunContext.judge_policy()`); without one, for the user
            at their terminal, with the home of `mibyan_home()`.
    """
    from mibyan.tools.command_judge import judge

    try:
        where = Path(cwd).expanduser() if cwd else Path.cwd()
    except FileNotFoundError:  # the process's working directory was deleted
        where = Path("/")
    try:
        if policy is None:
            from mibyan.config.paths import mibyan_home

            policy = JudgePolicy(home=mibyan_home())
        return judge(command, policy, cwd=where.absolute())
    except Exception:  # a security boundary: a command the judge fails on must not run
        log.exception("the command judge failed on a command; it is refused")
        return _UNJUDGED


#: The kinds of verdict that say the judge could not read what the command does: a syntax it does not
#: know, a name, path or script only known when it runs, a script it cannot read or that is piped in.
UNREAD_KINDS = frozenset(
    ["unreadable", "unreadable_script", "dynamic_command", "dynamic_write", "dynamic_path", "pipe_to_shell"]
)
#: What the start line says when --yolo runs without a sandbox.
YOLO_UNCONFINED = "--yolo without a sandbox: commands mibyan cannot read still ask"


def unread(verdict: Verdict) -> bool:
    """Whether the verdict asks (also) because the judge could not read what the command does."""
    return any(part in UNREAD_KINDS for part in verdict.key.split("+"))


def covered(key: str, approved: Iterable[str]) -> bool:
    """Whether earlier answers approve a verdict of kind `key`: the same kind, or each of its parts."""
    granted = set(approved)
    return bool(key) and (key in granted or all(part in granted for part in key.split("+")))


Answer = Literal["once", "session", "always", "deny"]


@dataclass(frozen=True)
class Approver:
    """An `approval_callback` that is handed the whole ApprovalRequest (mibyan's own transports are).

    A plain callable is called `(subject, reason)`, the form documented for Python callers.
    """

    answer: Callable[[ApprovalRequest], Answer]


#: What `approval_callback` may be: an Approver, or a callable `(subject, reason) -> answer`.
ApprovalCallback = Approver | Callable[[str, str], Any]


def _asker(callback: ApprovalCallback | None) -> Callable[[ApprovalRequest], Any] | None:
    """The policy's question from an `approval_callback`, in whichever of its two forms it comes."""
    if callback is None or isinstance(callback, Approver):
        return None if callback is None else callback.answer
    plain = callback
    return lambda request: plain(request.subject, request.reason)


class ApprovalPolicy:
    """Decides whether a dangerous command may run: --yolo, earlier answers, or asking the user.

    "session" answers last for this agent; "always" answers are saved in the user's config.yaml under
    `approvals.always`, except for the tools of an editor's MCP server (for the session only). Without a
    callback (and without --yolo) the answer is deny, and the result says why nobody was asked:
    `unasked` (the gateway sets its own). A user who does not answer within `timeout` seconds has denied.
    """

    #: Why nobody could be asked, for the refusal's result (the gateway's differs from the terminal's).
    unasked = "nobody could be asked to approve it (no terminal; use --yolo or run interactively)"
    #: Whether a subagent's questions go to whoever this policy asks (a gateway's channel, which takes
    #: them one at a time), rather than being answered from this session's earlier answers.
    subagents_ask = False
    #: Whether a sandbox confines the commands: without one, --yolo does not cover what the judge could
    #: not read (those commands still ask, or are refused with nobody to ask).
    confined = True

    def __init__(
        self,
        *,
        ask: ApprovalCallback | None,
        yolo: bool,
        always: list[str],
        timeout: float,
        save_always: Callable[[str], None],
    ) -> None:
        self._ask = _asker(ask)
        self.yolo = yolo
        self._approved = {key for key in always if not key.endswith(EDITOR_KEY)}
        self._timeout = timeout
        self._save_always = save_always
        self._lock = threading.Lock()

    def decide(self, request: ApprovalRequest, *, signal: InterruptSignal | None = None) -> tuple[bool, str]:
        """(allowed, why) for the call `request` asks about. Hardline commands are never allowed.
        `signal` is the call's stop signal: set, a denial is a question withdrawn rather than answered."""
        verdict, what = request.verdict, request.what
        if verdict.tier == "hardline":
            return False, f"blocked: {verdict.reason}; mibyan never runs this"
        if verdict.tier == "safe":
            return True, ""
        if verdict.ask_every_time and self._ask is None:
            return False, f"not run: it {verdict.reason}; the user must say yes each time, even with --yolo"
        if self.yolo and not verdict.ask_every_time and (self.confined or not unread(verdict)):
            return True, "approved by --yolo"
        with self._lock:  # one question at a time, and a second call of the same kind sees the answer
            if covered(verdict.key, self._approved) and not verdict.ask_every_time:
                return True, "approved earlier"
            if self._ask is None:
                return False, f"refused: {self.unasked} — {what} was not run ({verdict.reason})"
            answer = self._ask_user(request)
            if verdict.ask_every_time and answer != "deny":
                return True, "approved by user (this once)"
            if answer in ("session", "always"):
                self._approved.add(verdict.key)
            if answer == "always" and not verdict.key.endswith(EDITOR_KEY):
                self._save_always(verdict.key)
        if answer == "deny":
            # the question was withdrawn, not answered: say so in the history
            if signal is not None and signal.is_set():
                why = "the turn was stopped before the question was answered"
                return False, f"not run: {why} ({verdict.reason})"
            return False, f"denied by user: {what} was not run ({verdict.reason})"
        return True, f"approved by user ({answer})"

    def carry_over_from(self, other: ApprovalPolicy) -> None:
        """Keep what the user decided on `other` (--yolo, "for this session" answers) when it is replaced."""
        self.yolo = other.yolo
        with self._lock:
            self._approved.update(other._approved)

    def for_subagent(self, child: ApprovalPolicy) -> None:
        """Let `child`, a subagent's policy, decide as this one would: its questions go where this
        policy's do when `subagents_ask`, and a refusal without asking says why as this one's would."""
        child.unasked = self.unasked
        child.subagents_ask = self.subagents_ask
        if self.subagents_ask:
            child._ask = self._ask

    def answer_from_session(self, request: ApprovalRequest) -> Answer:
        """A subagent's answers: yes for a command or MCP call of a kind this user approved for the
        session, else no.

        What is asked every time (running outside the sandbox, reading a secret) is never approved on the
        user's behalf, and neither is a file tool's call outside the working directory.
        """
        verdict = request.verdict
        if verdict.ask_every_time or not (request.tool == "terminal" or request.tool.startswith("mcp__")):
            return "deny"
        approved = verdict.needs_approval and covered(verdict.key, self._approved)
        return "once" if approved else "deny"

    def _ask_user(self, request: ApprovalRequest) -> Answer:
        if self._ask is None:
            return "deny"
        ask = self._ask
        box: list[Any] = []
        # the question runs in the tool's context, so the one who asks knows which call it is about
        calling = contextvars.copy_context()
        worker = threading.Thread(
            target=lambda: box.append(calling.run(ask, request)), daemon=True, name="mibyan-approval"
        )
        worker.start()
        worker.join(self._timeout)
        answer = box[0] if box else "deny"
        if answer == "once" or answer == "session" or answer == "always":
            return cast(Answer, answer)
        return "deny"
