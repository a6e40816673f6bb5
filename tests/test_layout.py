"""The shape of the code that the brief promises: only sources/schema.py, sources/sqlite_file.py (the
tables nsysan exports and what an export records about itself: schema.py's first half until
a895cde) and the readers of events/ (read.py and its read_*.py siblings: the pools, launches,
capture start, code loads and graphs) name nsys tables."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nsysan

PACKAGE = Path(nsysan.__file__).parent
ALLOWED = {PACKAGE / "sources" / "schema.py", PACKAGE / "sources" / "sqlite_file.py",
           *(PACKAGE / "events").glob("read*.py")}
# Every nsys table prefix nsysan reads or checks for (see ../shared/docs/nsys-schema.md)
TABLE = re.compile(r"\b(CUPTI_ACTIVITY_\w+|CUDA_GPU_MEMORY_\w+|CUDA_CALLCHAINS|NVTX_EVENTS|NVTX_PAYLOAD\w*|"
                   r"StringIds|ThreadNames|TARGET_INFO_\w+|META_DATA_\w+|EXPORT_META_DATA|ENUM_[A-Z_]+|"
                   r"ANALYSIS_DETAILS|ProcessStreams|PROCESSES|DIAGNOSTIC_EVENT)\b")


def _code_strings(tree: ast.AST) -> list[ast.Constant]:
    """String constants that are code, not docstrings (docstrings may explain where data comes from)."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [node for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_only_schema_and_events_read_name_nsys_tables() -> None:
    assert {PACKAGE / "sources" / "schema.py", PACKAGE / "sources" / "sqlite_file.py"} <= ALLOWED \
        and all(path.exists() for path in ALLOWED)  # moved: say so
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path in ALLOWED:
            continue
        for node in _code_strings(ast.parse(path.read_text(), str(path))):
            if TABLE.search(node.value):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {TABLE.search(node.value).group()}")
    assert offenders == []


def test_the_rule_finds_a_table_name_in_code() -> None:
    # The check above must be able to fail: a table name in a string constant is found.
    tree = ast.parse('"""Reads NVTX_EVENTS."""\nSQL = "SELECT * FROM NVTX_EVENTS"\n')
    assert [TABLE.search(n.value).group() for n in _code_strings(tree) if TABLE.search(n.value)] == ["NVTX_EVENTS"]


# A module over ~500 lines is two modules (../shared/docs/style.md); past this it must be split.
MAX_MODULE_LINES = 600


def test_no_module_is_too_long_to_read_alone() -> None:
    lengths = {str(path.relative_to(PACKAGE)): len(path.read_text().splitlines()) for path in PACKAGE.rglob("*.py")}
    assert {name: n for name, n in lengths.items() if n > MAX_MODULE_LINES} == {}
    assert len(lengths) > 50  # the walk found the package's modules
