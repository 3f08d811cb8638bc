"""A real `mibyan gateway` process for tests and benchmarks: its config, its start, its client."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "test-gateway-token"
_URL = re.compile(r"mibyan gateway: (\S+) \((\w+)\) on (\S+)")


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


class RunningGateway:
    """A `mibyan gateway` subprocess; `url` is the printed one (port 0 resolved)."""

    def __init__(self, home: Path, *, env: dict[str, str] | None = None, timeout: float = 60) -> None:
        environment = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
        environment.update({"MIBYAN_HOME": str(home), "PYTHONPATH": str(ROOT), "MIBYAN_GATEWAY_TOKEN": TOKEN})
        environment.update(env or {})
        self.home = home
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mibyan.cli.main", "gateway"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=environment,
        )
        self.lines: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read_stderr, daemon=True).start()
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

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)
            self._lines.put(line)
        self._lines.put(None)

    def client(self, **kwargs: Any) -> Any:
        import openai

        kwargs.setdefault("api_key", TOKEN)
        return openai.OpenAI(base_url=self.url, max_retries=0, timeout=60, **kwargs)

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
