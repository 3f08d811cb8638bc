"""MCP servers: how much a healthy server delays the first request, and what mibyan adds to each call.

First request: from starting `mibyan chat -q` to the model server receiving the request, with one MCP
server configured (its tools cached by an earlier run, as after the first use) against the same run
without MCP (the floor); target: at most 300 ms more. Per call: an `echo` through mibyan's MCP tool (the
handler the executor calls: its thread hop to the MCP loop, the call, the result's formatting) against
the SDK's own `Client.call_tool` on a server of the same program (the floor: the server's own time and
the transport); target: at most 5 ms more.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from loopback import Reply, ScriptedServer  # noqa: E402

from bench.figures import show, stats  # noqa: E402

SERVER = [sys.executable, str(ROOT / "tests" / "mcp_test_server.py")]
NODE = ROOT / "tests" / "node" / "node_modules" / ".bin" / "mcp-server-filesystem"
CALLS = 200


def first_request_ms(server: ScriptedServer, home: Path, runs: int) -> tuple[list[float], list[float]]:
    env = {**os.environ, "MIBYAN_HOME": str(home), "PYTHONPATH": str(ROOT)}
    command = [
        sys.executable,
        "-m",
        "mibyan.cli.main",
        "chat",
        "-q",
        "hi",
        "-Q",
        "--base-url",
        server.base_url,
    ]
    with_mcp: list[float] = []
    without: list[float] = []
    config = home / "config.yaml"
    servers = {"files": {"command": str(NODE), "args": [str(home)]}} if NODE.exists() else {}
    servers = servers or {"py": {"command": SERVER[0], "args": SERVER[1:]}}
    for index in range(runs + 1):
        for sink, mcp in ((with_mcp, True), (without, False)):
            config.write_text(json.dumps({"mcp_servers": servers if mcp else {}}))
            count = len(server.requests)
            started = time.perf_counter()
            subprocess.run(
                command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False
            )
            if index:  # the first run fills the tool cache
                sink.append((server.requests[count].arrived - started) * 1000)
    return with_mcp, without


def mibyan_calls(home: Path) -> list[float]:
    from mibyan.config.mcp import McpServerSettings
    from mibyan.core.interruptible import InterruptSignal
    from mibyan.tools.context import RunContext
    from mibyan.tools.mcp_connections import McpConnections
    from mibyan.tools.mcp_tools import McpToolset

    settings = {"py": McpServerSettings(command=SERVER[0], args=SERVER[1:], approval="allow")}
    with McpConnections(settings, home=home, start_timeout=30) as connections:
        connections.start()
        connections.wait_settled(timeout=30)
        toolset = McpToolset(connections, owned=False, signal=InterruptSignal(), default_timeout=30)
        echo = toolset.specs()["mcp__py__echo"].handler
        run = RunContext()  # as the executor passes for a call
        samples = []
        for _ in range(CALLS):
            began = time.perf_counter()
            echo(run, text="hello")
            samples.append((time.perf_counter() - began) * 1000)
    return samples


def sdk_calls() -> list[float]:
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    async def run() -> list[float]:
        samples = []

        parameters = StdioServerParameters(command=SERVER[0], args=SERVER[1:])
        with open(os.devnull, "w") as quiet:
            async with Client(stdio_client(parameters, errlog=quiet)) as client:
                for _ in range(CALLS):
                    began = time.perf_counter()
                    await client.call_tool("echo", {"text": "hello"})
                    samples.append((time.perf_counter() - began) * 1000)
        return samples

    return asyncio.run(run())


def main(runs: int = 5) -> None:
    with (
        tempfile.TemporaryDirectory() as tmp,
        ScriptedServer(default=lambda body: Reply(text="ok")) as server,
    ):
        home = Path(tmp)
        ours, floor = first_request_ms(server, home, runs)
        show("first request, one healthy MCP server (cached)", ours, floor)
        print(f"  {'(the difference)':<46} {stats(ours)[0] - stats(floor)[0]:8.2f} ms  (target <= 300 ms)")
        calls, bare = mibyan_calls(home), sdk_calls()
        show("one MCP call (echo), through mibyan", calls, bare)
        print(f"  {'(the difference)':<46} {stats(calls)[0] - stats(bare)[0]:8.2f} ms  (target <= 5 ms)")


if __name__ == "__main__":
    main()
