"""Context compression: preflight, overflow, summaries that fail, and the session lineage."""

from __future__ import annotations

import json
from pathlib import Path

from loopback import Reply, ScriptedServer

from agent_state import SessionStore
from mibyan.agent.messages import repair_history

WINDOW = 16_000


def long_history(rounds: int = 80, output_chars: int = 1000) -> list[dict]:
    """A session of tool rounds: 4 messages a round (call, result, remark, the user's go-ahead)."""
    messages: list[dict] = [
        {"role": "user", "content": "Please audit every module of the project, one by one."}
    ]
    for i in range(rounds):
        call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "read_file", "arguments": json.dumps({"path": f"src/module_{i}.py"})},
        }
        messages.append({"role": "assistant", "content": f"Reading module {i}.", "tool_calls": [call]})
        messages.append(
            {
                "role": "tool",
                "tool_call_id": f"call_{i}",
                "name": "read_file",
                "content": f"# module_{i}\n" + ("x = compute(y)\n" * (output_chars // 15)),
            }
        )
        messages.append({"role": "assistant", "content": f"Module {i} looks fine."})
        messages.append({"role": "user", "content": "Next one."})
    return messages[:-1]


def is_summary_request(body: dict) -> bool:
    return "You compress the middle of a conversation" in json.dumps(body["messages"][:1])


def configure(home: Path) -> None:
    (home / "config.yaml").write_text(f"agent: {{api_max_retries: 0}}\nmodel: {{context_window: {WINDOW}}}\n")


def test_a_long_conversation_is_compressed_and_completes(
    server: ScriptedServer, make_agent, home: Path
) -> None:
    configure(home)
    history = long_history()
    assert len(history) >= 300

    def script(body: dict) -> Reply:
        if is_summary_request(body):
            return Reply(
                text="## Goal\nAudit the modules.\n## Current state\n99 modules read, all fine.\n"
                "## Facts to remember\n- The project keeps its modules in src/.\n"
            )
        tools = sum(1 for m in body["messages"] if m["role"] == "tool")
        return Reply(text="Audit complete.") if tools >= 24 else Reply(tool_calls=[("list_directory", {})])

    server.default = script
    statuses: list[tuple[str, str]] = []
    agent = make_agent(status_callback=lambda kind, message: statuses.append((kind, message)))
    original_session = agent.session_id

    result = agent.run_conversation("Now summarize the audit.", conversation_history=history)

    assert result["final_response"] == "Audit complete."
    agent_requests = [s.body for s in server.requests if not is_summary_request(s.body)]
    for body in agent_requests:
        assert len(json.dumps(body["messages"])) / 4 < WINDOW
        assert repair_history(body["messages"][1:])[1] == []
    first = agent_requests[0]["messages"]
    expected = [*history, {"role": "user", "content": "Now summarize the audit."}]
    assert first[1] == expected[0]
    assert first[-20:] == expected[-20:]
    assert first[2]["content"].startswith("[Summary of")
    assert any(kind == "compressed" and "→" in message for kind, message in statuses)

    store = SessionStore.open(home)
    child = result["session_id"]
    assert child != original_session
    assert store.get_session(child)["parent_id"] == original_session
    assert store.get_session(original_session)["end_reason"] == "compressed"
    assert store.search("module_42")[0]["session_id"] == original_session
    assert make_agent(session_id=original_session).session_id == child
    assert store.facts.relevant("where are the modules kept?") == ["The project keeps its modules in src/."]


def test_a_failing_summarizer_still_leaves_a_valid_history(
    server: ScriptedServer, make_agent, home: Path
) -> None:
    configure(home)
    server.default = lambda body: Reply(status=500) if is_summary_request(body) else Reply(text="carried on")

    result = make_agent().run_conversation("go on", conversation_history=long_history())

    assert result["final_response"] == "carried on"
    assert repair_history(result["messages"])[1] == []
    summary = result["messages"][1]["content"]
    assert "details of these messages were dropped" in summary


def test_context_overflow_is_compressed_and_retried_once(
    server: ScriptedServer, make_agent, home: Path
) -> None:
    (home / "config.yaml").write_text("agent: {api_max_retries: 0}\n")  # a large window: no preflight
    overflow = Reply(
        status=400,
        error_body={
            "error": {
                "message": "This model's maximum context length is 8192 tokens",
                "code": "context_length_exceeded",
            }
        },
    )
    server.add(overflow)
    server.default = lambda body: (
        Reply(text="summary") if is_summary_request(body) else Reply(text="fits now")
    )

    result = make_agent().run_conversation("next", conversation_history=long_history(rounds=40))

    assert result["final_response"] == "fits now"
    assert len(server.requests) == 3  # the overflow, the summary, the retry
    assert len(server.requests[2].body["messages"]) < len(server.requests[0].body["messages"])


def test_overflow_that_persists_is_one_clear_error(server: ScriptedServer, make_agent, home: Path) -> None:
    (home / "config.yaml").write_text("agent: {api_max_retries: 0}\n")
    server.default = lambda body: (
        Reply(text="s")
        if is_summary_request(body)
        else Reply(status=400, error_body={"error": {"message": "prompt is too long"}})
    )
    result = make_agent().run_conversation("next", conversation_history=long_history(rounds=40))
    assert result["exit_reason"] == "error"
    assert "prompt is too long" in result["error"]
    assert repair_history(result["messages"])[1] == []


def test_manual_compress(server: ScriptedServer, make_agent) -> None:
    server.default = lambda body: (
        Reply(text="short summary") if is_summary_request(body) else Reply(text="ok")
    )
    agent = make_agent()
    agent.run_conversation("start", conversation_history=long_history(rounds=30))
    before = agent.session_id

    report = agent.compress()

    assert report["compressed"] is True and report["session_id"] != before
    assert "summarized" in report["report"]


def test_the_last_protect_last_n_messages_are_kept_verbatim_when_they_fit_the_window(
    scripted, make_scripted_agent, home: Path
) -> None:
    # 28 turns of about 380 tokens a message: the newest 20 (about 7.6k tokens) fit the 16k window,
    # though not under the preflight threshold (half of it): they are kept as they are all the same
    configure(home)
    history: list[dict] = []
    for turn in range(28):
        history.append({"role": "user", "content": f"Question {turn}: " + "why is that so? " * 95})
        history.append({"role": "assistant", "content": f"Answer {turn}: " + "because it is. " * 100})

    def script(body: dict) -> Reply:
        if is_summary_request(body):
            return Reply(text="summary")
        usage = {"prompt_tokens": len(json.dumps(body)) // 4, "completion_tokens": 5}  # as sent
        if any(m["role"] == "tool" for m in body["messages"]):
            return Reply(text="ok", usage=usage)
        return Reply(tool_calls=[("list_directory", {})], usage=usage)

    scripted.default = script
    kinds: list[str] = []
    agent = make_scripted_agent(status_callback=lambda kind, message: kinds.append(kind))
    result = agent.run_conversation("go on", conversation_history=history)

    assert result["final_response"] == "ok"
    asked = [r.body["messages"] for r in scripted.requests if not is_summary_request(r.body)]
    sent = asked[0]
    # the next request is over the threshold too, but there is too little outside the tail to summarize
    assert len(asked) == 2 and asked[1][:-2] == sent and kinds.count("compressed") == 1
    expected = [*history, {"role": "user", "content": "go on"}]
    assert sent[2]["content"].startswith("[Summary of")
    assert sent[-20:] == expected[-20:]  # the newest 20, word for word
    # the system prompt, the task, the summary, the note that the conversation goes on, the 20
    assert len(sent) == 4 + 20
