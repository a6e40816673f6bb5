"""Hostile and broken input: every bad report gets one clear error, nothing is lost or leaked.

Each input is built in tmp_path from a copy of a real fixture, altered with sqlite3, and given to
the real command (`python -m nsysan analyze ...` in a subprocess). An input nsysan can't analyze
must give exit code 2 and exactly one stderr line `nsysan: ...`; one it can analyze must give the
right numbers plus the diagnostic that says what was odd. Never a traceback, never "internal
error", and never a changed input or a file written next to it. docs/reliability.md lists every
case with its outcome; tests/test_export.py covers the export stage function by function.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import resource
import shlex
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import pytest
from conftest import FIXTURES, ROOT
from test_export import copying_nsys, fake_nsys, make_partial_export

import nsysan
from nsysan.model import Analysis
from nsysan.render.json import render_json

V22_REPORT = FIXTURES / "known_mem_v22.nsys-rep"
V25_REPORT = FIXTURES / "known_mem_v25.nsys-rep"
MEM = "CUDA_GPU_MEMORY_USAGE_EVENTS"
MiB = 1 << 20
SECRET = "AKIAhunter2SECRETvalue"


# --- helpers ------------------------------------------------------------------------------------


def run_cli(*args: str, env: Optional[dict] = None, timeout: float = 300,
            preexec_fn: Optional[Callable[[], None]] = None,
            command: Optional[list[str]] = None) -> subprocess.CompletedProcess:
    """`python -m nsysan ARGS` as a user runs it (stdout and stderr are pipes, not a terminal)."""
    full_env = {k: v for k, v in os.environ.items()
                if k not in ("NSYSAN_DEBUG", "NSYSAN_EXPORT_TIMEOUT", "NSYSAN_NSYS", "COLUMNS")}
    full_env.update(env or {})
    return subprocess.run(command or [sys.executable, "-m", "nsysan", *args], capture_output=True, text=True,
                          cwd=ROOT, env=full_env, timeout=timeout, preexec_fn=preexec_fn)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(folder: Path) -> dict[str, str]:
    """Every entry under `folder` with its content hash: any file written or changed shows up."""
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): (sha256(p) if p.is_file() and not p.is_symlink() else p.lstat().st_mode)
            for p in sorted(folder.rglob("*"))}


def assert_one_error_line(result: subprocess.CompletedProcess, pattern: str = "") -> str:
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, result.stderr
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("nsysan: "), result.stderr
    assert re.search(pattern, lines[0]), lines[0]
    return lines[0]


def copy_fixture(name: str, folder: Path, as_name: Optional[str] = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(FIXTURES / f"{name}.sqlite", folder / (as_name or f"{name}.sqlite")))


def altered(name: str, *statements: str | Callable[[sqlite3.Connection], None],
            as_name: Optional[str] = None) -> Callable[[Path], Path]:
    """A builder: copy fixture `name` into the folder and run `statements` on the copy."""
    def build(folder: Path) -> Path:
        path = copy_fixture(name, folder, as_name)
        with contextlib.closing(sqlite3.connect(path)) as conn:
            for statement in statements:
                if callable(statement):
                    statement(conn)
                else:
                    conn.executescript(statement)
            conn.commit()
        return path
    return build


def loosen(table: str) -> str:
    """SQL that rebuilds `table` without its NOT NULL constraints, rows in the same order (so
    NULLs and odd types can be written where nsys never writes them)."""
    return (f"CREATE TABLE _loose AS SELECT * FROM {table} ORDER BY rowid; DROP TABLE {table}; "
            f"ALTER TABLE _loose RENAME TO {table};")


def drop_column(table: str, column: str) -> str:
    """SQL that drops a column, also one that ALTER TABLE DROP COLUMN refuses (primary keys)."""
    def sql(conn: sqlite3.Connection) -> None:
        keep = [r[1] for r in conn.execute(f"PRAGMA table_info({table})") if r[1] != column]
        conn.executescript(f"CREATE TABLE _cut AS SELECT {', '.join(keep)} FROM {table} ORDER BY rowid; "
                           f"DROP TABLE {table}; ALTER TABLE _cut RENAME TO {table};")
    return sql  # type: ignore[return-value]


def shuffled(table: str) -> str:
    """SQL that rewrites `table` with its rows in a fixed scrambled order (not time order)."""
    return (f"CREATE TEMP TABLE _rows AS SELECT * FROM {table} ORDER BY (rowid * 7919) % 1009, rowid; "
            f"DELETE FROM {table}; INSERT INTO {table} SELECT * FROM _rows; DROP TABLE _rows;")


def bad_memory_row(bytes_sql: str = "bytes", op_sql: str = "memoryOperationType", start_sql: str = "start",
                   pid_sql: str = "globalPid", address_sql: str = "address + 4096", kind_sql: str = "memKind") -> str:
    """SQL inserting a copy of the first allocation at a fresh address, with some values replaced.
    If nsysan kept such a row as it is, the peak would move."""
    return (f"INSERT INTO {MEM} (start, globalPid, deviceId, contextId, address, pc, bytes, memKind, "
            f"memoryOperationType, correlationId) SELECT {start_sql}, {pid_sql}, deviceId, contextId, "
            f"{address_sql}, pc, {bytes_sql}, {kind_sql}, {op_sql}, correlationId FROM {MEM} "
            f"WHERE memoryOperationType = 0 AND memKind = 2 ORDER BY start LIMIT 1;")


def petabytes(count: int) -> Callable[[sqlite3.Connection], None]:
    """`count` never-freed allocations of 1 PiB each (the largest size kept), at fresh addresses."""
    def insert(conn: sqlite3.Connection) -> None:
        (first,) = conn.execute(f"SELECT rowid FROM {MEM} WHERE memoryOperationType = 0 AND memKind = 2 "
                                "ORDER BY start LIMIT 1").fetchone()
        conn.executemany(f"INSERT INTO {MEM} (start, globalPid, deviceId, contextId, address, pc, bytes, memKind, "
                         f"memoryOperationType, correlationId) SELECT start + ?, globalPid, deviceId, contextId, ?, pc, "
                         f"{1 << 50}, memKind, 0, correlationId FROM {MEM} WHERE rowid = ?",
                         [(i, (1 << 44) + i * 4096, first) for i in range(count)])
    return insert


def truncated(name: str, keep: Callable[[int], int]) -> Callable[[Path], Path]:
    def build(folder: Path) -> Path:
        data = (FIXTURES / f"{name}.sqlite").read_bytes()
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.sqlite"
        path.write_bytes(data[:keep(len(data))])
        return path
    return build


def corrupted_page(name: str, table: str) -> Callable[[Path], Path]:
    """A copy whose root page of `table` is overwritten: the table list reads fine, the table not."""
    def build(folder: Path) -> Path:
        path = copy_fixture(name, folder)
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
            (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()
            (page_size,) = conn.execute("PRAGMA page_size").fetchone()
        with open(path, "r+b") as handle:
            handle.seek((root - 1) * page_size)
            handle.write(b"\xa5" * page_size)
        return path
    return build


def raw_file(name: str, data: bytes) -> Callable[[Path], Path]:
    def build(folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
        return folder / name
    return build


def other_program_db(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "places.sqlite"  # what a browser keeps its history in
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE moz_places (id INTEGER PRIMARY KEY, url TEXT, title TEXT)")
        conn.execute("INSERT INTO moz_places VALUES (1, 'https://example.com', 'Example')")
        conn.commit()
    return path


def empty_db(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "empty-db.sqlite"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA user_version = 1")  # a valid database file with no tables
        conn.commit()
    return path


def partial_export(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return make_partial_export(folder / "partial.sqlite")


def report_copy(folder: Path) -> Path:
    """known_mem_v22.nsys-rep alone in `folder` (no sibling .sqlite), so nsys has to export it."""
    folder.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy2(V22_REPORT, folder / V22_REPORT.name))


def nvtx_rows(rows: Callable[[int], list[tuple]]) -> Callable[[sqlite3.Connection], None]:
    """Insert push/pop ranges on the fixture's main thread: rows(globalTid) -> (start, end, text)."""
    def insert(conn: sqlite3.Connection) -> None:
        (main_thread,) = conn.execute("SELECT globalTid FROM NVTX_EVENTS WHERE text = 'burst'").fetchone()
        conn.executemany("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES (?, ?, 59, ?, ?)",
                         [(s, e, t, main_thread) for s, e, t in rows(main_thread)])
    return insert


