"""Configuration layers and the `mibyan` command, run as a real subprocess."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import ROOT, run_cli
from loopback import Reply, ScriptedServer

from mibyan.config.loader import load_settings
from mibyan.core.errors import ConfigError


def test_defaults_predefine_three_providers_and_a_500_call_budget(tmp_path: Path) -> None:
    settings = load_settings(home=tmp_path, cwd=tmp_path, env={})
    assert {"openai", "anthropic", "openrouter"} <= set(settings.providers)
    assert settings.agent.max_turns == 500


def test_layers_later_wins(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("model: {name: from-home}\nagent: {max_turns: 7}\n")
    (tmp_path / ".mibyan").mkdir()
    (tmp_path / ".mibyan" / "config.yaml").write_text("agent: {max_turns: 9}\n")
    settings = load_settings(
        home=tmp_path, cwd=tmp_path, env={"MIBYAN_MODEL": "from-env"}, overrides={"agent": {"stream": False}}
    )
    assert settings.model.name == "from-env"
    assert settings.agent.max_turns == 9
    assert settings.agent.stream is False


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("agent: {max_turn: 3}\n", "agent.max_turn: unknown key"),
        ("agent: {max_turns: -1}\n", "agent.max_turns:"),
        ("agent: [unclosed\n", "malformed YAML"),
        ("- a list\n", "top level must be a mapping"),
    ],
)
def test_a_bad_config_file_is_one_error_naming_the_file_and_key(
    tmp_path: Path, text: str, expected: str
) -> None:
    (tmp_path / "config.yaml").write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_settings(home=tmp_path, cwd=tmp_path, env={})
    assert str(tmp_path / "config.yaml") in str(caught.value)
    assert expected in str(caught.value)


def test_cli_one_shot_prints_the_answer_on_stdout_and_progress_on_stderr(
    server: ScriptedServer, home
) -> None:
    server.add(Reply(tool_calls=[("list_directory", {"path": "."})]), Reply(text="The folder is tidy."))
    done = run_cli("chat", "-q", "look around", "--base-url", server.base_url, home=home)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "The folder is tidy.\n"
    assert "list_directory" in done.stderr


@pytest.mark.parametrize("api_mode", ["chat_completions", "codex_responses", "anthropic_messages"])
def test_a_one_shot_imports_no_extra_its_libraries_would_bring_and_none_of_the_sdk_types_it_never_uses(
    server: ScriptedServer, home: Path, api_mode: str
) -> None:
    """aiohttp (installed for the Matrix connector) and h2 cost every start 0.1 s and 11 MiB when the
    SDKs import them; the program leaves them out. The SDK's types package would import every type its
    API has (half of `import openai`); the program imports those its calls use. The call works, in each
    wire mode."""
    server.add(Reply(text="lean"))
    done = run_cli(
        *("chat", "-q", "hi", "--base-url", server.url_for(api_mode), "--api-mode", api_mode),
        home=home,
        env={"PYTHONPROFILEIMPORTTIME": "1", "OPENAI_API_KEY": "k", "ANTHROPIC_API_KEY": "k"},
    )
    assert done.returncode == 0 and done.stdout == "lean\n", done.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line}
    sdk = "anthropic" if api_mode == "anthropic_messages" else "openai"
    assert sdk in imported
    # (a module left out shows as the failed attempt of what asked for it; imported, it brings these)
    assert not {"aiohttp.client", "yarl", "h2.exceptions", "hpack"} & imported
    if sdk == "openai":  # types of the SDK's other endpoints: batches, fine-tuning, evaluations
        assert not {"openai.types.batch", "openai.types.fine_tuning.fine_tuning_job", "openai.types.eval"} & (
            imported
        )


def test_cli_reads_the_prompt_from_stdin_and_prints_json(server: ScriptedServer, home) -> None:
    server.add(Reply(text="piped"))
    done = run_cli(
        "chat", "-q", "-", "--json", "--base-url", server.base_url, home=home, stdin="from a pipe\n"
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["final_response"] == "piped" and result["exit_reason"] == "completed"
    assert server.requests[0].body["messages"][-1]["content"] == "from a pipe"


def test_cli_exits_3_when_the_budget_is_spent(server: ScriptedServer, home) -> None:
    server.default = lambda body: Reply(tool_calls=[("list_directory", {})])
    done = run_cli("chat", "-q", "loop", "--max-turns", "2", "--base-url", server.base_url, "-Q", home=home)
    assert done.returncode == 3
    assert len(server.requests) == 3
    assert "budget" in done.stderr


def test_cli_exits_1_on_a_provider_error(server: ScriptedServer, home) -> None:
    server.add(Reply(status=404, error_body={"error": {"message": "The model `nope` does not exist"}}))
    done = run_cli("chat", "-q", "hi", "-m", "nope", "--base-url", server.base_url, home=home)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith("mibyan: HTTP 404")
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "args", [["--api-mode", "carrier_pigeon"], ["--max-turns", "many"], ["-m", ""], ["--base-url", " "]]
)
def test_cli_usage_errors_are_one_line_and_exit_2(home, args: list[str]) -> None:
    done = run_cli("chat", "-q", "hi", *args, home=home)
    assert done.returncode == 2
    assert done.stderr.startswith(f"mibyan: error: argument {args[0]}")
    assert len(done.stderr.strip().splitlines()) == 1
    assert done.stdout == ""


def test_cli_config_errors_are_one_line_and_exit_2(home) -> None:
    (home / "config.yaml").write_text("agent:\n  colour: blue\n")
    done = run_cli("chat", "-q", "hi", home=home)
    assert done.returncode == 2
    assert done.stderr.strip() == f"mibyan: {home / 'config.yaml'}: agent.colour: unknown key"


def test_cli_without_a_key_says_how_to_configure_a_provider(home) -> None:
    done = run_cli("chat", "-q", "hi", home=home)
    assert done.returncode == 2
    assert "OPENAI_API_KEY" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_help_imports_neither_sdk() -> None:
    import subprocess

    code = (
        "import sys\nfrom mibyan.cli.main import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('openai', 'anthropic', 'pydantic', 'yaml', 'rich', 'prompt_toolkit')"
        " if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_the_log_file_is_private_and_masks_keys(home) -> None:
    import logging
    import stat

    from mibyan.cli.logs import setup_logging

    setup_logging(home)
    logging.getLogger("mibyan.test").warning("calling with key sk-proj-%s", "Zz9" * 10)
    for handler in logging.getLogger("mibyan").handlers:
        handler.flush()
    log = home / "logs" / "mibyan.log"
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    text = log.read_text()
    assert "calling with key sk-pro" in text and "Zz9Zz9Zz9" not in text


def test_the_chat_footer_shows_tokens_cache_and_cost() -> None:
    from mibyan.cli.render import Renderer

    usage = {
        "input_tokens": 1_000_000,
        "output_tokens": 100_000,
        "cache_read_tokens": 800_000,
        "cache_write_tokens": 5_000,
    }
    line = Renderer.footer(usage, "gpt-4o-mini")
    assert line.strip() == (
        "1,000,000 in · 100,000 out · 800,000 read from cache · 5,000 written to cache · $0.2100"
    )
    assert "$" not in Renderer.footer(usage, "some-local-model")


def test_a_streamed_answer_is_rendered_whole_when_it_ends() -> None:
    import io

    from rich.console import Console

    from mibyan.cli.render import Renderer

    renderer = Renderer(Console(file=io.StringIO(), width=100, force_terminal=False))
    for i in range(500):
        renderer.on_delta(f"word{i} ")
    usage = {"input_tokens": 1, "output_tokens": 1}
    renderer.end_turn(
        {
            "final_response": "x",
            "messages": [],
            "session_id": "s",
            "task_id": "t",
            "api_calls": 1,
            "completed": True,
            "interrupted": False,
            "exit_reason": "completed",
            "usage": usage,
            "error": None,
        },
        "m",
    )
    assert "word499" in renderer.console.file.getvalue()  # the last pieces came after the last re-parse


def test_a_config_file_that_is_not_utf8_is_one_line_naming_it(home: Path) -> None:
    (home / "config.yaml").write_bytes(b"model:\n  name: caf\xe9\n")
    done = run_cli("chat", "-q", "hi", home=home)
    assert done.returncode == 2
    assert (
        done.stderr
        == f"mibyan: {home / 'config.yaml'}: not UTF-8 text (byte 0xe9 at offset 18); save it as UTF-8\n"
    )


def test_an_unknown_toolset_flag_is_a_usage_error_naming_the_known_ones(home: Path) -> None:
    done = run_cli(
        "chat", "-q", "hi", "--toolsets", "core,bogus", "--base-url", "http://127.0.0.1:9/v1", home=home
    )
    assert done.returncode == 2
    assert done.stderr == "mibyan: --toolsets: unknown toolset 'bogus' (known: all, core)\n"


@pytest.mark.parametrize(
    ("kwargs", "config", "expected"),
    [
        ({"enabled_toolsets": ["nope"]}, "", "tools.toolsets: unknown toolset 'nope' (known: all, core"),
        ({}, "tools: {deny: [web_fetc]}\n", "tools.deny: unknown tool 'web_fetc' (known: clarify, "),
        ({}, "tools: {allow: [terminl]}\n", "tools.allow: unknown tool 'terminl' (known: clarify, "),
    ],
)
def test_unknown_toolsets_and_tools_are_a_config_error(
    make_agent, home: Path, kwargs: dict[str, object], config: str, expected: str
) -> None:
    (home / "config.yaml").write_text(config)
    with pytest.raises(ConfigError) as caught:
        make_agent(**kwargs)
    assert str(caught.value).startswith(expected)


def test_a_base_url_that_is_not_a_url_is_named_as_such(home: Path) -> None:
    (home / "config.yaml").write_text("providers: {openai: {base_url: not a url}}\n")
    done = run_cli("chat", "-q", "hi", home=home)
    assert done.returncode == 2
    assert done.stderr == (
        f"mibyan: {home / 'config.yaml'}: providers.openai.base_url: must be an http(s) URL such as "
        "https://api.openai.com/v1, not 'not a url'\n"
    )
    flag = run_cli("chat", "-q", "hi", "--base-url", "localhost:8080", home=home.parent / "other")
    assert flag.returncode == 2 and "base_url: must be an http(s) URL" in flag.stderr


def test_max_turns_0_names_the_flag(home: Path) -> None:
    done = run_cli("chat", "-q", "hi", "--max-turns", "0", home=home)
    assert done.returncode == 2
    assert done.stderr.startswith("mibyan: error: argument --max-turns: must be at least 1, not 0")


def test_a_connection_error_names_the_address_it_tried(home: Path) -> None:
    with ScriptedServer() as gone:
        url = gone.base_url
    done = run_cli("chat", "-q", "hi", "-Q", "--base-url", url, home=home)
    assert done.returncode == 1
    assert (
        done.stderr.splitlines()[-1]
        == f"mibyan: cannot reach the provider: Connection error. (openai at {url})"
    )


def test_the_missing_key_message_names_the_home_in_use(tmp_path: Path) -> None:
    home = tmp_path / "elsewhere"
    done = run_cli("chat", "-q", "hi", home=home)
    assert done.returncode == 2
    assert f"model.provider in {home / 'config.yaml'}" in done.stderr and "~/.mibyan" not in done.stderr


def test_a_one_shot_says_which_session_to_resume(server: ScriptedServer, home: Path) -> None:
    server.add(Reply(text="first"), Reply(text="second"), Reply(text="third"))
    done = run_cli("chat", "-q", "one", "--base-url", server.base_url, home=home)
    assert done.returncode == 0
    line = done.stderr.splitlines()[-1]
    session_id = line.split()[2]
    assert line == f"mibyan: session {session_id} (resume with: mibyan chat --resume {session_id})"
    resumed = run_cli(
        "chat", "--resume", session_id, "-q", "two", "-Q", "--base-url", server.base_url, home=home
    )
    assert resumed.returncode == 0 and resumed.stderr == ""
    assert [m["content"] for m in server.requests[-1].body["messages"][1:]] == ["one", "first", "two"]


def test_a_one_shot_that_ends_at_once_still_delivers_all_of_a_long_answer(
    server: ScriptedServer, home: Path
) -> None:
    answer = "line of a long answer\n" * 50_000  # 1.1 MB: more than any pipe buffer holds
    server.add(Reply(text=answer.strip(), chunks=40))
    done = run_cli("chat", "-q", "tell me everything", "--base-url", server.base_url, home=home)
    assert done.returncode == 0, done.stderr
    assert done.stdout == answer
    assert sorted(p.name for p in home.glob("state.db*")) == ["state.db"]  # the store was closed


def test_sandbox_mode_off_may_be_written_without_quotes(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("sandbox: {mode: off}\n")
    assert load_settings(home=tmp_path, cwd=tmp_path, env={}).sandbox.mode == "off"


def test_settings_follow_every_change_of_the_file_even_one_of_the_same_size(tmp_path: Path) -> None:
    """Settings made once are reused (a gateway builds an agent per message) while the file is the same."""
    config = tmp_path / "config.yaml"
    config.write_text("model:\n  name: model-a\n")
    first = load_settings(home=tmp_path, cwd=tmp_path, env={})
    config.write_text("model:\n  name: model-b\n")  # same size, and at once: the same modification time
    second = load_settings(home=tmp_path, cwd=tmp_path, env={})
    assert (first.model.name, second.model.name) == ("model-a", "model-b")
    assert load_settings(home=tmp_path, cwd=tmp_path, env={}).model.name == "model-b"
    assert load_settings(home=tmp_path, cwd=tmp_path, env={"MIBYAN_MODEL": "model-c"}).model.name == "model-c"
