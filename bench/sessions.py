"""Session store figures: per-message insert cost as a session grows, resume time, search time."""

from __future__ import annotations

import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent_state import SessionStore  # noqa: E402
from bench.figures import show  # noqa: E402

WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
    "sierra",
    "tango",
    "uniform",
    "victor",
    "whiskey",
    "xray",
    "yankee",
    "zulu",
]


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 30)))


def message(i: int, rng: random.Random) -> dict[str, object]:
    role = "user" if i % 2 == 0 else "assistant"
    return {"role": role, "content": sentence(rng)}


def insert_cost(
    store: SessionStore, session_id: str, start: int, count: int, rng: random.Random
) -> list[float]:
    samples = []
    for i in range(start, start + count):
        began = time.perf_counter()
        store.messages.append(session_id, message(i, rng))
        samples.append((time.perf_counter() - began) * 1000)
    return samples


SEARCH_FLOOR_MS = 50.0  # what `sessions search` may add to `mibyan --help`; the query itself is a few ms


def bench_search_command(home: Path) -> None:
    """Wall time of `mibyan sessions search` minus `mibyan --help`, run alternately, beside its floor."""
    from bench.run import RUNS, mibyan_command, wall

    env = {**os.environ, "MIBYAN_HOME": str(home), "PYTHONPATH": str(ROOT)}
    search = [*mibyan_command(), "sessions", "search", "zanzibarite"]
    extra = []
    for _ in range(RUNS):
        extra.append(wall(search, env, runs=1)[0] - wall([*mibyan_command(), "--help"], env, runs=1)[0])
    show("`mibyan sessions search` minus `--help`, 110,000", extra, [SEARCH_FLOOR_MS])


def main() -> None:
    rng = random.Random(7)
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        store = SessionStore.open(home)
        store.sessions.create("growing", model="m", title="growing")
        at_100 = insert_cost(store, "growing", 0, 100, rng)[-50:]
        store.messages.replace("growing", [message(i, rng) for i in range(9_950)])
        at_10k = insert_cost(store, "growing", 9_950, 50, rng)
        show("insert one message, session of 100", at_100)
        show("insert one message, session of 10,000", at_10k, at_100)

        from run_agent import AIAgent

        resume = []
        for _ in range(5):
            began = time.perf_counter()
            agent = AIAgent(session_id="growing", home=home, base_url="http://127.0.0.1:9/v1")
            resume.append((time.perf_counter() - began) * 1000)
            assert len(agent.session.history) == 10_000
        show("resume a 10,000-message session (AIAgent)", resume)

        for n in range(10):
            store.sessions.create(f"bulk{n}", model="m", title=f"bulk {n}")
            store.messages.replace(f"bulk{n}", [message(i, rng) for i in range(10_000)])
        store.messages.append(
            "bulk3", {"role": "user", "content": "where did I put the zanzibarite crystal?"}
        )
        searches = []
        for _ in range(20):
            began = time.perf_counter()
            hits = store.search("zanzibarite")
            searches.append((time.perf_counter() - began) * 1000)
            assert len(hits) == 1
        show("search one word among 110,000 messages", searches)
        common = []
        for _ in range(5):
            began = time.perf_counter()
            store.search("alpha bravo", limit=20)
            common.append((time.perf_counter() - began) * 1000)
        show("search two common words, top 20 of 110,000", common)
        bench_search_command(home)
        ratio = statistics.median(at_10k) / statistics.median(at_100)
        print(f"  median ratio insert@10k / insert@100: {ratio:.2f}")


if __name__ == "__main__":
    main()
