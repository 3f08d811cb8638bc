"""`mibyan acp`: mibyan as an editor's agent over the Agent Client Protocol (ACP, JSON-RPC on stdio).

Each ACP session is one `AIAgent` (source "acp"), so it is a mibyan session like any other: `mibyan
sessions list` shows it, and `session/load` continues it. Several sessions live in one process. The
agent is synchronous: each prompt runs `run_conversation` on a thread of its own while the connection
stays on the asyncio loop; `session/cancel` interrupts it and the prompt answers `cancelled`.

Each session's agent works in the folder the editor gave it (its `workdir`: relative paths, commands and
the sandbox's root, and where its project's `.mibyan/config.yaml` is read), so sessions of several
projects run side by side; the process's own working directory never changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from acp import PROTOCOL_VERSION, RequestError
from acp.schema import (
    AgentCapabilities,
    ClientCapabilities,
    Implementation,
    InitializeResponse,
    ListSessionsResponse,
    LoadSessionResponse,
    McpCapabilities,
    NewSessionResponse,
    PromptCapabilities,
    PromptResponse,
    SessionCapabilities,
    SessionInfo,
    SessionListCapabilities,
)

from mibyan.agent.options import AgentOptions
from mibyan.config.paths import mibyan_home
from mibyan.core.errors import MibyanError
from mibyan.core.sanitize import visible
from mibyan.editors import updates
from mibyan.editors.bridge import TurnBridge
from mibyan.editors.files import EditorFiles
from mibyan.editors.outbox import Outbox, settle_in_thread

if TYPE_CHECKING:
    from acp.interfaces import Client

    from mibyan.agent.turn_state import ExitReason
    from run_agent import AIAgent

log = logging.getLogger("mibyan.editors")

#: Sessions per page of session/list.
_PAGE = 50
# the ACP stop reason of each way a turn ends but "error", which answers the prompt with an error instead
_STOP_REASONS: dict[ExitReason, Literal["end_turn", "max_turn_requests", "cancelled"]] = {
    "completed": "end_turn",
    "budget_exhausted": "max_turn_requests",
    "interrupted": "cancelled",
}


def _checked_cwd(cwd: str) -> Path:
    path = Path(cwd)
    if not path.is_absolute() or not path.is_dir():
        raise RequestError.invalid_params(
            {"details": f"cwd must be an existing folder's absolute path: {cwd!r}"}
        )
    return Path(os.path.realpath(path))


def _left_out_notice(names: list[str]) -> str | None:
    if not names:
        return None
    return (
        f"The editor's MCP servers {', '.join(names)} use SSE, which mibyan does not speak: "
        "this session runs without them."
    )


class EditorSession:
    """One ACP session: its agent, the bridge of its callbacks, and its running prompt."""

    def __init__(
        self, session_id: str, cwd: Path, agent: AIAgent, bridge: TurnBridge, notice: str | None
    ) -> None:
        self.session_id = session_id
        self.cwd = cwd
        self.agent = agent
        self.bridge = bridge
        self.notice = notice
        self.running = False
        self.cancelled = False

    def cancel(self) -> None:
        if self.running:
            self.cancelled = True
            self.agent.interrupt()
            self.bridge.withdraw_questions()


class MibyanEditorAgent:
    """The ACP agent side (`acp.interfaces.Agent`): initialize, session/new, session/load, session/prompt,
    session/cancel."""

    def __init__(self, options: AgentOptions) -> None:
        """`options`: what the command line says about every session's agent (each is built in its
        session's folder, with the editor's servers and callbacks: _build_agent)."""
        self._options = options
        self._home = Path(options.home) if options.home is not None else mibyan_home()
        self._sessions: dict[str, EditorSession] = {}
        self._building = asyncio.Lock()  # agents are built one at a time: each in its own folder
        self._capabilities = ClientCapabilities()
        self._outbox: Outbox | None = None
        self._handling = 0  # requests being answered now
        self._idle: asyncio.Event | None = None

    @contextlib.asynccontextmanager
    async def _answering(self) -> AsyncIterator[None]:
        """Count a request while it is answered, so that the end of stdin lets it finish."""
        self._handling += 1
        try:
            yield
        finally:
            self._handling -= 1
            if self._handling == 0 and self._idle is not None:
                self._idle.set()

    def on_connect(self, conn: Client) -> None:
        self._outbox = Outbox(conn, asyncio.get_event_loop())
        self._outbox.start()

    @property
    def outbox(self) -> Outbox:
        assert self._outbox is not None, "on_connect comes first"
        return self._outbox

    async def initialize(
        self,
        protocol_version: int,
        client_capabilities: ClientCapabilities | None = None,
        client_info: Implementation | None = None,
        **kwargs: Any,
    ) -> InitializeResponse:
        import mibyan

        self._capabilities = client_capabilities or ClientCapabilities()
        return InitializeResponse(
            protocol_version=min(protocol_version, PROTOCOL_VERSION),
            agent_capabilities=AgentCapabilities(
                load_session=True,
                prompt_capabilities=PromptCapabilities(embedded_context=True, image=False, audio=False),
                mcp_capabilities=McpCapabilities(http=True, sse=False),
                session_capabilities=SessionCapabilities(list=SessionListCapabilities()),
            ),
            agent_info=Implementation(name="mibyan", title="mibyan", version=mibyan.__version__),
        )

    async def authenticate(self, method_id: str, **kwargs: Any) -> None:
        return None  # keys come from mibyan's configuration, as on the command line

    async def new_session(
        self, cwd: str, mcp_servers: list[Any] | None = None, **kwargs: Any
    ) -> NewSessionResponse:
        async with self._answering():
            session = await self._open(None, _checked_cwd(cwd), mcp_servers)
        return NewSessionResponse(session_id=session.session_id)

    async def load_session(
        self, cwd: str, session_id: str, mcp_servers: list[Any] | None = None, **kwargs: Any
    ) -> LoadSessionResponse:
        async with self._answering():
            return await self._load(_checked_cwd(cwd), session_id, mcp_servers)

    async def _load(
        self, folder: Path, session_id: str, mcp_servers: list[Any] | None
    ) -> LoadSessionResponse:
        """Open a stored editor session and replay it: what was said, the tool calls, the task list."""
        self._check_loadable(session_id)
        session = self._sessions.get(session_id)
        if session is not None and session.running:
            raise RequestError.invalid_request({"details": "this session is answering a prompt now"})
        if session is None:
            session = await self._open(session_id, folder, mcp_servers)
        for update in updates.replay(list(session.agent.history), folder):
            self.outbox.post(session_id, update)
        todos = session.agent.store.todos.get(session.agent.session_id)
        if todos:
            self.outbox.post(session_id, updates.plan_update(todos))
        await self.outbox.flushed()
        return LoadSessionResponse()

    def _check_loadable(self, session_id: str) -> None:
        """Only the editor's own sessions load: not a chat's, a gateway channel's or a subagent's."""
        from agent_state import SessionStore

        store = SessionStore.open(self._home)
        try:
            row = store.sessions.get(session_id)
        finally:
            store.close()
        if row is None:
            raise RequestError.invalid_params(
                {"details": f"no session {session_id!r} (see 'mibyan sessions list')"}
            )
        if row.get("source") != "acp":
            raise RequestError.invalid_params(
                {"details": f"{session_id!r} is not an editor's session; resume it with 'mibyan chat'"}
            )

    async def list_sessions(
        self, cwd: str | None = None, cursor: str | None = None, **kwargs: Any
    ) -> ListSessionsResponse:
        """The editor's sessions, newest first (in `cwd` when given), a page at a time."""
        from datetime import UTC, datetime

        from agent_state import SessionStore

        offset = int(cursor) if cursor and cursor.isdigit() else 0
        with SessionStore.open(self._home) as store:
            rows = store.sessions.started_by("acp", cwd=cwd, limit=_PAGE + 1, offset=offset)
        sessions = [
            SessionInfo(
                session_id=row["id"],
                cwd=row["cwd"] or "/",
                title=row["title"],
                updated_at=datetime.fromtimestamp(row["updated_at"], UTC).isoformat(),
            )
            for row in rows[:_PAGE]
        ]
        more = str(offset + _PAGE) if len(rows) > _PAGE else None
        return ListSessionsResponse(sessions=sessions, next_cursor=more)

    async def _open(self, session_id: str | None, cwd: Path, mcp_servers: list[Any] | None) -> EditorSession:
        """Build the session's agent in `cwd` (its project configuration and sandbox are that folder's),
        with the editor's MCP servers joined to the configured ones."""
        from mibyan.agent.session import new_session_id
        from mibyan.editors.servers import editor_servers

        _, left_out = editor_servers(mcp_servers)
        notice = _left_out_notice(left_out)

        acp_id = session_id or new_session_id()
        fs = self._capabilities.fs
        files = EditorFiles(
            acp_id,
            self.outbox,
            reads=bool(fs and fs.read_text_file),
            writes=bool(fs and fs.write_text_file),
        )
        holder: dict[str, AIAgent] = {}
        bridge = TurnBridge(
            acp_id, self.outbox, cwd, lambda: holder["agent"].store.todos.get(holder["agent"].session_id)
        )
        try:
            async with self._building:
                agent = await settle_in_thread(
                    lambda: self._build_agent(
                        acp_id, bridge, cwd, files if files.reads or files.writes else None, mcp_servers
                    ),
                    name="mibyan-acp-open",
                )
        except MibyanError as exc:
            raise RequestError.internal_error({"details": str(exc)}) from None
        holder["agent"] = agent
        bridge.question_timeout = agent.settings.approvals.timeout
        session = EditorSession(acp_id, cwd, agent, bridge, notice)
        self._sessions[acp_id] = session
        if notice:
            log.warning("session %s: %s", acp_id, visible(notice))
        return session

    def _build_agent(
        self,
        session_id: str,
        bridge: TurnBridge,
        cwd: Path,
        files: EditorFiles | None,
        editor_mcp: list[Any] | None,
    ) -> AIAgent:
        from mibyan.agent.callbacks import Callbacks
        from mibyan.config.loader import load_settings
        from mibyan.editors.servers import editor_servers
        from run_agent import AIAgent

        configured = set(load_settings(home=self._home, cwd=cwd).mcp_servers) if editor_mcp else set()
        servers, _ = editor_servers(editor_mcp, configured)
        return AIAgent(
            options=dataclasses.replace(
                self._options,
                session_id=session_id,
                source="acp",
                workdir=cwd,
                file_access=files,
                mcp_servers=servers or None,
                callbacks=Callbacks.from_kwargs(bridge.callbacks()),
            )
        )

    def _session(self, session_id: str) -> EditorSession:
        session = self._sessions.get(session_id)
        if session is None:
            raise RequestError.invalid_params(
                {"details": f"no open session {session_id!r}: create or load it first"}
            )
        return session

    async def prompt(self, prompt: list[Any], session_id: str, **kwargs: Any) -> PromptResponse:
        async with self._answering():
            return await self._prompt(self._session(session_id), prompt)

    async def _prompt(self, session: EditorSession, prompt: list[Any]) -> PromptResponse:
        """Run one prompt to its end on a thread; the answer comes after every update it caused."""
        if session.running:
            raise RequestError.invalid_request({"details": "a prompt is running in this session already"})
        text = updates.prompt_text(prompt)
        if not text.strip():
            raise RequestError.invalid_params({"details": "the prompt is empty"})
        session.running, session.cancelled = True, False
        session.bridge.begin()
        try:
            if session.notice:
                session.bridge.notices.insert(0, session.notice)
                session.notice = None
            session.bridge.flush_notices()
            result = await settle_in_thread(
                lambda: session.agent.run_conversation(text), name="mibyan-acp-prompt"
            )
        except MibyanError as exc:
            raise RequestError.internal_error({"details": str(exc)}) from None
        finally:
            session.bridge.end(cancelled=session.cancelled)
            await self.outbox.flushed()
            session.running = False
        if session.cancelled:
            return PromptResponse(stop_reason="cancelled")
        if result["exit_reason"] == "error":
            raise RequestError.internal_error({"details": result["error"] or "the turn failed"})
        return PromptResponse(stop_reason=_STOP_REASONS[result["exit_reason"]])

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        session = self._sessions.get(session_id)
        if session is not None:
            session.cancel()

    async def finish(self, *, grace: float = 10.0) -> None:
        """The editor closed stdin: cancel the running prompts and let the requests in hand answer."""
        for session in self._sessions.values():
            session.cancel()
        if self._handling:
            self._idle = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), grace)

    async def close(self) -> None:
        """Close every session's agent (a prompt still running is interrupted first)."""
        sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            await settle_in_thread(session.agent.close, name="mibyan-acp-close")
        if self._outbox is not None:
            await self._outbox.close()
