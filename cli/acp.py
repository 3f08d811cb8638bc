"""`mibyan acp`: serve the Agent Client Protocol on stdio until the editor closes it (editors/server.py).

Stdout belongs to the protocol from the first moment: the real stdout is kept for it and fd 1 points at
/dev/null, so nothing printed later can corrupt a message. Logs go to `$MIBYAN_HOME/logs/acp.log`. A
broken configuration or a missing key is one line on stderr and exit code 2, before any message.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, cast

from mibyan.core.exit_codes import EXIT_ERROR, EXIT_OK, EXIT_USAGE

if TYPE_CHECKING:
    from mibyan.agent.options import AgentOptions


def _check_configuration(args: argparse.Namespace) -> None:
    """Fail at start, not at the editor's first session, on a broken config or a missing key."""
    from mibyan.agent.providers import resolve_runtime
    from mibyan.config.loader import load_settings, mibyan_home

    home = mibyan_home()
    settings = load_settings(home=home)
    resolve_runtime(
        settings,
        provider=args.provider or settings.model.provider,
        model=args.model or settings.model.name,
        base_url=args.base_url,
        api_key=None,
        api_mode=args.api_mode,
        env=os.environ,
        home=home,
    )


def run_acp(args: argparse.Namespace) -> int:
    """Entry of `mibyan acp`; returns the exit code when the editor closes the connection."""
    from mibyan.editors.stdio import reserve_stdout

    protocol_fd = reserve_stdout()
    from mibyan.cli.chat import options_of
    from mibyan.cli.logs import setup_logging
    from mibyan.config.paths import mibyan_home, prepare_home
    from mibyan.core.errors import ConfigError, MibyanError
    from mibyan.core.sanitize import visible

    try:
        # every session's agent: these options, in the session's folder (editors/server.py)
        options = dataclasses.replace(options_of(args), home=mibyan_home())
        prepare_home(mibyan_home())
        _check_configuration(args)
    except ConfigError as exc:
        sys.stderr.write(f"mibyan: {visible(str(exc))}\n")
        return EXIT_USAGE
    except MibyanError as exc:
        sys.stderr.write(f"mibyan: {visible(str(exc))}\n")
        return EXIT_ERROR
    setup_logging(mibyan_home(), file_name="acp.log")
    # the SDK logs through the root logger: into the same file, never onto the editor's stderr
    for handler in logging.getLogger("mibyan").handlers:
        logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.WARNING)
    return asyncio.run(_serve(options, protocol_fd))


async def _serve(options: AgentOptions, protocol_fd: int) -> int:
    from acp.agent.connection import AgentSideConnection
    from acp.interfaces import Agent

    from mibyan.editors.server import MibyanEditorAgent
    from mibyan.editors.stdio import StdioTransport

    agent = MibyanEditorAgent(options)
    transport = StdioTransport(sys.stdin.fileno(), protocol_fd)
    # the SDK's Agent protocol lists every optional method; the router asks for the ones it finds
    connection = AgentSideConnection(cast("Agent", agent), transport, listening=False)
    listening = asyncio.ensure_future(connection.listen())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, listening.cancel)
    try:
        await listening
        await agent.finish()
    except asyncio.CancelledError:
        logging.getLogger("mibyan.editors").info("stopped by a signal")
    finally:
        await agent.close()
        await connection.close()
    return EXIT_OK
