"""Where a gateway message's time goes: cProfile over the gateway's threads (its event loop, the agent
runs, the ledger) while messages are sent at 0 ms model latency on 1 channel, then on 10.

The gateway is `mibyan gateway`'s own start (`run_gateway`) on a thread of this process, the scripted
model on loopback beside it; the figures are CPU per message by function, summed over threads.
Run with `python bench/gateway_profile.py [channels] [messages] [top]` from the repository
(`MIBYAN_BENCH_PROFILE_DUMP=FILE` keeps the merged profile for `python -m pstats FILE`).
"""

from __future__ import annotations

import argparse
import concurrent.futures.thread as pool_threads
import cProfile
import io
import os
import pstats
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from gatewaying import TOKEN, write_config  # noqa: E402
from loopback import Reply, ScriptedServer  # noqa: E402

PROFILES: list[cProfile.Profile] = []
_worker = pool_threads._worker  # type: ignore[attr-defined]


def _profiled_worker(*args: Any, **kwargs: Any) -> None:
    """Every pool thread (agent runs, ledger I/O) under a profiler of its own."""
    profile = cProfile.Profile()
    PROFILES.append(profile)
    profile.enable()
    try:
        _worker(*args, **kwargs)
    finally:
        profile.disable()


def serve(home: Path) -> tuple[str, Callable[[], None], threading.Thread]:
    """The gateway on a thread, profiled; its URL and its stop."""
    from mibyan.cli.gateway import run_gateway

    os.environ.update({"MIBYAN_HOME": str(home), "MIBYAN_GATEWAY_TOKEN": TOKEN})
    ready = threading.Event()
    found: dict[str, Any] = {}

    def say(line: str) -> None:
        if " on http" in line:
            found["url"] = line.rsplit(" on ", 1)[1]
        if line.endswith(": ready"):
            ready.set()

    def hold(stop: Callable[[], None]) -> None:
        found["stop"] = stop

    def run() -> None:
        profile = cProfile.Profile()
        PROFILES.append(profile)
        profile.enable()
        try:
            run_gateway(argparse.Namespace(check=False), write=say, stop_with=hold)
        finally:
            profile.disable()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    if not ready.wait(60):
        raise RuntimeError("the gateway did not get ready")
    return found["url"], found["stop"], thread


def send(url: str, channels: int, messages: int) -> float:
    import openai

    clients = [openai.OpenAI(base_url=url, api_key=TOKEN, max_retries=0) for _ in range(channels)]

    def one(number: int) -> None:
        for index in range(messages // channels):
            clients[number].chat.completions.create(
                model="meepa",
                messages=[{"role": "user", "content": f"m {index}"}],
                extra_headers={"X-Mibyan-Channel": f"p-{channels}-{number}"},
            )

    # plain threads, not a pool: the pool's threads are the gateway's, profiled, and the clients are not
    threads = [threading.Thread(target=one, args=(number,)) for number in range(channels)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - began


def report(label: str, messages: int, top: int) -> None:
    out = io.StringIO()
    for profile in PROFILES:
        profile.create_stats()
    stats = pstats.Stats(*[p for p in PROFILES if p.stats], stream=out)  # type: ignore[arg-type,attr-defined]
    total = sum(row[2] for row in stats.stats.values())  # type: ignore[attr-defined]
    print(f"== {label}: {total / messages * 1000:.2f} ms of profiled CPU per message over all threads")
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)
    print(out.getvalue())
    dump = os.environ.get("MIBYAN_BENCH_PROFILE_DUMP")
    if dump:  # for pstats or snakeviz: `python -m pstats FILE`
        stats.dump_stats(dump)


def main() -> None:
    channels = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    messages = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 40
    pool_threads._worker = _profiled_worker  # type: ignore[attr-defined]
    with (
        tempfile.TemporaryDirectory() as tmp,
        ScriptedServer(default=lambda body: Reply(text="ok")) as server,
    ):
        home = Path(tmp)
        agents = [{"id": "meepa", "default": True, "provider": "local", "model": "m1"}]
        write_config(home, {"local": server.base_url}, agents, gateway={"max_concurrent": 100})
        url, stop, thread = serve(home)
        send(url, channels, channels * 2)  # the first messages (imports, probes) are not profiled
        for profile in PROFILES:
            profile.clear()
        seconds = send(url, channels, messages)
        print(f"{channels} channel(s): {messages / seconds:.1f} msg/s (profiled, so slower)")
        stop()  # the threads end, and with them their profiles
        thread.join(60)
        report(f"{channels} channel(s)", messages, top)


if __name__ == "__main__":
    main()
