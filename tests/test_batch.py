"""`mibyan batch`: tasks from a JSONL file, validated first, resumable by content (the loopback model)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from conftest import ROOT, run_cli, wait_until
from loopback import Reply, ScriptedServer


def _write_tasks(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def _batch(server: ScriptedServer, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("batch", *args, "--base-url", server.base_url, home=home, env={"OPENAI_API_KEY": "k"})


def _start(server: ScriptedServer, home: Path, *args: str) -> subprocess.Popen[bytes]:
    environment = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    environment.update({"MIBYAN_HOME": str(home), "PYTHONPATH": str(ROOT), "OPENAI_API_KEY": "k"})
    command = [sys.executable, "-m", "mibyan.cli.main", "batch", *args, "--base-url", server.base_url]
    return subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _results(out: Path) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    for path in sorted((out / "results").glob("part-*.jsonl")):
        for raw in path.read_text().split("\n"):
            try:
                lines.append(json.loads(raw))
            except ValueError:
                continue  # a torn line
    return lines


def _final(out: Path) -> dict[str, str]:
    latest: dict[str, str] = {}
    for line in _results(out):
        latest[line["task_id"]] = line["disposition"]
    return latest


def test_a_row_whose_prompt_is_a_number_stops_the_run_before_any_model_call(
    server: ScriptedServer, home: Path, tmp_path: Path
) -> None:
    tasks = _write_tasks(tmp_path / "t.jsonl", [{"prompt": "fine"}, {"prompt": 123}, {"prompt": "fine too"}])
    done = _batch(server, home, "run", str(tasks), "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and f"{tasks}:2: prompt must be a non-empty string" in done.stderr
    assert server.requests == []
    assert not (tmp_path / "out" / "results").exists()


def test_skip_invalid_records_the_bad_lines_as_invalid_and_runs_the_others(
    server: ScriptedServer, home: Path, tmp_path: Path
) -> None:
    server.default = lambda body: Reply(text="done")
    tasks = _write_tasks(tmp_path / "t.jsonl", ["{not json", {"prompt": "fine"}, {"promt": "typo"}])
    out = tmp_path / "out"
    done = _batch(server, home, "run", str(tasks), "--out", str(out), "--skip-invalid", "-Q")
    assert done.returncode == 0, done.stderr
    assert sorted(_final(out).values()) == ["invalid", "invalid", "ok"]
    assert len(server.requests) == 1
    again = _batch(server, home, "run", str(tasks), "--out", str(out), "--skip-invalid", "-Q")
    assert again.returncode == 0 and len(_results(out)) == 3  # nothing recorded twice


def test_the_same_prompt_three_times_is_three_tasks_and_a_resume_runs_only_those_left(
    server: ScriptedServer, home: Path, tmp_path: Path
) -> None:
    server.default = lambda body: Reply(text="same answer")
    tasks = _write_tasks(tmp_path / "t.jsonl", [{"prompt": "again"}] * 3)
    out = tmp_path / "out"
    first = _batch(server, home, "run", str(tasks), "--out", str(out), "--max-tokens", "1", "--workers", "1")
    assert first.returncode == 3, first.stderr  # the budget stopped it after the first task
    assert list(_final(out).values()) == ["ok"] and len(server.requests) == 1
    second = _batch(server, home, "run", str(tasks), "--out", str(out))
    assert second.returncode == 0, second.stderr
    assert len(server.requests) == 3
    assert len(_final(out)) == 3 and set(_final(out).values()) == {"ok"}


def test_killed_mid_run_and_run_again_only_the_missing_tasks_call_the_model(
    server: ScriptedServer, home: Path, tmp_path: Path
) -> None:
    release = threading.Event()
    answered = Counter[str]()

    def reply(body: dict[str, Any]) -> Reply:
        prompt = body["messages"][-1]["content"]
        if not release.is_set() and len(answered) >= 4:
            release.wait(30)  # held in flight until the batch is killed
        answered[prompt] += 1
        return Reply(text=f"answer to {prompt}")

    server.default = reply
    tasks = _write_tasks(tmp_path / "t.jsonl", [{"prompt": f"task {n}"} for n in range(10)])
    out = tmp_path / "out"
    batch = _start(server, home, "run", str(tasks), "--out", str(out), "--workers", "2")
    try:
        assert wait_until(lambda: len(_results(out)) >= 4 and len(server.requests) >= 6)
    finally:
        batch.kill()  # SIGKILL: no chance to write anything more
        batch.wait()
    release.set()
    before = {line["task_id"] for line in _results(out)}
    assert len(before) == 4
    # a line the killed run had only half written names a task it never finished: it is not a result
    from mibyan.batch.tasks import read_tasks

    missing = next(task.task_id for task in read_tasks(tasks)[0] if task.task_id not in before)
    torn = next((out / "results").glob("part-0001-*.jsonl"))
    with torn.open("a") as part:
        part.write(json.dumps({"task_id": missing, "disposition": "ok"})[:-1])  # no closing brace, no newline
    calls_before = len(server.requests)
    again = _batch(server, home, "run", str(tasks), "--out", str(out), "--workers", "2", "-Q")
    assert again.returncode == 0, again.stderr
    assert len(server.requests) - calls_before == 6  # exactly the six tasks without a result
    lines = _results(out)
    assert Counter(line["task_id"] for line in lines).most_common(1)[0][1] == 1
    assert len(lines) == 10 and {line["disposition"] for line in lines} == {"ok"}
    for part in (out / "results").glob("part-*.jsonl"):
        runs = {json.loads(raw)["run"] for raw in part.read_text().splitlines() if raw.endswith("}")}
        assert runs == {int(part.name.split("-")[1])}  # each file written by one run alone
    status = run_cli("batch", "status", str(out), "--json", home=home)
    counted = json.loads(status.stdout)
    assert counted["dispositions"]["ok"] == 10 and counted["pending"] == 0


def test_a_resume_with_another_model_is_refused_in_one_line(
    server: ScriptedServer, home: Path, tmp_path: Path
) -> None:
    server.default = lambda body: Reply(text="done")
    tasks = _write_tasks(tmp_path / "t.jsonl", [{"prompt": "one"}])
    out = tmp_path / "out"
    assert _batch(server, home, "run", str(tasks), "--out", str(out), "-Q").returncode == 0
    other = _batch(server, home, "run", str(tasks), "--out", str(out), "-m", "another-model")
    assert other.returncode == 2
    assert other.stderr.count("\n") == 1 and 'model "gpt-4o-mini", not "another-model"' in other.stderr
    assert len(server.requests) == 1


def test_every_ok_result_has_a_trajectory_whose_turns_are_the_stored_session(
    server: ScriptedServer, home: Path, tmp_path: Path
) -> None:
    from agent_state import SessionStore

    server.add(Reply(tool_calls=[("read_file", {"path": "notes.txt"})]), Reply(text="it is empty"))
    tasks = _write_tasks(tmp_path / "t.jsonl", [{"prompt": "read notes.txt", "id": "notes"}])
    out = tmp_path / "out"
    done = _batch(server, home, "run", str(tasks), "--out", str(out), "-Q")
    assert done.returncode == 0, done.stderr
    (result,) = _results(out)
    assert result["task_id"] == "notes" and result["disposition"] == "ok" and result["api_calls"] == 2
    (line,) = (out / "trajectories").glob("part-*.jsonl")
    trajectory = json.loads(line.read_text())
    with SessionStore.open(home) as store:
        stored = store.load_messages(result["session_id"])
        assert store.get_session(result["session_id"])["source"] == "batch"
    turns = trajectory["conversations"]
    assert [t["from"] for t in turns] == ["system", "human", "gpt", "tool", "gpt"]
    assert [m["role"] for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert '"name": "read_file"' in turns[2]["value"] and "notes.txt" in turns[2]["value"]
    assert stored[2]["content"][:20] in turns[3]["value"]
    assert turns[4]["value"] == stored[3]["content"] == "it is empty"


def test_ctrl_c_interrupts_the_running_tasks_records_them_and_exits_130(
    server: ScriptedServer, home: Path, tmp_path: Path
) -> None:
    server.default = lambda body: Reply(text="late", delay=30)  # a hang-up ends the wait
    tasks = _write_tasks(tmp_path / "t.jsonl", [{"prompt": f"task {n}"} for n in range(4)])
    out = tmp_path / "out"
    batch = _start(server, home, "run", str(tasks), "--out", str(out), "--workers", "2")
    assert server.wait_for_requests(2)
    batch.send_signal(signal.SIGINT)
    _, stderr = batch.communicate(timeout=30)
    assert batch.returncode == 130, stderr
    assert list(_final(out).values()) == ["interrupted", "interrupted"]
    server.default = lambda body: Reply(text="done")
    again = _batch(server, home, "run", str(tasks), "--out", str(out), "-Q")
    assert again.returncode == 0 and sorted(_final(out).values()) == ["ok"] * 4


def test_backend_ray_without_ray_installed_is_one_line_and_exit_2(
    server: ScriptedServer, home: Path, tmp_path: Path
) -> None:
    hide = tmp_path / "no-ray"
    (hide / "ray").mkdir(parents=True)
    (hide / "ray" / "__init__.py").write_text("raise ImportError(\"No module named 'ray'\")\n")
    tasks = _write_tasks(tmp_path / "t.jsonl", [{"prompt": "one"}])
    done = run_cli(
        "batch", "run", str(tasks), "--out", str(tmp_path / "out"), "--backend", "ray",
        "--base-url", server.base_url, home=home,
        env={"OPENAI_API_KEY": "k", "PYTHONPATH": f"{hide}{os.pathsep}{ROOT}"},
    )  # fmt: skip
    assert done.returncode == 2
    assert (
        done.stderr
        == "mibyan: --backend ray needs Ray: pip install 'mibyan[ray]' (or use the default --backend local)\n"
    )
    assert server.requests == []


def test_a_result_left_without_its_trajectory_gets_it_from_the_store_at_the_next_run(
    server: ScriptedServer, home: Path, tmp_path: Path
) -> None:
    import shutil

    server.default = lambda body: Reply(text="done")
    tasks = _write_tasks(tmp_path / "t.jsonl", [{"prompt": "one"}, {"prompt": "two"}])
    out = tmp_path / "out"
    assert _batch(server, home, "run", str(tasks), "--out", str(out), "-Q").returncode == 0
    shutil.rmtree(out / "trajectories")  # as a kill between a result's line and its trajectory's leaves it
    again = _batch(server, home, "run", str(tasks), "--out", str(out), "-Q")
    assert again.returncode == 0, again.stderr
    assert len(server.requests) == 2  # nothing ran again
    (part,) = (out / "trajectories").glob("part-0002-*.jsonl")
    mended = [json.loads(raw) for raw in part.read_text().splitlines()]
    assert sorted(t["conversations"][1]["value"] for t in mended) == ["one", "two"]


def test_per_provider_lets_one_model_call_at_a_time_reach_the_provider(
    server: ScriptedServer, home: Path, tmp_path: Path
) -> None:
    in_flight, most = [0], [0]
    lock = threading.Lock()

    def reply(body: dict[str, Any]) -> Reply:
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        opened = []

        def answering(event: str) -> None:
            # counted out at the reply's first event: its caller holds the slot until the reply's end
            if not opened:
                opened.append(event)
                with lock:
                    in_flight[0] -= 1

        return Reply(text="done", delay=0.05, after_event=answering)

    server.default = reply
    tasks = _write_tasks(tmp_path / "t.jsonl", [{"prompt": f"task {n}"} for n in range(4)])
    out = tmp_path / "out"
    done = _batch(
        server, home, "run", str(tasks), "--out", str(out), "--workers", "4", "--per-provider", "1", "-Q"
    )
    assert done.returncode == 0, done.stderr
    assert len(server.requests) == 4 and most[0] == 1
