"""The message model and its rules, enforced in this one place.

History is a list of OpenAI chat-format dicts without the system prompt (the agent keeps that apart):
`user`, `assistant` (`content`, optional `tool_calls`, `reasoning`, `provider_data`) and `tool`
(`tool_call_id`, `content`). The rules every provider checks:

- user and assistant alternate; only `tool` messages repeat;
- every tool call of an assistant message has exactly one result, in the order of the calls,
  before the next user or assistant message.

`History` is the only thing that mutates a conversation: a live append that would break a rule is a bug
and raises `HistoryError`; a loaded history that breaks them (interrupt, crash, hand-edited import) is
mended by `repair_history`, which adds what is missing and reports everything it changed.
"""

from __future__ import annotations

import json
import re
from collections import deque
from typing import Any, Literal, NotRequired, Protocol, TypedDict

from mibyan.core.errors import MibyanError

# A part of a multimodal content list (`{"type": "text", "text": ...}`, an image): passed on as it is.
ContentPart = dict[str, Any]


class ToolCallFunction(TypedDict):
    """The function a tool call names, and its arguments as the JSON text the model wrote."""

    name: str
    arguments: str


class ToolCall(TypedDict):
    """One call of an assistant message, in the OpenAI chat format."""

    id: str
    type: NotRequired[Literal["function"]]
    function: ToolCallFunction


class SystemMessage(TypedDict):
    """The system prompt, when a history carries one (the agent keeps its own apart)."""

    role: Literal["system"]
    content: str | list[ContentPart]


class UserMessage(TypedDict):
    """What the user said: text, or content parts."""

    role: Literal["user"]
    content: str | list[ContentPart]


class AssistantMessage(TypedDict):
    """A model reply: its text (None when it only calls tools), its calls, and what must be replayed.

    `provider_data` holds what a provider needs sent back verbatim (Anthropic thinking blocks with their
    signatures, Responses reasoning items with encrypted content).
    """

    role: Literal["assistant"]
    content: str | list[ContentPart] | None
    tool_calls: NotRequired[list[ToolCall]]
    reasoning: NotRequired[str]
    provider_data: NotRequired[dict[str, Any]]


class ToolMessage(TypedDict):
    """The result of one tool call, answering the call with `tool_call_id`."""

    role: Literal["tool"]
    tool_call_id: str
    content: str | list[ContentPart]
    name: NotRequired[str]


# One message of a history: the dict form of DESIGN §3, told apart by its `role`.
Message = SystemMessage | UserMessage | AssistantMessage | ToolMessage

INTERRUPTED_RESULT = "interrupted: no result"
NO_REPLY = "(no reply: the turn was interrupted before an answer)"
_CONTINUE = "(continue)"


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
REPLACEMENT_CHARACTER = "\ufffd"


def replace_invalid_text(text: str) -> tuple[str, int]:
    """`text` with every lone surrogate (a byte that was not UTF-8, kept by `surrogateescape`) as U+FFFD.

    Returns the text and how many characters were replaced: one per undecodable byte.
    """
    return _LONE_SURROGATE.subn(REPLACEMENT_CHARACTER, text)


class HistoryError(MibyanError):
    """An append would break the message rules: a bug in the caller, never the user's fault."""


class InvalidMessage(MibyanError, ValueError):
    """A message handed in from outside (a conversation_history entry) is not a message at all."""


_ROLES = ("system", "user", "assistant", "tool")


def check_messages(messages: list[Any], *, where: str = "conversation_history") -> None:
    """Refuse, in one line naming the entry and its field, what no repair can turn into a message.

    What breaks only the order rules (a missing result, two user messages in a row) is left for
    `repair_history`; an entry that is not a dict, has an unknown role, content that is not text (a
    string, a list of parts, or None for an assistant message), tool calls that are not a list of
    `{"id", "function": {"name", "arguments"}}` objects, or is a tool result without the id of its call
    is refused.

    Raises:
        InvalidMessage: naming the first bad entry, e.g. `conversation_history[3]: unknown role 'robot'`
            or `conversation_history[0].tool_calls: must be a list of tool calls, not str`.
    """
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidMessage(f"{where}[{index}]: a message must be a dict, not {type(message).__name__}")
        role = message.get("role")
        if role not in _ROLES:
            raise InvalidMessage(
                f"{where}[{index}]: unknown role {role!r} (expected one of {', '.join(_ROLES)})"
            )
        problem = _field_problem(message)
        if problem is not None:
            raise InvalidMessage(f"{where}[{index}].{problem}")


