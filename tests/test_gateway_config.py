"""The gateway's configuration (`mibyan gateway --check`), its trust rules, and its delivery ledger."""

from __future__ import annotations

import dataclasses
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT, run_cli
from gatewaying import TOKEN, write_config
from sandboxing import needs_bwrap

from agent_state import SessionStore
from mibyan.config.loader import load_settings
from mibyan.config.trust import UntrustedConfigWarning
from mibyan.gateway.ledger import Ledger

LOCAL = {"local": "http://127.0.0.1:9/v1"}
MEEPA = {"id": "meepa", "default": True, "provider": "local", "model": "m"}


def check(home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return run_cli("gateway", "--check", home=home, env={"MIBYAN_GATEWAY_TOKEN": TOKEN, **env})


def test_a_valid_configuration_checks_out(home: Path) -> None:
    write_config(home, LOCAL, [MEEPA, {"id": "bob-2", "provider": "local"}])

    done = check(home)

    assert (done.returncode, done.stderr) == (
        0,
        "mibyan gateway: configuration is valid: 2 agent(s), 1 connector(s)\n",
    )


def test_a_check_reads_the_http_connectors_token_without_loading_a_web_server(home: Path) -> None:
    write_config(home, LOCAL, [MEEPA])

    done = check(home, PYTHONPROFILEIMPORTTIME="1")

    assert done.returncode == 0, done.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line}
    assert "mibyan.gateway.connectors.http_token" in imported
    assert not {"uvicorn", "starlette", "mibyan.gateway.connectors.http"} & imported
    assert "MIBYAN_GATEWAY_TOKEN" in check(home, MIBYAN_GATEWAY_TOKEN="").stderr  # and still reads it


@pytest.mark.parametrize(
    ("agents", "connectors", "named"),
    [
        ([MEEPA], [{"name": "api", "kind": "http", "agent": "nobody"}], "unknown agent 'nobody'"),
        ([MEEPA, {**MEEPA, "default": False}], None, "two agents have the id 'meepa'"),
        ([{**MEEPA, "id": "Meepa!"}], None, "agents.0.id"),
        ([{**MEEPA, "provider": "nowhere"}], None, "unknown provider 'nowhere'"),
        ([MEEPA], [{"name": "api", "kind": "http"}, {"name": "api", "kind": "http"}], "two connectors"),
        ([MEEPA], [{"name": "api", "kind": "smoke-signals"}], "connectors.0.kind"),
        ([{**MEEPA, "max_iterations": 0}], None, "agents.0.max_iterations"),
        ([{**MEEPA, "tools": {"deny": ["no_such_tool"]}}], None, "no_such_tool"),
        ([{**MEEPA, "isolation": {"enabled": True, "netwrok": True}}], None, "isolation.netwrok"),
        ([{**MEEPA, "mcp_servers": ["nope"]}], None, "mcp_servers: unknown server 'nope' (known: files)"),
        (
            [{**MEEPA, "memory": "private"}],
            None,
            "agents.0.memory: Input should be 'per_channel' or 'shared'",
        ),
        (
            [{**MEEPA, "mcp_servers": ["files"], "isolation": {"enabled": True}}],
            None,
            "they run outside its sandbox",
        ),
    ],
)
def test_a_broken_gateway_configuration_is_one_line_and_exit_2(
    home: Path, agents: list[dict[str, Any]], connectors: list[dict[str, Any]] | None, named: str
) -> None:
    write_config(
        home, LOCAL, agents, connectors=connectors, extra={"mcp_servers": {"files": {"command": "x"}}}
    )

    done = check(home)

    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and named in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@needs_bwrap
def test_an_isolated_agent_where_bubblewrap_cannot_run_stops_the_gateway(home: Path, tmp_path: Path) -> None:
    write_config(home, LOCAL, [{**MEEPA, "isolation": {"enabled": True}}])
    assert check(home).returncode == 0

    done = check(home, PATH=str(tmp_path))  # no bwrap on this PATH

    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "agents (meepa): isolation" in done.stderr
    assert "bubblewrap" in done.stderr


def test_a_missing_token_says_which_variable_to_set(home: Path) -> None:
    write_config(home, LOCAL, [MEEPA], connectors=[{"name": "api", "kind": "http", "token_env": "API_TOKEN"}])

    done = check(home, API_TOKEN="")

    assert done.returncode == 2
    assert "set API_TOKEN" in done.stderr and done.stderr.count("\n") == 1


