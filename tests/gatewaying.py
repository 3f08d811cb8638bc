"""A real `mibyan gateway` for tests and benchmarks: its config, its start (a process, or the same start on a
thread of the test process), its client."""

from __future__ import annotations

import argparse
import logging
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    import pytest

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "test-gateway-token"
_URL = re.compile(r"mibyan gateway: (\S+) \((\w+)\) on (\S+)")


def out_of_an_agents_sight(*paths: Path) -> bool:
    """Whether a path is inside the user's home, which a gateway agent's sandbox hides, or the machine's
    temporary folder, which it replaces with the agent's own (so a server program there, in a clone
    under /tmp say, cannot start in it)."""
    import tempfile

    from mibyan.tools.path_policy import user_homes

    hidden = [*user_homes(), Path("/tmp").resolve(), Path(tempfile.gettempdir()).resolve()]
    return any(place == path or place in path.parents for place in hidden for path in paths)


def write_config(
    home: Path,
    providers: dict[str, str],
    agents: list[dict[str, Any]],
    *,
    connectors: list[dict[str, Any]] | None = None,
    gateway: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    """A home config.yaml with one loopback provider per (name → base URL) and the given agents (and
    `extra` top-level keys)."""
    config: dict[str, Any] = {
        "agent": {"api_max_retries": 0, "stream": True},
        "providers": {
            name: {"api_mode": "chat_completions", "base_url": url} for name, url in providers.items()
        },
        "model": {"provider": next(iter(providers)), "name": "default-model"},
        "agents": agents,
        "connectors": connectors if connectors is not None else [{"name": "api", "kind": "http", "port": 0}],
    }
    if gateway:
        config["gateway"] = gateway
    config.update(extra or {})
    (home / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


class ServedGateway:
    """What both kinds of gateway share: the lines it said (with their newlines), its URLs once it is
    ready, its client."""

    home: Path
    lines: list[str]
    _lines: queue.Queue[str | None]

    def _wait_until_ready(self, timeout: float) -> None:
        self.urls: dict[str, str] = {}
        while True:
            line = self._lines.get(timeout=timeout)
            if line is None:
                raise RuntimeError("the gateway exited before it was ready:\n" + "".join(self.lines))
            match = _URL.match(line)
            if match:
                self.urls[match.group(1)] = match.group(3)
            if line.strip() == "mibyan gateway: ready":
                break
        self.url = next(iter(self.urls.values()))

    def client(self, **kwargs: Any) -> Any:
        import openai

        kwargs.setdefault("api_key", TOKEN)
        return openai.OpenAI(base_url=self.url, max_retries=0, timeout=60, **kwargs)


def gateway_environment(home: Path, env: dict[str, str] | None) -> dict[str, str]:
    """What a gateway of the tests runs with: this environment without keys, the home and the token."""
    environment = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    environment.update({"MIBYAN_HOME": str(home), "PYTHONPATH": str(ROOT), "MIBYAN_GATEWAY_TOKEN": TOKEN})
    environment.update(env or {})
    return environment


class RunningGateway(ServedGateway):
    """A `mibyan gateway` subprocess; `url` is the printed one (port 0 resolved)."""

    def __init__(self, home: Path, *, env: dict[str, str] | None = None, timeout: float = 60) -> None:
        self.home = home
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mibyan.cli.main", "gateway"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=gateway_environment(home, env),
        )
        self.lines = []
        self._lines = queue.Queue()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        self._wait_until_ready(timeout)

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)
            self._lines.put(line)
        self._lines.put(None)

    def terminate(self, timeout: float = 30) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(timeout=30)

    def __enter__(self) -> RunningGateway:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.kill()


#: the loggers `mibyan gateway` sets up for its log file (once per process), put back after each one here
_LOGGERS = ("mibyan", "uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")


class InProcessGateway(ServedGateway):
    """The same gateway served on a thread of the test process, for the tests not about the process
    (routing, the ledger, approvals): `mibyan gateway`'s own start (`run_gateway`: the config, the agents,
    the connectors, the log file), its lines collected and its stop handed over instead of signals.

    The product reads its environment from `os.environ`, so it is set through the test's `monkeypatch`
    to what `RunningGateway` would start with (and so undone when the test ends); one at a time.
    `terminate` is SIGTERM's stop; there is no `kill` (a test of a crash needs the process).
    """

    def __init__(
        self,
        home: Path,
        monkeypatch: pytest.MonkeyPatch,
        *,
        env: dict[str, str] | None = None,
        timeout: float = 60,
    ) -> None:
        from mibyan.cli.gateway import run_gateway

        environment = gateway_environment(home, env)
        for name in [n for n in os.environ if n not in environment]:
            monkeypatch.delenv(name)
        for name, value in environment.items():
            monkeypatch.setenv(name, value)
        self.home = home
        self.lines = []
        self._lines = queue.Queue()
        self._stop: Callable[[], None] | None = None
        self.returncode: int | None = None
        self._loggers = {name: _logger_state(name) for name in _LOGGERS}
        for handler in list(logging.getLogger("mibyan").handlers):  # another's log file: set aside
            logging.getLogger("mibyan").removeHandler(handler)

        def say(line: str) -> None:
            self.lines.append(line + "\n")
            self._lines.put(line + "\n")

        def serve() -> None:
            command = argparse.Namespace(check=False)
            try:
                self.returncode = run_gateway(command, write=say, stop_with=self._hold)
            except BaseException:  # what the process would print before it exits 1
                self.returncode = 1
                for line in traceback.format_exc().splitlines(keepends=True):
                    say(line.rstrip("\n"))
            finally:
                self._lines.put(None)

        self._thread = threading.Thread(target=serve, name="mibyan-gateway", daemon=True)
        self._thread.start()
        try:
            self._wait_until_ready(timeout)
        except BaseException:
            self.close()
            raise

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _hold(self, stop: Callable[[], None]) -> None:
        self._stop = stop

    def terminate(self, timeout: float = 30) -> int:
        """Stop it as SIGTERM does; its exit code."""
        if self._stop is not None and self._thread.is_alive():
            self._stop()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the gateway did not stop within {timeout} s")
        self._put_loggers_back()
        assert self.returncode is not None
        return self.returncode

    def close(self) -> None:
        """Stop it if it still runs (the end of its `with`, or of the test)."""
        if self._thread.is_alive():
            self.terminate()
        self._put_loggers_back()

    def _put_loggers_back(self) -> None:
        for name, (handlers, propagate, level) in self._loggers.items():
            logger = logging.getLogger(name)
            for handler in list(logger.handlers):
                logger.removeHandler(handler)
                if name == "mibyan" and handler not in handlers:
                    handler.close()
            for handler in handlers:
                logger.addHandler(handler)
            logger.propagate, logger.level = propagate, level
        self._loggers = {}

    def __enter__(self) -> InProcessGateway:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _logger_state(name: str) -> tuple[list[logging.Handler], bool, int]:
    logger = logging.getLogger(name)
    return list(logger.handlers), logger.propagate, logger.level
