"""The default context engine: prune old tool outputs, then summarize the middle of the conversation.

What is kept intact: the first user message (the task) and the newest `compression.protect_last_n`
messages (the boundary moves back so a tool call is never cut from its results), fewer only when those
alone would not fit the window (after an overflow: the target). What goes: first the bulk of old tool
outputs; if that is not enough, the middle is summarized by the auxiliary model with a structured
prompt; if the result is still too big, the longest texts and tool arguments before the tail are cut
(their beginning and end kept, the pairing of calls untouched), and the tail's only if it leaves too
little of the window.
If summarizing fails, a deterministic summary says plainly that details were dropped.
The result always obeys the message rules. The summary also lists facts worth keeping beyond the
session; the agent stores them (the memory flush) before the summarized messages leave the context.
"""

from __future__ import annotations

import re

from mibyan.agent.context_engine import CompressionResult, ContextEngine
from mibyan.agent.messages import (
    Message,
    assistant_message,
    shorten_message,
    tool_calls_of,
    user_message,
)
from mibyan.tools.schema import ToolSchema

_PRUNE_ABOVE = 600  # characters: tool outputs longer than this are pruned first
_RESULT_IN_PROMPT = 1500
_PROMPT_LIMIT = 120_000
_TARGET_SHARE = 0.6  # after compressing, aim for this share of the threshold
_TAIL_SHARE = 0.8  # the protected tail may take this much of the room left; the rest is for the summary
_WORTH_SUMMARIZING = 0.25  # of the threshold: less before the protected tail is not compressed for
_CUT_FLOOR = 400  # characters: no message is cut shorter than this
_PROMPT_SHARE_OF_WINDOW = 2.0  # the summarizer's excerpt: at most half the window (4 characters a token)

SUMMARY_SYSTEM = (
    "You compress the middle of a conversation between a user and a software agent so the agent can go "
    "on working without it. Be factual and specific: keep file paths, names, commands, numbers and "
    "decisions. Do not invent anything."
)
SUMMARY_PROMPT = """Summarize the conversation excerpt below under these headings:

## Goal
## Decisions made
## Files touched
## Current state
## Pending work
## Facts to remember
(durable facts worth keeping beyond this session - about the user, the project, decisions - one per
line starting with "- "; write "none" if there are none)

Excerpt ({count} messages):

{excerpt}"""

_SUMMARY_HEADER = "[Summary of {count} earlier messages, compressed to fit the context window]\n\n"
_AFTER_SUMMARY = "[The conversation continues after the summary above.]"


def facts_in(summary: str) -> list[str]:
    """The lines of the summary's "Facts to remember" section."""
    match = re.search(r"^#+\s*Facts to remember\s*$(.*?)(?=^#+\s|\Z)", summary, re.M | re.S | re.I)
    if not match:
        return []
    facts = [line.strip().lstrip("-*• ").strip() for line in match.group(1).splitlines()]
    return [
        fact for fact in facts if fact and fact.lower().rstrip(".") != "none" and not fact.startswith("(")
    ]


def render_excerpt(messages: list[Message], limit: int = _PROMPT_LIMIT) -> str:
    lines: list[str] = []
    for message in messages:
        role = message["role"]
        if role == "tool":
            text = str(message.get("content") or "")
            if len(text) > _RESULT_IN_PROMPT:
                text = text[:_RESULT_IN_PROMPT] + f" […{len(text) - _RESULT_IN_PROMPT} more characters]"
            lines.append(f"TOOL RESULT ({message.get('name') or message.get('tool_call_id')}): {text}")
            continue
        if message.get("content"):
            lines.append(f"{role.upper()}: {message['content']}")
        for call in tool_calls_of(message):
            lines.append(f"ASSISTANT CALLED {call['function']['name']}({call['function'].get('arguments')})")
    excerpt = "\n\n".join(lines)
    if len(excerpt) > limit:
        half = limit // 2
        left_out = len(excerpt) - limit
        excerpt = f"{excerpt[:half]}\n\n[… {left_out} characters left out …]\n\n{excerpt[-half:]}"
    return excerpt


def fallback_summary(messages: list[Message]) -> str:
    """A summary made without a model: what was asked and which tools ran. It says what was lost."""
    asks = [
        str(m.get("content") or "").strip().splitlines()[0][:160]
        for m in messages
        if m["role"] == "user" and str(m.get("content") or "").strip()
    ]
    tools = sorted({call["function"]["name"] for m in messages for call in tool_calls_of(m)})
    parts = ["The summarizer was not available, so the details of these messages were dropped."]
    if asks:
        parts.append("The user asked: " + " | ".join(asks[-10:]))
    if tools:
        parts.append("Tools used: " + ", ".join(tools))
    return "\n".join(parts)


