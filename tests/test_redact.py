"""Secrets never reach the store, its search index or the log file in clear, whatever text surrounds them."""

from __future__ import annotations

import json
import logging
import sqlite3
import string
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import run_cli
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from loopback import Reply, ScriptedServer

from agent_state import SessionStore
from mibyan.core.redact import mask_secrets

ALNUM = string.ascii_letters + string.digits

# One example of each shape, each the secret part only (what must not survive).
KEYS = {
    "openai": "sk-proj-" + "Ab3" * 12,
    "anthropic": "sk-ant-api03-" + "x9Y" * 10,
    "aws id": "AKIA" + "ABCDEFGHIJ234567",
    "aws session": "ASIA" + "ZYXWVUTSRQ765432",
    "github": "ghp_" + "a1" * 18,
    "github fine-grained": "github_pat_11" + "B2c" * 9,
    "slack": "xoxb-" + "1234567890-abcDEF",
    "google": "AIza" + "Sy" + "D4" * 16 + "x",
    "stripe": "sk_live_" + "51Hk" * 6,
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
}
PEM = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA1x2y3z\n-----END RSA PRIVATE KEY-----"
ASSIGNED = {  # text → the value that must not survive
    "export DB_PASSWORD=hunter2xyz": "hunter2xyz",
    "https://api.example.com/cb?token=q8Zr3kLm&page=2": "q8Zr3kLm",
    '{"password": "correct horse", "user": "bob"}': "correct horse",
    "client_secret: s3cr3t-v4lue": "s3cr3t-v4lue",
    "API_KEY='k-77aa88bb'": "k-77aa88bb",
    "postgres://bob:pa55w0rd@db.internal:5432/app": "pa55w0rd",
    "Authorization: Bearer abcdefghijklmnopqrstuvwx": "abcdefghijklmnopqrstuvwx",
    "the config says token: abc123xyz and more": "abc123xyz",
    "then password: hunter2! worked": "hunter2!",
    "it failed with api_key: k-77aa88bb, so": "k-77aa88bb",
    'curl -H "X-Api-Key: q8Zr3kLm99" https://x': "q8Zr3kLm99",
    "curl -H 'Authorization: Basic dXNlcjpwYXNzd29yZA==' https://x": "dXNlcjpwYXNzd29yZA==",
    "Authorization: token 0123abcdefabcdef": "0123abcdefabcdef",
    '{"headers": {"authorization": "basic YWxpY2U6czNjcjN0"}}': "YWxpY2U6czNjcjN0",
}


@pytest.mark.parametrize("kind", list(KEYS))
def test_each_known_key_shape_is_masked(kind: str) -> None:
    masked = mask_secrets(f"my {kind} key is {KEYS[kind]} - keep it")
    assert KEYS[kind] not in masked
    assert "[masked]" in masked


@pytest.mark.parametrize("text", list(ASSIGNED))
def test_values_given_to_secret_names_are_masked_and_the_names_kept(text: str) -> None:
    masked = mask_secrets(text)
    assert ASSIGNED[text] not in masked
    assert "[masked]" in masked


def test_a_private_key_block_is_masked_whole() -> None:
    assert "MIIEowIBAAKCAQEA1x2y3z" not in mask_secrets(f"here:\n{PEM}\nthanks")


@pytest.mark.parametrize(
    "text",
    [
        "max_tokens=4096",
        "token = get_token()",
        "the key point is speed",
        "see https://example.com/a",
        "so the token: it expires after an hour, and the password: whatever you chose",
        "make a token: https://github.com/settings/tokens then come back",
        "Authorization: required for every call; max_tokens: 4096, token_count: 12",
        "the README lists `token: …` as masked",
    ],
)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert mask_secrets(text) == text


filler = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(before=filler, after=filler, kind=st.sampled_from(list(KEYS)))
def test_a_key_is_masked_whatever_surrounds_it(before: str, after: str, kind: str) -> None:
    assert KEYS[kind] not in mask_secrets(f"{before} {KEYS[kind]} {after}")


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(["password", "token", "api_key", "SECRET", "db_password", "auth_token"]),
    value=st.text(alphabet=ALNUM + "!@$%^*-_+./", min_size=6, max_size=30).filter(lambda v: not v.isdigit()),
    noise=st.dictionaries(st.text(alphabet=ALNUM, min_size=1, max_size=8), filler, max_size=3),
)
def test_tool_arguments_stay_valid_json_with_their_secret_masked(name: str, value: str, noise: dict) -> None:
    assume(value not in json.dumps(noise))  # the same text as an ordinary value elsewhere is not the secret
    arguments = json.dumps({**noise, name: value, "command": f"export {name.upper()}={value}"})
    masked = mask_secrets(arguments)
    assert value not in masked
    assert set(json.loads(masked)) == set(json.loads(arguments))


def test_nothing_secret_reaches_the_store_or_its_search_index(
    server: ScriptedServer, home: Path, tmp_path: Path
) -> None:
    google, password = KEYS["google"], "hunter2xyz"
    server.add(
        Reply(tool_calls=[("terminal", {"command": f"export DB_PASSWORD={password}; echo {google}"})]),
        Reply(text=f"done: I used {google}"),
    )
    done = run_cli(
        "chat",
        "-q",
        f"use {google} and password={password}",
        "--yolo",
        "--base-url",
        server.base_url,
        home=home,
    )
    assert done.returncode == 0, done.stderr

    data = b"".join(p.read_bytes() for p in home.glob("state.db*"))
    assert google.encode() not in data and password.encode() not in data
    store = SessionStore.open(home)
    assert store.search(google) == [] and store.search(password) == []
    with sqlite3.connect(home / "state.db") as db:
        calls = [
            json.loads(row[0])
            for row in db.execute("SELECT tool_calls FROM messages WHERE tool_calls IS NOT NULL")
        ]
    assert json.loads(calls[0][0]["function"]["arguments"])["command"].startswith(
        "export DB_PASSWORD=…[masked]"
    )


@pytest.fixture
def log_file(tmp_path: Path) -> Iterator[Path]:
    """The CLI's log file in a private home, taken down again after the test (it is process-wide)."""
    from mibyan.cli.logs import setup_logging

    logger = logging.getLogger("mibyan")
    before = (list(logger.handlers), logger.propagate, logger.level)
    for handler in before[0]:  # an earlier test's log file: set up once per process, so set aside
        logger.removeHandler(handler)
    setup_logging(tmp_path)
    yield tmp_path / "logs" / "mibyan.log"
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    for handler in before[0]:
        logger.addHandler(handler)
    logger.propagate, logger.level = before[1], before[2]


def test_the_log_file_masks_secrets_in_messages_and_tracebacks(log_file: Path) -> None:
    log = logging.getLogger("mibyan.test")
    try:
        raise ValueError(f"bad key {KEYS['google']}")
    except ValueError:
        log.exception("calling with token=%s", "q8Zr3kLm99")
    for handler in logging.getLogger("mibyan").handlers:
        handler.flush()
    text = log_file.read_text()
    assert "calling with token=…[masked]" in text
    assert KEYS["google"] not in text and "q8Zr3kLm99" not in text
