"""Shared fixtures: a scripted loopback server, a private mibyan home, agents wired to both."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings as hypothesis_settings

sys.path.insert(0, str(Path(__file__).parent))

from loopback import ScriptedServer
from scripted_model import ScriptedModel

# The same examples on every run and every machine: a property test that fails, fails for everyone.
hypothesis_settings.register_profile("mibyan", derandomize=True, database=None)
hypothesis_settings.load_profile("mibyan")

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures" / "recorded"
SOURCES = ("core", "config", "store", "tools", "agent", "gateway", "editors", "web", "batch", "cli", "mibyan")


def _compile_once() -> None:
    """Compile mibyan's sources once, before the workers start, and keep pytest's rewritten tests.

    These machines set PYTHONDONTWRITEBYTECODE, which would make every xdist worker and every `mibyan`
    subprocess a test starts compile the same sources again (a quarter of a second of CPU each, hundreds of
    times a run). Python still reads what is compiled, so the controller compiles the package once;
    pytest keeps the tests' rewritten code only when this process may write bytecode.
    """
    sys.dont_write_bytecode = False
    if "PYTEST_XDIST_WORKER" in os.environ:
        return
    import compileall

    for name in SOURCES:
        compileall.compile_dir(ROOT / name, quiet=2)
    helpers = [path for path in Path(__file__).parent.glob("*.py") if not path.name.startswith("test_")]
    for module in (*ROOT.glob("*.py"), *helpers):
        compileall.compile_file(module, quiet=2)


_compile_once()


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as scripted:
        yield scripted


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir(mode=0o700)
    (path / "config.yaml").write_text("agent:\n  api_max_retries: 0\n")
    return path


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in (
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "OPENROUTER_API_KEY",
        "OPENAI_BASE_URL",
        "ANTHROPIC_BASE_URL",
        "MIBYAN_MODEL",
        "MIBYAN_PROVIDER",
        "MIBYAN_STORE_URL",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MIBYAN_HOME", str(tmp_path / "default-home"))
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def start_gateway(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Any]]:
    """Start `mibyan gateway` inside this process: `start_gateway(home, env=...)` is an InProcessGateway
    (tests/gatewaying.py), the client RunningGateway's; whatever still runs is stopped at the end."""
    from gatewaying import InProcessGateway

    started: list[InProcessGateway] = []

    def start(home: Path, *, env: dict[str, str] | None = None, timeout: float = 60) -> InProcessGateway:
        assert not any(g.running for g in started), "one in-process gateway at a time (one environment)"
        gateway = InProcessGateway(home, monkeypatch, env=env, timeout=timeout)
        started.append(gateway)
        return gateway

    yield start
    for gateway in started:
        gateway.close()


@pytest.fixture
def make_agent(server: ScriptedServer, home: Path) -> Callable[..., Any]:
    from run_agent import AIAgent

    def make(**kwargs: Any) -> AIAgent:
        kwargs.setdefault("base_url", server.base_url)
        kwargs.setdefault("home", home)
        return AIAgent(**kwargs)

    return make


@pytest.fixture
def scripted() -> ScriptedModel:
    """The in-process scripted model, for loop logic (no sockets: see tests/scripted_model.py)."""
    return ScriptedModel()


@pytest.fixture
def make_scripted_agent(scripted: ScriptedModel, home: Path) -> Callable[..., Any]:
    """Agents whose model calls go to the in-process scripted model."""
    from run_agent import AIAgent

    def make(**kwargs: Any) -> AIAgent:
        kwargs.setdefault("base_url", scripted.url_for(kwargs.get("api_mode") or "chat_completions"))
        kwargs.setdefault("api_key", "scripted-key")
        kwargs.setdefault("home", home)
        return AIAgent(http_transport=scripted.transport(), **kwargs)

    return make


def run_cli(
    *args: str,
    home: Path,
    stdin: str | bytes | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 60,
    cwd: Path | None = None,
    preexec_fn: Callable[[], None] | None = None,
    wrapper: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    """Run the real `mibyan` entry point in a subprocess.

    `stdin` may be bytes (passed as they are); `preexec_fn` runs in the child before it starts (resource
    limits); `wrapper` is a command the entry point runs under (bwrap, for a read-only home).
    """
    environment = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    environment.update({"MIBYAN_HOME": str(home), "PYTHONPATH": str(ROOT)})
    environment.update(env or {})
    done = subprocess.run(
        [*wrapper, sys.executable, "-m", "mibyan.cli.main", *args],
        input=stdin.encode() if isinstance(stdin, str) else stdin,
        capture_output=True,
        env=environment,
        timeout=timeout,
        cwd=cwd,
        preexec_fn=preexec_fn,
    )
    return subprocess.CompletedProcess(done.args, done.returncode, _text(done.stdout), _text(done.stderr))


def _text(data: bytes) -> str:
    """What text mode would have read (universal newlines), without failing on bytes that are not UTF-8."""
    return data.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")


@pytest.fixture
def places(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Folders outside the working directory and temp, for the sandbox tests (see sandboxing.py)."""
    from sandboxing import places_outside_temp

    yield from places_outside_temp(monkeypatch)


@pytest.fixture
def host_server() -> Iterator[str]:
    """A web server on the host's loopback, which a sandbox without network cannot reach."""
    from sandboxing import serving_hello

    with serving_hello() as url:
        yield url


def run_in_background(agent: Any, prompt: str) -> tuple[threading.Thread, dict[str, Any]]:
    """Start `agent.run_conversation(prompt)` on a thread; the dict holds its result once it returns."""
    outcome: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: outcome.update(agent.run_conversation(prompt)))
    worker.start()
    return worker, outcome


def free_port() -> int:
    """A loopback port nobody listens on now (for a server the fixture starts)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(condition: Callable[[], Any], timeout: float = 30.0) -> Any:
    """Poll `condition` until it holds (for what only shows from outside: a process gone, a line logged)
    or `timeout` seconds pass; returns its last value."""
    deadline = time.monotonic() + timeout
    while not (value := condition()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return value


@pytest.fixture(scope="session")
def pg_cluster(testrun_uid: str) -> Iterator[str]:
    """The superuser DSN of the session's PostgreSQL (tests/pging.py); the workers share one cluster."""
    from pging import shared_cluster

    with shared_cluster(testrun_uid) as dsn:
        yield dsn


@pytest.fixture
def pg_url(pg_cluster: str) -> Iterator[str]:
    """A new empty PostgreSQL database for this test, as a postgresql:// URL."""
    from pging import fresh_database

    with fresh_database(pg_cluster) as url:
        yield url