class ContextCompressor(ContextEngine):
    """Prune, then summarize, then cut what is still too big; never break a history."""

    def should_compress(
        self, messages: list[Message], *, system_prompt: str, tools: list[ToolSchema], threshold: float
    ) -> bool:
        """Past `threshold` of the window, when compressing would win something: a protected tail may
        be past the threshold by itself, and summarizing the two messages that just left it, at every
        request, would cost a summary and a session each time. So it waits until what lies before the
        tail is worth it, or the history nears the window."""
        total = self.estimator.estimate(messages, system_prompt, tools)
        if total <= threshold * self.window:
            return False
        if total > self.window * _TAIL_SHARE:
            return True
        tail = self._tail_start(messages, self.settings.compression.protect_last_n)
        return self.estimator.estimate(messages[1:tail]) > threshold * self.window * _WORTH_SUMMARIZING

    @staticmethod
    def _tail_start(messages: list[Message], protect: int) -> int:
        start = max(1, len(messages) - protect)
        while start > 1 and messages[start]["role"] == "tool":
            start -= 1
        return start

    def _target(self, before: int, reason: str) -> float:
        target = self.settings.compression.threshold * self.window * _TARGET_SHARE
        if reason == "overflow":
            # The provider refused a request we thought fitted: its window is smaller than we know.
            target = min(target, before * 0.5)
        return target

    def _fitting_tail(
        self, messages: list[Message], system_prompt: str, tools: list[ToolSchema], limit: float
    ) -> int:
        """Where the protected tail starts: the newest `protect_last_n` messages, or fewer when those alone
        would not fit `limit` beside the task and leave room for the summary (halving down to the last
        message). The tail is protected against the window, not the preflight target: that it would not
        fit under the threshold is no reason to summarize what the user said a moment ago."""
        fixed = self.estimator.estimate([], system_prompt, tools)  # sent whatever the history holds
        room = (limit - fixed) * _TAIL_SHARE
        protect = self.settings.compression.protect_last_n
        while True:
            tail = self._tail_start(messages, protect)
            if protect <= 1 or self.estimator.estimate([messages[0], *messages[tail:]]) <= room:
                return tail
            protect //= 2

    def compress(
        self, messages: list[Message], *, system_prompt: str, tools: list[ToolSchema], reason: str
    ) -> CompressionResult | None:
        before = self.estimator.estimate(messages, system_prompt, tools)
        target = self._target(before, reason)
        # after an overflow the window is smaller than we know: the target is all that is known to fit
        limit = target if reason == "overflow" else self.window
        tail = self._fitting_tail(messages, system_prompt, tools, limit)
        pruned, count = self._prune(messages, tail)
        after = self.estimator.estimate(pruned, system_prompt, tools)
        # On request, or after the provider said the request was too long, pruning alone is not trusted.
        if after <= target and reason not in ("manual", "overflow"):
            return CompressionResult(pruned, before, after, summarized=0, pruned=count)
        summarized, failed, facts = 0, False, list[str]()
        compressed = pruned
        if tail > 1:
            compressed, failed, facts = self._summarize_middle(pruned, tail)
            summarized = tail - 1
        kept = len(messages) - tail  # the protected tail, at the end of `compressed` too
        compressed, cut = self._cut_to_fit(compressed, system_prompt, tools, target, keep=kept)
        if self.estimator.estimate(compressed, system_prompt, tools) > limit * _TAIL_SHARE:
            # the tail alone leaves too little of the window: its messages are cut as well
            compressed, cut = self._cut_to_fit(compressed, system_prompt, tools, target)
        if not summarized and not cut and not count:
            return None
        after = self.estimator.estimate(compressed, system_prompt, tools)
        return CompressionResult(
            compressed,
            before,
            after,
            summarized=summarized,
            pruned=0 if summarized else count,
            summary_failed=failed,
            facts=facts,
            cut=cut,
        )

    def _summarize_middle(self, messages: list[Message], tail: int) -> tuple[list[Message], bool, list[str]]:
        """The first message, a summary of those before `tail`, then the tail; whether the summary failed;
        the facts it lists."""
        middle = messages[1:tail]
        failed = False
        limit = min(_PROMPT_LIMIT, int(self.window * _PROMPT_SHARE_OF_WINDOW))
        try:
            summary = self.summarize(
                SUMMARY_SYSTEM,
                SUMMARY_PROMPT.format(count=len(middle), excerpt=render_excerpt(middle, limit=limit)),
            )
        except Exception:  # the summarizer is a side task: its failure must not break the history
            summary, failed = fallback_summary(middle), True
        compressed = [
            messages[0],
            assistant_message(_SUMMARY_HEADER.format(count=len(middle)) + summary.strip()),
        ]
        if messages[tail]["role"] == "assistant":
            compressed.append(user_message(_AFTER_SUMMARY))
        compressed.extend(messages[tail:])
        return compressed, failed, [] if failed else facts_in(summary)

    def _cut_to_fit(
        self,
        messages: list[Message],
        system_prompt: str,
        tools: list[ToolSchema],
        target: float,
        *,
        keep: int = 0,
    ) -> tuple[list[Message], int]:
        """Shorten the longest texts and arguments (halving a cap) until the history fits `target` or
        every message is down to a few hundred characters; the last `keep` messages stay as they are.
        Returns how many messages were cut."""
        head, kept = messages[: len(messages) - keep], messages[len(messages) - keep :]
        longest = max((len(str(m.get("content") or "")) for m in head), default=0)
        longest = max(
            [longest] + [len(c["function"].get("arguments") or "") for m in head for c in tool_calls_of(m)]
        )
        cap = longest
        shortened = messages
        while cap > _CUT_FLOOR and self.estimator.estimate(shortened, system_prompt, tools) > target:
            cap = max(_CUT_FLOOR, cap // 2)
            shortened = [shorten_message(m, cap) for m in head] + kept
        cut = sum(1 for old, new in zip(messages, shortened, strict=True) if old is not new)
        return shortened, cut

    @staticmethod
    def _prune(messages: list[Message], tail: int) -> tuple[list[Message], int]:
        pruned: list[Message] = []
        count = 0
        for index, message in enumerate(messages):
            content = message.get("content")
            if (
                index < tail
                and message["role"] == "tool"
                and isinstance(content, str)
                and len(content) > _PRUNE_ABOVE
            ):
                message = {
                    **message,
                    "content": f"{content[:200]}\n[… older tool output pruned: {len(content)} characters]",
                }
                count += 1
            pruned.append(message)
        return pruned, count
