"""The gateway against its floors, on the scripted model of the tests (loopback, 0 ms unless said):

- launch to `ready` with two agents (floor: 200 ms);
- the first message of a fresh gateway over the later ones (floor: 1.5x);
- the latency it adds per message at one channel over the mock's own time (a client asking the mock
  straight), at p50 and p95 (floors: 5 and 10 ms), alternating the two so drift in load hits both;
- messages per second at 1, 10 and 50 channels (floor: 150 at 10 channels), and the gateway's CPU per
  message at 10 channels beside what the model SDK alone spends on one such streamed call (the part of a
  message no gateway can take out): a ratio a slower machine scales alike, where msg/s and ms do not;
- 20 channels at once at 1 s model latency (floor: 1.1 s);
- its resident memory with 2 agents after 100 channels, in a gateway of its own (floor: 80 MiB).

The machine's cores are shared: read the ratios, and run it again before believing a figure.
Run with `python bench/gateway.py` from the repository.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from gatewaying import RunningGateway, write_config  # noqa: E402
from loopback import Reply, ScriptedServer  # noqa: E402

from bench.figures import show  # noqa: E402

MESSAGES = int(os.environ.get("MIBYAN_BENCH_GATEWAY_MESSAGES", "300"))
LATENCY_SAMPLES = int(os.environ.get("MIBYAN_BENCH_RUNS", "60"))
STARTS = int(os.environ.get("MIBYAN_BENCH_STARTS", "5"))
AGENTS = [
    {"id": "meepa", "default": True, "provider": "local", "model": "m1"},
    {"id": "bob", "provider": "local", "model": "m2"},
]
SLOW = 1.0  # seconds the model takes in the 20-channel figure
#: the gateway may keep its compiled modules (a machine that forbids it, as these do, compiles them at
#: every start, which is the interpreter's cost and not the gateway's)
COMPILED = {"PYTHONDONTWRITEBYTECODE": ""}


def ask(client: Any, channel: str, text: str, model: str = "meepa") -> None:
    client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": text}], extra_headers={"X-Mibyan-Channel": channel}
    )


def throughput(gateway: RunningGateway, channels: int, messages: int) -> tuple[float, float]:
    """Messages per second with `channels` clients, each sending its share in turn on its own channel,
    and the gateway process's CPU per message (ms) meanwhile."""
    per_channel = max(1, messages // channels)
    clients = [gateway.client() for _ in range(channels)]
    for number, client in enumerate(clients):  # each channel's session exists, its connection is open
        ask(client, f"bench-{channels}-{number}", "hello")

    def client(number: int) -> None:
        for index in range(per_channel):
            ask(clients[number], f"bench-{channels}-{number}", f"message {index}")

    began, cpu = time.perf_counter(), cpu_seconds(gateway.process.pid)
    with ThreadPoolExecutor(channels) as pool:
        list(pool.map(client, range(channels)))
    sent = per_channel * channels
    return sent / (time.perf_counter() - began), (cpu_seconds(gateway.process.pid) - cpu) / sent * 1000


def cpu_seconds(pid: int) -> float:
    """The CPU time (user and system, all threads) process `pid` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sdk_call_cpu(server: ScriptedServer, calls: int) -> list[float]:
    """The CPU (ms) this thread spends on one streamed call to the mock through the model SDK, as the
    gateway's agents call it: the SDK's own share of every message."""
    import openai

    mock = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
    samples = []
    for index in range(calls + 2):
        began = time.thread_time()
        for _ in mock.chat.completions.create(
            model="m1", messages=[{"role": "user", "content": f"direct {index}"}], stream=True
        ):
            pass
        samples.append((time.thread_time() - began) * 1000)
    return samples[2:]  # the first two open the connection and import what a call needs


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def paired_latency(
    gateway: RunningGateway, server: ScriptedServer, samples: int
) -> tuple[list[float], list[float]]:
    """One message through the gateway and one straight to the mock (streamed, as the agents call it),
    alternately. Milliseconds."""
    import openai

    client = gateway.client()
    mock = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
    ask(client, "latency", "warm up")
    through, direct = [], []
    for index in range(samples):
        began = time.perf_counter()
        ask(client, "latency", f"latency {index}")
        through.append((time.perf_counter() - began) * 1000)
        began = time.perf_counter()
        stream = mock.chat.completions.create(
            model="m1", messages=[{"role": "user", "content": f"direct {index}"}], stream=True
        )
        for _ in stream:
            pass
        direct.append((time.perf_counter() - began) * 1000)
    return through, direct


def resident_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc")


def starts(server: ScriptedServer) -> tuple[list[float], list[float], list[float]]:
    """Fresh gateways (each on a fresh home): launch to ready, the first message, the next five, each
    message on a channel of its own (a new channel's session is made by the first message and the
    later ones alike, so what differs is the gateway's first). Milliseconds."""
    ready, first, later = [], [], []
    for _ in range(STARTS):
        with tempfile.TemporaryDirectory() as tmp:
            home = Path(tmp)
            write_config(home, {"local": server.base_url}, AGENTS)
            began = time.perf_counter()
            with RunningGateway(home, env=COMPILED) as gateway:
                ready.append((time.perf_counter() - began) * 1000)
                client = gateway.client()
                client.models.list()  # the client's connection is open before anything is timed,
                _ = client.chat.completions  # and its own chat modules imported (this process's cost)
                for index in range(6):
                    began = time.perf_counter()
                    ask(client, f"first-{index}", "hello")  # each a new channel, as the first is
                    (first if index == 0 else later).append((time.perf_counter() - began) * 1000)
    return ready, first, later


def twenty_slow_channels(gateway: RunningGateway, server: ScriptedServer) -> float:
    """Seconds until 20 channels, asking at once, are all answered by a model taking SLOW seconds."""
    clients = [gateway.client() for _ in range(20)]
    for number, client in enumerate(clients):
        ask(client, f"slow-{number}", "hello")
    server.default = lambda body: Reply(text="ok", delay=SLOW)
    try:
        began = time.perf_counter()
        with ThreadPoolExecutor(20) as pool:
            list(pool.map(lambda n: ask(clients[n], f"slow-{n}", "slow"), range(20)))
        return time.perf_counter() - began
    finally:
        server.default = lambda body: Reply(text="ok")


def after_100_channels(server: ScriptedServer) -> float:
    """MiB resident in a fresh gateway once 100 channels of one agent and one of the other are answered
    (one client after the other, as people arrive; the throughput runs' many threads are not in it)."""
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        write_config(home, {"local": server.base_url}, AGENTS)
        with RunningGateway(home, env=COMPILED) as gateway:
            client = gateway.client()
            for number in range(100):
                ask(client, f"idle-{number}", "hi")
            ask(client, "b", "hi", model="bob")
            return resident_mib(gateway.process.pid)


def main() -> None:
    with ScriptedServer(default=lambda body: Reply(text="ok")) as server:
        ready, first, later = starts(server)
        show("launch to ready, 2 agents", ready, [200.0])
        show("first message of a fresh gateway", first, later)
        print(f"{'  (floor: 1.5x the later messages)':<48}")
        with tempfile.TemporaryDirectory() as tmp:
            home = Path(tmp)
            write_config(home, {"local": server.base_url}, AGENTS, gateway={"max_concurrent": 100})
            with RunningGateway(home, env=COMPILED) as gateway:
                through, direct = paired_latency(gateway, server, LATENCY_SAMPLES)
                show("one message through the gateway, 1 channel", through, direct)
                for name, fraction, floor in (("p50", 0.5, 5.0), ("p95", 0.95, 10.0)):
                    added = percentile(through, fraction) - percentile(direct, fraction)
                    label = f"added latency at {name} over the mock"
                    print(f"{label:<48} {added:8.2f} ms   floor {floor:.2f} ms")
                for channels in (1, 10, 50):
                    rate, cpu = throughput(gateway, channels, MESSAGES)
                    floor = "   floor 150.0 msg/s" if channels == 10 else ""
                    label = f"messages per second, {channels} channel(s), 0 ms model"
                    print(f"{label:<48} {rate:8.1f} msg/s{floor}")
                    if channels == 10:
                        sdk = sdk_call_cpu(server, LATENCY_SAMPLES)
                        show("  gateway CPU per message, 10 channels", [cpu], sdk)
                        print("  (floor: what the SDK alone spends on one streamed call)")
                seconds = twenty_slow_channels(gateway, server)
                print(f"{f'20 channels at once, {SLOW:.0f} s model':<48} {seconds:8.2f} s      floor 1.10 s")
        print(
            f"{'resident memory, 2 agents, after 100 channels':<48} {after_100_channels(server):8.1f} MiB"
            "  floor 80.0 MiB"
        )


if __name__ == "__main__":
    main()
