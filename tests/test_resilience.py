"""Errors, retries, credential refresh, failover and truncation, on loopback servers."""

from __future__ import annotations

from pathlib import Path

import pytest
from loopback import Reply, ScriptedServer

from agent_state import SessionStore


def overloaded(status: int = 529, retry_after: float | None = None) -> Reply:
    headers = {"retry-after": str(retry_after)} if retry_after is not None else {}
    return Reply(
        status=status,
        error_body={"error": {"message": "Overloaded", "type": "overloaded_error"}},
        headers=headers,
    )


def configure(home: Path, text: str) -> None:
    (home / "config.yaml").write_text(text)


@pytest.mark.parametrize("status", [429, 500, 503, 529])
def test_transient_errors_are_retried(server: ScriptedServer, make_agent, home: Path, status: int) -> None:
    configure(home, "agent: {api_max_retries: 2}\n")
    server.add(overloaded(status, retry_after=0.05), Reply(text="second time lucky"))
    statuses: list[str] = []
    result = make_agent(status_callback=lambda kind, message: statuses.append(kind)).run_conversation("hi")
    assert result["final_response"] == "second time lucky"
    assert statuses == ["retry"]


def with_fallback(home: Path, server: ScriptedServer, retries: int = 1, extra: str = "") -> None:
    configure(
        home,
        f"""
agent: {{api_max_retries: {retries}, max_retry_wait: 0.1}}
model: {{provider: primary, name: primary-model}}
providers:
  primary: {{base_url: "{server.base_url}", api_mode: chat_completions}}
  backup: {{base_url: "{server.base_url}", api_mode: chat_completions}}
fallback_providers: [{{provider: backup, model: backup-model}}]
{extra}""",
    )


def by_model(body: dict) -> Reply:
    if body["model"] == "primary-model":
        return overloaded(529)
    tools_done = sum(1 for m in body["messages"] if m["role"] == "tool")
    return (
        Reply(text=f"done after {tools_done}")
        if tools_done >= 3
        else Reply(tool_calls=[("list_directory", {})])
    )


def test_a_failing_primary_hands_the_conversation_to_the_fallback(server: ScriptedServer, home: Path) -> None:
    from run_agent import AIAgent

    with_fallback(home, server)
    server.default = by_model
    events: list[tuple[str, str]] = []
    agent = AIAgent(home=home, status_callback=lambda kind, message: events.append((kind, message)))

    result = agent.run_conversation("three rounds please")

    assert result["final_response"] == "done after 3"
    models = [seen.body["model"] for seen in server.requests]
    assert models[:2] == ["primary-model", "primary-model"]  # the first try and one retry
    assert set(models[2:]) == {"backup-model"}
    assert any(kind == "failover" for kind, _ in events)
    recorded = SessionStore.open(home).events.of(result["session_id"])
    assert recorded[0]["kind"] == "provider_switch" and "backup/backup-model" in recorded[0]["detail"]

    before = len(server.requests)
    agent.run_conversation("and again")
    assert server.requests[before].body["model"] == "primary-model"


def test_agents_sharing_a_health_record_skip_a_failed_primary_for_the_interval(
    server: ScriptedServer, home: Path
) -> None:
    from mibyan.agent.providers import ProviderHealth
    from run_agent import AIAgent

    def set_interval(seconds: int) -> None:
        with_fallback(home, server, retries=0)
        text = (home / "config.yaml").read_text()
        configure(
            home,
            text.replace("max_retry_wait: 0.1}", f"max_retry_wait: 0.1, health_check_interval: {seconds}}}"),
        )

    server.default = lambda body: (
        overloaded(529) if body["model"] == "primary-model" else Reply(text="backup")
    )
    health = ProviderHealth()

    def models_asked(agent: AIAgent) -> list[str]:
        before = len(server.requests)
        with agent:
            assert agent.run_conversation("hi")["final_response"] == "backup"
        return [seen.body["model"] for seen in server.requests[before:]]

    set_interval(3600)
    assert models_asked(AIAgent(home=home, provider_health=health)) == ["primary-model", "backup-model"]
    assert models_asked(AIAgent(home=home, provider_health=health)) == ["backup-model"]
    # an agent with its own record (the command line's) starts each turn with the primary, as before
    assert models_asked(AIAgent(home=home)) == ["primary-model", "backup-model"]
    set_interval(0)  # the interval has passed: the primary is asked again
    assert models_asked(AIAgent(home=home, provider_health=health)) == ["primary-model", "backup-model"]


