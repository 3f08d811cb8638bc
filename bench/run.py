"""mibyan's benchmarks: start-up and per-iteration overhead, each beside the floor it is judged against.

Run with `python bench/run.py` from the repository (with mibyan installed in the running Python).
Every figure is the median of several runs with min/max, and a ratio to its floor measured in the same run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from loopback import Reply, ScriptedServer  # noqa: E402

from bench.figures import show  # noqa: E402

RUNS = int(os.environ.get("MIBYAN_BENCH_RUNS", "7"))
ROUNDS = 12  # tool rounds per per-iteration measurement


def wall(command: list[str], env: dict[str, str], runs: int = RUNS) -> list[float]:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def paired(command: list[str], floor: list[str], env: dict[str, str]) -> tuple[list[float], list[float]]:
    """Time `command` and its floor alternately, so drift in the machine's load hits both alike."""
    ours: list[float] = []
    base: list[float] = []
    for _ in range(RUNS):
        ours.extend(wall(command, env, runs=1))
        base.extend(wall(floor, env, runs=1))
    return ours, base


def mibyan_command() -> list[str]:
    script = Path(sys.executable).with_name("mibyan")
    return [str(script)] if script.exists() else [sys.executable, "-m", "mibyan.cli.main"]


def bench_startup(server: ScriptedServer, env: dict[str, str]) -> None:
    show("mibyan --help", *paired([*mibyan_command(), "--help"], [sys.executable, "-c", "pass"], env))

    server.default = lambda body: Reply(text="ok")
    bare_call = (
        "import openai\n"
        f"c = openai.OpenAI(base_url={server.base_url!r}, api_key='k', max_retries=0)\n"
        "for _ in c.chat.completions.create(model='m', messages=[{'role': 'user', 'content': 'hi'}],"
        " stream=True, stream_options={'include_usage': True}): pass\n"
    )
    one_shot = [*mibyan_command(), "chat", "-q", "hi", "--base-url", server.base_url, "-Q"]
    floor = [sys.executable, "-c", bare_call]
    show("one-shot `mibyan chat -q` (zero model latency)", *paired(one_shot, floor, env))
    show("  from the reply's last byte to process exit", *paired_tails(server, one_shot, floor, env))


def paired_tails(
    server: ScriptedServer, command: list[str], floor: list[str], env: dict[str, str]
) -> tuple[list[float], list[float]]:
    """From the server's last byte of the reply to the process's exit, for `command` and its floor."""
    ours: list[float] = []
    base: list[float] = []
    for _ in range(RUNS):
        for cmd, sink in ((command, ours), (floor, base)):
            subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
            sink.append((time.perf_counter() - server.reply_sent_at[-1]) * 1000)
    return ours, base


def time_to_prompt(env: dict[str, str]) -> float:
    """Milliseconds from starting `mibyan chat` in a terminal to its prompt being on the screen."""
    import os
    import pty
    import select

    started = time.perf_counter()
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(mibyan_command()[0], [*mibyan_command(), "chat"], env)
    seen = b""
    try:
        while "›".encode() not in seen:
            ready, _, _ = select.select([fd], [], [], 10)
            if not ready:
                raise RuntimeError("mibyan chat showed no prompt within 10 s")
            seen += os.read(fd, 4096)
        return (time.perf_counter() - started) * 1000
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(fd)


def bench_repl_startup(env: dict[str, str]) -> None:
    samples = [time_to_prompt(env) for _ in range(RUNS)]
    show("`mibyan chat` to a usable prompt", samples, wall([sys.executable, "-c", "pass"], env))


def gaps(server: ScriptedServer, first_request: int) -> list[float]:
    """Per iteration: from the last byte of a reply to the first byte of the next request, in ms."""
    arrived = [seen.arrived for seen in server.requests[first_request:]]
    sent = server.reply_sent_at[first_request:]
    return [(arrived[i + 1] - sent[i]) * 1000 for i in range(len(arrived) - 1)]


def history_of(length: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    while len(messages) < length:
        messages.append(
            {"role": "user", "content": f"Please look at file number {len(messages)} and tell me about it."}
        )
        messages.append(
            {
                "role": "assistant",
                "content": f"File {len(messages)} holds a short configuration section. " * 4,
            }
        )
    return messages[:length]


def tool_round_script(rounds: int) -> Callable[[dict[str, Any]], Reply]:
    count = {"n": 0}

    def reply(body: dict[str, Any]) -> Reply:
        count["n"] += 1
        if count["n"] % (rounds + 1) == 0:
            return Reply(text="finished")
        return Reply(tool_calls=[("noop", {})])

    return reply


def bench_iterations(server: ScriptedServer, length: int, home: Path) -> tuple[list[float], list[float]]:
    import openai

    from mibyan.tools.registry import tool
    from run_agent import AIAgent

    @tool(toolset="bench")
    def noop() -> str:
        """Do nothing."""
        return "ok"

    tools = [
        {
            "type": "function",
            "function": {
                "name": "noop",
                "description": "Do nothing.",
                "parameters": {"type": "object", "properties": {}},
            },
        }
    ]
    history = history_of(length)

    ours: list[float] = []
    server.default = tool_round_script(ROUNDS)
    for _ in range(max(RUNS // 2, 2)):
        agent = AIAgent(base_url=server.base_url, home=home, enabled_toolsets=["bench"])
        start = len(server.requests)
        agent.run_conversation("go", conversation_history=list(history))
        ours.extend(gaps(server, start))

    bare: list[float] = []
    client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
    for _ in range(max(RUNS // 2, 2)):
        start = len(server.requests)
        messages = [
            {"role": "system", "content": "You are an agent."},
            *history,
            {"role": "user", "content": "go"},
        ]
        while True:
            calls: dict[int, dict[str, Any]] = {}
            finish = None
            for chunk in client.chat.completions.create(
                model="m", messages=messages, tools=tools, stream=True, stream_options={"include_usage": True}
            ):
                for choice in chunk.choices:
                    for part in choice.delta.tool_calls or []:
                        slot = calls.setdefault(part.index, {"id": part.id, "name": "", "arguments": ""})
                        slot["name"] += part.function.name or ""
                        slot["arguments"] += part.function.arguments or ""
                    finish = choice.finish_reason or finish
            if finish != "tool_calls":
                break
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": c["id"],
                            "type": "function",
                            "function": {"name": c["name"], "arguments": c["arguments"]},
                        }
                        for c in calls.values()
                    ],
                }
            )
            messages.extend(
                {"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in calls.values()
            )
        bare.extend(gaps(server, start))
    return ours, bare


def bench_parallel_tools(server: ScriptedServer, home: Path) -> None:
    """8 terminal calls in one reply, each sleeping 0.5 s: wall time of the tool round vs one call."""
    from run_agent import AIAgent

    calls = [("terminal", {"command": "sleep 0.5"}) for _ in range(8)]
    rounds: list[float] = []
    single: list[float] = []
    for _ in range(max(RUNS // 2, 3)):
        for batch, sink in ((calls, rounds), (calls[:1], single)):
            server.script.extend([Reply(tool_calls=batch), Reply(text="done")])
            agent = AIAgent(base_url=server.base_url, home=home)
            start = len(server.requests)
            agent.run_conversation("run them")
            seen = server.requests[start:]
            sink.append((seen[1].arrived - server.reply_sent_at[start]) * 1000)
    show("8 parallel `sleep 0.5` terminal calls (round wall)", rounds, single)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, ScriptedServer() as server:
        home = Path(tmp)
        env = {**os.environ, "MIBYAN_HOME": tmp, "PYTHONPATH": str(ROOT)}
        print(f"mibyan benchmarks ({RUNS} runs each; python {sys.version.split()[0]})")
        bench_startup(server, env)
        bench_repl_startup(env)
        for length in (10, 2000):
            ours, bare = bench_iterations(server, length, home)
            show(f"per-iteration overhead, {length} messages", ours, bare)
            show(f"  bare openai SDK loop, {length} messages", bare)
        bench_parallel_tools(server, home)
    from bench import (
        acp_cancel,
        context,
        delegation,
        judge,
        mcp_servers,
        render,
        sandbox,
        sessions,
        skills,
        web,
    )

    sessions.main()
    skills.main()
    context.main()
    delegation.main()
    render.main()
    sandbox.main()
    judge.main()
    mcp_servers.main()
    acp_cancel.main()
    web.main()


if __name__ == "__main__":
    main()
