"""The system prompt, persistent memory, facts and skills."""

from __future__ import annotations

import contextlib
import multiprocessing
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from loopback import Reply, ScriptedServer

from mibyan.agent.memory import LIMITS, MemoryStore
from mibyan.core.errors import ToolError


def system_of(body: dict) -> str:
    return body["messages"][0]["content"]


def notes_of(body: dict) -> str:
    """The end of the request, where this call's ephemeral notes go (after the user's message)."""
    return body["messages"][-1]["content"]


def test_the_prompt_is_byte_identical_across_runs_and_turns(
    server: ScriptedServer, make_agent, home: Path, tmp_path: Path, monkeypatch
) -> None:
    (home / "SOUL.md").write_text("You are Pip, a terse agent.")
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / ".git").mkdir()
    (project / "AGENTS.md").write_text("Run tests with make test.")
    monkeypatch.chdir(project / "src")
    MemoryStore(home).change("memory", "add", "The user deploys on Fridays.")
    server.default = lambda body: Reply(text="ok")

    agent = make_agent()
    agent.chat("one")
    agent.chat("two")
    make_agent().chat("three")

    prompts = [system_of(s.body) for s in server.requests]
    assert prompts[0] == prompts[1] == prompts[2]
    prompt = prompts[0]
    assert prompt.startswith("You are Pip, a terse agent.")
    assert "Run tests with make test." in prompt and "The user deploys on Fridays." in prompt
    order = [
        prompt.index(part) for part in ("Pip", "use a tool", "Project context", "Memory", "Working directory")
    ]
    assert order == sorted(order)


def test_a_memory_written_in_one_session_is_in_the_next_ones_prompt(
    server: ScriptedServer, make_agent
) -> None:
    server.add(
        Reply(tool_calls=[("memory", {"action": "add", "target": "user", "content": "Prefers tabs."})]),
        Reply(text="noted"),
        Reply(text="hello again"),
    )
    first = make_agent()
    first.chat("I like tabs")
    assert "Prefers tabs." not in system_of(server.requests[1].body)  # the prompt of a session does not move

    make_agent().chat("hi")
    assert "Prefers tabs." in system_of(server.requests[2].body)


def test_memory_limits_and_secrets(home: Path) -> None:
    memory = MemoryStore(home)
    memory.change("user", "add", "a" * (LIMITS["user"] - 10))
    with pytest.raises(ToolError, match="cut at least"):
        memory.change("user", "add", "b" * 50)
    with pytest.raises(ToolError, match="secret"):
        memory.change("memory", "add", "key: sk-proj-abcdefghijklmnopqrstuvwx")
    memory.change("memory", "add", "Uses pnpm.")
    memory.change("memory", "replace", "Uses yarn.", old="Uses pnpm.")
    assert memory.read("memory") == "Uses yarn.\n"
    with pytest.raises(ToolError, match="is not in"):
        memory.change("memory", "remove", old="npm")


def _writer(home: str, tag: str) -> None:
    memory = MemoryStore(Path(home))
    for i in range(60):
        with contextlib.suppress(ToolError):  # refused once the file is full: that is the point
            memory.change("memory", "add", f"{tag} note {i:02d} " + "x" * 20)


def test_two_writers_never_pass_the_limit(home: Path) -> None:
    context = multiprocessing.get_context("fork")
    writers = [context.Process(target=_writer, args=(str(home), tag)) for tag in ("A", "B")]
    for process in writers:
        process.start()
    for process in writers:
        process.join(30)
    text = MemoryStore(home).read("memory")
    assert len(text) <= LIMITS["memory"]
    assert {"A", "B"} <= {line.split()[0] for line in text.splitlines()}
    assert all(line.endswith("x" * 20) for line in text.splitlines())


def test_facts_come_back_when_a_message_mentions_them(server: ScriptedServer, make_agent) -> None:
    server.add(
        Reply(
            tool_calls=[("memory", {"action": "remember", "content": "The staging database is pg-stage-3."})]
        ),
        Reply(text="stored"),
        Reply(text="pg-stage-3"),
    )
    make_agent().chat("remember where staging lives")
    make_agent().chat("which staging database do we use?")
    assert "pg-stage-3" in notes_of(server.requests[-1].body)