def test_a_long_retry_after_fails_over_at_once(server: ScriptedServer, home: Path) -> None:
    from run_agent import AIAgent

    with_fallback(home, server, retries=3)
    server.default = lambda body: (
        overloaded(429, retry_after=60) if body["model"] == "primary-model" else Reply(text="from the backup")
    )

    kinds: list[str] = []
    result = AIAgent(home=home, status_callback=lambda kind, message: kinds.append(kind)).run_conversation(
        "hurry"
    )

    assert result["final_response"] == "from the backup"
    # No retry (and so no wait) on the primary: the backup was asked right after the first refusal.
    assert kinds == ["failover"]
    assert [seen.body["model"] for seen in server.requests] == ["primary-model", "backup-model"]


def test_401_rereads_the_key_once_before_failing_over(
    server: ScriptedServer, home: Path, tmp_path: Path
) -> None:
    from run_agent import AIAgent

    key_file = tmp_path / "key"
    key_file.write_text("old-key")
    with_fallback(home, server, retries=0)
    configure(
        home,
        (home / "config.yaml")
        .read_text()
        .replace(
            "api_mode: chat_completions}",
            f"api_mode: chat_completions, api_key_command: 'cat {key_file}'}}",
            1,
        ),
    )
    unauthorized = Reply(status=401, error_body={"error": {"message": "Incorrect API key provided"}})
    server.add(unauthorized)
    agent = AIAgent(home=home)
    key_file.write_text("new-key")  # the user rotated the key after mibyan started
    server.add(Reply(text="welcome back"))

    result = agent.run_conversation("hi")

    assert result["final_response"] == "welcome back"
    assert [s.headers["authorization"] for s in server.requests] == ["Bearer old-key", "Bearer new-key"]


def test_401_with_no_new_key_fails_over(server: ScriptedServer, home: Path) -> None:
    from run_agent import AIAgent

    with_fallback(home, server, retries=0)
    server.default = lambda body: (
        Reply(status=401, error_body={"error": {"message": "bad key"}})
        if body["model"] == "primary-model"
        else Reply(text="backup answers")
    )
    assert AIAgent(home=home).chat("hi") == "backup answers"


def test_when_every_provider_fails_the_error_is_one_clear_line(server: ScriptedServer, home: Path) -> None:
    from conftest import run_cli

    with_fallback(home, server, retries=0)
    server.default = lambda body: overloaded(529)
    done = run_cli("chat", "-q", "hi", "-Q", home=home)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith("mibyan: HTTP 529")
    assert "Traceback" not in done.stderr


def test_cut_text_is_continued_and_joined(server: ScriptedServer, make_agent) -> None:
    server.add(Reply(text="The first half, ", finish_reason="length"), Reply(text="and the second half."))
    result = make_agent().run_conversation("write a lot")
    assert result["final_response"] == "The first half, and the second half."
    assert result["messages"][-1]["content"] == "The first half, and the second half."
    continuation = server.requests[1].body["messages"]
    assert continuation[-2] == {"role": "assistant", "content": "The first half, "}
    assert "Continue exactly where it stopped" in continuation[-1]["content"]


def test_cut_tool_calls_are_not_run(server: ScriptedServer, make_agent, tmp_path: Path) -> None:
    target = tmp_path / "big.txt"
    server.add(
        Reply(
            tool_calls=[("write_file", {"path": str(target), "content": "partial"})], finish_reason="length"
        ),
        Reply(text="I will write it in parts."),
    )
    result = make_agent().run_conversation("write a big file")
    assert not target.exists()
    tool = next(m for m in result["messages"] if m["role"] == "tool")
    assert tool["content"].startswith("not run: this call was cut off")
    assert result["final_response"] == "I will write it in parts."


def test_a_stalled_fallback_chain_gets_one_grace_call(server: ScriptedServer, home: Path) -> None:
    from run_agent import AIAgent

    with_fallback(home, server, retries=0)
    server.default = lambda body: (
        Reply(reasoning="hmm") if body["model"] == "primary-model" else Reply(text="the backup answers")
    )
    result = AIAgent(home=home, max_iterations=3).run_conversation("answer")
    assert result["final_response"] == "the backup answers"
    assert [s.body["model"] for s in server.requests] == ["primary-model"] * 3 + ["backup-model"]
