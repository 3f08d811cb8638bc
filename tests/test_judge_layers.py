"""The judge's modules import in layers: no circle among them, deferred imports (inside functions) counted,
those under `TYPE_CHECKING` not (they never run)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parent.parent / "tools"


def _imported(path: Path) -> set[str]:
    """The tools/ modules `path` imports when it runs (`mibyan.tools.x` and `tools.x` alike)."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(inner) for statement in node.body for inner in ast.walk(statement))
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    found = set()
    for name in names:
        parts = name.removeprefix("mibyan.").split(".")
        if len(parts) >= 2 and parts[0] == "tools" and (TOOLS / f"{parts[1]}.py").is_file():
            found.add(parts[1])
    return found - {path.stem}


def _judge_modules() -> dict[str, set[str]]:
    """The judge (tools/command_judge.py) and every tools/ module it comes to import, with their imports."""
    graph: dict[str, set[str]] = {}
    todo = ["command_judge"]
    while todo:
        module = todo.pop()
        if module not in graph:
            graph[module] = _imported(TOOLS / f"{module}.py")
            todo.extend(graph[module])
    return graph


def _layers(graph: dict[str, set[str]]) -> list[set[str]]:
    """The modules floor by floor, each importing only from the floors below; raises on a circle."""
    placed: set[str] = set()
    layers: list[set[str]] = []
    while len(placed) < len(graph):
        layer = {m for m, imports in graph.items() if m not in placed and imports <= placed}
        if not layer:
            left = {m: sorted(i - placed) for m, i in graph.items() if m not in placed}
            raise AssertionError(f"these judge modules import each other in a circle: {left}")
        layers.append(layer)
        placed |= layer
    return layers


def test_the_judges_modules_import_in_layers_without_a_circle() -> None:
    graph = _judge_modules()
    assert {"command_rules", "command_spec", "command_words", "command_walk"} <= set(graph)
    layers = _layers(graph)
    assert "command_judge" in layers[-1]
    assert "verdict" in layers[0]  # what a judgement is, below everything that judges


def test_no_function_of_the_judge_is_too_complex_to_read() -> None:
    """The judge's worst cyclomatic complexity stays under 20 (ruff's mccabe count)."""
    modules = [str(TOOLS / f"{m}.py") for m in sorted(_judge_modules())]
    config = "lint.mccabe.max-complexity=19"
    ruff = [sys.executable, "-m", "ruff", "check", "--no-cache", "--select", "C901", "--config", config]
    result = subprocess.run([*ruff, *modules], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout
