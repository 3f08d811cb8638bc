"""The matrix connector: the latency a message's answer adds over the homeserver's own round trip between
two clients, and messages answered per second with 10 rooms at once. Floor: a second Matrix client that
answers each message as soon as its sync hands it over, measured the same way (the asker's own sync).

Needs Synapse in `/opt/synapse-venv` (as the tests do). Run with `python bench/matrix.py` from the
repository; `MIBYAN_BENCH_RUNS` sets the samples (20).
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from conftest import wait_until  # noqa: E402
from gatewaying import RunningGateway, write_config  # noqa: E402
from loopback import Reply, ScriptedServer  # noqa: E402
from synapsing import Synapse, User, joined, missing_reason  # noqa: E402

from bench.figures import show  # noqa: E402

SAMPLES = int(os.environ.get("MIBYAN_BENCH_RUNS", "20"))
ROOMS, PER_ROOM = 10, 5
PASSWORD = "bench-password"


class Echo:
    """A second person's client that answers every message in its rooms the moment its sync sees it."""

    def __init__(self, user: User) -> None:
        self.user = user
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from nio import SyncResponse

        client = self.user.client
        since = self.user.run(client.sync(timeout=0)).next_batch
        while not self._stop.is_set():
            answer = self.user.run(client.sync(timeout=2000, since=since))
            if not isinstance(answer, SyncResponse):
                continue
            since = answer.next_batch
            for room_id in answer.rooms.invite:
                self.user.run(client.join(room_id))
            for room_id, room in answer.rooms.join.items():
                for event in room.timeline.events:
                    if (
                        event.source.get("sender") != self.user.user_id
                        and event.source["type"] == "m.room.message"
                    ):
                        body = {"msgtype": "m.text", "body": "echo " + event.source["content"]["body"]}
                        self.user.run(client.room_send(room_id, "m.room.message", body))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class Watcher:
    """The asker's own sync: waits for the next messages from `sender` (long-polled, no sleeping)."""

    def __init__(self, user: User) -> None:
        self.user = user
        self.since = user.run(user.client.sync(timeout=0)).next_batch

    def wait(self, sender: str, count: int = 1) -> None:
        from nio import SyncResponse

        seen = 0
        while seen < count:
            answer = self.user.run(self.user.client.sync(timeout=30_000, since=self.since))
            assert isinstance(answer, SyncResponse), answer
            self.since = answer.next_batch
            for room in answer.rooms.join.values():
                seen += sum(1 for e in room.timeline.events if e.source.get("sender") == sender)


def round_trip(alice: User, watcher: Watcher, room: str, peer: str, text: str) -> float:
    began = time.perf_counter()
    alice.send(room, text)
    watcher.wait(peer)
    return (time.perf_counter() - began) * 1000


def direct(alice: User, peer: str) -> str:
    room = alice.room(peer, direct=True, name="bench")
    assert wait_until(lambda: joined(alice, room, peer), 30), f"{peer} did not join"
    return room


def main() -> int:
    reason = missing_reason()
    if reason is not None:
        print(f"bench/matrix.py: {reason}")
        return 1
    with (
        tempfile.TemporaryDirectory() as scratch,
        ScriptedServer(default=lambda _body: Reply(text="ok")) as model,
    ):
        (Path(scratch) / "synapse").mkdir()
        synapse = Synapse(Path(scratch) / "synapse")
        try:
            return _measure(synapse, model, Path(scratch) / "home")
        finally:
            synapse.kill()


def _measure(synapse: Synapse, model: ScriptedServer, home: Path) -> int:
    alice, bob = User(synapse, "alice"), User(synapse, "bob")
    synapse.register("meepa", PASSWORD)
    for user_id in (alice.user_id, bob.user_id, "@meepa:localhost"):
        synapse.exempt(user_id)
    home.mkdir(mode=0o700)
    connector = {
        "name": "team",
        "kind": "matrix",
        "homeserver": synapse.url,
        "user_id": "@meepa:localhost",
        "password_env": "MIBYAN_MATRIX_PASSWORD",
        "allow": [alice.user_id],
    }
    agent: dict[str, Any] = {"id": "meepa", "default": True, "provider": "local", "model": "m"}
    write_config(home, {"local": model.base_url}, [agent], connectors=[connector])
    echo = Echo(bob)
    with RunningGateway(home, env={"MIBYAN_MATRIX_PASSWORD": PASSWORD}):
        peer_room, bot_room = direct(alice, bob.user_id), direct(alice, "@meepa:localhost")
        watcher = Watcher(alice)
        for room, peer in ((peer_room, bob.user_id), (bot_room, "@meepa:localhost")):
            round_trip(alice, watcher, room, peer, "warm up")
        floor, gateway = [], []
        for index in range(SAMPLES):  # alternately, so drift in the machine's load hits both alike
            floor.append(round_trip(alice, watcher, peer_room, bob.user_id, f"m{index}"))
            gateway.append(round_trip(alice, watcher, bot_room, "@meepa:localhost", f"m{index}"))
        show("a message answered by a second client", floor)
        show("a message answered by the agent", gateway, floor)
        show("added by mibyan", [g - f for g, f in zip(gateway, floor, strict=True)])
        rooms = [direct(alice, "@meepa:localhost") for _ in range(ROOMS)]
        watcher = Watcher(alice)
        began = time.perf_counter()
        for index in range(PER_ROOM):
            for room in rooms:
                alice.send(room, f"burst {index}")
        watcher.wait("@meepa:localhost", ROOMS * PER_ROOM)
        rate = ROOMS * PER_ROOM / (time.perf_counter() - began)
        print(f"{'messages answered per second, 10 rooms':<48} {rate:8.1f} /s", flush=True)
    echo.stop()
    for user in (alice, bob):
        user.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
