"""`mibyan chat`: the one-shot prompt (-q) and the interactive chat."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from types import FrameType
from typing import TYPE_CHECKING, Any

from cli.main import EXIT_BUDGET, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from cli.progress import Progress
from cli.prompts import prompt_callbacks

if TYPE_CHECKING:
    from run_agent import AIAgent

_EXIT_CODES = {
    "completed": EXIT_OK,
    "error": EXIT_ERROR,
    "budget_exhausted": EXIT_BUDGET,
    "interrupted": EXIT_INTERRUPTED,
}


def _read_prompt(query: str) -> str | None:
    text = sys.stdin.read() if query == "-" else query
    return text.strip() or None


def _session_to_resume(args: argparse.Namespace) -> str | None:
    """The id --resume / --continue asks for (a prefix is resolved), or None for a new session."""
    if args.resume is None:
        return None
    from agent_state import SessionStore, StoreError
    from config.loader import mibyan_home

    store = SessionStore.open(mibyan_home())
    try:
        if args.resume:
            return store.resolve_id(args.resume)
        latest = store.most_recent()
        if latest is None:
            raise StoreError("there is no session to resume yet: start one with 'mibyan chat'")
        return latest
    finally:
        store.close()


def _make_agent(args: argparse.Namespace, progress: Progress) -> AIAgent:
    from run_agent import AIAgent

    toolsets = [t.strip() for t in args.toolsets.split(",") if t.strip()] if args.toolsets else None
    return AIAgent(
        model=args.model,
        provider=args.provider,
        base_url=args.base_url,
        api_mode=args.api_mode,
        max_iterations=args.max_turns,
        enabled_toolsets=toolsets,
        stream=False if getattr(args, "json", False) else None,
        session_id=_session_to_resume(args),
        source="cli",
        yolo=args.yolo,
        **progress.callbacks(),
        **prompt_callbacks(),
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

    def reset(self) -> None:
        self._pressed = False


def _one_shot(agent: AIAgent, prompt: str, args: argparse.Namespace, progress: Progress) -> int:
    handler = _InterruptHandler(agent)
    signal.signal(signal.SIGINT, handler)
    result = agent.run_conversation(prompt)
    progress.end_answer()
    if args.json:
        json.dump(_json_result(result), sys.stdout, ensure_ascii=False, indent=2)
        sys.stdout.write("\n")
    elif not progress.streamed_answer and result["final_response"]:
        sys.stdout.write(result["final_response"] + "\n")
    if result["error"]:
        sys.stderr.write(f"mibyan: {result['error']}\n")
    elif result["exit_reason"] == "budget_exhausted":
        sys.stderr.write(
            f"mibyan: stopped: the budget of {agent.settings.agent.max_turns} model calls is spent\n"
        )
    return _EXIT_CODES[result["exit_reason"]]


def _json_result(result: dict[str, Any]) -> dict[str, Any]:
    return {
        key: result[key]
        for key in (
            "final_response",
            "session_id",
            "task_id",
            "exit_reason",
            "completed",
            "interrupted",
            "api_calls",
            "usage",
            "error",
            "messages",
        )
    }


def _repl(agent: AIAgent, progress: Progress) -> int:
    handler = _InterruptHandler(agent)
    signal.signal(signal.SIGINT, handler)
    sys.stderr.write(
        f"mibyan · {agent.runtime.model} via {agent.runtime.provider} · session {agent.session_id}\n"
        "Type /exit or press Ctrl-D to leave; Ctrl-C stops a running answer.\n"
    )
    _show_last_exchange(agent)
    while True:
        handler.reset()
        try:
            line = input("› ")
        except EOFError:
            sys.stderr.write("\n")
            return EXIT_OK
        except KeyboardInterrupt:
            sys.stderr.write("\n")
            return EXIT_INTERRUPTED
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            return EXIT_OK
        if text == "/todo":
            from tools.todo import render_todos

            sys.stderr.write(render_todos(agent.store.get_todos(agent.session_id)) + "\n")
            continue
        if text == "/compress":
            report = agent.compress()
            sys.stderr.write(f"  · {report['report']}\n")
            continue
        progress.reset()
        result = agent.run_conversation(text)
        progress.end_answer()
        if not progress.streamed_answer and result["final_response"]:
            sys.stdout.write(result["final_response"] + "\n")
        if result["error"]:
            sys.stderr.write(f"mibyan: {result['error']}\n")
        elif result["interrupted"]:
            sys.stderr.write("(interrupted)\n")


def _show_last_exchange(agent: AIAgent) -> None:
    """On resume, show where the conversation stopped."""
    messages = agent._history.messages
    last_user = next((m for m in reversed(messages) if m["role"] == "user"), None)
    if last_user is None:
        return
    last_answer = next((m for m in reversed(messages) if m["role"] == "assistant" and m.get("content")), None)
    sys.stderr.write(f"(resumed: {len(messages)} messages)\n› {last_user['content']}\n")
    if last_answer is not None:
        sys.stdout.write(f"{last_answer['content']}\n")


def run_chat(args: argparse.Namespace) -> int:
    from agent.errors import MibyanError

    prompt = None
    if args.query is not None:
        prompt = _read_prompt(args.query)
        if prompt is None:
            sys.stderr.write("mibyan: error: the prompt is empty\n")
            return EXIT_USAGE
    # No background import of the SDK: imports hold the GIL, so a second importing thread only adds
    # contention; measured with bench/run.py, one-shot start-up was about 8% faster without it.
    progress = Progress(quiet=args.quiet, stream_answer=not getattr(args, "json", False))
    try:
        agent = _make_agent(args, progress)
    except MibyanError as exc:
        sys.stderr.write(f"mibyan: {exc}\n")
        return EXIT_USAGE
    try:
        if prompt is not None:
            return _one_shot(agent, prompt, args, progress)
        return _repl(agent, progress)
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        return EXIT_INTERRUPTED
