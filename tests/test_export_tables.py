"""Exporting only the tables nsysan reads (`nsys export --tables`, 2023.4 on), against fake `nsys`
scripts that record their arguments and write a real export, and the real Debian nsys 2022.4
(which has no --tables): the cache records what each export holds and exports again when it
lacks a table; an export made elsewhere with too few tables is refused in one line."""

from __future__ import annotations

import contextlib
import json
import shlex
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest

import nsysan
from nsysan.sources import export
from nsysan.cli import main
from nsysan.errors import NsysanError
from nsysan.sources.export import ensure_sqlite, recorded_tables
from nsysan.sources.sqlite_file import ALWAYS_EXPORTED, EXPORTED_TABLES, FIRST_EXPORT_TABLES, LAUNCH_TABLES

from conftest import FIXTURES, analysis_of
from test_export import HELP_2022, HELP_2025, V22, V22_SQLITE, V25_SQLITE, copy_alone, fake_nsys

V25 = FIXTURES / "known_mem_v25.nsys-rep"
HELP_2025_TABLES = HELP_2025 + ("--tables=<table_name1[,table_name2,...]>", "--times=<range>")
V25_PEAK = 952107008  # known_mem_v25's peak (README, golden document)
# What nsysan asks nsys for when the kernel table is added to a cached export: that table alone, and
# what tells that nsys took the list; it is appended into the entry, the tables held not exported again.
KERNEL_PART = [*LAUNCH_TABLES, *ALWAYS_EXPORTED]


def recording_nsys(directory: Path, log: Path, *, version: str = "2025.3.2.0",
                   export_help: tuple[str, ...] = HELP_2025_TABLES, body: str = "") -> Path:
    """A fake nsys that logs each export's arguments (one JSON list a line) and writes the real
    2025.3 export of known_mem_v25 as its output (`body` runs first and may exit)."""
    logger = f"python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' \"$@\" >> {shlex.quote(str(log))}"
    return fake_nsys(directory, f"{logger}\n{body}\ncp {shlex.quote(str(V25_SQLITE))} \"$out\"\nexit 0",
                     version=version, export_help=export_help)


