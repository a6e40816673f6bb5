"""The package's import graph follows its architecture: no import against the flow, no circle.

Every module of nsysan is parsed with `ast` (nothing is imported, so the test takes about a
second) and every `import` in it is an edge: at module level, inside functions, and under
`if TYPE_CHECKING:` too. A lazy import inside a function still means the module needs the other
one to do its job, and a type named only for the checker is still a dependency of the design: a
circle hidden behind TYPE_CHECKING or a function-level import is a circle all the same, so
neither is excused.

The layers, lowest first. A module may import its own layer (within the circle rule) and the
layers below it, with two narrower rules: the model imports only the base, and render imports
only the model and the base (render reads the model, docs/json.md's documents, and nothing else).

- base: what every layer uses and that knows no layer: the one error type (errors.py), base/ (units,
  CUDA's API and error names) and runtime/ (the C allocator's settings, Ctrl-C at start-up, the
  memory an analysis may take).
- model: every result type (frozen dataclasses, documented in docs/json.md) and their tables for
  notebooks. The flow is data flowing sources -> events -> analyses -> model -> render; as types,
  the model is the vocabulary every producer writes and every consumer reads, so it sits low and
  imports nothing but the base.
- sources: reading files: the export (nsys), the schema probe, the query reader, the snapshot of a
  live SQLite file, nvidia-smi logs, the program's own OOM log, analysis JSON documents.
- events: the memory events, API calls, NVTX ranges and stacks decoded from the sources, and the
  numpy helpers they are decoded with.
- engine: runs analyses over batches of events, knowing none of them.
- analyses: each question answered from the events, into the model.
- render: terminal, JSON, HTML, PNG views of the model.
- then what consumes or produces whole Analysis objects, in this order: runs/ (compare, limits and
  check, history), pipeline/ (one report in -> one Analysis out, the analysis cache, what compare
  and check accept), batch/, commands/, and last the CLI and the package's own namespace
  (`import nsysan`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "nsysan"

# Lowest first. Each entry: layer -> the module-name prefixes in it (longest prefix wins).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("nsysan.errors", "nsysan.base", "nsysan.runtime")),
    ("model", ("nsysan.model",)),
    ("sources", ("nsysan.sources",)),
    ("events", ("nsysan.events",)),
    ("engine", ("nsysan.engine",)),
    ("analyses", ("nsysan.analyses",)),
    ("render", ("nsysan.render",)),
    ("runs", ("nsysan.runs",)),
    ("pipeline", ("nsysan.pipeline",)),
    ("batch", ("nsysan.batch",)),
    ("commands", ("nsysan.commands",)),
    ("cli", ("nsysan.cli", "nsysan.__main__", "nsysan")),
]
RANK = {name: i for i, (name, _) in enumerate(LAYERS)}
# Narrower than "every layer below": the layer -> the only layers it may import besides its own.
ONLY = {"model": {"base"}, "render": {"model", "base"}}

# (importer, imported) -> why it is allowed. Keep it empty; an entry needs its reason.
ALLOWED: dict[tuple[str, str], str] = {}


def _modules() -> dict[str, tuple[Path, bool]]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


MODULES = _modules()


def _known(name: str) -> str:
    """The module (or package) of nsysan that `name` names: `nsysan.model.Analysis` -> `nsysan.model`."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def imports() -> list[tuple[str, str, int]]:
    """(importer, imported, line) for every import of an nsysan module by another, anywhere in it.
    An import of a module that does not exist is kept in MISSING."""
    edges = []
    for name, (path, is_package) in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    here = name.split(".") if is_package else name.split(".")[:-1]
                    base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                # `from . import apis` imports a module; `from .model import Analysis` a name of one
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                           for alias in node.names]
            else:
                continue
            MISSING.extend(f"{name}:{node.lineno} imports {t}" for t in targets
                           if t.split(".")[0] == "nsysan" and t not in MODULES)
            edges += [(name, _known(t), node.lineno) for t in targets
                      if t.split(".")[0] == "nsysan" and _known(t) != name]
    return edges


def layer_of(module: str) -> str:
    best, layer = "", None
    for name, prefixes in LAYERS:
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
                best, layer = prefix, name
    assert layer is not None, f"{module} is in no layer: add it to LAYERS"
    return layer


def _unit(module: str) -> str:
    """The package a module belongs to (`nsysan.analyses.peak` -> `nsysan.analyses`), or the module
    itself for the loose modules of the top level."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or MODULES[module][1] else module


def _circles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


MISSING: list[str] = []
EDGES = imports()


def test_the_graph_is_read():
    """The parse finds the imports it must: a test of nothing would pass any package."""
    found = {(a, b) for a, b, _ in EDGES}
    assert ("nsysan.pipeline.stages", "nsysan.sources.schema") in found  # at module level
    assert len(MODULES) > 100 and len(found) > 500
    assert all(layer_of(m) for m in MODULES)


def test_every_import_names_a_module():
    """A module moved or renamed leaves no import of its old name behind (each would otherwise be
    read as an import of the package above it)."""
    assert not MISSING


def test_no_import_against_the_flow():
    against = []
    for a, b, line in EDGES:
        la, lb = layer_of(a), layer_of(b)
        if la == lb or (a, b) in ALLOWED:
            continue
        if RANK[lb] > RANK[la] or (la in ONLY and lb not in ONLY[la]):
            against.append(f"{a}:{line} ({la}) imports {b} ({lb})")
    assert not against, f"{len(against)} imports against the flow:\n" + "\n".join(sorted(set(against)))


@pytest.mark.parametrize("level", ["module", "package"])
def test_no_import_circles(level):
    if level == "module":
        edges = {(a, b) for a, b, _ in EDGES if (a, b) not in ALLOWED}
    else:
        edges = {(_unit(a), _unit(b)) for a, b, _ in EDGES if (a, b) not in ALLOWED and _unit(a) != _unit(b)}
    circles = _circles(edges)
    assert not circles, f"{len(circles)} circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_no_module_shares_a_name_with_its_package_s_function():
    """`nsysan.compare` was a module and a function at once: whichever was bound last won, so
    `import nsysan.compare` could replace the function. A package defines no function, class or
    constant under the name of one of its modules."""
    clashes = []
    for package, (path, is_package) in MODULES.items():
        if not is_package:
            continue
        defined = set()
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, ast.Assign):
                defined.update(t.id for t in node.targets if isinstance(t, ast.Name))
        submodules = {m.rsplit(".", 1)[1] for m in MODULES if "." in m and m.rsplit(".", 1)[0] == package}
        clashes += [f"{package}.{name}" for name in sorted(defined & submodules)]
    assert not clashes


def test_the_top_level_shows_the_layers():
    """Beside the package's namespace, the command's entry points and the public error type, every
    module lives in the package of its layer."""
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == ["__init__.py", "__main__.py", "cli.py", "errors.py"]
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    layered = {prefix.split(".")[1] for _, prefixes in LAYERS for prefix in prefixes if prefix.count(".") == 1}
    assert packages <= layered, packages - layered


def test_allowed_entries_are_still_needed():
    """An allow-list entry whose import is gone is removed, so the list only shrinks."""
    found = {(a, b) for a, b, _ in EDGES}
    assert not [pair for pair in ALLOWED if pair not in found]
