"""The sandbox's cost: `true` through the terminal tool, confined vs unconfined (floor: under 30 ms more),
and one sandboxed `true` beside a bare `bwrap --ro-bind / / true` (floor: 2x), with what lies between
them: bubblewrap with the sandbox's own mounts running `true` (no shell), and the shell alone."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.figures import show  # noqa: E402
from mibyan.core.errors import ConfigError  # noqa: E402
from mibyan.tools.context import RunContext  # noqa: E402
from mibyan.tools.sandbox import Sandbox  # noqa: E402
from mibyan.tools.terminal import terminal  # noqa: E402

EXTRA_FLOOR_MS = 30.0
BARE_RATIO_FLOOR = 2.0


def timed(argv: list[str]) -> float:
    began = time.perf_counter()
    subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    return (time.perf_counter() - began) * 1000


def beside_bare_bwrap(sandbox: Sandbox, workdir: Path, runs: int) -> None:
    """One sandboxed `true` through the terminal tool against a bare bubblewrap start, alternately."""
    bare: list[float] = []
    mounts: list[float] = []
    shell: list[float] = []
    tool: list[float] = []
    for _ in range(runs):
        bare.append(timed(["bwrap", "--ro-bind", "/", "/", "true"]))
        mounts.append(timed(sandbox.wrap(["true"], cwd=workdir)))
        shell.append(timed(["bash", "-c", "true"]))
        tool.append(timed_true(sandbox))
    show("bare `bwrap --ro-bind / / true`", bare)
    show("  bwrap with the sandbox's mounts, `true`", mounts, bare)
    show("  `bash -c true`, unconfined", shell)
    show("terminal `true` in the sandbox (bubblewrap)", tool, bare)
    print(f"{'  (floor: 2.00x the bare bwrap start)':<48}")


def timed_true(sandbox: Sandbox | None) -> float:
    began = time.perf_counter()
    result = terminal(RunContext(sandbox=sandbox), "true")
    elapsed = (time.perf_counter() - began) * 1000
    if "[exit code 0" not in result:
        raise RuntimeError(f"`true` failed: {result}")
    return elapsed


def main(runs: int = 30) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        home = workdir / "home"
        variants = {
            "bubblewrap": {"backend": "bubblewrap"},
            "landlock": {"backend": "landlock"},
            # a gateway agent's: the home hidden; isolated: a fresh root, no network
            "bubblewrap, home hidden": {"backend": "bubblewrap", "hidden": [home]},
            "bubblewrap, isolated": {
                "backend": "bubblewrap",
                "hidden": [home],
                "isolated": True,
                "network": False,
            },
        }
        home.mkdir()
        try:
            gateway_like = Sandbox(
                "workspace-write", workdir, protected=[home], hidden=[home], backend="bubblewrap"
            )
            beside_bare_bwrap(gateway_like, workdir, runs)
        except ConfigError as exc:
            print(f"beside a bare bwrap: not measured: {exc}")
        for label, options in variants.items():
            try:
                sandbox = Sandbox("workspace-write", workdir, protected=[home], **options)  # type: ignore[arg-type]
            except ConfigError as exc:  # a backend this machine lacks is reported, not measured
                print(f"terminal `true` in the sandbox ({label}): not measured: {exc}")
                continue
            confined: list[float] = []
            plain: list[float] = []
            for _ in range(runs):  # alternate, so drift in the machine's load hits both alike
                confined.append(timed_true(sandbox))
                plain.append(timed_true(None))
            show(f"terminal `true` in the sandbox ({label})", confined, plain)
            extra = [c - p for c, p in zip(confined, plain, strict=True)]
            show(f"  extra time of the sandbox ({label})", extra, [EXTRA_FLOOR_MS])


if __name__ == "__main__":
    main()