def exports(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def tables_argument(args: list[str]) -> list[str] | None:
    return args[args.index("--tables") + 1].split(",") if "--tables" in args else None


def test_an_nsys_with_tables_exports_exactly_the_tables_nsysan_reads(tmp_path):
    log = tmp_path / "log"
    nsys = recording_nsys(tmp_path / "bin", log)
    report = copy_alone(V25, tmp_path / "in")
    result = ensure_sqlite(report, nsys=nsys, cache_dir=tmp_path / "cache")
    (args,) = exports(log)
    assert tables_argument(args) == list(EXPORTED_TABLES)
    assert "CUDA_GPU_MEMORY_USAGE_EVENTS" in EXPORTED_TABLES and "CUPTI_ACTIVITY_KIND_RUNTIME" in EXPORTED_TABLES
    assert ["--include-blobs", "true"] == args[args.index("--include-blobs"):args.index("--include-blobs") + 2]
    assert recorded_tables(result.sqlite_path) == EXPORTED_TABLES
    record = json.loads(export.record_path(result.sqlite_path).read_text())
    assert record == {"nsys": "2025.3.2.0", "tables": list(EXPORTED_TABLES)}
    # analyzed end to end from that export: known_mem_v25's numbers, no warning of a partial export
    analysis = nsysan.analyze(report, nsys=nsys, cache_dir=tmp_path / "cache")
    assert analysis.peak.peak_bytes == V25_PEAK and analysis.source.from_cache
    assert "partial_export" not in {d.code for d in analysis.diagnostics}
    assert len(exports(log)) == 1


# --- The kernel table, exported only for steps found from the kernels ---------------------------

def tables_nsys(directory: Path, log: Path, written: Path, then: str = "") -> Path:
    """A fake nsys 2025.3 that logs each export's arguments and writes `written` (a real 2025.3
    export) as nsys does with --tables: only the tables named in it, the others dropped (`then`:
    Python run after, with `out` and `args`)."""
    directory.mkdir(parents=True, exist_ok=True)
    keep_named = directory / "keep_named.py"
    keep_named.write_text(
        "import shutil, sqlite3, sys\n"
        "source, out, args = sys.argv[1], sys.argv[2], sys.argv[3:]\n"
        "shutil.copyfile(source, out)\n"
        "if '--tables' in args:\n"
        "    keep = set(args[args.index('--tables') + 1].split(','))\n"
        "    conn = sqlite3.connect(out)\n"
        "    for (name,) in conn.execute(\"SELECT name FROM sqlite_master WHERE type = 'table'\").fetchall():\n"
        "        if name not in keep:\n"
        "            conn.execute(f'DROP TABLE \"{name}\"')\n"
        "    conn.commit()\n"
        "    conn.close()\n" + then)
    return recording_nsys(directory, log, body=f"{shlex.quote(sys.executable)} {shlex.quote(str(keep_named))} "
                                               f"{shlex.quote(str(written))} \"$out\" \"$@\" || exit 1\nexit 0")


def whole_and_lazy(tmp_path: Path, fixture: str, **options) -> tuple[dict, dict, list[list[str]]]:
    """The document of one report analyzed twice: from an export of every table (an nsys without
    --tables) and as nsysan exports it with --tables, with the arguments of the second's exports."""
    written = FIXTURES / f"{fixture}.sqlite"
    report = copy_alone(V25, tmp_path / "in")  # stands for the report that `written` is the export of
    every = recording_nsys(tmp_path / "old", tmp_path / "old.log", version="2022.4.2.1", export_help=HELP_2022,
                           body=f"cp {shlex.quote(str(written))} \"$out\"; exit 0")
    whole = nsysan.analyze(report, nsys=every, cache_dir=tmp_path / "whole", **options)
    log = tmp_path / "log"
    lazy = nsysan.analyze(report, nsys=tables_nsys(tmp_path / "bin", log, written), cache_dir=tmp_path / "lazy",
                          **options)
    # the same document but for which nsys made the export
    assert whole.source.exported_with == "2022.4.2.1" and lazy.source.exported_with == "2025.3.2.0"
    same_source = {"source": {**lazy.to_dict()["source"], "exported_with": "2022.4.2.1"}}
    return whole.to_dict(), {**lazy.to_dict(), **same_source}, exports(log)


@pytest.mark.slow  # analyses each report twice (4-7 s on the loaded 2 cores)
def test_steps_from_nvtx_export_no_kernel_table(tmp_path):
    """torch_leak_v25: its one process marks its steps with NVTX, so its launch sequence is not
    read and the kernel table (1,938 kernels) is never exported; the document is the one of an
    export of every table."""
    whole, lazy, args = whole_and_lazy(tmp_path, "torch_leak_v25")
    assert [tables_argument(a) for a in args] == [list(FIRST_EXPORT_TABLES)]
    assert LAUNCH_TABLES == ("CUPTI_ACTIVITY_KIND_KERNEL",) and set(FIRST_EXPORT_TABLES) == set(EXPORTED_TABLES) - {
        "CUPTI_ACTIVITY_KIND_KERNEL"}
    assert [(s["found_by"], len(s["steps"])) for s in lazy["steps"]] == [("nvtx", 6)]
    assert lazy == whole


@pytest.mark.slow  # analyses each report twice (4-7 s on the loaded 2 cores)
def test_steps_from_kernels_export_the_kernel_table_after(tmp_path):
    """torch_nonvtx_warmup_v25: no NVTX, so its steps come from its launches named by their
    kernels; the first export shows that, and the kernel table is exported after, into the same
    cache entry, before the launches are read. Read without it (the launches named by their API),
    the steps, their phases and the hidden memory would differ."""
    whole, lazy, args = whole_and_lazy(tmp_path, "torch_nonvtx_warmup_v25")
    assert [(s["found_by"], len(s["steps"])) for s in lazy["steps"]] == [("kernels", 10)]
    assert lazy == whole
    assert [tables_argument(a) for a in args] == [list(FIRST_EXPORT_TABLES), KERNEL_PART]
    assert lazy["source"]["from_cache"] is False
    # the entry now holds the kernel table: analyzed again, nothing is exported
    again = nsysan.analyze(copy_alone(V25, tmp_path / "in"), nsys=tmp_path / "bin" / "nsys",
                           cache_dir=tmp_path / "lazy")
    assert again.source.from_cache and len(exports(tmp_path / "log")) == 2


@pytest.mark.slow  # analyses each report twice (4-7 s on the loaded 2 cores)
def test_steps_from_kernels_streamed_export_the_kernel_table_first(tmp_path):
    """Streamed, the processes without NVTX steps are known only while streaming: the kernel table
    is added before, and the document is the whole frame's."""
    whole, lazy, args = whole_and_lazy(tmp_path, "torch_nonvtx_warmup_v25", keep_events=False, max_memory=0)
    assert lazy == whole and [(s["found_by"], len(s["steps"])) for s in lazy["steps"]] == [("kernels", 10)]
    assert [tables_argument(a) for a in args] == [list(FIRST_EXPORT_TABLES), KERNEL_PART]


@pytest.mark.slow  # analyses each report twice (4-7 s on the loaded 2 cores)
@pytest.mark.parametrize("options", [{}, {"keep_events": False, "max_memory": 0}], ids=["whole", "streamed"])
def test_a_process_that_keeps_loading_code_exports_the_kernel_table(tmp_path, options):
    """torch_libloads_v25: its steps come from NVTX, but its process keeps loading code (the first
    export's API table shows it), and its loads are named by the kernels that ran after them: the
    kernel table is exported after the first export, and the document is the one of an export of
    every table, loads named (whole frame and streamed)."""
    whole, lazy, args = whole_and_lazy(tmp_path, "torch_libloads_v25", **options)
    assert [(s["found_by"], len(s["steps"])) for s in lazy["steps"]] == [("nvtx", 10)]
    assert [tables_argument(a) for a in args] == [list(FIRST_EXPORT_TABLES), KERNEL_PART]
    (process,) = lazy["hidden"]["processes"]
    assert process["keeps_loading"] and process["libraries_after_loads"]["cuDNN"] == 58
    assert lazy == whole


@pytest.mark.slow  # analyses each report twice (4-7 s on the loaded 2 cores)
def test_quick_and_step_range_export_no_kernel_table(tmp_path):
    """--quick reads no launches, nor does --step-range (it names the steps): one export each."""
    for options in ({"quick": True}, {"step_range": "^step"}):
        whole, lazy, args = whole_and_lazy(tmp_path / str(len(options)) / next(iter(options)), "torch_nonvtx_leak_v25",
                                           **options)
        assert [tables_argument(a) for a in args] == [list(FIRST_EXPORT_TABLES)]
        assert lazy == whole


def table_rows(path: Path, table: str) -> list[tuple]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute(f'SELECT * FROM "{table}" ORDER BY rowid').fetchall()


def test_the_kernel_table_is_appended_to_the_cached_export(tmp_path):
    """The kernel table added later is exported alone and appended into the cached entry: its rows,
    in order, are the real export's, beside the tables the entry held; nothing else is left in the
    cache."""
    written = FIXTURES / "torch_nonvtx_warmup_v25.sqlite"
    log = tmp_path / "log"
    nsys = tables_nsys(tmp_path / "bin", log, written)
    report = copy_alone(V25, tmp_path / "in")
    first = ensure_sqlite(report, nsys=nsys, cache_dir=tmp_path / "cache", tables=FIRST_EXPORT_TABLES)
    held = table_rows(first.sqlite_path, "CUPTI_ACTIVITY_KIND_RUNTIME")
    second = ensure_sqlite(report, nsys=nsys, cache_dir=tmp_path / "cache", tables=EXPORTED_TABLES)
    assert [tables_argument(a) for a in exports(log)] == [list(FIRST_EXPORT_TABLES), KERNEL_PART]
    assert second.sqlite_path == first.sqlite_path and not second.from_cache
    assert recorded_tables(second.sqlite_path) == (*FIRST_EXPORT_TABLES, *LAUNCH_TABLES)
    kernels = table_rows(second.sqlite_path, "CUPTI_ACTIVITY_KIND_KERNEL")
    assert len(kernels) > 1000 and kernels == table_rows(written, "CUPTI_ACTIVITY_KIND_KERNEL")
    assert table_rows(second.sqlite_path, "CUPTI_ACTIVITY_KIND_RUNTIME") == held
    assert sorted(p.name for p in (tmp_path / "cache").iterdir() if p.suffix == ".sqlite" or p.name.startswith(".")) \
        == [second.sqlite_path.name]  # no part, no copy left behind


def test_a_table_exported_with_other_strings_is_not_appended(tmp_path):
    """Tables name their strings by id: where the added table's export numbers its strings otherwise
    than the entry's, it is not appended (its names would be read wrong); every table wanted is
    exported anew, and the entry holds the real strings."""
    written = FIXTURES / "torch_nonvtx_warmup_v25.sqlite"
    log = tmp_path / "log"
    other_strings = ("if 'CUPTI_ACTIVITY_KIND_RUNTIME' not in args[args.index('--tables') + 1]:\n"
                     "    conn = sqlite3.connect(out)\n"
                     "    conn.execute(\"UPDATE StringIds SET value = value || ' (other)'\")\n"
                     "    conn.commit()\n"
                     "    conn.close()\n")
    nsys = tables_nsys(tmp_path / "bin", log, written, then=other_strings)
    report = copy_alone(V25, tmp_path / "in")
    ensure_sqlite(report, nsys=nsys, cache_dir=tmp_path / "cache", tables=FIRST_EXPORT_TABLES)
    result = ensure_sqlite(report, nsys=nsys, cache_dir=tmp_path / "cache", tables=EXPORTED_TABLES)
    whole = [*FIRST_EXPORT_TABLES, *LAUNCH_TABLES]
    assert [tables_argument(a) for a in exports(log)] == [list(FIRST_EXPORT_TABLES), KERNEL_PART, whole]
    assert recorded_tables(result.sqlite_path) == tuple(whole)
    assert table_rows(result.sqlite_path, "StringIds") == table_rows(written, "StringIds")
    kernels = "CUPTI_ACTIVITY_KIND_KERNEL"
    assert table_rows(result.sqlite_path, kernels) == table_rows(written, kernels)


def test_an_nsys_without_tables_exports_every_table(tmp_path):
    log = tmp_path / "log"
    nsys = recording_nsys(tmp_path / "bin", log, version="2022.4.2.1", export_help=HELP_2022)
    result = ensure_sqlite(copy_alone(V25, tmp_path / "in"), nsys=nsys, cache_dir=tmp_path / "cache")
    (args,) = exports(log)
    assert "--tables" not in args and "--include-blobs" not in args
    assert args[:3] == ["export", "--type", "sqlite"]
    assert recorded_tables(result.sqlite_path) is None  # every table


def test_a_cached_export_short_of_a_table_is_exported_again_with_more(tmp_path):
    log = tmp_path / "log"
    nsys = recording_nsys(tmp_path / "bin", log)
    report = copy_alone(V25, tmp_path / "in")
    fewer = ("StringIds", "META_DATA_*", "CUDA_GPU_MEMORY_USAGE_EVENTS", "SOME_TABLE_ONLY_IT_READS")
    first = ensure_sqlite(report, nsys=nsys, cache_dir=tmp_path / "cache", tables=fewer)
    assert tables_argument(exports(log)[0]) == list(fewer)
    assert ensure_sqlite(report, nsys=nsys, cache_dir=tmp_path / "cache", tables=fewer[:2]).from_cache
    assert len(exports(log)) == 1  # fewer tables than it holds: reused
    # a later analysis needs more: exported again, what it held kept, into the same entry
    second = ensure_sqlite(report, nsys=nsys, cache_dir=tmp_path / "cache")
    assert not second.from_cache and second.sqlite_path == first.sqlite_path
    # only what it lacks is exported (the glob covers both META_DATA tables), with what tells that
    # nsys took the list; the entry records what it held and what was added
    covered = {"StringIds", "META_DATA_EXPORT", "META_DATA_CAPTURE", "CUDA_GPU_MEMORY_USAGE_EVENTS"}
    assert tables_argument(exports(log)[1]) == [*(t for t in EXPORTED_TABLES if t not in covered), *ALWAYS_EXPORTED]
    assert recorded_tables(second.sqlite_path) == (*fewer, *(t for t in EXPORTED_TABLES if t not in fewer))
    assert ensure_sqlite(report, nsys=nsys, cache_dir=tmp_path / "cache").from_cache
    assert len(exports(log)) == 2


def test_an_export_whose_own_record_lacks_a_table_is_exported_again(tmp_path):
    """An entry without nsysan's record (made before it kept one, or copied in) is judged by the
    --tables its export records; one that lacks a table nsysan reads is never analyzed."""
    log = tmp_path / "log"
    nsys = recording_nsys(tmp_path / "bin", log)
    report = copy_alone(V25, tmp_path / "in")
    entry = ensure_sqlite(report, nsys=nsys, cache_dir=tmp_path / "cache").sqlite_path
    export.record_path(entry).unlink()
    with contextlib.closing(sqlite3.connect(entry)) as conn:
        conn.execute("UPDATE META_DATA_EXPORT SET value = 'CUDA_GPU_MEMORY_USAGE_EVENTS,StringIds' "
                     "WHERE name = 'EXPORT_PARAM_TABLES_TO_EXPORT'")
        conn.commit()
    assert recorded_tables(entry) == ("CUDA_GPU_MEMORY_USAGE_EVENTS", "StringIds")
    analysis = nsysan.analyze(report, nsys=nsys, cache_dir=tmp_path / "cache")
    assert len(exports(log)) == 2 and not analysis.source.from_cache
    # what an analysis asks first (known_mem_v25's steps come from NVTX: no kernel table)
    # (what it lacks of that, and the tables that tell nsys took the list)
    assert set(tables_argument(exports(log)[1])) == set(FIRST_EXPORT_TABLES) - {"CUDA_GPU_MEMORY_USAGE_EVENTS"}
    assert analysis.peak.peak_bytes == V25_PEAK


def test_a_failed_export_with_tables_is_made_again_with_every_table(tmp_path):
    log = tmp_path / "log"
    fails_with_tables = 'case "$*" in *--tables*) echo "Error: unknown table pattern" >&2; exit 1;; esac'
    nsys = recording_nsys(tmp_path / "bin", log, body=fails_with_tables)
    result = ensure_sqlite(copy_alone(V25, tmp_path / "in"), nsys=nsys, cache_dir=tmp_path / "cache")
    assert [tables_argument(a) is None for a in exports(log)] == [False, True]
    assert recorded_tables(result.sqlite_path) is None


def test_an_export_that_ignored_the_list_is_made_again_with_every_table(tmp_path):
    """An nsys that took the patterns literally writes no META_DATA_EXPORT: not trusted."""
    log = tmp_path / "log"
    literal = f'case "$*" in *--tables*) cp {shlex.quote(str(V22_SQLITE))} "$out"; exit 0;; esac'
    nsys = recording_nsys(tmp_path / "bin", log, body=literal)
    result = ensure_sqlite(copy_alone(V25, tmp_path / "in"), nsys=nsys, cache_dir=tmp_path / "cache")
    assert len(exports(log)) == 2 and recorded_tables(result.sqlite_path) is None
    assert nsysan.analyze(result.sqlite_path).peak.peak_bytes == V25_PEAK


def with_tables_recorded(source: Path, target: Path, tables: str) -> Path:
    shutil.copyfile(source, target)
    with contextlib.closing(sqlite3.connect(target)) as conn:
        conn.execute("UPDATE META_DATA_EXPORT SET value = ? WHERE name = 'EXPORT_PARAM_TABLES_TO_EXPORT'", (tables,))
        conn.commit()
    return target


def test_a_sqlite_exported_with_too_few_tables_is_refused_in_one_line(tmp_path, capsys):
    short = with_tables_recorded(V25_SQLITE, tmp_path / "short.sqlite", "CUDA_GPU_MEMORY_USAGE_EVENTS,StringIds")
    with pytest.raises(SystemExit) as stopped:
        main(["analyze", str(short), "--format", "json"])
    assert stopped.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("nsysan: short.sqlite was exported with --tables and may lack ThreadNames, PROCESSES")
    assert "CUPTI_ACTIVITY_KIND_RUNTIME" in line and "without --tables" in line
    with pytest.raises(NsysanError, match="short.sqlite was exported with --tables"):
        nsysan.analyze(short, quick=True)


def test_a_sqlite_exported_with_every_table_nsysan_reads_is_analyzed(tmp_path):
    enough = with_tables_recorded(V25_SQLITE, tmp_path / "enough.sqlite", ",".join(EXPORTED_TABLES))
    analysis = nsysan.analyze(enough)
    assert analysis.peak.peak_bytes == V25_PEAK
    assert "partial_export" not in {d.code for d in analysis.diagnostics}


def test_a_sibling_exported_with_too_few_tables_is_not_read(tmp_path):
    log = tmp_path / "log"
    nsys = recording_nsys(tmp_path / "bin", log)
    report = copy_alone(V25, tmp_path / "in")
    sibling = with_tables_recorded(V25_SQLITE, report.with_suffix(".sqlite"), "CUDA_GPU_MEMORY_USAGE_EVENTS")
    with contextlib.closing(sqlite3.connect(sibling)) as conn:  # otherwise the report's own export
        conn.execute("UPDATE META_DATA_EXPORT SET value = 'known_mem_v25.nsys-rep' WHERE name = 'EXPORT_PARAM_INPUT_FILE'")
        conn.commit()
    assert export.sibling_mismatch(report, sibling) is None  # it is the report's export, but short
    result = ensure_sqlite(report, nsys=nsys, cache_dir=tmp_path / "cache")
    assert not result.from_sibling and len(exports(log)) == 1
    full = with_tables_recorded(V25_SQLITE, tmp_path / "full.sqlite", "")
    shutil.copyfile(full, sibling)
    assert ensure_sqlite(report, nsys=nsys, cache_dir=tmp_path / "cache").from_sibling


def test_debian_nsys_2022_exports_every_table_and_the_analysis_reads_it(nsys_path, tmp_path):
    """The real nsys: 2022.4 has no --tables, so its export is whole and recorded as such."""
    report = copy_alone(V22, tmp_path / "in")
    result = ensure_sqlite(report, nsys=nsys_path, cache_dir=tmp_path / "cache")
    if not export.exports_tables(nsys_path):
        assert recorded_tables(result.sqlite_path) is None
    else:  # a newer nsys found first on this machine: only nsysan's tables
        assert recorded_tables(result.sqlite_path) == EXPORTED_TABLES
    analysis = nsysan.analyze(report, nsys=nsys_path, cache_dir=tmp_path / "cache")
    # the same numbers as from the export shipped beside it (made by the same 2022.4)
    shipped = analysis_of("known_mem_v22")
    assert analysis.source.from_cache and analysis.peak == shipped.peak and analysis.peak.peak_bytes > 0


def strings_in_code(package: Path) -> list[str]:
    """Every string constant of the package's modules (SQL, table names), without docstrings and
    comments, which name tables nsysan does not read."""
    import ast

    found = []
    for path in package.rglob("*.py"):
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}
        found += [node.value for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]
    return found


