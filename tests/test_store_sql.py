"""SQL lives in meshfast/store/: no module outside it holds statement text (STYLE.md: SQL lives
in named constants with ``$n`` parameters, no string formatting of SQL). A source scan: every
string literal (docstrings aside) outside meshfast/store/ is checked for the start of a SQL
statement, or a call of a PostgreSQL function that only a statement makes."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "meshfast"
STORE = PACKAGE / "store"

# A statement's opening words, as this codebase writes them (keywords in capitals).
STATEMENT = re.compile(
    r"""^[\s(]*(?:
        SELECT\s+\S
      | INSERT\s+INTO\b
      | UPDATE\s+\w+\s+(?:AS\s+)?(?:\w+\s+)?SET\b
      | DELETE\s+FROM\b
      | WITH\s+(?:RECURSIVE\s+)?\w+(?:\s*\([^)]*\))?\s+AS\b
      | (?:CREATE|ALTER|DROP)\s+(?:OR\s+REPLACE\s+|UNIQUE\s+)?(?:TABLE|INDEX|ROLE|FUNCTION|TRIGGER|VIEW|SEQUENCE|TYPE|SCHEMA|POLICY|EXTENSION)\b
      | COPY\s+\w+\s*(?:\(|FROM\b|TO\b)
      | TRUNCATE\b
      | GRANT\s+\w+
      | REVOKE\s+\w+
      | (?:UN)?LISTEN\s+\w+
      | NOTIFY\s+\w+
      | SET\s+(?:LOCAL\s+|SESSION\s+)?\w+\s*(?:=|TO\b)
      | RESET\s+\w+
      | DO\s+\$\$
      | LOCK\s+TABLE\b
      | VACUUM\b
    )""",
    re.VERBOSE,
)
# SQL anywhere in a literal: a clause pair or a server function only SQL calls.
FRAGMENT = re.compile(r"\bFROM\s+\w+\s+WHERE\b|\bpg_notify\s*\(|\bpg_(?:try_)?advisory_\w*lock\w*\s*\(|"
                      r"\bON\s+CONFLICT\b|\bRETURNING\s+\w")


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def sql_literals(path: Path) -> list[tuple[int, str]]:
    """The string literals in ``path`` that read as SQL (with their lines); the parts of an
    f-string are checked one by one, and an implicit concatenation as one."""
    tree = ast.parse(path.read_text(), str(path))
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            texts = [node.value]
        elif isinstance(node, ast.JoinedStr):
            texts = ["".join(v.value if isinstance(v, ast.Constant) else "x" for v in node.values)]
        else:
            continue
        for text in texts:
            if STATEMENT.search(text) or FRAGMENT.search(text):
                found.append((node.lineno, text.strip().splitlines()[0][:80]))
    return found


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if STORE not in p.parents)


def test_the_scan_sees_sql() -> None:
    """The patterns catch the shapes SQL took in this codebase (and not an HTTP method)."""
    for text in ("SELECT 1", "\nSELECT id FROM users WHERE id = $1", "INSERT INTO t (a) VALUES ($1)",
                 "UPDATE admins SET status = $2 WHERE id = $1", "DELETE FROM t WHERE id = $1",
                 "WITH RECURSIVE chain (id) AS (SELECT 1)", "SET statement_timeout = 5",
                 "SELECT pg_notify('c', $1)", "CREATE TABLE IF NOT EXISTS t (a int)", "LISTEN meshfast_config",
                 "COPY request_logs_ingest (id) FROM STDIN", "x ON CONFLICT DO NOTHING"):
        assert STATEMENT.search(text) or FRAGMENT.search(text), text
    for text in ("DELETE", "GET", "COPY that committed", "select a model", "UPDATE the dashboard",
                 "SELECT", "pause_admin"):
        assert not (STATEMENT.search(text) or FRAGMENT.search(text)), text


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_sql_outside_the_store(path: Path) -> None:
    assert sql_literals(path) == [], f"SQL belongs in meshfast/store/ (named constants with $n parameters): {path}"


def test_the_store_holds_sql() -> None:
    """The scan reads the store's modules as SQL (so its silence elsewhere means something)."""
    assert sql_literals(STORE / "sql.py")
    assert sql_literals(STORE / "cluster.py")
