"""session/cancel over ACP: from the editor's cancel to the prompt's `cancelled` answer (target: 300 ms).

Two places a cancel lands: in the middle of a streamed answer, and in the middle of a running command
(`sleep 30`). The floor is the round trip of a request that does nothing (initialize).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from editing import EditorProcess, answer_text, kinds  # noqa: E402
from loopback import Reply, ScriptedServer  # noqa: E402

from bench.figures import show  # noqa: E402

TARGET_MS = 300.0


def _cancel_ms(editor: EditorProcess, session: str, ready: str) -> float:
    seen = len(editor.editor.of(session))
    pending = editor.start_prompt(session, "go")
    if ready == "stream":
        editor.editor.wait_for(lambda: answer_text(editor.editor.of(session)[seen:]) != "")
    else:
        editor.editor.wait_for(
            lambda: "tool_call_update:in_progress" in kinds(editor.editor.of(session)[seen:])
        )
    began = time.perf_counter()
    editor.cancel(session)
    stop = pending.result(30)
    elapsed = (time.perf_counter() - began) * 1000
    assert stop == "cancelled", stop
    return elapsed


def _round_trip_ms(editor: EditorProcess) -> float:
    from acp import PROTOCOL_VERSION

    began = time.perf_counter()
    editor.run(editor.conn.initialize(protocol_version=PROTOCOL_VERSION))
    return (time.perf_counter() - began) * 1000


def main(runs: int = 7) -> None:
    streams: list[float] = []
    tools: list[float] = []
    floor: list[float] = []
    with tempfile.TemporaryDirectory() as tmp, ScriptedServer() as server:
        home, project = Path(tmp) / "home", Path(tmp) / "project"
        home.mkdir(mode=0o700)
        project.mkdir()
        (home / "config.yaml").write_text("agent:\n  api_max_retries: 0\n")
        with EditorProcess(home, "--base-url", server.base_url) as editor:
            session = editor.new_session(project)
            for _ in range(runs):
                server.add(Reply(text="An answer that is cancelled as it streams", chunks=8, stall=30))
                streams.append(_cancel_ms(editor, session, "stream"))
                server.add(Reply(tool_calls=[("terminal", {"command": "sleep 30"})]))
                tools.append(_cancel_ms(editor, session, "tool"))
                floor.append(_round_trip_ms(editor))
    show(f"acp cancel mid-stream (target {TARGET_MS:g} ms)", streams, floor)
    show(f"acp cancel mid-command (target {TARGET_MS:g} ms)", tools, floor)


if __name__ == "__main__":
    main()
