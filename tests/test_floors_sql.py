"""The faces (viewer, editor bridge, gateway) and the benchmarks send no SQL of their own: every query
is a method of the store's repositories, so a second store backend serves them unchanged (DESIGN §16)."""

from __future__ import annotations

import ast
import re

import pytest
from conftest import ROOT

#: The folders that reach sessions only through `agent_state.SessionStore` and its repositories.
FACES = ("web", "editors", "gateway", "bench")

#: A string that is an SQL statement: a statement's first word, then what such a statement needs next.
_STATEMENT = re.compile(
    r"^\s*(SELECT\b.*\bFROM\b|SELECT\s+(1|count)\b|INSERT\s+(OR\s+\w+\s+)?INTO\b|UPDATE\s+\w+\s+SET\b"
    r"|DELETE\s+FROM\b|CREATE\s+(TABLE|INDEX|VIRTUAL|TRIGGER)\b|ALTER\s+TABLE\b|DROP\s+TABLE\b"
    r"|WITH\s+RECURSIVE\b|PRAGMA\b|BEGIN\b|COMMIT\b)",
    re.DOTALL,
)
#: SQLite's own spellings, wherever they stand in a string.
_SQLITE_ONLY = re.compile(r"sqlite_master|\bbm25\(|\bsnippet\(|\bMATCH\s+\?|INSERT\s+OR\s+IGNORE|\bPRAGMA\s")
#: Calls that run SQL, or hand out the raw connection that runs it.
_RUNS_SQL = {"execute", "executemany", "executescript", "query", "transaction"}


def _text_of(node: ast.AST) -> str | None:
    """A string literal's text; an f-string's with `{}` for each value put in."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


def sql_in(source: str, name: str) -> list[str]:
    """What in one module's source sends SQL: `name:line: what`."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        text = _text_of(node)
        if text is not None:
            if _STATEMENT.match(text) or _SQLITE_ONLY.search(text):
                found.append(f"{name}:{node.lineno}: SQL text {text[:60]!r}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in _RUNS_SQL:
                found.append(f"{name}:{node.lineno}: .{node.func.attr}() runs SQL")
        elif isinstance(node, ast.Import | ast.ImportFrom):
            modules = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module]
            if "sqlite3" in modules:
                found.append(f"{name}:{node.lineno}: imports sqlite3")
    return found


def test_the_faces_and_the_benchmarks_send_no_sql() -> None:
    modules = [path for face in FACES for path in sorted((ROOT / face).rglob("*.py"))]
    assert len(modules) > 20  # the folders were found
    found = [hit for path in modules for hit in sql_in(path.read_text(), str(path.relative_to(ROOT)))]
    assert found == [], "SQL outside the store (make it a method of a repository in store/):\n" + "\n".join(
        found
    )


@pytest.mark.parametrize(
    "source",
    [
        'store.query("SELECT DISTINCT source FROM sessions ORDER BY 1")',
        'rows = db.execute("UPDATE gateway_inbox SET status = ? WHERE id = ?", (s, i))',
        'SQL = "INSERT OR IGNORE INTO gateway_outbox (inbox_id) VALUES (?)"',
        "TABLE = \"SELECT 1 FROM sqlite_master WHERE name = 'model_calls'\"",
        'Q = f"SELECT {columns} FROM messages WHERE session_id = ?"',
        'Q = "x WHERE messages_fts MATCH ? ORDER BY bm25(messages_fts)"',
        "import sqlite3",
        "with store.transaction() as db:\n    pass",
    ],
)
def test_the_check_sees_sql_however_it_is_spelt(source: str) -> None:
    assert sql_in(source, "face.py")


@pytest.mark.parametrize(
    "source",
    [
        '"""Select the session to show, from the store."""',
        'label = "Update the title"',
        'store.sessions.newest_first(50, source="cli")',
        'request.query_params.get("q")',
    ],
)
def test_plain_words_and_repository_calls_are_not_sql(source: str) -> None:
    assert sql_in(source, "face.py") == []
