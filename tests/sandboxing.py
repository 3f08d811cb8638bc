"""What the sandbox tests share: a working directory and a folder beside it outside temp, a web server on
the host's loopback, and a way to run one command through an agent on the loopback model."""

from __future__ import annotations

import functools
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from loopback import Reply, ScriptedServer
from test_tools import tool_results

from mibyan.tools import landlock

BLOCKED = "the sandbox (workspace-write) blocked writing outside"


@functools.cache
def bwrap_works() -> bool:
    """Whether bubblewrap is installed and may make the namespaces the sandbox uses (one probe run)."""
    if shutil.which("bwrap") is None:
        return False
    probe = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid"]
    probe += ["--unshare-net", "--new-session", "--die-with-parent", "true"]
    done = subprocess.run(probe, capture_output=True, check=False)
    return done.returncode == 0


needs_bwrap = pytest.mark.skipif(not bwrap_works(), reason="bubblewrap (bwrap) missing or cannot run here")
needs_landlock = pytest.mark.skipif(landlock.abi_version() == 0, reason="this kernel has no Landlock")


@dataclass
class Places:
    """A working directory and a folder beside it, both outside the temporary directory."""

    workdir: Path
    elsewhere: Path


def places_outside_temp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Places]:
    """Make the places (the working directory becomes the current one); remove them afterwards."""
    # /tmp is writable in the sandbox, so the places the tests need stopped must lie outside it
    base = Path("/var/tmp")
    if not base.is_dir() or str(base).startswith(tempfile.gettempdir()):
        pytest.skip("needs /var/tmp outside the temporary directory")
    root = Path(tempfile.mkdtemp(prefix="mibyan-sandbox-test-", dir=base))
    workdir, elsewhere = root / "work", root / "elsewhere"
    workdir.mkdir()
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("precious\n")
    monkeypatch.chdir(workdir)
    yield Places(workdir, elsewhere)
    shutil.rmtree(root, ignore_errors=True)


def configure(home: Path, sandbox: str) -> None:
    """Write the home's config.yaml with this `sandbox:` section."""
    (home / "config.yaml").write_text(f"agent: {{api_max_retries: 0}}\nsandbox: {sandbox}\n")


def run_command(server: ScriptedServer, make_agent: Callable[..., Any], command: str, **agent: Any) -> str:
    """The result of one terminal call the model makes, run by an agent made with `agent` arguments."""
    server.add(Reply(tool_calls=[("terminal", {"command": command})]), Reply(text="done"))
    return tool_results(make_agent(**agent).run_conversation("run it"))[0]


@contextmanager
def serving_hello() -> Iterator[str]:
    """A web server on the host's loopback interface answering every GET with a known word; its URL."""

    class Hello(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"hello-from-the-host")

        def log_message(self, *args: Any) -> None:
            return

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    thread = threading.Thread(target=lambda: httpd.serve_forever(poll_interval=0.01), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        httpd.server_close()


def fetch(url: str) -> str:
    """A command that fetches `url` and prints what it got."""
    return f"python3 -c \"import urllib.request; print(urllib.request.urlopen('{url}', timeout=10).read())\""