def test_an_untrusted_project_cannot_configure_the_gateway(home: Path, tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / ".mibyan").mkdir(parents=True)
    hostile = {
        "agents": [{"id": "evil"}],
        "connectors": [{"name": "open", "kind": "http", "host": "0.0.0.0"}],
        "gateway": {"max_concurrent": 1000},
    }
    (project / ".mibyan" / "config.yaml").write_text(yaml.safe_dump(hostile))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        settings = load_settings(home=home, cwd=project, env={})

    assert settings.agents == [] and settings.connectors == []
    assert settings.gateway.max_concurrent == 16
    [notice] = [w for w in caught if issubclass(w.category, UntrustedConfigWarning)]
    assert "agents" in str(notice.message) and "connectors" in str(notice.message)


def test_the_command_line_does_not_import_the_http_stack() -> None:
    code = "import sys, mibyan.cli.main; print(any(m in sys.modules for m in ('starlette', 'uvicorn')))"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT)},
        check=True,
    )
    assert done.stdout.strip() == "False"


@pytest.fixture
def ledger(home: Path) -> Ledger:
    return Ledger(SessionStore.open(home))


def test_a_message_key_is_recorded_once_per_channel(ledger: Ledger) -> None:
    first, new = ledger.record_inbound("meepa/api/alice", "k-1", {"text": "hi"})
    again, repeated = ledger.record_inbound("meepa/api/alice", "k-1", {"text": "hi"})
    other, elsewhere = ledger.record_inbound("meepa/api/bob", "k-1", {"text": "hi"})

    assert (new, repeated, elsewhere) == (True, False, True)
    assert again.id == first.id != other.id


def test_a_request_the_ledger_kept_runs_as_it_arrived(ledger: Ledger) -> None:
    from mibyan.gateway.work import RunRequest

    history = ({"role": "user", "content": "before"}, {"role": "assistant", "content": "yes"})
    request = RunRequest("hi", history, one_off=True, approval_answer=False)
    entry, _ = ledger.record_inbound("meepa/api#1", "k-1", request.as_record())

    assert RunRequest.from_record(entry.request) == request
    assert RunRequest.from_record({"text": "hi"}) == RunRequest("hi")  # what an older gateway kept
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.text = "changed"  # type: ignore[misc]


def test_a_reply_is_pending_until_sent(ledger: Ledger) -> None:
    entry, _ = ledger.record_inbound("meepa/api/alice", "k-1", {"text": "hi"})
    ledger.record_reply(entry, "hello", "s1", {"input_tokens": 1})
    started = time.time()  # a run starting now: the reply is a previous run's

    [pending] = ledger.undelivered(within=600, before=started)
    ledger.mark_sent(entry.id)

    assert (pending.text, pending.session_id) == ("hello", "s1")
    assert ledger.undelivered(within=600, before=started) == []
    assert ledger.unfinished() == []


def test_a_reply_recorded_by_the_run_itself_is_not_redelivered_at_its_start(ledger: Ledger) -> None:
    """A message answered while the gateway starts (resumed, or arrived by a chat connector) is sent by
    its own run: sending it again from the redelivery of a previous run's replies was a second reply."""
    started = time.time()
    entry, _ = ledger.record_inbound("meepa/mail/alice", "m-1", {"text": "hi"})
    ledger.record_reply(entry, "hello", "s1", {})

    assert ledger.undelivered(within=600, before=started) == []
    assert [r.text for r in ledger.undelivered(within=600, before=time.time() + 1)] == ["hello"]


def test_a_reply_older_than_the_redelivery_window_is_marked_stale_not_sent(ledger: Ledger) -> None:
    entry, _ = ledger.record_inbound("meepa/api/alice", None, {"text": "hi"})
    ledger.record_reply(entry, "too late", "s1", {})

    assert ledger.undelivered(within=0, before=time.time() + 1) == []
    reply = ledger.reply_for(entry.id)
    assert reply is not None and reply.status == "stale"


def test_finished_messages_are_forgotten_after_a_week_unfinished_ones_never(ledger: Ledger) -> None:
    done, _ = ledger.record_inbound("meepa/api/alice", "old", {"text": "hi"})
    ledger.record_reply(done, "hello", "s1", {})
    ledger.mark_sent(done.id)
    waiting, _ = ledger.record_inbound("meepa/api/alice", "cut-off", {"text": "still to answer"})

    assert ledger.forget_finished() == 0  # a week has not passed
    assert ledger.forget_finished(older_than=-1) == 1

    assert ledger.record_inbound("meepa/api/alice", "old", {"text": "hi"})[1] is True
    assert waiting.id in {entry.id for entry in ledger.unfinished()}