def _field_problem(message: dict[str, Any]) -> str | None:
    """What is wrong with one field of a message whose role is known, as `field: why`; None if nothing."""
    role, content = message["role"], message.get("content")
    text = isinstance(content, str) or (content is None and role == "assistant")
    parts = isinstance(content, list) and all(isinstance(part, dict) for part in content)
    if not text and not parts:
        return f"content: must be a string or a list of content parts, not {type(content).__name__}"
    calls = message.get("tool_calls")
    if calls is not None:
        if role != "assistant":
            return "tool_calls: only an assistant message has tool calls"
        if not isinstance(calls, list):
            return f"tool_calls: must be a list of tool calls, not {type(calls).__name__}"
        for number, call in enumerate(calls):
            problem = _call_problem(call)
            if problem is not None:
                return f"tool_calls[{number}]{problem}"
    if role == "tool" and not isinstance(message.get("tool_call_id"), str):
        return "tool_call_id: a tool message needs the id of its call, a string"
    return None


def _call_problem(call: Any) -> str | None:
    if not isinstance(call, dict):
        return f": must be an object with an id and a function, not {type(call).__name__}"
    if not isinstance(call.get("id"), str) or not call["id"]:
        return ".id: must be a non-empty string"
    function = call.get("function")
    if not isinstance(function, dict):
        return ".function: must be an object with a name and arguments"
    if not isinstance(function.get("name"), str) or not function["name"]:
        return ".function.name: must be a non-empty string"
    if not isinstance(function.get("arguments", ""), str):
        return ".function.arguments: must be a string (JSON text)"
    return None


class MessageSink(Protocol):
    """Where history changes are persisted (the session store, or nothing)."""

    def append_message(self, message: Message) -> None: ...

    def replace_messages(self, messages: list[Message]) -> None: ...


def user_message(content: str) -> UserMessage:
    return {"role": "user", "content": content}


def assistant_message(
    content: str | None,
    *,
    tool_calls: list[ToolCall] | None = None,
    reasoning: str | None = None,
    provider_data: dict[str, Any] | None = None,
) -> AssistantMessage:
    message: AssistantMessage = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    if reasoning:
        message["reasoning"] = reasoning
    if provider_data:
        message["provider_data"] = provider_data
    return message


def tool_message(tool_call_id: str, content: str, *, name: str | None = None) -> ToolMessage:
    message: ToolMessage = {"role": "tool", "tool_call_id": tool_call_id, "content": content}
    if name:
        message["name"] = name
    return message


def tool_calls_of(message: Message) -> list[ToolCall]:
    """The tool calls of `message`: those of an assistant message, none for any other role."""
    if message["role"] == "assistant":
        return message.get("tool_calls") or []
    return []


