"""The command judge: time to judge a typical command and a long compound one, beside floors of 0.3 ms and
2 ms, and a command line at the length cap (64 KiB of short words, the reader's worst case: about 0.7 to 1 s
on 2 busy cores, growing linearly with the length) and one past it (refused at once).

The first judgement also pays for importing tree-sitter and loading the bash grammar; it is shown apart.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.figures import show  # noqa: E402

FLOOR_MS = [2.0]  # what one judgement may cost: well under the time bash itself takes to start
TYPICAL_FLOOR_MS = [0.3]  # a one-line command, as most are: judged many times per turn, never felt
TYPICAL = "git status && ls -la src | grep -v __pycache__ > files.txt"
COMPOUND = "\n".join(
    [
        "set -euo pipefail",
        'for f in $(git ls-files "*.py"); do',
        '  if grep -q "TODO" "$f"; then echo "$f" >> todo.txt; fi',
        "done",
        "build() { make -j4 > build.log 2>&1 || { tail -20 build.log; return 1; }; }",
        "cd src && build && cd ..",
        "bash -c 'python3 -m pytest -q | tee test.log'",
        "cat <<EOF | sh\necho done\nEOF",
        "find . -name '*.pyc' -exec rm -f {} +",
        'echo "$(date): $(wc -l < todo.txt) todos" | tee -a report.txt',
    ]
)


def _first_judgement_ms() -> float:
    code = (
        "import time; t = time.perf_counter(); from mibyan.tools.approval import classify_command; "
        f"classify_command({TYPICAL!r}); print((time.perf_counter() - t) * 1000)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return float(out.stdout.strip())


def _per_command(command: str, runs: int, cwd: Path | None = None) -> list[float]:
    from mibyan.tools.approval import classify_command

    classify_command(command, cwd=cwd)  # warm: the parser exists
    samples = []
    for _ in range(runs):
        began = time.perf_counter()
        classify_command(command, cwd=cwd)
        samples.append((time.perf_counter() - began) * 1000)
    return samples


SCRIPT = "\n".join(["set -e", *(f"echo step {i} && ls -la src{i} > out{i}.txt" for i in range(19))])


def _script_on_disk(runs: int) -> list[float]:
    """`bash build.sh`: the judge reads the 20-line script and judges what it holds."""
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "build.sh").write_text(SCRIPT + "\n")
        return _per_command("bash build.sh", runs, cwd=Path(folder))


#: A command line at the cap, of the shape the reader spends most on: one short word after another.
AT_THE_CAP = "echo " + "a " * ((64 * 1024 - 5) // 2)
PAST_THE_CAP = "echo " + "a " * (512 * 1024)


def main(runs: int = 200) -> None:
    show("judge a typical command", _per_command(TYPICAL, runs), TYPICAL_FLOOR_MS)
    lines = COMPOUND.count("\n") + 1
    show(f"judge a {lines}-line compound command", _per_command(COMPOUND, runs // 4), FLOOR_MS)
    show("judge the 20 lines of a script, given inline", _per_command(SCRIPT, runs // 4), FLOOR_MS)
    show("judge `bash build.sh`, those lines on disk", _script_on_disk(runs // 4), FLOOR_MS)
    show("judge a 64 KiB command of 32,766 words", _per_command(AT_THE_CAP, 3))
    show("refuse a 1 MiB command (over the cap)", _per_command(PAST_THE_CAP, runs // 4))
    show("  first judgement in a process (imports)", [_first_judgement_ms() for _ in range(3)])


if __name__ == "__main__":
    main()