# The original analyses the altered copies are compared with (computed once, in process).
_originals: dict[str, dict] = {}


def original(name: str) -> dict:
    if name not in _originals:
        _originals[name] = json.loads(render_json(nsysan.analyze(FIXTURES / f"{name}.sqlite")))
    return _originals[name]


def without(doc: dict, *keys: str) -> dict:
    return {k: v for k, v in doc.items() if k not in ("source", *keys)}


def codes(doc: dict) -> list[str]:
    return [d["code"] for d in doc["diagnostics"]]


def message(doc: dict, code: str) -> str:
    (text,) = [d["message"] for d in doc["diagnostics"] if d["code"] == code]
    return text


# --- the cases ----------------------------------------------------------------------------------


@dataclass
class Case:
    id: str
    build: Callable[[Path], Path]              # folder -> the input file (or directory)
    error: Optional[str] = None                # regex of the one stderr line; None: must analyze
    check: Optional[Callable[[dict], None]] = None  # checks the JSON document of an analysis
    args: list[str] = field(default_factory=list)   # extra options; {tmp} is the test's tmp_path
    env: dict = field(default_factory=dict)
    command: Optional[list[str]] = None        # instead of `python -m nsysan` (see "no nsys at all")


def same_as_original(name: str, added: tuple[str, ...] = ()) -> Callable[[dict], None]:
    """The whole analysis equals the unaltered fixture's; only `added` diagnostics are new."""
    def check(doc: dict) -> None:
        base = original(name)
        # answers repeat the warnings of diagnostics, which may differ
        assert without(doc, "diagnostics", "answers") == without(base, "diagnostics", "answers")
        assert [v for v in doc["answers"] if v["topic"] != "trust"] == \
            [v for v in base["answers"] if v["topic"] != "trust"]
        assert [d for d in doc["diagnostics"] if d["code"] not in added] == base["diagnostics"]
        assert sorted(set(codes(doc)) - set(codes(base))) == sorted(added)
    return check


def left_out(count: int) -> Callable[[dict], None]:
    """Exactly `count` impossible memory rows were left out; everything else is unchanged."""
    def check(doc: dict) -> None:
        same_as_original("known_mem_v25", ("bad_memory_rows",))(doc)
        assert message(doc, "bad_memory_rows").startswith(f"{count} memory events had missing or impossible")
    return check


def same_memory_numbers(name: str = "known_mem_v25") -> Callable[[dict], None]:
    """Peak, per-group totals and never-freed blocks as in the original (names may differ)."""
    def check(doc: dict) -> None:
        base = original(name)
        assert (doc["peak"]["peak_bytes"], doc["peak"]["peak_time_ns"]) == \
            (base["peak"]["peak_bytes"], base["peak"]["peak_time_ns"])
        assert [{k: g[k] for k in ("kind", "peak_bytes", "allocations", "frees", "never_freed_bytes")}
                for g in doc["groups"]] == \
            [{k: g[k] for k in ("kind", "peak_bytes", "allocations", "frees", "never_freed_bytes")}
             for g in base["groups"]]
        assert [a["bytes"] for a in doc["never_freed"]] == [a["bytes"] for a in base["never_freed"]]
    return check


def all_checks(*checks: Callable[[dict], None]) -> Callable[[dict], None]:
    def check(doc: dict) -> None:
        for each in checks:
            each(doc)
    return check


def peak_range(expected: str) -> Callable[[dict], None]:
    def check(doc: dict) -> None:
        assert doc["peak"]["nvtx_range"] == expected
    return check


def has_codes(*expected: str) -> Callable[[dict], None]:
    def check(doc: dict) -> None:
        assert set(expected) <= set(codes(doc)), codes(doc)
    return check


def no_peak_and(*expected: str) -> Callable[[dict], None]:
    def check(doc: dict) -> None:
        assert doc["peak"] is None and doc["groups"] == [] and doc["never_freed"] == []
        has_codes(*expected)(doc)
    return check


def frees_without_allocations(doc: dict) -> None:
    base = original("known_mem_v25")
    frees = sum(g["frees"] for g in base["groups"])
    assert sum(g["frees_without_alloc"] for g in doc["groups"]) == frees
    assert sum(g["allocations"] for g in doc["groups"]) == 0
    assert doc["never_freed"] == [] and doc["never_freed_total"] == 0
    assert "allocated_before_capture" in codes(doc)
    assert message(doc, "allocated_before_capture").startswith(f"{frees} frees ")


def overlapping(doc: dict) -> None:
    # One extra 64 MiB cudaMalloc row at the address of the leaked 128 MiB block, while it is
    # still live: the documented rule pairs each free with the latest allocation at its address,
    # so both stay live; the diagnostic says the numbers may be overstated.
    base = original("known_mem_v25")
    assert "overlapping_allocations" in codes(doc)
    assert message(doc, "overlapping_allocations").startswith("1 allocations ")
    assert doc["never_freed_total"] == base["never_freed_total"] + 1
    assert 64 * MiB in [a["bytes"] for a in doc["never_freed"]]


def huge_nvtx(doc: dict) -> None:
    name = doc["peak"]["nvtx_range"]
    assert name.startswith("burst") and set(name[5:]) == {"x"} and len(name) == 200  # cut at 200 chars
    same_memory_numbers()(doc)


