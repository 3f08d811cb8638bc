"""`mibyan gateway [--check]`: serve the configured agents over their connectors, in the foreground.

Start: one line per connector on stderr (`mibyan gateway: <name> (<kind>) on <url>`), then
`mibyan gateway: ready`. SIGTERM or SIGINT: stop accepting, let running turns finish within
`gateway.shutdown_grace`, interrupt what is still running (its history stays valid and the message is
resumed at the next start), exit 0. A broken configuration is one line and exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from mibyan.config.loader import AgentSettings, load_settings, mibyan_home
from mibyan.config.paths import HomeError
from mibyan.core.errors import ConfigError
from mibyan.core.exit_codes import EXIT_ERROR, EXIT_OK, EXIT_USAGE

if TYPE_CHECKING:
    from mibyan.gateway.connectors.base import Connector
    from mibyan.gateway.runner import Gateway

log = logging.getLogger("mibyan.gateway")
Say = Callable[[str], None]
#: where `mibyan gateway` is handed its stop (thread-safe) instead of catching SIGTERM and SIGINT
StopWith = Callable[[Callable[[], None]], None]


def _to_stderr(line: str) -> None:
    sys.stderr.write(f"{line}\n")
    sys.stderr.flush()


def check_config(settings: AgentSettings, home: Path) -> None:
    """What the gateway needs beyond a valid file: agents, connectors, a token per connector, and for
    each agent a provider it can reach and tools that exist.

    Raises:
        ConfigError: one line saying what to set.
    """
    from mibyan.gateway.agents import AgentInstance
    from mibyan.gateway.connectors.http_token import read_token
    from mibyan.gateway.connectors.matrix_setup import check_chat_connector

    if not settings.agents:
        raise ConfigError("agents: no agent is configured; add one under agents: (see README)")
    if not settings.connectors:
        raise ConfigError("connectors: no connector is configured; add one under connectors: (see README)")
    for connector in settings.connectors:
        if connector.kind == "http":
            read_token(connector, os.environ)  # a server is never left open without a token
        else:
            check_chat_connector(connector, os.environ)  # no `allow`: it does not start
    for entry in settings.agents:
        AgentInstance(entry, settings, home).check()  # an isolated agent where bwrap cannot run: exit 2


def run_gateway(
    args: argparse.Namespace, *, write: Say = _to_stderr, stop_with: StopWith | None = None
) -> int:
    """Entry of `mibyan gateway`; returns the exit code.

    Args:
        args: the parsed command line.
        write: where each of its lines goes (without the newline); stderr.
        stop_with: None: SIGTERM and SIGINT stop the gateway. Else handed the gateway's stop, callable
            from any thread, before it starts: a gateway served on a thread of another program (the
            tests' in-process one), where signals cannot be caught, is stopped with it.
    """
    from mibyan.cli.logs import setup_logging

    def say(line: str) -> None:
        write(f"mibyan gateway: {line}")

    home = mibyan_home()
    try:
        settings = load_settings(home=home)
        check_config(settings, home)
        if args.check:
            agents, connectors = len(settings.agents), len(settings.connectors)
            say(f"configuration is valid: {agents} agent(s), {connectors} connector(s)")
            _say_shared_memory(settings, say)
            return EXIT_OK
        _prepare_home(home, say)
        setup_logging(home, file_name="gateway.log")
        _log_server_to_file()
        return asyncio.run(_serve(settings, home, say, stop_with))
    except ConfigError as exc:
        write(f"mibyan: {exc}")
        return EXIT_USAGE
    except HomeError as exc:
        write(f"mibyan: {exc}")
        return EXIT_ERROR


def _prepare_home(home: Path, say: Say) -> None:
    """The home is private before the gateway writes everyone's conversations to it (as a chat makes it):
    a home others could read is made private, and the gateway says so once."""
    from mibyan.config.paths import prepare_home

    tightened = prepare_home(home)
    if tightened:
        say(f"made {', '.join(tightened)} private, so only you can read the sessions")


def _say_shared_memory(settings: AgentSettings, say: Say) -> None:
    """Name the agents whose channels share what they learn of a user (`memory: shared`): one user's
    words reach every other user of that agent."""
    for entry in settings.agents:
        if entry.memory == "shared":
            say(f"{entry.id}: memory is shared by all its channels")
            log.info("agent %s: memory is shared by all its channels", entry.id)


def _log_server_to_file() -> None:
    """What the HTTP server underneath says (a malformed request it refused, say) goes to gateway.log
    with mibyan's own lines, not onto the terminal."""
    server = logging.getLogger("uvicorn")
    server.handlers = list(logging.getLogger("mibyan").handlers)
    server.propagate = False


async def _redeliver(gateway: Gateway, connectors: list[Connector]) -> None:
    """Send the replies a previous run recorded but did not send (those still recent enough)."""
    by_name = {connector.name: connector for connector in connectors}
    for reply in await gateway.undelivered():
        connector = by_name.get(reply.channel.split("/")[1])
        if connector is not None and await connector.deliver(reply):
            await gateway.delivered(reply.inbox_id)


async def _serve(settings: AgentSettings, home: Path, say: Say, stop_with: StopWith | None) -> int:
    from mibyan.gateway.agents import prepare_workspace
    from mibyan.gateway.connectors import make_connector
    from mibyan.gateway.runner import Gateway

    gateway = Gateway(settings, home)
    for instance in gateway.agents.values():
        prepare_workspace(instance.workspace)
        instance.write_agents_md()
    connectors = [make_connector(entry, gateway) for entry in settings.connectors]
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    if stop_with is None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
    else:

        def stop() -> None:
            loop.call_soon_threadsafe(stopping.set)

        stop_with(stop)
    resumed = await gateway.resume()
    if resumed:
        log.info("resumed %d message(s) left unanswered by the last run", resumed)
    watching = asyncio.create_task(gateway.take_over_abandoned())  # a no-op unless the store is shared
    _say_shared_memory(settings, say)
    for instance in gateway.agents.values():
        warning = instance.sandbox_warning()
        if warning is not None:  # commands confined less than the configuration asks
            say(f"warning: agent {instance.id}: {warning}")
            log.warning("agent %s: %s", instance.id, warning)
    # each agent's code and its model's window, loaded and asked while the connectors start
    warming = gateway.warm()
    for connector in connectors:
        await connector.start()
        say(f"{connector.name} ({connector.kind}) on {connector.url}")
        notice = getattr(connector, "notice", None)
        if notice:
            say(f"warning: {connector.name}: {notice}")
    await warming
    await _redeliver(gateway, connectors)
    say("ready")
    log.info("ready: %s", ", ".join(f"{c.name} on {c.url}" for c in connectors))
    await stopping.wait()
    say("stopping")
    watching.cancel()
    await gateway.drain()
    for connector in connectors:
        await connector.stop()
    gateway.close()
    return EXIT_OK
