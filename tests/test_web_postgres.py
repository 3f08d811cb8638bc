"""The viewer's live page on a PostgreSQL store is woken by NOTIFY (DESIGN §16): a message another process
stores appears on the live stream at once, however long the viewer waits between two looks."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from conftest import ROOT

from agent_state import SessionStore
from mibyan.web.app import create_app

pytestmark = pytest.mark.postgres

TOKEN = "live-token"
COOKIE = "mibyan_web_live"
#: What another process runs to store one user message in a session of the store.
WRITE = """
import sys
from agent_state import SessionStore
with SessionStore.at_url(sys.argv[1]) as store:
    store.append_message(sys.argv[2], {"role": "user", "content": sys.argv[3]})
"""


@pytest.fixture
def viewer(pg_url: str) -> Iterator[str]:
    """The viewer over the store, on a loopback port, looking for new messages only once an hour."""
    with SessionStore.at_url(pg_url) as store:
        store.append_message("watched", {"role": "user", "content": "first"}, create={"source": "cli"})
        app = create_app(store, token=TOKEN, cookie=COOKIE, poll_interval=3600)
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()  # connections queue from now on, before the server's thread is up
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
        thread.start()
        try:
            port = listener.getsockname()[1]
            yield f"http://127.0.0.1:{port}"
        finally:
            app.state.viewer.stop()
            server.should_exit = True
            thread.join(30)
            listener.close()


def _stored_elsewhere(pg_url: str, text: str) -> None:
    written = subprocess.run(
        [sys.executable, "-c", WRITE, pg_url, "watched", text],
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert written.returncode == 0, written.stderr


def _next_message(lines: Iterator[str]) -> str:
    """The HTML of the stream's next `message` event."""
    kind = None
    for line in lines:
        if line.startswith("event: "):
            kind = line.removeprefix("event: ")
        elif line.startswith("data: ") and kind == "message":
            return str(json.loads(line.removeprefix("data: "))["html"])
    raise AssertionError("the live stream ended")


def test_a_message_another_process_stores_reaches_the_live_stream_through_notify(
    viewer: str, pg_url: str
) -> None:
    headers = {"Cookie": f"{COOKIE}={TOKEN}"}
    with httpx.stream("GET", f"{viewer}/s/watched/live", headers=headers, timeout=120) as stream:
        assert stream.status_code == 200
        lines = stream.iter_lines()
        assert "first" in _next_message(lines)  # the first look, as the stream opened

        _stored_elsewhere(pg_url, "second, from another process")
        assert "second, from another process" in _next_message(lines)
        # the stream was waiting (an hour, but for a notice) when this one was stored: only NOTIFY woke it
        _stored_elsewhere(pg_url, "third, from yet another")
        assert "third, from yet another" in _next_message(lines)
