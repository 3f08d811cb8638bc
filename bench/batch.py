"""`mibyan batch`: 1,000 tasks against the scripted model at 50 ms a call with 16 workers, local and Ray.

Each figure is the wall time of the whole command (start-up, validation, every task, the last write),
beside its floor: the ideal 1,000 x 50 ms / 16 = 3.1 s, as if the model's latency were the only cost.
Run with `python bench/batch.py [local|ray ...]` from the repository (Ray from the extra `mibyan[ray]`).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from loopback import Reply, ScriptedServer  # noqa: E402

from bench.figures import show  # noqa: E402

TASKS = int(os.environ.get("MIBYAN_BENCH_TASKS", "1000"))
WORKERS = 16
LATENCY = 0.05
RUNS = int(os.environ.get("MIBYAN_BENCH_RUNS", "3"))


def one_run(server: ScriptedServer, backend: str, tmp: Path) -> tuple[float, float, int, int]:
    """Seconds of one whole `mibyan batch run`, the CPU seconds of the processes it waited for (not Ray's
    workers), the tasks with a result line, and the model calls."""
    tasks = tmp / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"prompt": f"task {n}"}) + "\n" for n in range(TASKS)))
    out = tmp / f"out-{backend}-{time.monotonic_ns()}"
    environment = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    environment.update({"MIBYAN_HOME": str(tmp / "home"), "OPENAI_API_KEY": "k", "PYTHONPATH": str(ROOT)})
    command = [sys.executable, "-m", "mibyan.cli.main", "batch", "run", str(tasks), "--out", str(out)]
    command += ["--workers", str(WORKERS), "--backend", backend, "--base-url", server.base_url, "-Q"]
    calls_before = len(server.requests)
    cpu_before = _children_cpu()
    started = time.perf_counter()
    done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=600, check=False)
    seconds = time.perf_counter() - started
    cpu = _children_cpu() - cpu_before
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
    results = sum(len(p.read_text().splitlines()) for p in (out / "results").glob("part-*.jsonl"))
    return seconds, cpu, results, len(server.requests) - calls_before


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(backends: list[str]) -> None:
    ideal = TASKS * LATENCY / WORKERS
    with tempfile.TemporaryDirectory() as folder, ScriptedServer() as server:
        server.default = lambda body: Reply(text="done", delay=LATENCY)
        for backend in backends:
            samples: list[float] = []
            cpu: list[float] = []
            for _ in range(RUNS):
                seconds, used, results, calls = one_run(server, backend, Path(folder))
                samples.append(seconds)
                cpu.append(used)
                if results != TASKS or calls != TASKS:
                    print(f"{backend}: {results} results, {calls} model calls of {TASKS} tasks", flush=True)
            show(f"batch {TASKS} tasks x 50 ms, {WORKERS} workers, {backend}", samples, [ideal], unit="s")
            if backend == "local":  # Ray's workers are not the command's children: their CPU is not seen
                per_task = sorted(cpu)[len(cpu) // 2] / TASKS * 1000
                print(f"  CPU of the command: {per_task:.1f} ms a task, {os.cpu_count()} core(s)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["local", "ray"])
