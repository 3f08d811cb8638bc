"""Gateways on a PostgreSQL store beside one on SQLite, and two gateways beside one (DESIGN §16), on the
scripted model of the tests (loopback, 0 ms unless said). Each figure is printed beside its floor:

- the latency one gateway adds per message at one channel over the mock's own time, at p50 and p95, on
  SQLite and on PostgreSQL (floors: 5 and 10 ms, as bench/gateway.py's; and PostgreSQL's beside SQLite's);
- messages per second at 10 channels: one gateway on SQLite (floor: 150, bench/gateway.py's), one on
  PostgreSQL, two on PostgreSQL with each channel at one of them (floor: the one on PostgreSQL);
- one channel whose messages go to two gateways alternately (the lease goes back and forth; floor: the
  same messages to one gateway, so the ratio is the cost of the handoff);
- a repeated Idempotency-Key at the other gateway, sent while the first run's call is in flight: how long
  after the first reply it gets its own (the NOTIFY that wakes it; floor: `gateway.poll_seconds`, what
  looking again would take at the default).

PostgreSQL is a throwaway cluster started as tests/pging.py starts the tests' (or MIBYAN_TEST_PG_DSN).
The machine's cores are shared with the database and the gateways: read the ratios, and run it again
before believing a figure. Run with `python bench/gateway_shared.py` from the repository.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from gatewaying import RunningGateway, write_config  # noqa: E402
from loopback import Reply, ScriptedServer  # noqa: E402
from pging import fresh_database, shared_cluster  # noqa: E402

from bench.figures import show  # noqa: E402
from bench.gateway import COMPILED, ask, paired_latency, percentile  # noqa: E402

MESSAGES = int(os.environ.get("MIBYAN_BENCH_GATEWAY_MESSAGES", "200"))
LATENCY_SAMPLES = int(os.environ.get("MIBYAN_BENCH_RUNS", "60"))
REPEATS = int(os.environ.get("MIBYAN_BENCH_REPEATS", "10"))
CHANNELS = 10
AGENTS = [{"id": "meepa", "default": True, "provider": "local", "model": "m1"}]
IN_FLIGHT = 0.3  # seconds the first run's model call takes in the repeated-key figure
POLL_SECONDS = 1.0  # gateway.poll_seconds' default


@contextmanager
def gateways(server: ScriptedServer, count: int, url: str | None) -> Iterator[list[RunningGateway]]:
    """`count` gateways, each on a home of its own, sharing the PostgreSQL store `url` (None: one
    gateway on its home's SQLite)."""
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        started = []
        for number in range(count):
            home = Path(tmp) / f"home-{number}"
            home.mkdir(mode=0o700)
            extra = {"store": {"url": url}} if url else None
            write_config(
                home, {"local": server.base_url}, AGENTS, gateway={"max_concurrent": 100}, extra=extra
            )
            started.append(stack.enter_context(RunningGateway(home, env=COMPILED)))
        yield started


def throughput(at: list[RunningGateway], channels: int, messages: int) -> float:
    """Messages per second with `channels` clients, each on its own channel, at gateway `n % len(at)`."""
    per_channel = max(1, messages // channels)
    clients = [at[number % len(at)].client() for number in range(channels)]
    run = uuid.uuid4().hex[:6]
    for number, client in enumerate(clients):  # each channel's session exists, its connection is open
        ask(client, f"bench-{run}-{number}", "hello")

    def client(number: int) -> None:
        for index in range(per_channel):
            ask(clients[number], f"bench-{run}-{number}", f"message {index}")

    began = time.perf_counter()
    with ThreadPoolExecutor(channels) as pool:
        list(pool.map(client, range(channels)))
    return per_channel * channels / (time.perf_counter() - began)


def one_channel(at: list[RunningGateway], messages: int) -> list[float]:
    """Milliseconds per message on one channel, each sent after the last reply, to the gateways in turn."""
    clients = [gateway.client() for gateway in at]
    channel = f"turns-{uuid.uuid4().hex[:6]}"
    ask(clients[0], channel, "hello")
    samples = []
    for index in range(messages):
        began = time.perf_counter()
        ask(clients[index % len(clients)], channel, f"turn {index}")
        samples.append((time.perf_counter() - began) * 1000)
    return samples


def repeated_key(at: list[RunningGateway], server: ScriptedServer, repeats: int) -> list[float]:
    """Milliseconds from the first gateway's reply to the other's, for one Idempotency-Key sent to both:
    the other's request arrives while the first run's model call is in flight (IN_FLIGHT s)."""
    first, other = (gateway.client() for gateway in at)
    samples = [_one_repeat(first, other, server) for _ in range(repeats)]
    server.default = lambda body: Reply(text="ok")
    return samples


def _one_repeat(first: Any, other: Any, server: ScriptedServer) -> float:
    key = f"repeat-{uuid.uuid4().hex}"
    in_flight = threading.Event()

    def model(body: dict[str, Any]) -> Reply:
        in_flight.set()
        return Reply(text="once", delay=IN_FLIGHT)

    server.default = model
    done: dict[str, float] = {}

    def send(client: Any, name: str) -> None:
        client.chat.completions.create(
            model="meepa",
            messages=[{"role": "user", "content": "only once"}],
            extra_headers={"Idempotency-Key": key},
        )
        done[name] = time.perf_counter()

    with ThreadPoolExecutor(2) as pool:
        asked = pool.submit(send, first, "first")
        in_flight.wait(30)
        repeated = pool.submit(send, other, "other")
        asked.result(60)
        repeated.result(60)
    return max(0.0, done["other"] - done["first"]) * 1000


def latency(server: ScriptedServer, url: str | None, label: str) -> list[float]:
    with gateways(server, 1, url) as (gateway,):
        through, direct = paired_latency(gateway, server, LATENCY_SAMPLES)
    added = [a - b for a, b in zip(through, direct, strict=True)]
    show(f"one message through the gateway, {label}", through, direct)
    for name, fraction, floor in (("p50", 0.5, 5.0), ("p95", 0.95, 10.0)):
        value = percentile(through, fraction) - percentile(direct, fraction)
        print(f"{f'added latency at {name}, {label}':<48} {value:8.2f} ms   floor {floor:.2f} ms")
    return added


def main() -> None:
    with (
        ScriptedServer(default=lambda body: Reply(text="ok")) as server,
        shared_cluster(uuid.uuid4().hex[:8]) as cluster,
    ):
        on_sqlite = latency(server, None, "SQLite")
        with fresh_database(cluster) as url:
            on_postgres = latency(server, url, "PostgreSQL")
        show("added latency per message, PostgreSQL", on_postgres, on_sqlite)
        print(f"{'  (floor: the same on SQLite)':<48}")

        with gateways(server, 1, None) as one:
            sqlite_rate = throughput(one, CHANNELS, MESSAGES)
        print(
            f"{f'msg/s, {CHANNELS} channels, 1 gateway, SQLite':<48} {sqlite_rate:8.1f} msg/s   floor 150.0"
        )
        with fresh_database(cluster) as url, gateways(server, 2, url) as two:
            one_rate = throughput(two[:1], CHANNELS, MESSAGES)
            print(
                f"{f'msg/s, {CHANNELS} channels, 1 gateway, PostgreSQL':<48} {one_rate:8.1f} msg/s   "
                f"floor {sqlite_rate:.1f} (SQLite)  ratio {one_rate / sqlite_rate:.2f}x"
            )
            two_rate = throughput(two, CHANNELS, MESSAGES)
            print(
                f"{f'msg/s, {CHANNELS} channels, 2 gateways, PostgreSQL':<48} {two_rate:8.1f} msg/s   "
                f"floor {one_rate:.1f} (1 gateway)  ratio {two_rate / one_rate:.2f}x"
            )
            turns = max(10, MESSAGES // 4)
            alone = one_channel(two[:1], turns)
            handed = one_channel(two, turns)
            show("1 channel, 2 gateways in turn (per message)", handed, alone)
            print(f"{'  (floor: the same messages to 1 gateway)':<48}")
            waited = repeated_key(two, server, REPEATS)
            show("repeated key at the other gateway, after 1st", waited, [POLL_SECONDS * 1000])
            print(f"{'  (floor: looking again every poll_seconds)':<48}")


if __name__ == "__main__":
    main()
