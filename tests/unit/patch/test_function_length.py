"""No function of ``attnprobe.patch`` is over 60 lines (issue 25: a function that long does
several things; the chunk-and-shard loop the largest ones repeated is
:func:`attnprobe.core.chunked.run_chunked`). Counted from ``def`` to the function's last line,
as the AST gives them, over every module of the package (a new module is checked too)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import attnprobe.patch

LIMIT = 60
MODULES = sorted(Path(attnprobe.patch.__file__).parent.rglob("*.py"))


def long_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [f"{path.name}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.end_lineno - node.lineno + 1 > LIMIT]


def test_every_module_of_the_package_is_checked():
    assert len(MODULES) > 10 and all(p.suffix == ".py" for p in MODULES)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_no_function_is_over_the_limit(path):
    assert long_functions(path) == []


def test_the_count_runs_from_def_to_the_last_line(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT - 1))
    (tmp_path / "fits.py").write_text(f"def fits():\n{body}\n")  # def + 59 lines: 60
    (tmp_path / "long.py").write_text(f"def long():\n{body}\n    return 0\n")  # 61
    assert long_functions(tmp_path / "fits.py") == []
    assert long_functions(tmp_path / "long.py") == ["long.py:1 long (61 lines)"]