def test_a_trigger_word_brings_its_skill_into_the_turn(
    server: ScriptedServer, make_agent, home: Path
) -> None:
    skill = home / "skills" / "release"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text(
        "---\nname: release\ndescription: Cut a release\ntriggers: [release, ship]\n---\n"
        "1. Bump the version.\n2. Tag it.\n"
    )
    server.default = lambda body: Reply(text="ok")
    agent = make_agent()
    agent.chat("what is the weather")
    agent.chat("please ship it")
    assert "release: Cut a release" in system_of(server.requests[0].body)
    assert "Bump the version" not in system_of(server.requests[0].body)
    assert "[Skill: release]" in notes_of(server.requests[1].body)
    assert system_of(server.requests[1].body) == system_of(server.requests[0].body)

    listed = subprocess.run(
        [sys.executable, "-m", "mibyan.cli.main", "skills", "list"],
        capture_output=True,
        text=True,
        env={"MIBYAN_HOME": str(home), "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert "release: Cut a release  (triggers: release, ship)" in listed.stdout


def test_skills_match_by_meaning_when_an_embedding_provider_is_set(
    server: ScriptedServer, make_agent, home: Path
):
    skill = home / "skills" / "publishing"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text(
        "---\nname: publishing\ndescription: Publishing the package to the registry\n"
        "triggers: [pypi]\n---\nRun twine upload.\n"
    )
    (home / "config.yaml").write_text(f"""
agent: {{api_max_retries: 0}}
providers: {{embedder: {{base_url: "{server.base_url}", api_mode: chat_completions}}}}
skills: {{embedding: {{provider: embedder, model: tiny-embed}}, threshold: 0.3}}
""")
    server.default = lambda body: Reply(text="ok")
    agent = make_agent()
    agent.chat("how do I get the package onto the registry?")
    agent.chat("what time is it")
    chats = [seen.body for seen in server.requests if "messages" in seen.body]
    assert "[Skill: publishing]" in notes_of(chats[0])
    assert "[Skill: publishing]" not in notes_of(chats[1])
    assert (
        sum(1 for seen in server.requests if seen.path.endswith("/embeddings")) == 2
    )  # skills embedded once


def test_reload_applies_a_memory_change_within_the_session(
    server: ScriptedServer, make_agent, home: Path
) -> None:
    server.default = lambda body: Reply(text="ok")
    agent = make_agent()
    agent.chat("one")
    MemoryStore(home).change("memory", "add", "Releases go out on Tuesdays.")
    agent.chat("two")
    agent.reload_prompt()
    agent.chat("three")
    prompts = [system_of(s.body) for s in server.requests]
    assert "Tuesdays" not in prompts[1] and "Tuesdays" in prompts[2]
    make_agent(session_id=agent.session_id).chat("four")  # resumed: the stored, reloaded prompt
    assert "Tuesdays" in system_of(server.requests[-1].body)


def _skill(home: Path, name: str, description: str) -> Path:
    folder = home / "skills" / name
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "SKILL.md"
    path.write_text(f"---\nname: {name}\ndescription: {description}\ntriggers: [{name}]\n---\nDo {name}.\n")
    return path


def test_parsed_skills_are_kept_in_a_private_index_and_an_edit_is_seen_at_once(
    server: ScriptedServer, make_agent, home: Path
) -> None:
    import os
    import stat

    path = _skill(home, "deploy", "Deploy the service")
    server.default = lambda body: Reply(text="ok")
    make_agent().chat("hello")

    index = home / "cache" / "skills.json"
    assert stat.S_IMODE(index.stat().st_mode) == 0o600
    assert "Deploy the service" in index.read_text()

    _skill(home, "deploy", "Deploy the service to production, carefully")
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))
    make_agent().chat("deploy it")
    prompt = system_of(server.requests[-1].body)
    assert "deploy: Deploy the service to production, carefully" in prompt
    assert "[Skill: deploy]\nDo deploy." in notes_of(server.requests[-1].body)
