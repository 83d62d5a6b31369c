"""No function in ``src/tider`` runs over 60 lines, counted from its ``def`` line to the
last line of its body (decorators not counted), and no module over 450 lines."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "tider"
MAX_LINES = 60
MAX_MODULE_LINES = 450


def long_functions(root: Path, max_lines: int = MAX_LINES) -> dict[str, int]:
    """``{"path:function": lines}`` for every function (methods and nested ones included)
    under ``root`` longer than ``max_lines``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > max_lines:
                    out[f"{path.relative_to(root).as_posix()}:{node.name}"] = lines
    return out


def test_no_function_over_60_lines():
    assert long_functions(SRC) == {}


def test_the_count_runs_from_def_to_the_last_body_line(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(59))
    (tmp_path / "m.py").write_text(f"@decorator\ndef fits():\n{body}\n\n\ndef over():\n{body}\n    return x0\n")
    assert long_functions(tmp_path) == {"m.py:over": 61}


def test_no_module_over_450_lines():
    long = {
        p.relative_to(SRC).as_posix(): n
        for p in SRC.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}, f"split these modules (at most {MAX_MODULE_LINES} lines): {long}"
