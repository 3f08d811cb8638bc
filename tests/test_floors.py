"""The floors of the house: each module imports only from its own floor or a lower one.

1 `core/` · 2 `config/` and the store · 3 `tools/` and `model_tools.py` · 4 `agent/` and `run_agent.py` ·
5 `gateway/`, `editors/`, `web/` · 6 `cli/`. Deferred imports (inside a function) count: they hide circles
as well as any other; imports under `TYPE_CHECKING` don't, they never run. ARCHITECTURE.md draws the house.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: Each room (a folder, or a module at the top) and its floor.
FLOORS = {
    "core": 1,
    "config": 2,
    "agent_state": 2,
    "store": 2,
    "tools": 3,
    "model_tools": 3,
    "agent": 4,
    "run_agent": 4,
    "gateway": 5,
    "editors": 5,
    "web": 5,
    "batch": 5,
    "cli": 6,
}


def _room_of_module(name: str) -> str | None:
    """The room an import names: `mibyan.tools.registry` and `tools.registry` are both in tools/."""
    parts = name.split(".")
    if parts[0] == "mibyan":
        parts = parts[1:]
    return parts[0] if parts and parts[0] in FLOORS else None


def _modules() -> list[tuple[str, Path]]:
    found = []
    for room in FLOORS:
        if (ROOT / f"{room}.py").is_file():
            found.append((room, ROOT / f"{room}.py"))
        found.extend((room, path) for path in sorted((ROOT / room).rglob("*.py")) if (ROOT / room).is_dir())
    return found


def _imports_that_run(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, module) of every import that can run, `if TYPE_CHECKING:` blocks left out."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(inner) for statement in node.body for inner in ast.walk(statement))
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def upward_imports() -> list[str]:
    """Every import from a higher floor, as `path:line (floor n) imports module (floor m)`."""
    upward = []
    for room, path in _modules():
        floor = FLOORS[room]
        for line, module in _imports_that_run(ast.parse(path.read_text(), str(path))):
            target = _room_of_module(module)
            if target is not None and FLOORS[target] > floor:
                where = path.relative_to(ROOT)
                upward.append(f"{where}:{line} (floor {floor}) imports {module} (floor {FLOORS[target]})")
    return upward


def test_no_floor_imports_a_higher_one() -> None:
    upward = upward_imports()
    assert not upward, "imports from a higher floor:\n" + "\n".join(upward)


def test_every_import_of_mibyan_names_a_module_that_exists() -> None:
    # mypy is told to pass over imports it cannot find (SDKs without types): a module of ours that moved
    # would pass it unseen, and fail only when the import runs
    missing = []
    for _room, path in _modules():
        for line, module in _imports_that_run(ast.parse(path.read_text(), str(path))):
            parts = module.split(".")
            if parts[0] == "mibyan":
                parts = parts[1:]
            if not parts or _room_of_module(module) is None:
                continue
            base = ROOT.joinpath(*parts)
            if not (base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()):
                missing.append(f"{path.relative_to(ROOT)}:{line} imports {module}, which does not exist")
    assert not missing, "\n".join(missing)


def test_the_walk_sees_deferred_imports_and_leaves_out_type_checking_ones() -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from mibyan.cli.main import main\n"
        "def later():\n    from mibyan.gateway.runner import Gateway\n"
        "import run_agent\n"
    )
    modules = [module for _line, module in _imports_that_run(tree)]
    assert "mibyan.gateway.runner" in modules and "run_agent" in modules
    assert "mibyan.cli.main" not in modules


@pytest.mark.parametrize(
    ("module", "room"), [("mibyan.agent.messages", "agent"), ("agent_state", "agent_state")]
)
def test_an_import_is_placed_in_its_room_whichever_way_it_is_spelled(module: str, room: str) -> None:
    assert _room_of_module(module) == room
    assert _room_of_module(module.removeprefix("mibyan.")) == room
