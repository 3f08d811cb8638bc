"""Subagents in parallel: a parent delegating 3 tasks (2 tool rounds each, 1 s model latency) vs 1 task."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from loopback import ScriptedServer  # noqa: E402
from test_delegation import script  # noqa: E402

from bench.figures import show  # noqa: E402


def main(runs: int = 3) -> None:
    from run_agent import AIAgent

    three: list[float] = []
    one: list[float] = []
    with tempfile.TemporaryDirectory() as tmp, ScriptedServer() as server:
        for _ in range(runs):
            for tasks, sink in ((3, three), (1, one)):
                server.default = script(rounds=2, delay=1.0, tasks=tasks)
                agent = AIAgent(base_url=server.base_url, home=Path(tmp))
                began = time.perf_counter()
                agent.run_conversation("delegate")
                sink.append((time.perf_counter() - began) * 1000)
    show("parent delegating 3 tasks (1 s model latency)", three, one)


if __name__ == "__main__":
    main()