def many_ranges(doc: dict) -> None:
    same_memory_numbers()(doc)
    assert doc["peak"]["nvtx_range"] == "burst"
    assert len(doc["ranges"]) == 200 and len(doc["timeline"]["bands"]) <= 300  # capped lists


def non_utf8_names(doc: dict) -> None:
    same_memory_numbers()(doc)
    assert doc["peak"]["nvtx_range"] == "bu\ufffdrst"
    assert [p["name"] for p in doc["capture"]["processes"]] == ["/tmp/kn\ufffdown"]


def non_utf8_symbol(doc: dict) -> None:
    leaked = [(a["site"]["function"], a["bytes"]) for a in doc["never_freed"]]
    assert ("alloc_\ufffdweights", 134_217_728) in leaked  # the function name, bad byte replaced


def every_row_left_out(doc: dict) -> None:
    assert message(doc, "bad_memory_rows").startswith("52 memory events had missing or impossible")  # all 52


def exact_copies_left_out(doc: dict) -> None:
    same_as_original("known_mem_v25", ("bad_memory_rows",))(doc)
    assert message(doc, "bad_memory_rows").startswith("52 memory events were exact copies of others")


def no_api_table(doc: dict) -> None:
    base = original("known_mem_v25")
    assert "no_cuda_trace" in codes(doc)
    same_memory_numbers()(doc)
    assert doc["api_calls"] == [] and base["api_calls"] != []


FAKE_REPORT_ARGS = ["--nsys", "{tmp}/bin/nsys"]


def with_fake_nsys(body: str) -> Callable[[Path], Path]:
    """The V22 report alone in the folder, and a fake nsys in {tmp}/bin running `body` to export."""
    def build(folder: Path) -> Path:
        fake_nsys(folder.parent / "bin", body)
        return report_copy(folder)
    return build


def overwritten_first_page(folder: Path) -> Path:
    path = copy_fixture("known_mem_v25", folder)
    with open(path, "r+b") as handle:
        handle.seek(100)  # keep the 100-byte header, destroy the table list behind it
        handle.write(b"\xa5" * (4096 - 100))
    return path


def unknown_kind_group(doc: dict) -> None:
    # The copied 256 MiB allocation with memKind 99 is kept as kind "unknown": its own group and
    # a never-freed block, but not GPU-resident, so the peak does not move.
    same_memory_numbers()(dict(doc, groups=[g for g in doc["groups"] if g["kind"] != "unknown"],
                               never_freed=[a for a in doc["never_freed"] if a["kind"] != "unknown"]))
    (unknown,) = [g for g in doc["groups"] if g["kind"] == "unknown"]
    assert (unknown["allocations"], unknown["never_freed_bytes"]) == (1, 256 * MiB)


def with_cache_under_a_file(folder: Path) -> Path:
    copying_nsys(folder.parent / "bin", folder.parent / "nsys.log")
    (folder.parent / "a-file").write_text("not a folder")
    return report_copy(folder)


HALF_EXPORT = shlex.quote(str(FIXTURES / "known_mem_v22.sqlite"))
# What nsys 2022.4 leaves after failing on a 2023.x report: a file with only StringIds.
MAKE_PARTIAL = (f"{shlex.quote(sys.executable)} -c \"import sqlite3; "
                f"sqlite3.connect('$out').execute('CREATE TABLE StringIds (id, value)')\"")

