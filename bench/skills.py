"""What installed skills cost a turn: from `AIAgent()` to its first request with 50 skills, minus with none.

The floor is the 5 ms a user may pay for 50 skills. Each run starts a fresh agent in one process, as a
one-shot run does; runs with and without skills alternate, and the first of each is left out (it
builds the skill index once).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from loopback import Reply, ScriptedServer  # noqa: E402

from bench.figures import show  # noqa: E402

SKILLS = 50
RUNS = 31
FLOOR_MS = 5.0


def install_skills(home: Path, count: int) -> None:
    for i in range(count):
        folder = home / "skills" / f"skill-{i}"
        folder.mkdir(parents=True)
        (folder / "SKILL.md").write_text(
            f"---\nname: skill-{i}\ndescription: Handles chore number {i} the way this team does it\n"
            f"triggers: [chore{i}, 'do chore {i}', widget{i}]\n---\n" + "Step one, then step two.\n" * 40
        )


def to_first_request(server: ScriptedServer, home: Path) -> float:
    """Milliseconds from `AIAgent()` to its first request reaching the server."""
    from run_agent import AIAgent

    start = len(server.requests)
    began = time.perf_counter()
    AIAgent(base_url=server.base_url, home=home, stream=False).run_conversation("hello")
    return (server.requests[start].arrived - began) * 1000


def main() -> None:
    with (
        tempfile.TemporaryDirectory() as bare,
        tempfile.TemporaryDirectory() as skilled,
        ScriptedServer(default=lambda body: Reply(text="ok")) as server,
    ):
        install_skills(Path(skilled), SKILLS)
        for home in (bare, skilled):  # warm up: imports, and the skill index built once
            to_first_request(server, Path(home))
        added = []
        for _ in range(RUNS):  # alternate, so a change in the machine's load hits both alike
            without = to_first_request(server, Path(bare))
            added.append(to_first_request(server, Path(skilled)) - without)
    show(f"{SKILLS} skills: added time to the first request", added, [FLOOR_MS])


if __name__ == "__main__":
    main()
