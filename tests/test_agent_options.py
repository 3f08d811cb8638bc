"""AgentOptions: one frozen value that builds the same agent as AIAgent's keyword arguments."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from loopback import Reply, ScriptedServer


def _requests_alike(server: ScriptedServer, first: int, second: int) -> None:
    one, two = server.requests[first].body, server.requests[second].body
    assert one["model"] == two["model"]
    assert one["stream"] is two["stream"]
    assert [t["function"]["name"] for t in one["tools"]] == [t["function"]["name"] for t in two["tools"]]
    assert one["messages"][1:] == two["messages"][1:]


def test_options_and_keyword_arguments_build_the_same_agent(
    server: ScriptedServer, home: Path, tmp_path: Path
) -> None:
    from mibyan.agent.callbacks import Callbacks
    from run_agent import AgentOptions, AIAgent

    work = tmp_path / "work"
    work.mkdir()
    server.add(Reply(text="one"), Reply(text="two"))
    said: dict[str, list[str]] = {"kwargs": [], "options": []}
    given: dict[str, Any] = {
        "model": "m-7",
        "base_url": server.base_url,
        "home": home,
        "max_iterations": 7,
        "stream": False,
        "source": "script",
        "denied_tools": ["terminal"],
        "workdir": work,
    }
    options = AgentOptions(
        **given, callbacks=Callbacks(step_callback=lambda info: said["options"].append(info["finish_reason"]))
    )
    with (
        AIAgent(
            **given, step_callback=lambda info: said["kwargs"].append(info["finish_reason"])
        ) as by_kwargs,
        AIAgent(options=options) as by_options,
    ):
        assert by_kwargs.runtime == by_options.runtime
        assert by_kwargs.settings == by_options.settings
        assert by_options.settings.agent.max_turns == 7
        assert by_kwargs.workdir == by_options.workdir == work.resolve()
        assert by_kwargs.tool_schemas == by_options.tool_schemas
        assert "terminal" not in {schema.name for schema in by_options.tool_schemas}
        assert by_kwargs.chat("hello") == "one"
        assert by_options.chat("hello") == "two"
        for agent in (by_kwargs, by_options):
            assert (agent.store.get_session(agent.session_id) or {})["source"] == "script"
    _requests_alike(server, 0, 1)
    assert said == {"kwargs": ["stop"], "options": ["stop"]}


def test_one_options_value_builds_many_agents_and_stays_as_it_was(server: ScriptedServer, home: Path) -> None:
    from run_agent import AgentOptions, AIAgent

    server.add(Reply(text="first"), Reply(text="again"))
    base = AgentOptions(base_url=server.base_url, home=home)
    with AIAgent(options=base) as first:
        first.callbacks.status_callback = print  # the agent's own callbacks, not the options'
        assert first.chat("hi") == "first"
        session = first.session_id
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.model = "other"  # type: ignore[misc]
    assert base.callbacks.status_callback is None
    with AIAgent(options=dataclasses.replace(base, session_id=session)) as resumed:
        assert resumed.session_id == session
        assert resumed.chat("more") == "again"
    assert [m["content"] for m in server.requests[1].body["messages"][1:]] == ["hi", "first", "more"]


def test_unknown_or_doubled_arguments_are_refused_as_type_errors(home: Path) -> None:
    from run_agent import AgentOptions, AIAgent

    base = AgentOptions(base_url="http://127.0.0.1:9/v1", home=home)
    with pytest.raises(TypeError, match=r"unknown AIAgent argument\(s\): stream_callback"):
        AgentOptions.from_kwargs({"home": home, "stream_callback": print})
    with pytest.raises(TypeError, match=r"unknown AIAgent argument\(s\): callbacks"):
        AIAgent(base_url="http://127.0.0.1:9/v1", home=home, callbacks=base.callbacks)
    with pytest.raises(TypeError, match="not both"):
        AIAgent(options=base, model="m-7")
    with pytest.raises(TypeError, match="must be an AgentOptions"):
        AIAgent(options={"home": home})  # type: ignore[arg-type]


def test_a_refusal_without_anyone_to_ask_says_why_in_the_callers_words(
    server: ScriptedServer, make_agent: Any, tmp_path: Path
) -> None:
    victim = tmp_path / "precious"
    victim.mkdir()
    server.add(Reply(tool_calls=[("terminal", {"command": f"rm -r {victim}"})]), Reply(text="Kept it."))

    result = make_agent(unasked="the owner is away").run_conversation("clean up")

    assert victim.exists()
    tool = next(m for m in result["messages"] if m["role"] == "tool")
    assert tool["content"].startswith("refused: the owner is away — the command was not run")