CASES = [
    # --- not a report at all (the export stage; see also tests/test_export.py) -------------------
    Case("missing path", lambda f: f / "nowhere.sqlite", r"nowhere\.sqlite: no such file; check the path"),
    Case("a directory", lambda f: (f / "reports.sqlite").mkdir(parents=True) or f / "reports.sqlite",
         r"reports\.sqlite is a directory; pass one \.nsys-rep, \.qdrep or \.sqlite file"),
    Case("empty .sqlite", raw_file("empty.sqlite", b""), r"empty\.sqlite is empty \(0 bytes\)"),
    Case("empty .nsys-rep", raw_file("empty.nsys-rep", b""), r"empty\.nsys-rep is empty \(0 bytes\)"),
    Case("random bytes named .sqlite", raw_file("noise.sqlite", bytes(range(256)) * 64),
         r"noise\.sqlite is not a SQLite file; pass an export made by `nsys export --type sqlite`"),
    Case("random bytes named .nsys-rep", raw_file("noise.nsys-rep", bytes(range(256)) * 64),
         r"noise\.nsys-rep is not an Nsight Systems report \(it lacks the report header\)"),
    Case("random bytes named .qdrep", raw_file("noise.qdrep", bytes(range(256)) * 64),
         r"noise\.qdrep is not an Nsight Systems report"),
    Case(".qdstrm", raw_file("capture.qdstrm", b"QDSTRM" * 100),
         r"capture\.qdstrm is an unfinished capture \(\.qdstrm\); import it first with QdstrmImporter"),
    Case("a text file", raw_file("notes.txt", b"hello"), r"nsysan reads \.nsys-rep, \.qdrep and \.sqlite files"),
    Case("SQLite file of another program", other_program_db,
         r"places\.sqlite is an SQLite file but not an nsys export \(no nsys tables found\)"),
    Case("SQLite file without tables", empty_db, r"empty-db\.sqlite is an empty SQLite file, not an nsys export"),
    Case("partial export (StringIds, ProcessStreams)", partial_export,
         r"partial\.sqlite is a partial nsys export \(only StringIds/ProcessStreams\): the export failed"),
    # --- truncated and damaged SQLite -------------------------------------------------------------
    Case("truncated to its 16-byte magic", truncated("known_mem_v25", lambda n: 16),
         r"known_mem_v25\.sqlite is not a readable SQLite file \(.*\); it may be truncated or damaged"),
    *[Case(f"truncated to {label}", truncated("known_mem_v25", keep),
           r"known_mem_v25\.sqlite is truncated: it holds \d+ of its " + str((FIXTURES / "known_mem_v25.sqlite").stat().st_size) + r" bytes; .* copy or export it again")
      for label, keep in [("100 bytes (header only)", lambda n: 100), ("its first page", lambda n: 4096),
                          ("half", lambda n: n // 2), ("all but its last page", lambda n: n - 4096),
                          ("all but its last byte", lambda n: n - 1)]],
    Case("truncated known_bt_v25 (last page half gone)", truncated("known_bt_v25", lambda n: n - 2048),
         r"known_bt_v25\.sqlite is truncated: it holds \d+ of its " + str((FIXTURES / "known_bt_v25.sqlite").stat().st_size) + " bytes"),
    Case("memory table's page overwritten", corrupted_page("known_mem_v25", MEM),
         r"known_mem_v25\.sqlite: the export could not be read \(database disk image is malformed\); it may be "
         r"truncated or damaged"),
    Case("table list (page 1) overwritten", overwritten_first_page,
         r"known_mem_v25\.sqlite is not a readable SQLite file \(database disk image is malformed\); "
         r"it may be truncated or damaged"),
    # --- schema oddities that make numbers impossible: one clear error -----------------------------
    Case("memory table without memoryOperationType", altered("known_mem_v25", drop_column(MEM, "memoryOperationType")),
         r"known_mem_v25\.sqlite is a damaged nsys export: table CUDA_GPU_MEMORY_USAGE_EVENTS has no column "
         r"memoryOperationType, which every nsys export writes; export the report again"),
    Case("memory table without bytes", altered("known_mem_v25", drop_column(MEM, "bytes")),
         r"table CUDA_GPU_MEMORY_USAGE_EVENTS has no column bytes"),
    Case("memory table without memKind", altered("known_mem_v25", drop_column(MEM, "memKind")),
         r"table CUDA_GPU_MEMORY_USAGE_EVENTS has no column memKind"),
    Case("API table without nameId", altered("known_mem_v25", drop_column("CUPTI_ACTIVITY_KIND_RUNTIME", "nameId")),
         r"table CUPTI_ACTIVITY_KIND_RUNTIME has no column nameId"),
    Case("call stacks without stackDepth", altered("known_bt_v25", drop_column("CUDA_CALLCHAINS", "stackDepth")),
         r"table CUDA_CALLCHAINS has no column stackDepth"),
    Case("no StringIds table", altered("known_mem_v25", "DROP TABLE StringIds"),
         r"known_mem_v25\.sqlite is a damaged nsys export: it has CUDA API calls but no StringIds table"),
    # --- schema oddities nsysan analyzes, saying what was odd ---------------------------------------
    Case("no memory table (capture asked for it)", altered("known_mem_v25", f"DROP TABLE {MEM}"),
         check=no_peak_and("no_memory_events")),
    Case("no memory table, no capture metadata", altered("known_mem_v25", f"DROP TABLE {MEM}; DROP TABLE META_DATA_CAPTURE"),
         check=no_peak_and("sizes_not_collected")),
    Case("no CUDA API table", altered("known_mem_v25", "DROP TABLE CUPTI_ACTIVITY_KIND_RUNTIME"), check=no_api_table),
    Case("no NVTX table", altered("known_mem_v25", "DROP TABLE NVTX_EVENTS"),
         check=all_checks(same_memory_numbers(), peak_range(""))),
    Case("NVTX table without its text column", altered("known_mem_v25", drop_column("NVTX_EVENTS", "text")),
         check=all_checks(same_memory_numbers(), peak_range(""))),
    Case("no ENUM, metadata, process, thread or GPU tables",
         altered("known_mem_v25", *[f"DROP TABLE {t};" for t in (
             "ENUM_CUDA_MEM_KIND", "ENUM_CUDA_DEV_MEM_EVENT_OPER", "META_DATA_EXPORT", "META_DATA_CAPTURE",
             "PROCESSES", "ThreadNames", "TARGET_INFO_GPU", "TARGET_INFO_CUDA_DEVICE", "TARGET_INFO_SYSTEM_ENV",
             "ANALYSIS_DETAILS", "DIAGNOSTIC_EVENT")]),
         check=all_checks(same_memory_numbers(), peak_range("burst"))),
    Case("NULL time, process, address and size rows",
         altered("known_mem_v25", loosen(MEM), bad_memory_row(start_sql="NULL"), bad_memory_row(pid_sql="NULL"),
                 bad_memory_row(address_sql="NULL"), bad_memory_row(bytes_sql="NULL"),
                 bad_memory_row(op_sql="NULL")),
         check=left_out(5)),
    Case("negative and huge sizes", altered("known_mem_v25", bad_memory_row(bytes_sql="-1048576"),
                                            bad_memory_row(bytes_sql="4611686018427387904"),
                                            bad_memory_row(bytes_sql="9223372036854775807"),
                                            bad_memory_row(bytes_sql="-9223372036854775808")),
         check=left_out(4)),
    Case("sizes as REAL and as text", altered("known_mem_v25", loosen(MEM), bad_memory_row(bytes_sql="1e300"),
                                              bad_memory_row(bytes_sql="'lots'"),
                                              bad_memory_row(bytes_sql="X'00ff'")),
         check=left_out(3)),
    Case("sizes stored as numeric TEXT", altered("known_mem_v25", loosen(MEM),
                                                 f"UPDATE {MEM} SET bytes = CAST(bytes AS TEXT) || ' '"),
         check=same_as_original("known_mem_v25")),
    Case("operation type out of range", altered("known_mem_v25", bad_memory_row(op_sql="7"),
                                                bad_memory_row(op_sql="-1")),
         check=left_out(2)),
    Case("memory kind out of range", altered("known_mem_v25", bad_memory_row(kind_sql="99")),
         check=unknown_kind_group),
    Case("non-UTF-8 bytes in NVTX, process and thread names",
         altered("known_mem_v25", "UPDATE NVTX_EVENTS SET text = CAST(X'6275ff727374' AS TEXT) WHERE text = 'burst';"
                                  "UPDATE PROCESSES SET name = CAST(X'2f746d702f6b6eff6f776e' AS TEXT) "
                                  "WHERE name = '/tmp/known';"
                                  "UPDATE StringIds SET value = CAST(X'6bfe' AS TEXT) WHERE value = 'known';"),
         check=non_utf8_names),
    Case("BLOBs in NVTX, process and thread names",
         altered("known_mem_v25", loosen("NVTX_EVENTS"), loosen("StringIds"),
                 "UPDATE NVTX_EVENTS SET text = X'6275ff727374' WHERE text = 'burst';"
                 "UPDATE PROCESSES SET name = X'2f746d702f6b6eff6f776e' WHERE name = '/tmp/known';"
                 "UPDATE StringIds SET value = X'6bfe' WHERE value = 'known';"),
         check=non_utf8_names),
    Case("non-UTF-8 bytes in a call-stack symbol",
         altered("known_bt_v25", "UPDATE StringIds SET value = CAST(X'616c6c6f635fff77656967687473' || "
                                 "CAST('(unsigned long)' AS BLOB) AS TEXT) WHERE value = 'alloc_weights(unsigned long)'"),
         check=non_utf8_symbol),
    Case("BLOBs in every text of the export", altered(
        "known_bt_v25", *[loosen(t) for t in ("StringIds", "PROCESSES", "META_DATA_CAPTURE", "TARGET_INFO_SYSTEM_ENV",
                                              "TARGET_INFO_GPU", "META_DATA_EXPORT")],
        "UPDATE StringIds SET value = CAST(value AS BLOB) || X'ff'; UPDATE PROCESSES SET name = X'ff00';"
        "UPDATE META_DATA_CAPTURE SET value = X'ff'; UPDATE TARGET_INFO_SYSTEM_ENV SET value = X'ff';"
        "UPDATE TARGET_INFO_GPU SET name = X'ff', uuid = X'fe';"),
         check=same_memory_numbers("known_bt_v25")),
    Case("frees without allocations", altered("known_mem_v25", f"DELETE FROM {MEM} WHERE memoryOperationType = 0"),
         check=frees_without_allocations),
    Case("two live allocations at one address", altered(
        "known_mem_v25", f"INSERT INTO {MEM} (start, globalPid, deviceId, contextId, address, pc, bytes, memKind, "
                         f"memoryOperationType, correlationId) SELECT start + 1000, globalPid, deviceId, contextId, "
                         f"address, pc, {64 * MiB}, memKind, 0, correlationId FROM {MEM} WHERE bytes = {128 * MiB}"),
         check=overlapping),
    Case("every memory row twice (an export written twice into one file)",
         altered("known_mem_v25", f"INSERT INTO {MEM} SELECT * FROM {MEM}"),
         check=exact_copies_left_out),
    Case("events out of time order", altered("known_mem_v25", shuffled(MEM), shuffled("NVTX_EVENTS"),
                                             shuffled("CUPTI_ACTIVITY_KIND_RUNTIME")),
         check=same_as_original("known_mem_v25")),
    Case("impossible timestamps", altered("known_mem_v25", bad_memory_row(start_sql="9223372036854775807"),
                                          bad_memory_row(start_sql="-9223372036854775807")),
         check=left_out(2)),
    Case("a 5 MB NVTX string", altered("known_mem_v25", "UPDATE NVTX_EVENTS SET text = 'burst' || "
                                                        "printf('%.5000000c', 'x') WHERE text = 'burst'"),
         check=huge_nvtx),
    Case("100k distinct NVTX names", altered("known_mem_v25", nvtx_rows(
        lambda tid: [(1_000 + 10 * i, 1_005 + 10 * i, f"range {i}") for i in range(100_000)])),
         check=many_ranges),
    Case("100k nested NVTX pushes never popped", altered("known_mem_v25", nvtx_rows(
        lambda tid: [(1_000 + i, None, f"push {i}") for i in range(100_000)])),
         check=all_checks(same_memory_numbers(), peak_range("burst"))),
    # --- round two: arithmetic that would overflow (see also tests/test_hostile2.py) ------------------
    Case("device ids beyond int16 (40000, 50000)",
         altered("known_mem_v25", bad_memory_row().replace("SELECT start, globalPid, deviceId", "SELECT start, globalPid, 40000"),
                 bad_memory_row().replace("SELECT start, globalPid, deviceId", "SELECT start, globalPid, 50000")),
         check=left_out(2)),  # never merged into one device: left out, said so
    Case("5,000 allocations of 1 PiB (sums beyond int64)", altered("known_mem_v25", petabytes(5_000)),
         r"known_mem_v25\.sqlite: its memory events allocate 4\.9 EiB in all, more than 64-bit byte counts hold"),
    Case("a time shift beyond 2^62 ns (--ts-normalize record damaged)",
         altered("known_mem_v25", "UPDATE META_DATA_EXPORT SET value = 'true' WHERE name = 'EXPORT_PARAM_TIME_NORMALIZE';"
                                  "UPDATE META_DATA_EXPORT SET value = '9000000000000000000' "
                                  "WHERE name = 'EXPORT_CONFIG_TIME_SHIFT';"),
         check=same_as_original("known_mem_v25", ("bad_time_shift",))),
    Case("a time shift that moves every memory time beyond 2^61 ns",
         altered("known_mem_v25", "UPDATE META_DATA_EXPORT SET value = 'true' WHERE name = 'EXPORT_PARAM_TIME_NORMALIZE';"
                                  "UPDATE META_DATA_EXPORT SET value = '-4000000000000000000' "
                                  "WHERE name = 'EXPORT_CONFIG_TIME_SHIFT';"),
         check=all_checks(no_peak_and("bad_memory_rows"), every_row_left_out)),
    # --- nsys: missing, crashing, hanging, out of space ---------------------------------------------
    Case("no nsys at all", report_copy, r"Nsight Systems' nsys is needed to read known_mem_v22\.nsys-rep; "
                                        r"install it, or pass --nsys PATH",
         command=[sys.executable, "-c", "import nsysan.sources.export.nsys as e, sys; e.INSTALL_GLOBS = (); "
                                        "from nsysan.cli import main; main(sys.argv[1:])"],
         env={"PATH": "/nonexistent"}),
    Case("--nsys that does not exist", report_copy, r"--nsys /nonexistent/nsys: no runnable nsys there",
         args=["--nsys", "/nonexistent/nsys"]),
    Case("nsys crashes", with_fake_nsys('echo "Exportation error: disk on fire" >&2; exit 3'),
         r"nsys export of known_mem_v22\.nsys-rep failed \(exit 3\): Exportation error: disk on fire",
         args=FAKE_REPORT_ARGS),
    Case("nsys killed by a signal", with_fake_nsys("kill -SEGV $$"),
         r"was killed by signal 11 while exporting known_mem_v22\.nsys-rep", args=FAKE_REPORT_ARGS),
    Case("nsys hangs", with_fake_nsys("sleep 60"), r"did not finish within 1 s and was stopped",
         args=FAKE_REPORT_ARGS, env={"NSYSAN_EXPORT_TIMEOUT": "1"}),
    Case("nsys leaves a partial export and fails", with_fake_nsys(
        f"{MAKE_PARTIAL}\n"
        'echo "Exportation error: Dynamic exception type: ProtobufParseException" >&2; exit 1'),
         r"could not parse known_mem_v22\.nsys-rep \(ProtobufParseException\)", args=FAKE_REPORT_ARGS),
    Case("nsys exits 0 but writes a partial export", with_fake_nsys(MAKE_PARTIAL),
         r"exited cleanly but wrote an incomplete export of known_mem_v22\.nsys-rep", args=FAKE_REPORT_ARGS),
    Case("nsys exits 0 with its output cut short (disk full)",
         with_fake_nsys(f'head -c 200000 {HALF_EXPORT} > "$out"; exit 0'),
         r"exited cleanly but wrote an incomplete export of known_mem_v22\.nsys-rep", args=FAKE_REPORT_ARGS),
    Case("nsys runs out of disk space", with_fake_nsys(
        f'head -c 8192 {HALF_EXPORT} > "$out"\n'
        'echo "Exportation error: write failed: No space left on device" >&2; exit 1'),
         r"failed \(exit 1\): Exportation error: write failed: No space left on device", args=FAKE_REPORT_ARGS),
    Case("export cache folder under a regular file", with_cache_under_a_file,
         r"can't use the export cache at .*a-file/cache .*; set NSYSAN_CACHE_DIR to a writable directory",
         args=["--nsys", "{tmp}/bin/nsys", "--cache-dir", "{tmp}/a-file/cache"]),
    # A report newer than the installed nsys: tests/test_cli.py::test_report_newer_than_nsys_is_one_clear_line
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_every_bad_input_gives_one_line_or_a_diagnosed_analysis(case: Case, tmp_path: Path) -> None:
    folder = tmp_path / "in"
    report = case.build(folder)
    before = snapshot(folder)
    out = tmp_path / "out"
    args = [a.replace("{tmp}", str(tmp_path)) for a in case.args]
    if "--cache-dir" not in args:
        args += ["--cache-dir", str(tmp_path / "cache")]
    result = run_cli("analyze", str(report), "--json", str(out / "analysis.json"), "--no-progress", *args,
                     env=case.env, command=case.command and [*case.command, "analyze", str(report), "--json",
                                                             str(out / "analysis.json"), "--no-progress", *args])

    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, result.stderr
    if case.error is not None:
        assert_one_error_line(result, case.error)
        assert not out.exists() or not any(out.iterdir())  # no JSON, not even a half-written one
    else:
        assert result.returncode == 0 and result.stderr == "", result.stderr
        doc = json.loads((out / "analysis.json").read_text())
        assert Analysis.from_dict(doc).to_dict() == doc
        assert case.check is not None
        case.check(doc)
        assert "nsysan · " in result.stdout and "Diagnostics" in result.stdout  # the text summary too
        assert "\x1b" not in result.stdout
    assert snapshot(folder) == before  # the input unchanged, nothing written next to it


# --- the environment: read-only input, unwritable or full output, Ctrl-C, two runs at once -------


def test_read_only_report_and_folder_get_nothing_written(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    sqlite_copy = copy_fixture("known_mem_v25", folder)
    report = report_copy(folder)  # an .nsys-rep too: its export goes to the cache, never beside it
    copying_nsys(tmp_path / "bin", tmp_path / "nsys.log")
    before = snapshot(folder)
    for path in (sqlite_copy, report):
        path.chmod(0o444)
    folder.chmod(0o555)
    try:  # tests run as root here, where modes stop nothing: the snapshot is the proof
        for path in (sqlite_copy, report):
            result = run_cli("analyze", str(path), "--no-progress", "--nsys", str(tmp_path / "bin" / "nsys"),
                             "--cache-dir", str(tmp_path / "cache"))
            assert result.returncode == 0 and result.stderr == "", result.stderr
    finally:
        folder.chmod(0o755)
    assert {k: v for k, v in snapshot(folder).items()} == before  # no -journal, -wal, .sqlite or temp file


UNWRITABLE = {
    "a path under a regular file": ("{tmp}/notafolder/analysis.json",
                                    r"could not write .*notafolder/analysis\.json: Not a directory"),
    "an existing directory": ("{tmp}/adir", r"could not write .*adir: Is a directory"),
    "a folder in /proc": ("/proc/nsysan-no-such-folder/analysis.json", r"could not write /proc/nsysan-no-such-folder/"),
    # A device node like /dev/full (every write fails: no space), made in tmp_path so that a bug
    # replacing the node by a file could never break the machine's own /dev/full.
    "a device whose writes fail (like /dev/full)": ("{tmp}/full", r"could not write .*/full: No space left on device"),
}


@pytest.mark.parametrize("where", sorted(UNWRITABLE))
def test_json_that_cannot_be_written_is_one_line_and_leaves_nothing(where: str, tmp_path: Path) -> None:
    target, pattern = UNWRITABLE[where]
    target = target.replace("{tmp}", str(tmp_path))
    (tmp_path / "notafolder").write_text("a file, not a folder")
    (tmp_path / "adir").mkdir()
    (tmp_path / "adir" / "kept.txt").write_text("kept")
    if "full" in target:
        try:
            os.mknod(target, 0o666 | stat.S_IFCHR, os.makedev(1, 7))  # the device of /dev/full
        except OSError as err:
            pytest.skip(f"cannot make a device node here ({err.strerror})")
    before = snapshot(tmp_path)

    result = run_cli("analyze", "fixtures/known_mem_v25.sqlite", "--json", target, "--no-progress")

    assert_one_error_line(result, pattern)
    assert snapshot(tmp_path) == before  # no temp file left, the device node still a device node


def test_json_through_a_symlink_updates_the_file_it_points_to(tmp_path: Path) -> None:
    (tmp_path / "real.json").write_text("{}")
    (tmp_path / "link.json").symlink_to("real.json")
    result = run_cli("analyze", "fixtures/known_mem_v25.sqlite", "--json", str(tmp_path / "link.json"),
                     "--format", "json")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "link.json").is_symlink()
    assert json.loads((tmp_path / "real.json").read_text()) == json.loads(result.stdout)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "real.json"]


def test_json_into_a_pipe_is_streamed_not_replaced(tmp_path: Path) -> None:
    # `--json /dev/stdout` is a pipe or a terminal: written into, never replaced by a file (as
    # root, that would break /dev/stdout for the whole machine). A FIFO of our own stands in.
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    result = run_cli("analyze", "fixtures/known_mem_v25.sqlite", "--json", str(fifo), "--format", "json")
    reader.join(timeout=60)
    assert result.returncode == 0, result.stderr
    assert stat.S_ISFIFO(fifo.lstat().st_mode) and sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]
    assert json.loads(received[0]) == json.loads(result.stdout)


