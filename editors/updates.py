"""How mibyan's tool calls, task list, prompts and stored messages look to an editor: ACP shapes.

Pure functions, no I/O but one: the old text of a file the model is about to rewrite, read from disk
for the diff, and only inside the working directory (a diff must not carry a file from elsewhere to the
editor before the user approved touching it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from acp.schema import (
    AgentMessageChunk,
    AgentPlanUpdate,
    AgentThoughtChunk,
    ContentToolCallContent,
    EmbeddedResourceContentBlock,
    FileEditToolCallContent,
    PlanEntry,
    ResourceContentBlock,
    TerminalToolCallContent,
    TextContentBlock,
    TextResourceContents,
    ToolCallLocation,
    ToolCallProgress,
    ToolCallStart,
    ToolKind,
    UserMessageChunk,
)

from mibyan.core.sanitize import visible

if TYPE_CHECKING:
    from mibyan.agent.messages import Message

Update = (
    AgentMessageChunk
    | AgentThoughtChunk
    | UserMessageChunk
    | ToolCallStart
    | ToolCallProgress
    | AgentPlanUpdate
)
ToolContent = ContentToolCallContent | FileEditToolCallContent | TerminalToolCallContent

_KINDS: dict[str, ToolKind] = {
    "read_file": "read",
    "list_directory": "read",
    "skill_view": "read",
    "skills_list": "read",
    "write_file": "edit",
    "patch": "edit",
    "terminal": "execute",
    "search_files": "search",
    "session_search": "search",
    "web_fetch": "fetch",
    "todo": "think",
    "delegate_task": "think",
}
_EDITS = ("write_file", "patch")
_SUBAGENT_MARK = " \u203a "  # how tools/delegation.py names a subagent's calls
#: The longest tool output shown in the editor (the model gets the whole of it).
_SHOWN_OUTPUT = 8000
_TITLE_CHARS = 120


def arguments_of(raw: Any) -> dict[str, Any]:
    """A tool call's arguments as a dict, whatever the model sent (JSON text, a dict, or garbage)."""
    if isinstance(raw, dict):
        return raw
    try:
        parsed = json.loads(raw) if isinstance(raw, str) and raw.strip() else {}
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def tool_kind(name: str) -> ToolKind:
    """The editor's kind of a tool; a subagent's calls (named "<subagent> \u203a <tool>") are their tool's."""
    return _KINDS.get(name.rpartition(_SUBAGENT_MARK)[2], "other")


def one_line(text: str) -> str:
    """`text` as a title: one line, its control characters made visible, at most 120 characters."""
    line = " ".join(visible(text).split())
    return line if len(line) <= _TITLE_CHARS else line[: _TITLE_CHARS - 1] + "…"


def tool_title(name: str, args: dict[str, Any]) -> str:
    """What the editor shows as the call's title: the command, the path or the URL it acts on."""
    subject = {
        "terminal": args.get("command"),
        "web_fetch": args.get("url"),
        "search_files": args.get("pattern") or args.get("glob"),
        "session_search": args.get("query"),
        "delegate_task": args.get("goal") or args.get("task"),
    }.get(name) or args.get("path")
    return one_line(f"{name} {subject}") if isinstance(subject, str) and subject else name


def _absolute(path: str, cwd: Path) -> Path:
    return Path(os.path.normpath(cwd / os.path.expanduser(path)))


def tool_locations(args: dict[str, Any], cwd: Path) -> list[ToolCallLocation]:
    """The file a call touches, so the editor can follow along."""
    path = args.get("path")
    if not isinstance(path, str) or not path or "\x00" in path:
        return []
    return [ToolCallLocation(path=str(_absolute(path, cwd)))]


def _old_text(target: Path, cwd: Path) -> str | None:
    """The file's text now, when it lies inside the working directory; else None (shown as new)."""
    real, root = Path(os.path.realpath(target)), Path(os.path.realpath(cwd))
    if root == Path("/") or not str(real).startswith(str(root).rstrip("/") + "/"):
        return None
    try:
        if real.is_file() and real.stat().st_size <= 2 * 1024 * 1024:
            return real.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return None


def edit_content(name: str, args: dict[str, Any], cwd: Path, *, read_old: bool = True) -> list[ToolContent]:
    """A write_file or patch call as a diff: the whole file for write_file (against the file as it is
    now when `read_old`, else as a new file), the piece it replaces for patch."""
    path = args.get("path")
    if name not in _EDITS or not isinstance(path, str) or not path or "\x00" in path:
        return []
    target = _absolute(path, cwd)
    if name == "write_file" and isinstance(args.get("content"), str):
        return [
            FileEditToolCallContent(
                type="diff",
                path=str(target),
                old_text=_old_text(target, cwd) if read_old else None,
                new_text=args["content"],
            )
        ]
    if name == "patch" and isinstance(args.get("old"), str) and isinstance(args.get("new"), str):
        return [
            FileEditToolCallContent(type="diff", path=str(target), old_text=args["old"], new_text=args["new"])
        ]
    return []


def text_content(text: str) -> ContentToolCallContent:
    if len(text) > _SHOWN_OUTPUT:
        text = text[:_SHOWN_OUTPUT] + f"\n[... {len(text) - _SHOWN_OUTPUT} more characters]"
    return ContentToolCallContent(type="content", content=TextContentBlock(type="text", text=text))


