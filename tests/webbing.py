"""Real sessions for the viewer's tests: written by real agents (AIAgent on the loopback server), with
hostile text in every place the viewer shows, a refused and an approved command, an interrupted call,
a subagent, a compression, a gateway channel, and 100,000 more messages put in fast through the store's
own schema.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loopback import Reply, ScriptedServer

from agent_state import SessionStore
from bench.sessions import WORDS

XSS = "<script>alert('owned')</script>"
ESC = "\x1b[2J\x1b]0;pwned\x07"
#: The model's name for the gateway session: it shows in the list and on the page.
HOSTILE_MODEL = '"><img src=x onerror=alert(1)>'
SECRET_WORD = "zanzibarite"


@dataclass
class Sessions:
    main: str  # the CLI session that was compressed
    child: str  # where it went on after the compression
    subagent: str
    gateway: str
    channel: str


def _last_user(messages: list[dict[str, Any]]) -> int:
    return max(i for i, m in enumerate(messages) if m["role"] == "user")


def _reply(body: dict[str, Any]) -> Reply:
    messages = body["messages"]
    if "You compress the middle of a conversation" in json.dumps(messages[:1]):
        return Reply(text="Summary: the user asked for a look around; a subagent did it.")
    turn = messages[_last_user(messages) :]
    said = str(turn[0]["content"])
    results = sum(1 for m in turn if m["role"] == "tool")
    if said.startswith("Task: "):  # the subagent
        if not results:
            return Reply(tool_calls=[("list_directory", {})])
        return Reply(text=f"child report {XSS}")
    if "gateway" in said or "and now" in said:
        return Reply(text=f"an answer for the channel, **bold** {ESC}")
    script = [
        Reply(
            text=f"Let me look. [click](javascript:alert(1)) [docs](https://example.com/d) {ESC}",
            reasoning=f"thinking {ESC} hard",
            tool_calls=[
                ("terminal", {"command": f"echo '{XSS}'"}),
                ("terminal", {"command": "rm -rf /"}),  # never runs
                ("terminal", {"command": "rm -r ./no-such-folder"}),  # asks first; the user says yes
            ],
        ),
        Reply(tool_calls=[("delegate_task", {"goal": "look around"})]),
        Reply(text=f"Done. {XSS} `code`", usage={"prompt_tokens": 900, "completion_tokens": 40}),
    ]
    answered = sum(1 for m in turn if m["role"] == "assistant")
    return script[min(answered, 2)]


def make_sessions(home: Path, server: ScriptedServer) -> Sessions:
    """Write the viewer's test sessions into `home` through real agents (and the gateway's ledger)."""
    from mibyan.gateway.ledger import Ledger
    from run_agent import AIAgent

    server.default = _reply
    history = []
    for i in range(12):  # enough for a compression to have something to summarize
        history += [
            {"role": "user", "content": f"step {i}: {XSS if i == 0 else ''} read module {i}"},
            {"role": "assistant", "content": f"module {i} is fine " * 30},
        ]

    def approve(command: str, reason: str) -> str:
        return "once"

    with AIAgent(base_url=server.base_url, home=home, source="cli", approval_callback=approve) as agent:
        agent.run_conversation(f"Please {XSS} {ESC} look around", conversation_history=history)
        main = agent.session_id
        agent.compress()
        agent.run_conversation("and now?")
        child = agent.session_id
    dangling = [
        {"role": "user", "content": "start"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_cut", "type": "function", "function": {"name": "terminal", "arguments": "{}"}}
            ],
        },
    ]
    with AIAgent(model=HOSTILE_MODEL, base_url=server.base_url, home=home, source="gateway") as agent:
        agent.run_conversation("hello gateway", conversation_history=dangling)
        gateway = agent.session_id
    channel = "meepa/api/<b>alice</b>"
    with SessionStore.open(home) as store:
        Ledger(store).tag_session(gateway, channel)
        (subagent,) = [r["id"] for r in store.list_sessions() if r["source"] == "subagent"]
    return Sessions(main=main, child=child, subagent=subagent, gateway=gateway, channel=channel)


_WORDS = WORDS[:13]  # the benchmark's filler words: none of them is the secret one


def fill_messages(home: Path, *, total: int, sessions: int, secret_at: tuple[int, int]) -> str:
    """Add `total` plain messages over `sessions` sessions, in one transaction through the store's own
    schema (its triggers index them); the message at (session index, seq) `secret_at` says
    SECRET_WORD. Returns the id of that session."""
    per = total // sessions
    now = time.time() - 3600
    with SessionStore.open(home) as store, store.transaction() as db:
        db.executemany(
            "INSERT INTO sessions (id, title, source, model, created_at, updated_at, message_count)"
            " VALUES (?, ?, 'cli', 'bulk-model', ?, ?, ?)",
            [(f"bulk{s:05d}", f"bulk session {s}", now + s, now + s, per) for s in range(sessions)],
        )

        def rows() -> Any:
            for s in range(sessions):
                for seq in range(per):
                    text = " ".join(_WORDS[(s + seq + k) % len(_WORDS)] for k in range(8))
                    if (s, seq) == secret_at:
                        text += f" the {SECRET_WORD} is here"
                    role = "user" if seq % 2 == 0 else "assistant"
                    yield (f"bulk{s:05d}", seq, role, text, now + s)

        # The store's own insert trigger, set aside while the rows go in and the index is rebuilt at
        # once (ten times faster than a row at a time), then put back as it was.
        (trigger,) = db.execute("SELECT sql FROM sqlite_master WHERE name = 'messages_ai'").fetchone()
        db.execute("DROP TRIGGER messages_ai")
        db.executemany(
            "INSERT INTO messages (session_id, seq, role, content, created_at) VALUES (?, ?, ?, ?, ?)", rows()
        )
        db.execute("INSERT INTO messages_fts(messages_fts) VALUES ('rebuild')")
        db.execute(trigger)
    return f"bulk{secret_at[0]:05d}"


def text_of(html: str) -> str:
    """The page without its tags (what a reader sees), entities left as they are."""
    return re.sub(r"<[^>]+>", "", html)