def test_outputs_are_readable_by_others_like_any_new_file(tmp_path: Path) -> None:
    # Written through a temporary file, the JSON must still get the usual mode (0644 under umask
    # 022), not the 0600 of a temporary file: others open these reports.
    target = tmp_path / "analysis.json"
    result = run_cli("analyze", "fixtures/known_mem_v25.sqlite", "--json", str(target), "--no-progress",
                     preexec_fn=lambda: os.umask(0o022))
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


@contextlib.contextmanager
def full_disk(tmp_path: Path, how: str, size: str = "64k"):
    """A folder where writes fail part-way, and the preexec_fn that makes a run see it full.

    "tmpfs": a real tmpfs of `size` mounted there (needs root and mount rights), filled up. "rlimit":
    RLIMIT_FSIZE in the child, so any write beyond 4 KiB fails (EFBIG), wherever it goes.
    """
    folder = tmp_path / "disk"
    folder.mkdir()
    if how == "rlimit":
        yield folder, lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        return
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.decode(errors='replace').strip()})")
    try:
        yield folder, None
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def fill(folder: Path) -> None:
    """Write a filler file until the disk under `folder` is full."""
    with contextlib.suppress(OSError), open(folder / "filler", "wb") as handle:
        while True:
            handle.write(b"\0" * 4096)
            handle.flush()


