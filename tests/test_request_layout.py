"""What each model call sends: a cached prefix that does not move, and request-only parts kept on retry."""

from __future__ import annotations

import json
from pathlib import Path

from loopback import Reply, ScriptedServer
from scripted_model import ScriptedModel
from test_context import is_summary_request, long_history

from mibyan.agent.messages import repair_history


def last_user_blocks(body: dict) -> list[dict]:
    return next(m for m in reversed(body["messages"]) if m["role"] == "user")["content"]


def test_matched_facts_never_move_the_cached_anthropic_system_block(
    scripted: ScriptedModel, make_scripted_agent
) -> None:
    scripted.default = lambda body: Reply(text="ok")
    agent = make_scripted_agent(api_mode="anthropic_messages")
    agent.store.facts.add("The staging database is pg-stage-3.")

    for said in ("hello there", "which staging database do we use?", "thanks"):
        agent.chat(said)

    first, matching, after = (seen.body for seen in scripted.requests)
    assert json.dumps(first["system"]) == json.dumps(matching["system"]) == json.dumps(after["system"])
    assert "pg-stage-3" not in json.dumps(first) and "pg-stage-3" not in json.dumps(after)
    question, note = last_user_blocks(matching)[-2:]
    assert question == {
        "type": "text",
        "text": "which staging database do we use?",
        "cache_control": {"type": "ephemeral"},
    }
    assert "pg-stage-3" in note["text"] and "cache_control" not in note


def test_the_retry_after_an_overflow_still_asks_for_the_budget_summary(
    server: ScriptedServer, make_agent, home: Path
) -> None:
    (home / "config.yaml").write_text("agent: {api_max_retries: 0}\n")  # a large window: no preflight
    overflow = Reply(status=400, error_body={"error": {"message": "prompt is too long"}})
    # One model call is allowed: it asks for a tool, the summary call overflows, is compressed, retried.
    server.add(Reply(tool_calls=[("list_directory", {"path": "."})]), overflow)
    server.default = lambda body: (
        Reply(text="summary") if is_summary_request(body) else Reply(text="here is what I did")
    )

    result = make_agent(max_iterations=1).run_conversation(
        "go on", conversation_history=long_history(rounds=40)
    )

    assert result["exit_reason"] == "budget_exhausted"
    assert result["final_response"] == "here is what I did"
    overflowed, retried = [s.body for s in server.requests if not is_summary_request(s.body)][1:]
    asked = "You have used all 1 model calls"
    assert asked in overflowed["messages"][-1]["content"]
    assert asked in retried["messages"][-1]["content"]
    assert len(retried["messages"]) < len(overflowed["messages"])
    assert repair_history(result["messages"])[1] == []


def test_budget_notes_come_after_the_tool_results_and_leave_the_system_prompt_alone(
    scripted: ScriptedModel, make_scripted_agent
) -> None:
    scripted.default = lambda body: Reply(tool_calls=[("list_directory", {"path": "."})])
    agent = make_scripted_agent(max_iterations=4)

    agent.run_conversation("keep looking")

    chats = [seen.body for seen in scripted.requests]
    systems = {json.dumps(body["messages"][0]) for body in chats}
    assert len(systems) == 1  # one system prompt for every call of the turn
    late = chats[2]  # the third of four calls: 75% of the budget used
    *history, note = late["messages"]
    assert history[-1]["role"] == "tool"
    assert note["role"] == "user"
    assert note["content"].startswith("[Iteration budget: 1 of 4 model calls left.")
    assert not any("Iteration budget" in json.dumps(m) for m in chats[3]["messages"][:-1])


def test_in_responses_mode_the_notes_are_the_last_input_item_and_instructions_stay_put(
    scripted: ScriptedModel, make_scripted_agent
) -> None:
    scripted.default = lambda body: Reply(tool_calls=[("list_directory", {"path": "."})])
    agent = make_scripted_agent(api_mode="codex_responses", max_iterations=4)

    agent.run_conversation("keep looking")

    bodies = [seen.body for seen in scripted.requests]
    assert len({body["instructions"] for body in bodies}) == 1
    *_, output, note = bodies[2]["input"]
    assert output["type"] == "function_call_output"
    assert note["role"] == "user"
    assert note["content"][0]["text"].startswith("[Iteration budget: 1 of 4 model calls left.")
