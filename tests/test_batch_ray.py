"""`mibyan batch run --backend ray` against one local Ray of 1 CPU, started once for the session (marker
`ray`, left out of the default run: `pytest -m ray`); skipped with the reason where Ray is not installed."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from loopback import Reply, ScriptedServer
from test_batch import _batch, _final, _results, _start, _write_tasks

pytestmark = pytest.mark.ray


@pytest.fixture(scope="session")
def ray_address() -> Iterator[str]:
    """The address of a Ray with one CPU (fewer than the actors of a run need at a quarter each)."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'mibyan[ray]')")
    context = ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield str(context.address_info["gcs_address"])
    finally:
        ray.shutdown()


def test_the_ray_backend_gives_the_results_of_the_local_one(
    server: ScriptedServer, home: Path, tmp_path: Path, ray_address: str
) -> None:
    server.default = lambda body: Reply(text="answer to " + body["messages"][-1]["content"])
    tasks = _write_tasks(tmp_path / "t.jsonl", [{"prompt": f"task {n % 3}"} for n in range(6)])
    outcomes = {}
    for backend in ("local", "ray"):
        out = tmp_path / backend
        where = ["--ray-address", ray_address] if backend == "ray" else []
        done = _batch(server, home, "run", str(tasks), "--out", str(out), "--backend", backend, *where, "-Q")
        assert done.returncode == 0, done.stderr
        outcomes[backend] = {
            line["task_id"]: (line["disposition"], line["final_response"]) for line in _results(out)
        }
        assert len(list((out / "trajectories").glob("part-*.jsonl"))) >= 1
    assert outcomes["ray"] == outcomes["local"] and len(outcomes["local"]) == 6


def test_more_workers_than_the_cluster_holds_at_a_quarter_cpu_all_run_at_once_and_all_tasks_end(
    server: ScriptedServer, home: Path, tmp_path: Path, ray_address: str
) -> None:
    # 5 actors at a quarter of a CPU do not fit on 1 CPU: the one left unplaced held its task for good (the
    # stall at 992/1,000). The first 5 calls answer only once all 5 are in flight together.
    together = threading.Barrier(5, timeout=60)
    calls = [0]
    lock = threading.Lock()

    def reply(body: dict[str, Any]) -> Reply:
        with lock:
            calls[0] += 1
            first = calls[0] <= 5
        if not first:
            return Reply(text="after")
        try:
            together.wait()
        except threading.BrokenBarrierError:
            return Reply(text="alone")
        return Reply(text="together")

    server.default = reply
    tasks = _write_tasks(tmp_path / "t.jsonl", [{"prompt": f"task {n}"} for n in range(7)])
    out = tmp_path / "out"
    run = ["run", str(tasks), "--out", str(out), "--workers", "5", "--backend", "ray"]
    done = _batch(server, home, *run, "--ray-address", ray_address, "-Q")
    assert done.returncode == 0, done.stderr
    answers = sorted(line["final_response"] for line in _results(out))
    assert answers == ["after"] * 2 + ["together"] * 5
    assert sorted(_final(out).values()) == ["ok"] * 7


def test_ctrl_c_on_ray_records_the_running_tasks_as_interrupted_and_the_resume_runs_the_rest(
    server: ScriptedServer, home: Path, tmp_path: Path, ray_address: str
) -> None:
    quick = {"task 0", "task 1"}

    def reply(body: dict[str, Any]) -> Reply:
        if body["messages"][-1]["content"] in quick:
            return Reply(text="done")
        return Reply(text="late", delay=60)  # until the interrupted agent hangs up

    server.default = reply
    tasks = _write_tasks(tmp_path / "t.jsonl", [{"prompt": f"task {n}"} for n in range(6)])
    out = tmp_path / "out"
    run = ["run", str(tasks), "--out", str(out), "--workers", "2", "--backend", "ray"]
    batch = _start(server, home, *run, "--ray-address", ray_address)
    assert server.wait_for_requests(4, timeout=120)  # tasks 0 and 1 done, 2 and 3 held
    batch.send_signal(signal.SIGINT)
    _, stderr = batch.communicate(timeout=120)
    assert batch.returncode == 130, stderr
    assert len(server.requests) == 4  # nothing submitted after the Ctrl-C
    by_line = {line["line"]: line["disposition"] for line in _results(out)}
    assert by_line == {1: "ok", 2: "ok", 3: "interrupted", 4: "interrupted"}

    server.default = lambda body: Reply(text="done")
    again = _batch(server, home, *run, "--ray-address", ray_address, "-Q")
    assert again.returncode == 0, again.stderr
    resumed = [request.body["messages"][-1]["content"] for request in server.requests[4:]]
    assert sorted(resumed) == ["task 2", "task 3", "task 4", "task 5"]
    assert sorted(_final(out).values()) == ["ok"] * 6