@pytest.mark.parametrize("how", ["tmpfs", "rlimit"])
@pytest.mark.parametrize("option", ["--json", "--json-dir"])
def test_full_disk_keeps_the_previous_json_and_leaves_no_partial_file(tmp_path: Path, how: str, option: str) -> None:
    with full_disk(tmp_path, how) as (disk, limit):
        name = "analysis.json" if option == "--json" else "known_mem_v25.sqlite.analysis.json"
        previous = render_json(nsysan.analyze(FIXTURES / "known_plain_v25.sqlite"))  # a good, older document
        (disk / name).write_text(previous)
        if how == "tmpfs":
            fill(disk)
        before = snapshot(disk)

        result = run_cli("analyze", "fixtures/known_mem_v25.sqlite", option,
                         str(disk / name if option == "--json" else disk), "--no-progress", preexec_fn=limit)

        assert_one_error_line(result, r"could not write .*(No space left on device|File too large)")
        assert snapshot(disk) == before  # the old document whole, no temp file, nothing half-written
        assert (disk / name).read_text() == previous


def needs_output_option() -> None:
    if "--output" not in run_cli("analyze", "--help", env={"COLUMNS": "200"}).stdout:
        pytest.skip("needs -o")


def test_full_disk_never_leaves_a_report_folder_that_looks_complete(tmp_path: Path) -> None:
    needs_output_option()
    with full_disk(tmp_path, "tmpfs") as (disk, _):
        fill(disk)
        result = run_cli("analyze", "fixtures/known_mem_v25.sqlite", "-o", str(disk / "report"), "--no-progress")
        assert_one_error_line(result, r"could not write .*No space left on device")
        leftovers = sorted(p.name for p in (disk / "report").iterdir()) if (disk / "report").exists() else []
        assert "report.html" not in leftovers and not [n for n in leftovers if n.startswith(".")]


