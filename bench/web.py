"""Session viewer figures: the sessions list and a 2,000-message transcript, each fetched whole over
loopback HTTP from the viewer as `mibyan web` serves it (the token check, the queries, the templates),
beside the store reading the same rows.

The budget for both is 200 ms. Run with `python bench/web.py` (or as part of `python bench/run.py`).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent_state import SessionStore  # noqa: E402
from bench.figures import show, stats  # noqa: E402

BUDGET_MS = 200.0
RUNS = 9


def _turn(i: int) -> list[dict[str, object]]:
    """Four messages of a working session: a request, a tool call, its result, an answer in Markdown."""
    call = {
        "id": f"call_{i}",
        "type": "function",
        "function": {"name": "read_file", "arguments": json.dumps({"path": f"src/module_{i}.py"})},
    }
    return [
        {"role": "user", "content": f"Look at module {i} and tell me what <it> does."},
        {"role": "assistant", "content": None, "tool_calls": [call], "reasoning": "I should read it first."},
        {"role": "tool", "tool_call_id": f"call_{i}", "name": "read_file", "content": "x = 1\n" * 40},
        {
            "role": "assistant",
            "content": f"Module **{i}** sets `x`:\n\n- one line\n- [docs](https://example.com/{i})\n",
        },
    ]


def build(home: Path) -> str:
    with SessionStore.open(home) as store:
        for s in range(250):
            store.sessions.create(f"other{s:04d}", title=f"session {s}", source="cli", model="m")
        messages = [m for i in range(500) for m in _turn(i)]
        store.messages.replace("long", messages, create={"title": "a long session", "model": "m"})
        for i in range(1000):
            usage = {"input_tokens": 1000 + i, "output_tokens": 50, "cache_read_tokens": 800}
            store.events.record_model_call("long", "m", usage)
    return "long"


def timed(action: Callable[[], object], runs: int = RUNS) -> list[float]:
    samples = []
    for _ in range(runs):
        began = time.perf_counter()
        action()
        samples.append((time.perf_counter() - began) * 1000)
    return samples


def verdict(samples: list[float]) -> str:
    return "within" if stats(samples)[0] <= BUDGET_MS else "OVER"


@contextmanager
def serving(store: SessionStore) -> Iterator[int]:
    """The viewer on a loopback port, as `mibyan web` runs it, in a thread; yields the port."""
    import uvicorn

    from mibyan.core.net import listen_on
    from mibyan.web.app import create_app

    listener = listen_on("127.0.0.1", 0)
    app = create_app(store, token="t", cookie="c")
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[listener])), daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield listener.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        session_id = build(home)
        with SessionStore(home / "state.db", read_only=True) as store, serving(store) as port:
            connection = http.client.HTTPConnection("127.0.0.1", port)

            def get(path: str) -> None:
                connection.request("GET", path, headers={"Cookie": "c=t"})
                response = connection.getresponse()
                response.read()
                assert response.status == 200, response.status

            listing = timed(lambda: get("/"))
            floor = timed(lambda: store.sessions.newest_first(51))
            show("web: sessions list (251 sessions, 50 shown)", listing, floor)
            page = timed(lambda: get(f"/s/{session_id}"))
            floor = timed(lambda: store.messages.load(session_id))
            show("web: 2,000-message transcript, 1,000 calls", page, floor)
            budget = f"  budget {BUDGET_MS:.0f} ms: list {verdict(listing)}, transcript {verdict(page)}"
            print(budget, flush=True)


if __name__ == "__main__":
    main()
