"""The gateway: messages per second at 0 ms model latency with 1, 10 and 100 channels, the latency it adds
per message over a direct `AIAgent.run_conversation`, and its resident memory with 2 agents and 100 idle
channel sessions. Targets: added latency <= 5 ms at p50 (one channel), memory <= 150 MiB.

Run with `python bench/gateway.py` from the repository.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from gatewaying import RunningGateway, write_config  # noqa: E402
from loopback import Reply, ScriptedServer  # noqa: E402

from agent_state import SessionStore  # noqa: E402
from bench.figures import show  # noqa: E402

MESSAGES = int(os.environ.get("MIBYAN_BENCH_GATEWAY_MESSAGES", "200"))
LATENCY_SAMPLES = int(os.environ.get("MIBYAN_BENCH_RUNS", "30"))
AGENTS = [
    {"id": "meepa", "default": True, "provider": "local", "model": "m1"},
    {"id": "bob", "provider": "local", "model": "m2"},
]


def throughput(gateway: RunningGateway, channels: int, messages: int) -> float:
    """Messages per second with `channels` clients, each sending its share in turn on its own channel."""
    per_channel = max(1, messages // channels)

    def client(number: int) -> None:
        openai_client = gateway.client()
        for index in range(per_channel):
            openai_client.chat.completions.create(
                model="meepa",
                messages=[{"role": "user", "content": f"message {index}"}],
                extra_headers={"X-Mibyan-Channel": f"bench-{channels}-{number}"},
            )

    began = time.perf_counter()
    with ThreadPoolExecutor(channels) as pool:
        list(pool.map(client, range(channels)))
    return per_channel * channels / (time.perf_counter() - began)


def paired_latency(gateway: RunningGateway, home: Path, samples: int) -> tuple[list[float], list[float]]:
    """One message through the gateway and one straight to `run_conversation`, alternately, so drift in
    the machine's load hits both alike. Both continue one session, so their histories grow alike."""
    from run_agent import AIAgent

    client = gateway.client()
    agent = AIAgent(model="m1", provider="local", home=home, max_iterations=10)
    through, direct = [], []
    for index in range(samples):
        began = time.perf_counter()
        client.chat.completions.create(
            model="meepa",
            messages=[{"role": "user", "content": f"latency {index}"}],
            extra_headers={"X-Mibyan-Channel": "latency"},
        )
        through.append((time.perf_counter() - began) * 1000)
        began = time.perf_counter()
        agent.run_conversation(f"direct {index}")
        direct.append((time.perf_counter() - began) * 1000)
    return through, direct


def resident_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc")


def main() -> None:
    with (
        tempfile.TemporaryDirectory() as tmp,
        ScriptedServer(default=lambda body: Reply(text="ok")) as server,
    ):
        home = Path(tmp)
        write_config(home, {"local": server.base_url}, AGENTS, gateway={"max_concurrent": 100})
        with RunningGateway(home) as gateway:
            print(f"{'resident memory when ready':<48} {resident_mib(gateway.process.pid):8.1f} MiB")
            for channels in (1, 10, 100):
                rate = throughput(gateway, channels, MESSAGES)
                print(f"{f'messages per second, {channels} channel(s), 0 ms model':<48} {rate:8.1f} msg/s")
            through_gateway, direct = paired_latency(gateway, home, LATENCY_SAMPLES)
            show("one message through the gateway (one channel)", through_gateway, direct)
            added = statistics.median(through_gateway) - statistics.median(direct)
            print(f"{'added latency per message at p50':<48} {added:8.2f} ms   target <= 5.00 ms")
            gateway.client().chat.completions.create(
                model="bob",
                messages=[{"role": "user", "content": "hi"}],
                extra_headers={"X-Mibyan-Channel": "b"},
            )
            store = SessionStore.open(home)
            channels = store.channels.count()
            store.close()
            rss = resident_mib(gateway.process.pid)
            label = f"resident memory, 2 agents, {channels} idle channel sessions"
            print(f"{label:<48} {rss:8.1f} MiB  target <= 150.0 MiB")


if __name__ == "__main__":
    main()