def test_a_failed_run_keeps_the_previous_report_folder_whole(tmp_path: Path) -> None:
    needs_output_option()
    # 1 MiB: the plain capture's report (its page carries the charting library, ~100 KB) fits; once
    # the disk is filled up, the full one will not.
    with full_disk(tmp_path, "tmpfs", size="1m") as (disk, _):
        first = run_cli("analyze", "fixtures/known_plain_v25.sqlite", "-o", str(disk / "report"), "--no-progress")
        if first.returncode != 0:
            pytest.skip(f"the small report does not fit a 1 MiB tmpfs: {first.stderr.strip()}")
        page = (disk / "report" / "report.html").read_bytes()
        fill(disk)

        result = run_cli("analyze", "fixtures/known_mem_v25.sqlite", "-o", str(disk / "report"), "--no-progress")

        assert_one_error_line(result, r"could not write .*No space left on device")
        assert (disk / "report" / "report.html").read_bytes() == page  # the old page, whole
        assert not [p for p in (disk / "report").iterdir() if p.name.startswith(".")]  # no temp files
        json.loads((disk / "report" / "analysis.json").read_text())  # every file left is whole


def slow_nsys(directory: Path, started: Path, pid_file: Path) -> Path:
    """A fake nsys that writes part of an export, says it started, then hangs (its child's pid in
    `pid_file`) — the moment a user presses Ctrl-C."""
    return fake_nsys(directory, f'head -c 100000 {HALF_EXPORT} > "$out"\n'
                                f"sleep 60 & echo $! > {shlex.quote(str(pid_file))}\n"
                                f"touch {shlex.quote(str(started))}; wait")


@pytest.mark.parametrize("signum, code, line", [(signal.SIGINT, 130, "nsysan: interrupted"),
                                                (signal.SIGTERM, 143, "nsysan: stopped by SIGTERM")],
                         ids=["Ctrl-C", "SIGTERM"])
