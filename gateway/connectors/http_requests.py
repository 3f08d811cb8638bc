"""What the `http` connector reads from a request: the body of a chat completion request, checked.

Anything a client sends is checked here before it reaches the gateway: a body that is not a JSON
object we can read, that nests too deeply, holds a lone surrogate (which cannot be stored) or has a
`stream` that is not a boolean is a `BadRequest` (400); a client that hangs up before its body has
arrived is `HungUp`.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

from starlette.requests import ClientDisconnect, Request

from mibyan.agent.messages import InvalidMessage, Message, check_messages

_ROLES = frozenset({"system", "user", "assistant", "tool"})
_CHANNEL_MAX = 200
_BODY_MAX = 8 * 1024 * 1024  # bytes of one request body: a conversation, not an upload


class BadRequest(Exception):
    """The request body is not a chat completion request we can serve."""


class TooSlow(Exception):
    """The client did not send its request's body within the connector's `body_timeout`."""


class HungUp(Exception):
    """The client went away before its request's body had arrived."""


def _text_of(content: Any, where: str, *, kinds: tuple[str, ...] = ("text",)) -> str:
    """A message's text: a string, or the text of a list of content parts (`kinds` are read)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        texts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            text = part.get(kind) if isinstance(part, dict) and isinstance(kind, str) else None
            if kind in kinds and isinstance(text, str):
                texts.append(text)
            elif kind not in ("image_url", "input_audio", "file"):  # those are left out: text only
                raise BadRequest(f"{where}: a content part must be one of {', '.join(kinds)} with its text")
        if texts:
            return "".join(texts)
    raise BadRequest(f"{where}: must be a string or a list of text parts")


def _message(index: int, message: Any) -> Message:
    """One message of the request as the agent keeps it, or BadRequest naming the field at fault."""
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise BadRequest(f"{where}: must be an object")
    role = message.get("role")
    if role not in _ROLES:
        raise BadRequest(f"{where}.role: must be one of {', '.join(sorted(_ROLES))}")
    kept: dict[str, Any] = {"role": role}
    content = message.get("content")
    if role != "assistant" or content is not None:
        kinds = ("text", "refusal") if role == "assistant" else ("text",)
        kept["content"] = _text_of(content, f"{where}.content", kinds=kinds)
    elif not message.get("tool_calls"):
        raise BadRequest(f"{where}.content: an assistant message without tool calls needs its text")
    else:
        kept["content"] = None
    for key in ("tool_calls", "tool_call_id", "name"):
        if message.get(key) is not None:
            kept[key] = message[key]
    if role == "tool" and not (isinstance(kept.get("tool_call_id"), str) and kept["tool_call_id"]):
        raise BadRequest(f"{where}.tool_call_id: a tool message needs the id of the call it answers")
    if "name" in kept and not isinstance(kept["name"], str):
        raise BadRequest(f"{where}.name: must be a string")
    try:
        check_messages([kept], where="messages")
    except InvalidMessage as exc:  # the tool calls' shape: the library's rules, named at this index
        raise BadRequest(str(exc).replace("messages[0]", where, 1)) from None
    if "tool_calls" in kept:
        kept["tool_calls"] = [_call(call) for call in kept["tool_calls"]]
    return cast("Message", kept)  # each field checked above, by role


def _call(call: dict[str, Any]) -> dict[str, Any]:
    function = call["function"]
    return {
        "id": call["id"],
        "type": "function",
        "function": {"name": function["name"], "arguments": function.get("arguments") or "{}"},
    }


def parse_messages(body: dict[str, Any]) -> tuple[str, list[Message]]:
    """The new user message and the messages before it, each field checked (BadRequest names it)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    cleaned = [_message(index, message) for index, message in enumerate(messages)]
    last = cleaned[-1]
    if last["role"] != "user":
        raise BadRequest("the last message must be the user's (role 'user')")
    return str(last["content"]), cleaned[:-1]


async def read_body(request: Request, *, timeout: float) -> bytes:
    """The request body, refused (BadRequest) past `_BODY_MAX` bytes however it is sent, and (TooSlow)
    when all of it has not arrived `timeout` seconds after its headers."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > _BODY_MAX:
        raise BadRequest(f"the body is larger than {_BODY_MAX // (1024 * 1024)} MiB")
    parts: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout):
            async for part in request.stream():
                size += len(part)
                if size > _BODY_MAX:
                    raise BadRequest(f"the body is larger than {_BODY_MAX // (1024 * 1024)} MiB")
                parts.append(part)
    except ClientDisconnect:
        raise HungUp from None
    except TimeoutError:
        raise TooSlow(f"the request's body did not arrive within {timeout:g} s") from None
    return b"".join(parts)


def parse_body(data: bytes) -> dict[str, Any]:
    """The body as a JSON object (BadRequest when it is not one we can read)."""
    try:
        body = json.loads(data)
    except RecursionError:
        raise BadRequest("the body nests too deeply") from None
    except ValueError:
        raise BadRequest("the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean")
    return body


def check_text(*values: object) -> None:
    """What we keep must be text that can be stored: JSON may spell a lone surrogate (\\ud800), which
    is not."""
    try:
        json.dumps(values, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest("the body holds a lone surrogate (such as \\ud800), which is not text") from None


def check_channel(channel: object) -> str:
    """A channel id is a short printable string: it names a session and shows in `mibyan sessions`.

    Returns:
        The channel without blanks around it (` alice ` and `alice` are one channel).
    """
    if not isinstance(channel, str) or not channel.strip():
        raise BadRequest("the channel ('user' or X-Mibyan-Channel) must be a non-empty string")
    channel = channel.strip()
    if len(channel) > _CHANNEL_MAX or not channel.isprintable():
        raise BadRequest(f"the channel must be at most {_CHANNEL_MAX} printable characters")
    return channel


def check_message_key(message_key: str | None) -> None:
    """An `Idempotency-Key` is a short printable string, like a channel's id."""
    if message_key is not None and (len(message_key) > _CHANNEL_MAX or not message_key.isprintable()):
        raise BadRequest(f"Idempotency-Key must be at most {_CHANNEL_MAX} printable characters")