def call_start(
    tool_call_id: str, name: str, raw_args: Any, cwd: Path, *, status: str = "pending", read_old: bool = True
) -> ToolCallStart:
    """The announcement of a call (at the latest when it starts), with its title, kind and file."""
    args = arguments_of(raw_args)
    return ToolCallStart(
        session_update="tool_call",
        tool_call_id=tool_call_id,
        title=tool_title(name, args),
        kind=tool_kind(name),
        status=status,  # type: ignore[arg-type]
        locations=tool_locations(args, cwd) or None,
        content=edit_content(name, args, cwd, read_old=read_old) or None,
        raw_input=args or None,
    )


def call_running(
    tool_call_id: str, name: str, args: dict[str, Any], cwd: Path, diff: list[ToolContent]
) -> ToolCallProgress:
    """The call starts: its arguments are known now, so its title, file and diff too."""
    return ToolCallProgress(
        session_update="tool_call_update",
        tool_call_id=tool_call_id,
        title=tool_title(name, args),
        kind=tool_kind(name),
        status="in_progress",
        locations=tool_locations(args, cwd) or None,
        content=diff or None,
        raw_input=args or None,
    )


def call_finished(tool_call_id: str, *, ok: bool, result: str, diff: list[ToolContent]) -> ToolCallProgress:
    """The call ended: completed or failed, with its output (an edit that worked shows its diff)."""
    content: list[ToolContent] = list(diff) if ok else []
    if result and (not ok or not content):
        content.append(text_content(result))
    return ToolCallProgress(
        session_update="tool_call_update",
        tool_call_id=tool_call_id,
        status="completed" if ok else "failed",
        content=content or None,
        raw_output=result[:_SHOWN_OUTPUT] if result else None,
    )


def call_abandoned(tool_call_id: str, why: str) -> ToolCallProgress:
    """A call that was announced but did not run (the turn was cancelled, the reply was cut)."""
    return ToolCallProgress(
        session_update="tool_call_update",
        tool_call_id=tool_call_id,
        status="failed",
        content=[text_content(why)],
    )


_PLAN_STATUS = {"pending": "pending", "in_progress": "in_progress", "done": "completed"}


def plan_update(todos: list[dict[str, Any]]) -> AgentPlanUpdate:
    """The todo list as the editor's plan (cancelled tasks are left out: a plan has no such state)."""
    entries = [
        PlanEntry(content=str(item["text"]), priority="medium", status=_PLAN_STATUS[item["status"]])  # type: ignore[arg-type]
        for item in todos
        if item.get("status") in _PLAN_STATUS
    ]
    return AgentPlanUpdate(session_update="plan", entries=entries)


def agent_text(text: str) -> AgentMessageChunk:
    return AgentMessageChunk(
        session_update="agent_message_chunk", content=TextContentBlock(type="text", text=text)
    )


def agent_thought(text: str) -> AgentThoughtChunk:
    return AgentThoughtChunk(
        session_update="agent_thought_chunk", content=TextContentBlock(type="text", text=text)
    )


def prompt_text(blocks: list[Any]) -> str:
    """One user message from a prompt's blocks: its text, the files it mentions and the ones it embeds."""
    parts: list[str] = []
    for block in blocks:
        if isinstance(block, TextContentBlock):
            parts.append(block.text)
        elif isinstance(block, ResourceContentBlock):
            parts.append(f"[file: {block.uri}]")
        elif isinstance(block, EmbeddedResourceContentBlock) and isinstance(
            block.resource, TextResourceContents
        ):
            parts.append(f'<file uri="{block.resource.uri}">\n{block.resource.text}\n</file>')
        else:
            parts.append(f"[a {getattr(block, 'type', 'content')} block mibyan cannot read was left out]")
    return "\n\n".join(part for part in parts if part)


#: How the results of calls that did not do their work begin (stored messages say no more than that).
_FAILED = ("error:", "blocked", "denied", "refused", "not run", "not done", "interrupted")


def replay(messages: list[Message], cwd: Path) -> list[Update]:
    """A stored conversation as the updates that would have shown it: what the user said, the
    answers, reasoning, and each tool call with its result."""
    updates: list[Update] = []
    diffs: dict[str, list[ToolContent]] = {}
    for message in messages:
        content = message.get("content")  # an assistant message from outside may leave it out
        if message["role"] == "user" and isinstance(content, str):
            updates.append(
                UserMessageChunk(
                    session_update="user_message_chunk", content=TextContentBlock(type="text", text=content)
                )
            )
        elif message["role"] == "assistant":
            if message.get("reasoning"):
                updates.append(agent_thought(str(message.get("reasoning"))))
            if isinstance(content, str) and content:
                updates.append(agent_text(content))
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                name, raw = str(function.get("name", "")), function.get("arguments")
                diffs[call["id"]] = edit_content(name, arguments_of(raw), cwd, read_old=False)
                updates.append(call_start(call["id"], name, raw, cwd, status="in_progress", read_old=False))
        elif message["role"] == "tool" and message["tool_call_id"] in diffs:
            result = str(content or "")
            ok = not result.startswith(_FAILED)
            updates.append(
                call_finished(
                    message["tool_call_id"], ok=ok, result=result, diff=diffs[message["tool_call_id"]]
                )
            )
    return updates