def test_every_table_nsysan_names_is_exported():
    """A table read anywhere in nsysan but left out of EXPORTED_TABLES would be missing from every
    export made with --tables: each table name of the fixtures' exports that nsysan's code names
    must be covered."""
    import re

    from nsysan.sources.sqlite_file import tables_missing

    known: set[str] = set()
    for path in FIXTURES.glob("*.sqlite"):
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
            known |= {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    code = "\n".join(strings_in_code(Path(nsysan.__file__).parent))
    named = {t for t in known if re.search(rf"(?<![A-Za-z0-9_]){re.escape(t)}(?![A-Za-z0-9_])", code)}
    assert {"CUDA_GPU_MEMORY_USAGE_EVENTS", "CUPTI_ACTIVITY_KIND_KERNEL", "StringIds"} <= named
    # Named but never needed from an export with --tables: the metadata table of exports up to
    # 2023.2 (no nsys of them has --tables), and what a failed export leaves (schema.py).
    not_read = {"EXPORT_META_DATA", "ProcessStreams"}
    assert tables_missing(EXPORTED_TABLES, sorted(named - not_read)) == []


def test_what_a_recorded_tables_list_covers():
    from nsysan.sources.sqlite_file import tables_missing

    assert tables_missing(None) == []  # an export of every table
    assert tables_missing(EXPORTED_TABLES) == []
    needed = ["TARGET_INFO_GPU", "NVTX_EVENTS", "StringIds"]
    # globs and regular expressions alike (which nsys means is not documented), in any case
    assert tables_missing(["TARGET_INFO_*", "nvtx_events", "StringIds"], needed) == []
    assert tables_missing(["TARGET_INFO_.*", "NVTX_.+", "String(Ids)?"], needed) == []
    assert tables_missing(["TARGET_INFO_CUDA_DEVICE", "NVTX_EVENTS"], needed) == ["TARGET_INFO_GPU", "StringIds"]
    assert tables_missing(["[unclosed", "NVTX_EVENTS", "StringIds"], needed) == ["TARGET_INFO_GPU"]
