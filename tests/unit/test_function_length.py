"""No function in router/, agent/ or sim/ runs over 60 lines: a longer one does several
jobs, and each job should have a name (issue 13)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("router", "agent", "sim")
MAX_LINES = 60


def long_functions(root: Path, folders: tuple[str, ...]) -> list[str]:
    found = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LINES:
                    where = f"{path.relative_to(root)}:{node.lineno}"
                    found.append(f"{where} {node.name} ({lines} lines)")
    return found


def test_no_function_over_60_lines():
    assert long_functions(ROOT, FOLDERS) == []


def test_the_check_finds_a_long_method_and_spares_a_short_one(tmp_path):
    (tmp_path / "pkg").mkdir()
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_LINES))
    source = f"class C:\n    def long(self):\n{body}\n\n\ndef short():\n    return 1\n"
    (tmp_path / "pkg" / "m.py").write_text(source)
    assert long_functions(tmp_path, ("pkg",)) == [f"pkg/m.py:2 long ({MAX_LINES + 1} lines)"]
