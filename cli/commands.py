"""Slash commands of the interactive chat: one registry drives dispatch, /help and completion."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mibyan.cli.repl import Repl


@dataclass(frozen=True)
class Command:
    name: str
    usage: str
    help: str
    run: Callable[[Repl, str], bool | None]  # True: leave the chat
    complete: str | None = None  # "sessions" or "models": what the argument completes to


COMMANDS: dict[str, Command] = {}


def command(name: str, usage: str, help_text: str, complete: str | None = None) -> Callable[..., Any]:
    def register(fn: Callable[[Repl, str], bool | None]) -> Callable[[Repl, str], bool | None]:
        COMMANDS[name] = Command(name, usage, help_text, fn, complete)
        return fn

    return register


def dispatch(repl: Repl, line: str) -> bool:
    """Run a slash command; True when the chat should end."""
    name, _, argument = line[1:].partition(" ")
    found = COMMANDS.get(name)
    if found is None:
        repl.say(f"unknown command /{name}; /help lists them", style="red")
        return False
    return bool(found.run(repl, argument.strip()))


@command("help", "/help", "this list")
def _help(repl: Repl, argument: str) -> None:
    for item in COMMANDS.values():
        repl.say(f"  {item.usage:<18} {item.help}")
    repl.say("  Esc-Enter adds a line · Ctrl-C stops an answer · Ctrl-D leaves")


@command("exit", "/exit", "leave the chat")
def _exit(repl: Repl, argument: str) -> bool:
    return True


@command("new", "/new", "start a new session")
def _new(repl: Repl, argument: str) -> None:
    repl.replace_agent(session_id=None)
    repl.say(f"new session {repl.agent.session_id}")


@command("resume", "/resume [ID]", "continue a session (the most recent without ID)", complete="sessions")
def _resume(repl: Repl, argument: str) -> None:
    from agent_state import StoreError
    from mibyan.agent.session_lock import SessionBusy

    store = repl.agent.store
    try:
        session_id = (
            store.sessions.resolve_id(argument) if argument else store.sessions.most_recent(source="cli")
        )
    except StoreError as exc:  # an unknown or ambiguous id: say so and stay in this session
        repl.say(str(exc), style="red")
        return
    if session_id is None:
        repl.say("no session to resume", style="red")
        return
    try:
        repl.replace_agent(session_id=session_id)
    except SessionBusy as exc:  # a gateway's channel answering, another chat: stay in this session
        repl.say(str(exc), style="red")
        return
    repl.show_last_exchange()


@command("sessions", "/sessions", "recent sessions")
def _sessions(repl: Repl, argument: str) -> None:
    from mibyan.core.session_text import age

    for row in repl.agent.store.sessions.newest_first(15):
        mark = "*" if row["id"] == repl.agent.session_id else " "
        repl.say(
            f" {mark}{row['id']}  {age(row['updated_at']):<9} {row['message_count']:>4}  {row['title'] or ''}"
        )


@command("search", "/search QUERY", "search every past message")
def _search(repl: Repl, argument: str) -> None:
    if not argument:
        repl.say("usage: /search QUERY", style="red")
        return
    from mibyan.tools.session_tools import format_hits

    repl.say(format_hits(repl.agent.store.search(argument, limit=10)))


@command("model", "/model [NAME]", "show or change the model (same session)", complete="models")
def _model(repl: Repl, argument: str) -> None:
    if argument:
        repl.replace_agent(session_id=repl.agent.session_id, model=argument)
    runtime = repl.agent.runtime
    repl.say(f"{runtime.model} via {runtime.provider} ({runtime.api_mode})")


@command("compress", "/compress", "summarize older messages now")
def _compress(repl: Repl, argument: str) -> None:
    repl.say(repl.agent.compress()["report"])


@command("reload", "/reload", "rebuild the system prompt (after editing SOUL.md, memory or skills)")
def _reload(repl: Repl, argument: str) -> None:
    prompt = repl.agent.reload_prompt()
    repl.say(f"system prompt rebuilt ({len(prompt):,} characters)")


@command("usage", "/usage", "tokens used in this chat")
def _usage(repl: Repl, argument: str) -> None:
    repl.say(repl.renderer.footer(repl.usage, repl.agent.runtime.model).strip())


@command("tools", "/tools", "the tools the model can use")
def _tools(repl: Repl, argument: str) -> None:
    for schema in repl.agent.tool_schemas:
        repl.say(f"  {schema.name:<16} {(schema.description.splitlines() or [''])[0]}")


@command("mcp", "/mcp", "the MCP servers: their state and tools")
def _mcp(repl: Repl, argument: str) -> None:
    mcp = repl.agent.tools.mcp
    if mcp is None:
        repl.say("no MCP servers are configured (mcp_servers: in your config.yaml)")
        return
    from mibyan.cli.mcp import describe

    for line in describe(mcp.connections, {schema.name for schema in repl.agent.tool_schemas}):
        repl.say(line)


@command("retry", "/retry", "ask the last question again")
def _retry(repl: Repl, argument: str) -> None:
    said = repl.agent.undo_last_turn()
    if said is None:
        repl.say("nothing to retry", style="red")
        return
    repl.run_turn(said)


@command("undo", "/undo", "forget the last question and its answer")
def _undo(repl: Repl, argument: str) -> None:
    said = repl.agent.undo_last_turn()
    repl.say(f"forgot: {said}" if said is not None else "nothing to undo")


@command("title", "/title TEXT", "name this session")
def _title(repl: Repl, argument: str) -> None:
    if argument:
        repl.agent.store.sessions.rename(repl.agent.session_id, argument)
        repl.say(f"titled: {argument}")


@command("reasoning", "/reasoning", "show or hide the model's reasoning")
def _reasoning(repl: Repl, argument: str) -> None:
    repl.renderer.show_reasoning = not repl.renderer.show_reasoning
    repl.say(f"reasoning {'shown' if repl.renderer.show_reasoning else 'hidden'}")


@command("yolo", "/yolo", "run dangerous commands without asking (toggle)")
def _yolo(repl: Repl, argument: str) -> None:
    repl.agent.approvals.yolo = not repl.agent.approvals.yolo
    repl.say(f"yolo {'on: dangerous commands run without asking' if repl.agent.approvals.yolo else 'off'}")


@command("todo", "/todo", "the task list of this session")
def _todo(repl: Repl, argument: str) -> None:
    from mibyan.tools.todo import render_todos

    repl.say(render_todos(repl.agent.store.todos.get(repl.agent.session_id)))


def completions(kind: str | None, repl: Repl) -> list[str]:
    if kind == "sessions" and repl.ready():
        return [row["id"] for row in repl.agent.store.sessions.newest_first(30)]
    if kind == "models":
        from mibyan.agent.tokens import CONTEXT_WINDOWS

        return sorted(CONTEXT_WINDOWS)
    return []


__all__ = ["COMMANDS", "completions", "dispatch"]