def test_a_stop_during_an_export_is_one_line_and_leaves_no_reusable_entry(
        tmp_path: Path, signum: int, code: int, line: str) -> None:
    report = report_copy(tmp_path / "in")
    cache = tmp_path / "cache"
    nsys = slow_nsys(tmp_path / "bin", tmp_path / "started", tmp_path / "sleeper.pid")
    env = {k: v for k, v in os.environ.items() if k not in ("NSYSAN_DEBUG", "NSYSAN_EXPORT_TIMEOUT")}
    process = subprocess.Popen([sys.executable, "-m", "nsysan", "analyze", str(report), "--nsys", str(nsys),
                                "--cache-dir", str(cache), "--format", "json"], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "started").exists():
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.05)
        process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == code and stdout == ""
    assert stderr.strip().splitlines() == [line], stderr
    sleeper = int((tmp_path / "sleeper.pid").read_text())
    deadline = time.monotonic() + 5
    while Path(f"/proc/{sleeper}").exists() and Path(f"/proc/{sleeper}/stat").read_text().split()[2] not in "ZX":
        assert time.monotonic() < deadline, "nsys was left running"
        time.sleep(0.05)
    assert not list(cache.glob("*.sqlite")) and not list(cache.glob(".*"))  # no entry, no temp file

    log = tmp_path / "nsys.log"
    good = copying_nsys(tmp_path / "good", log)
    again = run_cli("analyze", str(report), "--nsys", str(good), "--cache-dir", str(cache), "--format", "json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["source"]["from_cache"] is False and len(log.read_text().splitlines()) == 1


def test_two_analyses_of_one_report_at_once_share_the_cache(tmp_path: Path) -> None:
    report = report_copy(tmp_path / "in")
    log = tmp_path / "nsys.log"
    nsys = copying_nsys(tmp_path / "bin", log, delay_s=1)
    env = {k: v for k, v in os.environ.items() if k not in ("NSYSAN_DEBUG", "NSYSAN_EXPORT_TIMEOUT")}
    command = [sys.executable, "-m", "nsysan", "analyze", str(report), "--nsys", str(nsys),
               "--cache-dir", str(tmp_path / "cache"), "--format", "json"]
    runs = [subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    outputs = [run.communicate(timeout=300) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], [err for _, err in outputs]
    docs = [json.loads(out) for out, _ in outputs]
    assert sorted(d["source"]["from_cache"] for d in docs) == [False, True]
    for doc in docs:
        del doc["source"]["from_cache"]
    assert docs[0] == docs[1]
    assert len(log.read_text().splitlines()) == 1  # exported once; the other run waited and reused it


# --- nothing from the profiled environment leaks; every profile string is inert --------------------


def with_secrets(folder: Path, also: str = "") -> Path:
    """known_mem_v25 with the profiled process's environment holding secrets, as nsys records it:
    PROCESS_n:ENVIRONMENT_VARIABLE rows in META_DATA_CAPTURE and TARGET_INFO_SYSTEM_ENV rows."""
    return altered(
        "known_mem_v25",
        f"INSERT INTO META_DATA_CAPTURE VALUES ('PROCESS_0:ENVIRONMENT_VARIABLE', 'AWS_SECRET_ACCESS_KEY=\"{SECRET}\"');"
        f"INSERT INTO META_DATA_CAPTURE VALUES ('PROCESS_1:ENVIRONMENT_VARIABLE', 'HF_TOKEN=hf_{SECRET}');"
        f"INSERT INTO META_DATA_CAPTURE VALUES ('AWS_SECRET_ACCESS_KEY', '{SECRET}');"
        f"INSERT INTO TARGET_INFO_SYSTEM_ENV (globalVid, devStateName, name, nameEnum, value) SELECT globalVid, "
        f"devStateName, 'AWS_SECRET_ACCESS_KEY', nameEnum, '{SECRET}' FROM TARGET_INFO_SYSTEM_ENV LIMIT 1;"
        f"UPDATE TARGET_INFO_SYSTEM_ENV SET value = value || ';AWS_SECRET_ACCESS_KEY={SECRET}' "
        f"WHERE name = 'DeviceEnvironment';" + also,
        as_name="with-secrets.sqlite")(folder)


def all_output(tmp_path: Path, *results: subprocess.CompletedProcess) -> str:
    """Everything nsysan printed, plus every file it wrote under tmp_path/out (decoded leniently)."""
    texts = [r.stdout + r.stderr for r in results]
    for path in sorted((tmp_path / "out").rglob("*")):
        if path.is_file():
            texts.append(path.read_bytes().decode("utf-8", "replace"))
    return "\n".join(texts)


def test_the_profiled_environment_never_reaches_terminal_json_or_html(tmp_path: Path) -> None:
    report = with_secrets(tmp_path / "in")
    with contextlib.closing(sqlite3.connect(report)) as conn:  # the secret really is in the input
        assert conn.execute("SELECT count(*) FROM META_DATA_CAPTURE WHERE value LIKE ?",
                            (f"%{SECRET}%",)).fetchone()[0] == 3
    out = tmp_path / "out"
    runs = [run_cli("analyze", str(report), "--no-progress", "--json", str(out / "analysis.json")),
            run_cli("analyze", str(report), "--format", "json", "--json-dir", str(out))]
    if "--output" in run_cli("analyze", "--help", env={"COLUMNS": "200"}).stdout:
        runs.append(run_cli("analyze", str(report), "--no-progress", "-o", str(out / "report")))
        assert (out / "report" / "report.html").exists()
    assert [r.returncode for r in runs] == [0] * len(runs), [r.stderr for r in runs]
    text = all_output(tmp_path, *runs)
    assert "burst" in text and "952107008" in text  # the outputs are really there
    assert SECRET not in text and "AWS_SECRET_ACCESS_KEY" not in text and "ENVIRONMENT_VARIABLE" not in text


def test_debug_output_of_a_failing_run_holds_no_environment(tmp_path: Path) -> None:
    # Damaged after the capture metadata was read: the traceback goes through the probe.
    report = with_secrets(tmp_path / "in", also="ALTER TABLE CUDA_GPU_MEMORY_USAGE_EVENTS DROP COLUMN bytes;")
    result = run_cli("--debug", "analyze", str(report), "--no-progress")
    assert result.returncode == 2
    assert "Traceback" in result.stderr  # --debug shows the traceback, and only that
    assert result.stderr.strip().splitlines()[-1].startswith("nsysan: ")
    assert SECRET not in result.stdout + result.stderr and "ENVIRONMENT_VARIABLE" not in result.stderr


HOSTILE_NAMES = {  # NVTX range or process/thread name -> what it tries
    "burst": "<script>alert(1)</script>",               # the peak's range: an inline script
    "step 0": '"><img src=x onerror=alert(1)>',           # break out of an attribute
    "setup": "~{{7*7}}~",                               # template injection
    "step 1": "$\\frac{$ a $x^{2",                       # broken mathtext in a PNG label
    "step 2": "bu\x1b]0;PWNED\x07rst\x1b[2J\u202eevil",  # terminal: retitle, clear screen, bidi override
    "step 3": "[bold red]markup[/bold red] [link=https://example.invalid]x[/link]",  # rich markup
}
HOSTILE_PROCESS = '<script>alert(2)</script>"><img src=x onerror=alert(2)>~{{7*7}}~\x1b[31m'
HOSTILE_THREAD = "<script>alert(3)</script>~{{7*7}}~\x1b]52;c;cHduZWQ=\x07"  # OSC 52: write the clipboard


def hostile_profile(folder: Path) -> Path:
    def rename(conn: sqlite3.Connection) -> None:
        for old, new in HOSTILE_NAMES.items():
            conn.execute("UPDATE NVTX_EVENTS SET text = ? WHERE text = ?", (new, old))
        conn.execute("UPDATE PROCESSES SET name = ? WHERE name = '/tmp/known'", (HOSTILE_PROCESS,))
        conn.execute("UPDATE StringIds SET value = ? WHERE value = 'known'", (HOSTILE_THREAD,))
    return altered("known_mem_v25", rename, as_name="hostile.sqlite")(folder)


def test_profile_strings_never_drive_the_terminal(tmp_path: Path) -> None:
    report = hostile_profile(tmp_path / "in")
    result = run_cli("analyze", str(report), "--no-progress", env={"COLUMNS": "250"})
    assert result.returncode == 0 and result.stderr == "", result.stderr
    out = result.stdout
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out  # no escape reaches the terminal
    assert "bu\\x1b]0;PWNED\\x07rst\\x1b[2J\\u202eevil" in out  # shown, as visible escapes
    assert "[bold red]markup[/bold red]" in out  # rich markup printed as text, not applied
    assert "\\x1b]52;c;cHduZWQ=\\x07" in out and "\\x1b[31m" in out


def test_profile_strings_are_only_escaped_in_the_html_report(tmp_path: Path) -> None:
    needs_output_option()
    report = hostile_profile(tmp_path / "in")
    result = run_cli("analyze", str(report), "--no-progress", "-o", str(tmp_path / "out"))
    assert result.returncode == 0 and result.stderr == "", result.stderr
    html = (tmp_path / "out" / "report.html").read_text()
    # the report's own script and its data (JSON, never run), nothing from the profile
    assert html.count("<script") == 2 and html.count('<script type="application/json" id="nsysan-data">') == 1
    for raw in ("<script>alert", "<img src=x", "onerror=alert(1)>", "\x1b", "\u202e"):
        assert raw not in html, raw
    assert "bu\\x1b]0;PWNED\\x07rst\\x1b[2J\\u202eevil" in html  # control characters shown, not hidden
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # the peak's range, shown as text
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in html  # the process name
    assert "&lt;script&gt;alert(3)&lt;/script&gt;" in html  # the thread name, in a site label
    assert "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;" in html
    assert "~{{7*7}}~" in html and "~49~" not in html  # shown literally, never evaluated
    doc = json.loads((tmp_path / "out" / "analysis.json").read_text())
    assert doc["peak"]["nvtx_range"] == HOSTILE_NAMES["burst"]  # the JSON keeps the name as it was
