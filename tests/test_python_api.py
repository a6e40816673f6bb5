"""The Python API's documentation stays true: every docstring example and every example of
docs/python.md runs on the shipped fixtures and prints what it shows, every public name has an
example, and docs/python.md lists every table with its exact columns."""

from __future__ import annotations

import doctest
import importlib
import inspect
import pkgutil
import re
import sys

import pandas as pd
import pytest
from conftest import ROOT, analysis_of

import nsysan
import nsysan.runs.compare_runs
import nsysan.errors
import nsysan.runs.limits
import nsysan.model
import nsysan.sources.analysis_document
from nsysan import Analysis

PYTHON_DOC = ROOT / "docs" / "python.md"
OPTIONS = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS


@pytest.fixture()
def at_root(monkeypatch):
    """Examples name fixtures/... as a user in the repository would; pandas prints as in a terminal
    100 columns wide."""
    monkeypatch.chdir(ROOT)
    with pd.option_context("display.width", 100, "display.max_columns", 20):
        yield


# nsysan.model is a package: its classes' examples live in its modules (doctest only looks at
# what a module defines itself).
MODEL_MODULES = [importlib.import_module(f"nsysan.model.{m.name}") for m in pkgutil.iter_modules(nsysan.model.__path__)]


@pytest.mark.parametrize("module", [nsysan, *MODEL_MODULES, nsysan.errors, nsysan.sources.analysis_document,
                                    nsysan.runs.limits, nsysan.runs.compare_runs], ids=lambda m: m.__name__)
def test_docstring_examples_run(module, at_root):
    result = doctest.testmod(module, optionflags=OPTIONS, report=True)
    assert result.failed == 0


def test_python_doc_examples_run(at_root):
    result = doctest.testfile(str(PYTHON_DOC), module_relative=False, optionflags=OPTIONS, report=True)
    assert result.attempted >= 20 and result.failed == 0


def _public_names() -> dict[str, object]:
    names = {name: getattr(nsysan, name) for name in nsysan.__all__ if name != "SCHEMA_ID"}
    for name, member in vars(Analysis).items():
        if (not name.startswith("_") or name == "__repr__") and callable(getattr(Analysis, name)):
            names[f"Analysis.{name}"] = getattr(Analysis, name)
    return names


def test_every_public_name_has_a_runnable_example():
    without = [name for name, obj in _public_names().items() if ">>> " not in (inspect.getdoc(obj) or "")]
    assert not without, f"add a docstring example (>>> ...) to: {without}"


def _documented_tables() -> dict[str, list[str]]:
    rows = re.findall(r"^\| `(\w+)` \| [^|]+ \| (.+) \|$", PYTHON_DOC.read_text(), flags=re.M)
    return {name: re.findall(r"`(\w+)`", columns) for name, columns in rows}


@pytest.mark.parametrize("fixture", ["ddp_leak_v25", "known_bt_v25"])
def test_python_doc_lists_every_table_and_its_columns(fixture):
    analysis = analysis_of(fixture)
    documented = _documented_tables()
    for name in Analysis.frame_names():
        columns = list(analysis.frame(name).columns)
        row = f"| `{name}` | (one row per ...) | " + ", ".join(f"`{c}`" for c in columns) + " |"
        assert name in documented, f"docs/python.md has no row for the table {name!r}; add:\n{row}"
        assert documented[name] == columns, f"docs/python.md lists other columns for {name!r}; make it:\n{row}"
    assert set(documented) == set(Analysis.frame_names())


def test_python_doc_lists_the_tables_of_compare_and_check():
    rows = re.findall(r"^\| `(comparison|verdict)\.(\w+)` \| [^|]+ \| (.+) \|$", PYTHON_DOC.read_text(), flags=re.M)
    documented = {(kind, name): re.findall(r"`(\w+)`", columns) for kind, name, columns in rows}
    comparison = nsysan.compare(analysis_of("torch_clean_v25"), analysis_of("torch_leak_v25"))
    verdict = nsysan.check(analysis_of("torch_leak_v25"), max_never_freed="1GiB")
    actual = {("comparison", n): list(comparison.frame(n).columns) for n in comparison.frame_names()}
    actual.update({("verdict", n): list(verdict.frame(n).columns) for n in verdict.frame_names()})
    assert documented == actual