def shorten_message(message: Message, max_chars: int) -> Message:
    """A copy of `message` whose text and tool-call arguments are at most about `max_chars` long.

    Text keeps its beginning and its end around a note of how much was cut; arguments too long to keep
    become a small valid JSON object saying so. Roles, ids and the pairing of calls with results are
    untouched, so a shortened history obeys the same rules. A message already short enough is returned
    as it is.
    """
    content = message.get("content")  # an assistant message from outside may leave it out
    calls = tool_calls_of(message)
    long_text = isinstance(content, str) and len(content) > max_chars
    long_calls = any(len(call["function"].get("arguments") or "") > max_chars for call in calls)
    if not long_text and not long_calls:
        return message
    shortened = message.copy()
    if isinstance(content, str) and long_text:
        keep = max(max_chars // 2 - 40, 0)
        note = f"\n[… {len(content) - 2 * keep} characters cut to fit the context window …]\n"
        shortened["content"] = content[:keep] + note + content[len(content) - keep :]
    if long_calls and shortened["role"] == "assistant":
        shortened["tool_calls"] = [_shorten_call(call, max_chars) for call in calls]
    return shortened


def _shorten_call(call: ToolCall, max_chars: int) -> ToolCall:
    arguments = call["function"].get("arguments") or ""
    if len(arguments) <= max_chars:
        return call
    note = json.dumps({"note": f"{len(arguments)} characters of arguments cut to fit the context window"})
    return {**call, "function": {**call["function"], "arguments": note}}


def tool_call_ids(message: Message) -> list[str]:
    return [call["id"] for call in tool_calls_of(message)]


def repair_history(messages: list[Message]) -> tuple[list[Message], list[str]]:
    """Return a copy of `messages` that obeys the rules, and a note for each change made.

    Missing tool results get a synthetic "interrupted: no result"; results are put in the order of their
    calls; two user (or two assistant) messages in a row get a placeholder between them. A tool result that
    answers no call, or a system message inside the history, cannot be placed anywhere valid: it is left out
    and reported. An empty list of notes means the history was already valid.
    """
    out: list[Message] = []
    notes: list[str] = []
    pending: list[str] = []
    results: dict[str, Message] = {}

    def close_tool_block() -> None:
        for call_id in pending:
            if call_id in results:
                out.append(results.pop(call_id))
            else:
                out.append(tool_message(call_id, INTERRUPTED_RESULT))
                notes.append(f"added the missing result of tool call {call_id}")
        pending.clear()

    for message in messages:
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id in pending and call_id not in results:
                if pending[len(results)] != call_id:
                    notes.append(f"moved the result of tool call {call_id} to the order of the calls")
                results[call_id] = message
            else:
                notes.append(f"left out a tool result that answers no call ({call_id})")
            continue
        if pending:
            close_tool_block()
        previous = out[-1]["role"] if out else None
        if role == "user":
            if previous == "user":
                out.append(assistant_message(NO_REPLY))
                notes.append("added a placeholder reply between two user messages")
        elif role == "assistant":
            if previous in ("assistant", None):
                out.append(user_message(_CONTINUE))
                notes.append("added a placeholder user message before an assistant message")
        else:
            notes.append(f"left out a message with role {role!r} inside the history")
            continue
        out.append(message)
        pending.extend(tool_call_ids(message))
    if pending:
        close_tool_block()
    return out, notes


class History:
    """The conversation of one session, and the one place that changes it.

    Args:
        messages: an existing history (loaded or passed in); repaired on `repair()`.
        sink: where every change is persisted as it happens.
    """

    def __init__(self, messages: list[Message] | None = None, *, sink: MessageSink | None = None) -> None:
        self._messages: list[Message] = list(messages or [])
        self._sink = sink
        self._expected: deque[str] = deque()
        #: it obeys the rules (but for calls still expecting results): repaired, then only appended
        #: to through the rules, or cut before a user message. Until then repair() reads it all.
        self._mended = not self._messages
        self._recount_expected()

    @property
    def messages(self) -> list[Message]:
        """The messages, oldest first. Read it; change it only through this class."""
        return self._messages

    def __len__(self) -> int:
        return len(self._messages)

    def _recount_expected(self) -> None:
        self._expected.clear()
        for index in range(len(self._messages) - 1, -1, -1):
            role = self._messages[index].get("role")
            if role == "assistant":
                answered = {m.get("tool_call_id") for m in self._messages[index + 1 :]}
                self._expected.extend(i for i in tool_call_ids(self._messages[index]) if i not in answered)
                return
            if role == "user":
                return

    def append(self, message: Message) -> None:
        """Append one message, enforcing the rules, and persist it.

        The message is stored before it joins the history: when storing fails, the history is as it was.
        """
        expected = deque(self._expected)
        role = message.get("role")
        if role == "tool":
            if not expected or message.get("tool_call_id") != expected[0]:
                raise HistoryError(
                    f"tool result {message.get('tool_call_id')!r} does not answer the next pending call"
                )
            expected.popleft()
        elif role in ("user", "assistant"):
            if expected:
                raise HistoryError(f"{role} message while tool calls {list(expected)} have no result")
            if self._messages and self._messages[-1].get("role") == role:
                raise HistoryError(f"two {role} messages in a row")
            if role == "assistant" and not self._messages:
                raise HistoryError("a history cannot start with an assistant message")
            expected.extend(tool_call_ids(message))
        else:
            raise HistoryError(f"unknown role {role!r}")
        if self._sink is not None:
            self._sink.append_message(message)
        self._expected = expected
        self._messages.append(message)

    def repair(self) -> list[str]:
        """Mend a history that breaks the rules, persist the mended one, and say what changed.

        A history mended once is not read again: everything since came through append's rules."""
        if self._mended and not self._expected:
            return []
        fixed, notes = repair_history(self._messages)
        if notes:
            if self._sink is not None:
                self._sink.replace_messages(fixed)
            self._messages = fixed
            self._recount_expected()
        self._mended = True
        return notes

    def undo_last_turn(self) -> str | None:
        """Drop the last user message and everything after it (stored too); return what the user said."""
        for index in range(len(self._messages) - 1, -1, -1):
            if self._messages[index].get("role") == "user":
                said = self._messages[index].get("content")
                if self._sink is not None:
                    self._sink.replace_messages(self._messages[:index])
                self._messages = self._messages[:index]
                self._recount_expected()
                return said if isinstance(said, str) else None
        return None

    def close_open_calls(self) -> list[str]:
        """Answer the calls left without a result "interrupted: no result" and mend the rest; say what
        changed. A call cut off mid-run is answered, never run again."""
        notes: list[str] = []
        for call_id in list(self._expected):  # the common case, closed by appends rather than a rewrite
            self.append(tool_message(call_id, INTERRUPTED_RESULT))
            notes.append(f"added the missing result of tool call {call_id}")
        notes.extend(self.repair())
        return notes

    def start_turn(self, content: str) -> list[str]:
        """Begin a user turn: close whatever the last turn left open, then append the user message.

        An interrupted turn can leave tool calls without results or a user message without a reply;
        both are closed with synthetic messages first, so nothing the user said is lost or merged.
        """
        notes: list[str] = []
        content, replaced = replace_invalid_text(content)
        if replaced:
            notes.append(f"replaced {replaced} characters of the prompt that were not valid text")
        notes.extend(self.close_open_calls())
        if self._messages and self._messages[-1].get("role") == "user":
            self.append(assistant_message(NO_REPLY))
            notes.append("added a placeholder reply to the unanswered user message")
        self.append(user_message(content))
        return notes
