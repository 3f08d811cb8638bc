"""Chat rendering: time to stream a long answer (5,000 pieces) through the Markdown renderer."""

from __future__ import annotations

import io
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402

from bench.figures import show  # noqa: E402
from mibyan.agent.turn_state import ConversationResult  # noqa: E402
from mibyan.cli.render import Renderer  # noqa: E402

_RESULT: ConversationResult = {
    "final_response": "",
    "messages": [],
    "session_id": "s",
    "task_id": "t",
    "api_calls": 1,
    "completed": True,
    "interrupted": False,
    "exit_reason": "completed",
    "usage": {"input_tokens": 1, "output_tokens": 1},
    "error": None,
}


def main(runs: int = 3) -> None:
    samples = []
    for _ in range(runs):
        renderer = Renderer(Console(file=io.StringIO(), width=100, force_terminal=True))
        began = time.perf_counter()
        for i in range(5000):
            renderer.on_delta(f"word{i} " + ("\n\n" if i % 40 == 0 else ""))
        renderer.end_turn(_RESULT, "m")
        samples.append((time.perf_counter() - began) * 1000)
    show("stream a 5,000-piece answer through the renderer", samples)


if __name__ == "__main__":
    main()
