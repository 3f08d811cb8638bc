"""`mibyan web [--host 127.0.0.1] [--port 0]`: serve the session viewer until Ctrl-C.

It prints `mibyan web: http://127.0.0.1:<port>/?token=<token>` on stdout once it listens; the token is
new at every start and every request must carry it (see `mibyan.web.guard`). The viewer serves this
machine only: a --host that other machines could reach is refused, since the Host check would refuse
their requests anyway and the page shows everything ever said to the agent (use an SSH tunnel).
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import socket
import sys
from collections.abc import Callable
from types import FrameType

import uvicorn

from agent_state import SessionStore, store_url
from mibyan.config.paths import mibyan_home
from mibyan.core.errors import MibyanError
from mibyan.core.exit_codes import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from mibyan.core.net import is_loopback_host, listen_on
from mibyan.core.sanitize import visible
from mibyan.gateway.listener import ListenerLimits, server_config


class _Server(uvicorn.Server):
    """uvicorn, which on Ctrl-C or SIGTERM also ends the live streams (they would hold it open)."""

    def __init__(self, config: uvicorn.Config, *, on_exit: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._on_exit()
        super().handle_exit(sig, frame)


def run_web(args: argparse.Namespace) -> int:
    """Entry of `mibyan web`; returns the exit code."""
    if not is_loopback_host(args.host):
        sys.stderr.write(
            f"mibyan: error: --host {visible(args.host)} is reachable from other machines; the viewer "
            "serves this machine only (127.0.0.1 or ::1; from elsewhere, use an SSH tunnel)\n"
        )
        return EXIT_USAGE
    home = mibyan_home()
    path = home / "state.db"
    try:
        url = store_url(home)
        if url is None and not path.is_file():
            sys.stderr.write(
                f"mibyan: no sessions yet ({visible(str(path))}): start one with 'mibyan chat'\n"
            )
            return EXIT_ERROR
        # the configured PostgreSQL store, or the home's SQLite file read-only (no lock an agent waits on)
        store = SessionStore.at_url(url) if url else SessionStore(path, read_only=True)
    except MibyanError as exc:
        sys.stderr.write(f"mibyan: {visible(str(exc))}\n")
        return EXIT_ERROR
    with store:
        try:
            listener = listen_on(args.host, args.port)
        except MibyanError as exc:
            sys.stderr.write(f"mibyan: {visible(str(exc))}\n")
            return EXIT_ERROR
        return asyncio.run(_serve(store, listener, args.host))


async def _serve(store: SessionStore, listener: socket.socket, host: str) -> int:
    from mibyan.web.app import create_app

    port = listener.getsockname()[1]
    token = secrets.token_urlsafe(24)
    app = create_app(store, token=token, cookie=f"mibyan_web_{port}")
    # a connection trickling its headers is closed after 10 s and at most 200 are open (the gateway's
    # defaults): otherwise a few hundred of them would stop the viewer answering
    config = server_config(
        app,
        ListenerLimits(),
        log_config=None,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=1,
    )
    server = _Server(config, on_exit=app.state.viewer.stop)
    shown = f"[{host}]" if ":" in host else host
    task = asyncio.create_task(server.serve(sockets=[listener]))
    while not server.started and not task.done():
        await asyncio.sleep(0.01)
    if not server.started:
        await task  # what stopped it is on stderr (uvicorn's log)
        return EXIT_ERROR
    sys.stdout.write(f"mibyan web: http://{shown}:{port}/?token={token}\n")
    sys.stdout.flush()
    await task
    return EXIT_OK