def test_secrets_in_a_message_are_masked_in_the_ledger(ledger: Ledger, home: Path) -> None:
    key = "sk-" + "a1b2c3d4" * 4
    ledger.record_inbound("meepa/api/alice", None, {"text": f"my key is {key}"})

    stored = b"".join(path.read_bytes() for path in home.glob("state.db*"))  # the WAL file too
    assert b"a1b2c3d4a1b2" not in stored and b"my key is sk-" in stored


def test_a_port_already_taken_is_one_line_and_exit_2(home: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        write_config(home, LOCAL, [MEEPA], connectors=[{"name": "api", "kind": "http", "port": port}])

        done = run_cli("gateway", home=home, env={"MIBYAN_GATEWAY_TOKEN": TOKEN})

    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and f"cannot listen on 127.0.0.1:{port}" in done.stderr


def test_check_names_an_agent_whose_channels_share_its_memory(home: Path) -> None:
    write_config(home, LOCAL, [{**MEEPA, "memory": "shared"}, {"id": "bob", "provider": "local"}])

    done = check(home)

    assert done.returncode == 0
    assert done.stderr.splitlines()[1:] == ["mibyan gateway: meepa: memory is shared by all its channels"]


MATRIX = {
    "name": "team",
    "kind": "matrix",
    "homeserver": "http://127.0.0.1:9",
    "user_id": "@meepa:localhost",
    "password_env": "MIBYAN_MATRIX_PASSWORD",
}


def test_a_matrix_connector_without_allow_does_not_start(home: Path) -> None:
    write_config(home, LOCAL, [MEEPA], connectors=[MATRIX])

    done = check(home, MIBYAN_MATRIX_PASSWORD="secret")

    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
    assert "set allow:" in done.stderr and "does not start" in done.stderr
    write_config(home, LOCAL, [MEEPA], connectors=[{**MATRIX, "allow": ["@alice:localhost"]}])
    assert check(home, MIBYAN_MATRIX_PASSWORD="secret").returncode == 0
    missing = check(home, MIBYAN_MATRIX_PASSWORD="")
    assert missing.returncode == 2 and "MIBYAN_MATRIX_PASSWORD is not set" in missing.stderr


def test_a_matrix_homeserver_that_cannot_be_reached_at_start_is_one_line_and_exit_2(home: Path) -> None:
    write_config(home, LOCAL, [MEEPA], connectors=[{**MATRIX, "allow": ["@alice:localhost"]}])

    done = run_cli("gateway", home=home, env={"MIBYAN_MATRIX_PASSWORD": "secret"})

    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1].startswith(
        "mibyan: connector 'team': cannot reach the homeserver http://127.0.0.1:9"
    )
    assert "Traceback" not in done.stderr


EMAIL = {
    "name": "mail",
    "kind": "email",
    "address": "meepa@localhost",
    "imap": {"host": "127.0.0.1", "port": 9, "tls": "none"},
    "smtp": {"host": "127.0.0.1", "port": 9, "tls": "none"},
    "password_env": "MIBYAN_MAIL_PASSWORD",
}


def test_an_email_connector_needs_allow_its_password_and_tls_beyond_loopback(home: Path) -> None:
    write_config(home, LOCAL, [MEEPA], connectors=[EMAIL])
    done = check(home, MIBYAN_MAIL_PASSWORD="secret")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
    assert "set allow:" in done.stderr and "does not start" in done.stderr

    allowed = {**EMAIL, "allow": ["alice@example.org", "@example.org"]}
    write_config(home, LOCAL, [MEEPA], connectors=[allowed])
    assert check(home, MIBYAN_MAIL_PASSWORD="secret").returncode == 0
    missing = check(home, MIBYAN_MAIL_PASSWORD="")
    assert missing.returncode == 2 and "MIBYAN_MAIL_PASSWORD is not set" in missing.stderr

    clear = {**allowed, "smtp": {"host": "smtp.example.org", "port": 25, "tls": "none"}}
    write_config(home, LOCAL, [MEEPA], connectors=[clear])
    done = check(home, MIBYAN_MAIL_PASSWORD="secret")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
    assert "smtp.tls: none sends the password in clear: only to a loopback host" in done.stderr


def test_an_imap_server_that_cannot_be_reached_at_start_is_one_line_and_exit_2(home: Path) -> None:
    write_config(home, LOCAL, [MEEPA], connectors=[{**EMAIL, "allow": ["alice@example.org"]}])

    done = run_cli("gateway", home=home, env={"MIBYAN_MAIL_PASSWORD": "secret"})

    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1].startswith(
        "mibyan: connector 'mail': cannot reach the IMAP server 127.0.0.1:9"
    )
    assert "Traceback" not in done.stderr
