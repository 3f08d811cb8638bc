"""`mibyan chat`: the one-shot prompt (-q) and the interactive chat."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
from types import FrameType
from typing import TYPE_CHECKING, Any

from mibyan.cli.progress import Progress
from mibyan.cli.prompts import prompt_callbacks
from mibyan.core.exit_codes import EXIT_BUDGET, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from mibyan.core.sanitize import for_stream, visible, visible_json

if TYPE_CHECKING:
    from pathlib import Path

    from mibyan.agent.options import AgentOptions
    from mibyan.agent.session_lock import SessionLock
    from mibyan.agent.turn_state import ConversationResult, ExitReason
    from mibyan.tools.mcp_connections import McpConnections
    from run_agent import AIAgent

_EXIT_CODES: dict[ExitReason, int] = {
    "completed": EXIT_OK,
    "error": EXIT_ERROR,
    "budget_exhausted": EXIT_BUDGET,
    "interrupted": EXIT_INTERRUPTED,
}


def _read_prompt(query: str) -> str | None:
    """The prompt of -q: its argument, or stdin for '-'; bytes that are not UTF-8 become U+FFFD."""
    raw = sys.stdin.buffer.read() if query == "-" else os.fsencode(query)
    from mibyan.agent.messages import replace_invalid_text

    text, replaced = replace_invalid_text(raw.decode("utf-8", errors="surrogateescape"))
    if replaced:
        what = "1 byte was" if replaced == 1 else f"{replaced} bytes were"
        sys.stderr.write(f"mibyan: the prompt was not valid UTF-8; {what} replaced\n")
    return text.strip() or None


def _session_to_resume(args: argparse.Namespace) -> str | None:
    """The id --resume / --continue asks for (a prefix is resolved), or None for a new session."""
    if args.resume is None:
        return None
    from agent_state import SessionStore, StoreError
    from mibyan.config.paths import mibyan_home

    store = SessionStore.open(mibyan_home())
    try:
        if args.resume:
            return store.sessions.resolve_id(args.resume)
        latest = store.sessions.most_recent(
            source="cli"
        )  # a gateway's channel or a script's run is not yours
        if latest is None:
            raise StoreError("there is no chat session to resume yet: start one with 'mibyan chat'")
        return latest
    finally:
        store.close()


def _prepare_home() -> None:
    """The home exists, is writable and private before the chat writes to it (a note if it was not)."""
    from mibyan.config.paths import mibyan_home, prepare_home

    tightened = prepare_home(mibyan_home())
    if tightened:
        sys.stderr.write(f"mibyan: made {', '.join(tightened)} private, so only you can read your sessions\n")


def toolsets_of(args: argparse.Namespace) -> list[str] | None:
    """The toolsets `--toolsets a,b` names (None: the configured ones); ConfigError for an unknown one."""
    if not args.toolsets:
        return None
    from model_tools import check_tool_selection

    toolsets = [name.strip() for name in args.toolsets.split(",") if name.strip()]
    check_tool_selection(toolsets, where="--toolsets")
    return toolsets


def make_agent(
    args: argparse.Namespace,
    callbacks: dict[str, Any],
    *,
    session_id: str | None,
    model: str | None = None,
    mcp_connections: McpConnections | None = None,
    held: SessionLock | None = None,
) -> AIAgent:
    """The agent the command-line options describe (with `mcp_connections`: another agent's servers).

    It holds its session's lock until it is closed: a session another process runs now (a gateway's
    channel answering, another chat) is refused, SessionBusy, before anything of it is opened or
    repaired. `held` is a lock this process holds already (the chat's session before a /resume).
    """
    from mibyan.agent.session_lock import build_holding
    from mibyan.cli.logs import setup_logging
    from mibyan.config.paths import mibyan_home

    home = mibyan_home()
    setup_logging(home)
    lock = None if session_id is None else _session_lock(home, session_id, held)
    return build_holding(home, lock, lambda: _build(args, callbacks, session_id, model, mcp_connections))


def _session_lock(home: Path, session_id: str, held: SessionLock | None) -> SessionLock:
    """The lock of the session asked for (one this process holds already, when it is the same)."""
    from agent_state import SessionStore
    from mibyan.agent.session_lock import SessionLock

    with SessionStore.open(home) as store:
        lock = SessionLock.for_session(home, store, session_id)
    return held if held is not None and held.path == lock.path else lock


def options_of(args: argparse.Namespace) -> AgentOptions:
    """The agent options the command line gives (`mibyan chat`, `mibyan acp`); ConfigError for an unknown
    toolset. What it leaves out comes from the configuration."""
    from mibyan.agent.options import AgentOptions

    return AgentOptions(
        model=args.model,
        provider=args.provider,
        base_url=args.base_url,
        api_mode=args.api_mode,
        max_iterations=args.max_turns,
        enabled_toolsets=toolsets_of(args),
        stream=False if getattr(args, "json", False) else None,
        yolo=args.yolo,
    )


def _build(
    args: argparse.Namespace,
    callbacks: dict[str, Any],
    session_id: str | None,
    model: str | None,
    mcp_connections: McpConnections | None,
) -> AIAgent:
    from mibyan.agent.callbacks import Callbacks
    from run_agent import AIAgent

    options = options_of(args)
    return AIAgent(
        options=dataclasses.replace(
            options,
            model=model or options.model,
            session_id=session_id,
            source="cli",
            mcp_connections=mcp_connections,
            callbacks=Callbacks.from_kwargs({**prompt_callbacks(), **callbacks}),
        )
    )


class _InterruptHandler:
    """Ctrl-C interrupts the running turn; a second one exits at once with code 130."""

    def __init__(self, agent: AIAgent) -> None:
        self._agent = agent
        self._pressed = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self._pressed:
            raise KeyboardInterrupt
        self._pressed = True
        self._agent.interrupt()


def _one_shot(agent: AIAgent, prompt: str, args: argparse.Namespace, progress: Progress) -> int:
    handler = _InterruptHandler(agent)
    signal.signal(signal.SIGINT, handler)
    result = agent.run_conversation(prompt)
    agent.session.store.sessions.end(agent.session_id, result["exit_reason"])  # `--resume` reopens it
    progress.end_answer()
    if args.json:
        document = json.dumps(_json_result(result), ensure_ascii=False, indent=2)
        sys.stdout.write((visible_json(document) if sys.stdout.isatty() else document) + "\n")
    elif not progress.streamed_answer and result["final_response"]:
        sys.stdout.write(for_stream(sys.stdout, result["final_response"]) + "\n")
    if not args.quiet:
        # so a script can continue the conversation with --resume
        sys.stderr.write(
            f"mibyan: session {agent.session_id} (resume with: mibyan chat --resume {agent.session_id})\n"
        )
    if result["error"]:
        sys.stderr.write(f"mibyan: {visible(result['error'])}\n")
    elif result["exit_reason"] == "budget_exhausted":
        sys.stderr.write(
            f"mibyan: stopped: the budget of {agent.settings.agent.max_turns} model calls is spent\n"
        )
    return _EXIT_CODES[result["exit_reason"]]


def _json_result(result: ConversationResult) -> dict[str, Any]:
    return {  # the documented order of `--json`'s keys
        "final_response": result["final_response"],
        "session_id": result["session_id"],
        "task_id": result["task_id"],
        "exit_reason": result["exit_reason"],
        "completed": result["completed"],
        "interrupted": result["interrupted"],
        "api_calls": result["api_calls"],
        "usage": result["usage"],
        "error": result["error"],
        "messages": result["messages"],
    }


def run_chat(args: argparse.Namespace) -> int:
    from mibyan.core.errors import MibyanError

    prompt = None
    if args.query is None and not sys.stdin.isatty():  # a chat needs a terminal: piped text is the prompt
        sys.stderr.write("mibyan: stdin is not a terminal: reading the prompt from it (as with -q -)\n")
        args.query = "-"
    if args.query is not None:
        prompt = _read_prompt(args.query)
        if prompt is None:
            sys.stderr.write("mibyan: error: the prompt is empty\n")
            return EXIT_USAGE
    try:
        _prepare_home()
    except MibyanError as exc:
        sys.stderr.write(f"mibyan: {exc}\n")
        return EXIT_ERROR
    # No background import of the SDK: imports hold the GIL, so a second importing thread only adds
    # contention; measured with bench/run.py, one-shot start-up was about 8% faster without it.
    try:
        session_id = _session_to_resume(args)
    except MibyanError as exc:
        sys.stderr.write(f"mibyan: {visible(str(exc))}\n")
        return EXIT_USAGE
    if prompt is None:
        from mibyan.cli.repl import run_repl

        return run_repl(args, session_id)
    # On a terminal the answer streams; into a pipe or a file it is written once, whole, at the end, so
    # a script reads exactly the final answer even when a dropped stream was retried.
    progress = Progress(quiet=args.quiet, stream_answer=not args.json and sys.stdout.isatty())
    try:
        agent = make_agent(args, progress.callbacks(), session_id=session_id)
    except MibyanError as exc:
        sys.stderr.write(f"mibyan: {visible(str(exc))}\n")
        return EXIT_USAGE
    try:
        return _one_shot(agent, prompt, args, progress)
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        return EXIT_INTERRUPTED
    except MibyanError as exc:  # the session store failed mid-turn (locked or unwritable database)
        progress.end_answer()
        sys.stderr.write(f"mibyan: {visible(str(exc))}\n")
        return EXIT_ERROR
    finally:
        agent.close()
