"""Tool calls that never return, tools that raise anything: neither keeps the process or the turn hostage."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import ROOT, run_in_background
from loopback import Reply, ScriptedServer

from mibyan.tools.registry import tool, unregister


def tool_results(result: dict) -> list[str]:
    return [m["content"] for m in result["messages"] if m["role"] == "tool"]


@pytest.fixture
def stuck_tool() -> Iterator[threading.Event]:
    """A tool that blocks until the test ends, and one that answers at once."""
    release = threading.Event()

    @tool(toolset="test")
    def stuck() -> str:
        """Blocks."""
        release.wait()
        return "too late"

    @tool(toolset="test")
    def quick() -> str:
        """Answers at once."""
        return "quick answer"

    yield release
    release.set()
    unregister("stuck")
    unregister("quick")


def test_a_call_after_an_abandoned_one_gets_its_own_time(
    server: ScriptedServer, make_agent, home: Path, stuck_tool: threading.Event
) -> None:
    # One call at a time: the second may start only once the first is given up. Its deadline must count
    # from then, and the abandoned call must not hold the place the second one runs in.
    (home / "config.yaml").write_text(
        "agent: {api_max_retries: 0, tool_timeout: 0.3, max_parallel_tools: 1}\n"
    )
    server.add(Reply(tool_calls=[("stuck", {}), ("quick", {})]), Reply(text="done"))

    result = make_agent(enabled_toolsets=["test"]).run_conversation("go")

    stuck, quick = tool_results(result)
    assert "did not finish within 0.3 s" in stuck
    assert quick == "quick answer"
    assert result["final_response"] == "done"


class _SilentPage:
    """A web server that accepts a request and never answers; it notices when the client hangs up."""

    def __init__(self) -> None:
        self.asked = threading.Event()
        self.hung_up = threading.Event()
        self._stop = threading.Event()
        page = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                page.asked.set()
                while not page._stop.is_set():
                    readable, _, _ = select.select([self.connection], [], [], 0.05)
                    if readable and not self.connection.recv(1, socket.MSG_PEEK):
                        page.hung_up.set()
                        return

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/slow"
        threading.Thread(target=self._httpd.serve_forever, args=(0.01,), daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()


@pytest.fixture
def silent_page() -> Iterator[_SilentPage]:
    page = _SilentPage()
    yield page
    page.close()


def test_an_interrupt_cuts_a_web_fetch_that_waits_for_a_silent_server(
    server: ScriptedServer, make_agent, home: Path, silent_page: _SilentPage
) -> None:
    (home / "config.yaml").write_text("agent: {api_max_retries: 0}\nweb: {allow_private: true}\n")
    server.add(Reply(tool_calls=[("web_fetch", {"url": silent_page.url, "timeout": 30})]))
    agent = make_agent()
    worker, outcome = run_in_background(agent, "fetch it")
    assert silent_page.asked.wait(10)

    agent.interrupt()
    worker.join(10)

    assert outcome["interrupted"] is True
    assert silent_page.hung_up.wait(5), "the fetch kept its connection open after the interrupt"


def test_a_tool_call_that_never_returns_does_not_keep_a_python_program_alive(
    server: ScriptedServer, home: Path, tmp_path: Path
) -> None:
    # A pre_tool_call hook that never returns stands for any tool stuck for good (a hung mount, a
    # server that trickles forever): it runs on the call's worker thread.
    (tmp_path / "stuck_hook.py").write_text(
        "import threading\n\ndef forever(name, args, task_id):\n    threading.Event().wait()\n"
    )
    (home / "config.yaml").write_text(
        "agent: {api_max_retries: 0, tool_timeout: 0.3}\nhooks: {pre_tool_call: ['stuck_hook:forever']}\n"
    )
    server.add(Reply(tool_calls=[("list_directory", {"path": "."})]), Reply(text="gave up on the listing"))
    program = (
        "import sys\nfrom run_agent import AIAgent\n"
        "with AIAgent(base_url=sys.argv[1], home=sys.argv[2]) as agent:\n    print(agent.chat('list it'))\n"
    )

    # The call is abandoned after 0.3 s; a worker thread that is not a daemon would keep the
    # interpreter waiting for it at exit, forever (the mibyan command itself ends with os._exit).
    done = subprocess.run(
        [sys.executable, "-c", program, server.base_url, str(home)],
        env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"},
        capture_output=True,
        text=True,
        timeout=20,
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "gave up on the listing"


def test_an_agent_level_tool_that_raises_becomes_error_text(server: ScriptedServer, make_agent) -> None:
    server.add(Reply(tool_calls=[("session_search", {"query": "bug", "limit": "ten"})]), Reply(text="ok"))

    result = make_agent().run_conversation("search")

    assert result["final_response"] == "ok"
    (answer,) = tool_results(result)
    assert answer.startswith("error: ValueError")


def test_a_subagent_that_cannot_start_is_an_error_for_the_model(
    server: ScriptedServer, make_agent, home: Path
) -> None:
    agent = make_agent()
    (home / "config.yaml").write_text("agent: {max_turns: many}\n")  # broken after the parent started
    server.add(Reply(tool_calls=[("delegate_task", {"goal": "look around"})]), Reply(text="ok"))

    result = agent.run_conversation("delegate")

    assert result["final_response"] == "ok"
    (answer,) = tool_results(result)
    assert answer.startswith("error: ConfigError") and "max_turns" in answer
    assert result["messages"][-2]["role"] == "tool"  # the call has its result; nothing dangles
