"""An unknown model's context window is asked of its server once, kept in the home, and used."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from loopback import Reply, ScriptedServer
from test_context import is_summary_request, long_history

LOCAL_MODEL = "my-local-model"
WINDOW = 8_000

LISTINGS = {
    "vLLM": {"id": LOCAL_MODEL, "object": "model", "max_model_len": WINDOW},
    "llama.cpp": {"id": LOCAL_MODEL, "object": "model", "meta": {"n_ctx_train": WINDOW, "n_vocab": 32000}},
    "LM Studio": {"id": LOCAL_MODEL, "object": "model", "max_context_length": WINDOW},
    "OpenRouter": {"id": LOCAL_MODEL, "context_length": WINDOW, "name": "My local model"},
}


def answer(body: dict) -> Reply:
    return Reply(text="summary" if is_summary_request(body) else "answered")


@pytest.mark.parametrize("kind", list(LISTINGS))
def test_the_window_a_server_reports_is_used(server: ScriptedServer, make_agent, kind: str) -> None:
    server.models = [
        {"id": "another-model", "max_model_len": 999_999, "context_length": 999_999},
        LISTINGS[kind],
    ]
    server.default = answer

    result = make_agent(model=LOCAL_MODEL).run_conversation(
        "go on", conversation_history=long_history(rounds=40)
    )

    assert result["exit_reason"] == "completed", result["error"]
    assert server.model_listings == 1
    assert any(is_summary_request(seen.body) for seen in server.requests)  # 8k, not 128k: compressed


def test_the_answer_is_kept_per_server_and_model_and_asked_once_ever(
    server: ScriptedServer, make_agent, home: Path
) -> None:
    server.models = [LISTINGS["vLLM"]]
    server.default = answer
    for _ in range(3):
        make_agent(model=LOCAL_MODEL).chat("hi")

    assert server.model_listings == 1
    cache = home / "cache" / "context_windows.json"
    assert stat.S_IMODE(cache.stat().st_mode) == 0o600
    assert json.loads(cache.read_text())[f"{server.base_url}|{LOCAL_MODEL}"] == WINDOW


@pytest.mark.parametrize("models", [None, [{"id": LOCAL_MODEL, "object": "model"}]])
def test_a_server_that_does_not_say_is_asked_once_and_the_table_used(
    server: ScriptedServer, make_agent, models
) -> None:
    server.models = models
    server.default = answer
    for _ in range(2):
        result = make_agent(model=LOCAL_MODEL).run_conversation(
            "go on", conversation_history=long_history(rounds=40)
        )
        assert result["exit_reason"] == "completed", result["error"]

    assert server.model_listings == 1
    assert not any(is_summary_request(seen.body) for seen in server.requests)  # 128k: nothing to compress


def test_a_known_model_never_waits_for_the_listing(server: ScriptedServer, make_agent) -> None:
    server.models = [{"id": "gpt-4o-mini", "max_model_len": WINDOW}]
    server.add(Reply(text="hi"))
    make_agent(model="gpt-4o-mini").chat("hi")
    assert server.model_listings == 0


def test_a_configured_window_wins_over_the_server(server: ScriptedServer, make_agent, home: Path) -> None:
    (home / "config.yaml").write_text("agent: {api_max_retries: 0}\nmodel: {context_window: 500000}\n")
    server.models = [LISTINGS["vLLM"]]
    server.add(Reply(text="hi"))
    make_agent(model=LOCAL_MODEL).chat("hi")
    assert server.model_listings == 0


@pytest.mark.parametrize(("owner", "asked"), [("llamacpp", True), ("vllm", False)])
def test_a_llama_cpp_server_is_asked_for_its_prompt_progress(
    server: ScriptedServer, make_agent, owner: str, asked: bool
) -> None:
    # llama.cpp reads a prompt in batches and sees a client that gave up only when it writes to it: its
    # progress chunks let a stopped call free the server's slot at once instead of after the whole prompt
    server.models = [{**LISTINGS["llama.cpp"], "owned_by": owner}]
    server.default = lambda _body: Reply(text="answered", progress=4)
    for _ in range(2):  # the second agent knows it from the home's cache: no listing asked again
        result = make_agent(model=LOCAL_MODEL).run_conversation("hi")
        assert result["final_response"] == "answered"

    assert server.model_listings == 1
    assert [seen.body.get("return_progress", False) for seen in server.requests] == [asked, asked]


def test_a_server_whose_answers_say_llama_cpp_is_asked_for_progress_from_then_on(
    server: ScriptedServer, make_agent
) -> None:
    # a known model's name (no listing is asked): its first answer's `Server` header tells; the home keeps it
    server.default = lambda _body: Reply(text="answered", headers={"Server": "llama.cpp"}, progress=2)
    agent = make_agent(model="gpt-4o-mini")
    agent.chat("one")
    agent.chat("two")
    make_agent(model="gpt-4o-mini").chat("three")

    assert server.model_listings == 0
    assert [seen.body.get("return_progress", False) for seen in server.requests] == [False, True, True]
