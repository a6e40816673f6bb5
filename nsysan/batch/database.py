"""nsysan.db: the batch's results as SQLite tables, written with sqlite-utils.

Every table is keyed by `report_hash` (the SHA-256 of the report's bytes), so the same report
analyzed again, in the same batch or in a later CI run appending with `--db`, replaces its rows
instead of adding copies. Tables are created and widened with `alter=True`: a field added to the
analysis document later becomes a new column, and older databases keep working. Open it with
`sqlite-utils` or Datasette (docs/batch.md).

    reports      one row per report (failed ones too, with their error)
    groups       per (process, CUDA device, memory kind): peak, end, never freed ...
    steps        per step of a process, when the analysis found steps
    never_freed  the allocations never freed (the document's capped list)
    sites        per call site, process and kind
    diagnostics  per diagnostic
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import json
import re
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from ..errors import NsysanError, printable
from ..model import Analysis

CHILD_TABLES = ("groups", "steps", "never_freed", "sites", "diagnostics")
_KEYS = {"groups": ("report_hash", "pid", "device", "kind"), "steps": ("report_hash", "pid", "device", "step"),
         "never_freed": ("report_hash", "n"), "sites": ("report_hash", "label", "pid", "kind"),
         "diagnostics": ("report_hash", "n")}


# How long a write waits for another process's lock (a second batch appending to the same --db,
# a `sqlite3` shell's open transaction) before the batch stops with a clear line: SQLite's own
# default. Each report is one short transaction (milliseconds, a few thousand rows at most), so two
# batches appending at once take turns well inside it.
LOCK_TIMEOUT_S = 5.0
_PRIMARY_KEYS = {"reports": ("report_hash",), **_KEYS}


class ResultsDatabase:
    """An open nsysan.db; `add(result, analysis)` writes one report, in one transaction.

    Opening refuses, in one line and before any analysis runs, a file that is another program's
    database, a database whose tables nsysan did not make, a damaged one (named, with how to
    rescue it), one it may not write and one another process keeps locked. Every write is an
    `IMMEDIATE` transaction (the schema it reads and the rows it writes are one unit, so two
    batches appending at once take turns instead of both adding the same column or table)."""

    def __init__(self, path: Path, tags: Sequence[str] = ()) -> None:
        import sqlite3

        import sqlite_utils

        self.path = Path(path)
        # `tag`: the --tag values as given (one bare tag, as before KEY=VALUE existed, stays itself);
        # `tags`: them as a JSON object, what `nsysan history` orders and filters runs by
        self.tag = " ".join(tags) or None
        self.tags = json.dumps(parse_tags(tags), sort_keys=True) if tags else None
        _refuse_what_is_not_ours(self.path)
        try:
            conn = sqlite3.connect(str(self.path), timeout=LOCK_TIMEOUT_S)
        except sqlite3.Error as err:
            raise self._error(err) from err
        try:
            self.db = sqlite_utils.Database(conn)
            self._prepare()
        except BaseException as err:
            conn.close()
            if isinstance(err, sqlite3.Error):
                raise self._error(err) from err
            raise

    def _prepare(self) -> None:
        """Check the file whole, check or make the tables, then WAL (readers such as Datasette
        don't block the batch)."""
        conn = self.db.conn
        problems = [row[0] for row in conn.execute("PRAGMA quick_check(3)")]
        if problems != ["ok"]:
            raise NsysanError(_damaged(self.path, "; ".join(problems)))
        with self._transaction():
            _check_tables(self.path, self.db)
            # Made at once, so a batch that stops before its first report (an unreachable Dask
            # scheduler) leaves a database the next batch recognizes as nsysan's; and queries can
            # name `steps` before any analysis had steps.
            if not self.db["reports"].exists():
                self.db["reports"].create({"report_hash": str}, pk="report_hash")
            if not self.db["steps"].exists():
                self.db["steps"].create({"report_hash": str, "pid": int, "device": int, "step": int},
                                        pk=("report_hash", "pid", "device", "step"))
        conn.execute("PRAGMA journal_mode=WAL")
        # One commit per report: with WAL, NORMAL syncs at checkpoints instead of every commit
        # (a power cut may lose the last reports, never corrupt the file).
        conn.execute("PRAGMA synchronous=NORMAL")

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """BEGIN IMMEDIATE: the write lock first (waiting up to LOCK_TIMEOUT_S), so what is read of
        the schema inside stays true until COMMIT; anything raised (a Ctrl-C too) rolls back."""
        conn = self.db.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            if conn.in_transaction:
                conn.rollback()
            raise
        conn.commit()

    def _error(self, err: Exception) -> NsysanError:
        return NsysanError(database_problem(self.path, err))

    def close(self) -> None:
        self.db.close()

    def add(self, result: dict[str, Any], analysis_file: Optional[str]) -> str:
        """Write one worker result (with the rows `database_rows` made on the worker); returns its key."""
        import sqlite3

        key = report_key(result)
        report = {"report_hash": key, "path": result["path"], "name": Path(result["path"]).name,
                  "ok": bool(result.get("ok")), "error": result.get("error"), "seconds": result.get("seconds"),
                  "tag": self.tag, "tags": self.tags, "analyzed_at": datetime.datetime.now(datetime.timezone.utc).isoformat(
                      timespec="seconds"), "analysis_file": analysis_file}
        tables = result.get("tables") or {}
        report.update(tables.get("reports", {}))
        try:
            with self._transaction():
                for table in CHILD_TABLES:
                    if self.db[table].exists():
                        self.db[table].delete_where("report_hash = ?", [key])
                self.db["reports"].upsert(report, pk="report_hash", alter=True)
                for table in CHILD_TABLES:
                    rows = tables.get(table)
                    if rows:
                        self.db[table].insert_all(rows, pk=_KEYS[table], alter=True, replace=True)
        except sqlite3.Error as err:
            raise self._error(err) from err
        return key


def _refuse_what_is_not_ours(path: Path) -> None:
    """Before anything is opened for writing: a file that is not a regular file, or a SQLite
    database of another program (an export, a report: never written into)."""
    import stat

    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return  # a new database
    except OSError as err:
        raise NsysanError(f"{path} could not be read: {err.strerror or err}") from err
    if not stat.S_ISREG(mode):
        raise NsysanError(f"{path} is not a regular file; give --db a new file or an nsysan.db")
    if not _is_ours_or_empty(path):
        raise NsysanError(f"{path} is not an nsysan database (no reports table) and is never written "
                          "into; give --db a new file or an nsysan.db")


_TAG_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
TAG_VALUE_MAX = 256


def parse_tags(tags: Sequence[str]) -> dict[str, str]:
    """`--tag KEY=VALUE` (repeatable) as a dict; a bare `--tag VALUE` is {"tag": VALUE}."""
    parsed: dict[str, str] = {}
    for text in tags:
        key, sep, value = text.partition("=") if "=" in text else ("tag", "=", text)
        if not _TAG_KEY.fullmatch(key):
            raise NsysanError(f"--tag {printable(text)[:80]!r}: the key must be letters, digits, '_', '.' or '-' "
                              "(at most 64), starting with a letter: --tag commit=$GITHUB_SHA")
        if len(value) > TAG_VALUE_MAX or not value.isprintable():
            raise NsysanError(f"--tag {key}: the value must be printable and at most {TAG_VALUE_MAX} characters")
        if key in parsed:
            raise NsysanError(f"--tag {key} is given twice")
        parsed[key] = value
    return parsed


def _is_ours_or_empty(path: Path) -> bool:
    """An empty file, or a SQLite database holding nsysan's reports table or only tables of
    nsysan's (an export, a report or any other database must never be written into).

    Opened `immutable`: no lock and no -shm, so a read-only database in WAL mode (whose -shm
    can't be made) is still recognized and then refused for what it is (read-only), not called
    another program's. A damaged file is recognized by its header and refused when opened."""
    import sqlite3

    try:
        with open(path, "rb") as handle:
            header = handle.read(16)
    except OSError as err:
        raise NsysanError(f"{path} could not be read: {err.strerror or err}") from err
    if not header:
        return True
    if header != b"SQLite format 3\x00":
        return False
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
        try:
            names = {row[0] for row in conn.execute("select name from sqlite_master where type = 'table'")}
        finally:
            conn.close()
    except sqlite3.DatabaseError as err:
        raise NsysanError(_damaged(path, str(err))) from err
    names = {name for name in names if not name.startswith("sqlite_")}
    return not names or "reports" in names or names <= set(_PRIMARY_KEYS)


def _check_tables(path: Path, db: Any) -> None:
    """Each of nsysan's tables that exists has nsysan's key (a `groups` table made by someone
    else would get rows that never replace each other, or an error half-way through a batch)."""
    names = set(db.table_names())
    if names and "reports" not in names and not names <= set(_PRIMARY_KEYS):
        raise NsysanError(f"{path} is not an nsysan database (no reports table) and is never written "
                          "into; give --db a new file or an nsysan.db")
    for table, key in _PRIMARY_KEYS.items():
        if table in names and tuple(db[table].pks) != key:
            raise NsysanError(f"{path} has a {table} table that nsysan did not make (keyed by "
                              f"{', '.join(db[table].pks)}, not {', '.join(key)}); give --db a new file, "
                              "or move this one aside")


def _damaged(path: Path, why: str) -> str:
    return (f"{path} is damaged (SQLite: {why}) and is never written into: move it aside (the batch then "
            f"makes a new one), or rescue its rows with: sqlite3 {path} .recover | sqlite3 recovered.db")


def database_problem(path: Path, err: Exception) -> str:
    """The one line for an SQLite error met opening or writing nsysan.db, by its cause."""
    name = getattr(err, "sqlite_errorname", "") or ""  # Python 3.11+; the message before that
    text = str(err)
    lowered = text.lower()
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in lowered:
        return (f"{path} is locked by another process (waited {LOCK_TIMEOUT_S:g} s to write); let the other "
                "batch finish, or give --db another file")
    if name.startswith(("SQLITE_READONLY", "SQLITE_PERM")) or "readonly" in lowered:
        return f"{path} can't be written ({text}); give --db a file you may write, or copy this one where you may"
    if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")) or "malformed" in lowered or "not a database" in lowered:
        return _damaged(path, text)
    if name.startswith("SQLITE_FULL") or "full" in lowered:
        return f"could not write {path}: the disk is full ({text})"
    if name.startswith("SQLITE_CANTOPEN") or "unable to open" in lowered:
        return (f"{path} could not be opened for writing ({text}); check that its folder exists and may be "
                f"written (SQLite also writes {path.name}-wal and -shm beside it)")
    return f"{path} could not be used as nsysan's database (SQLite: {text})"


def report_key(result: dict[str, Any]) -> str:
    """The report's content hash, or (for a file that could not be read) one made from its path."""
    return result.get("hash") or "unreadable:" + hashlib.sha256(result["path"].encode()).hexdigest()


def database_rows(key: str, analysis: Analysis, name: str) -> dict[str, Any]:
    """What `add` writes for one analysis: the report's facts ("reports") and each child table's
    rows. Made on the worker, so the process writing the database only writes. `name`: the input
    file's, for the error of a number SQLite can't hold."""
    tables: dict[str, Any] = {"reports": _report_facts(analysis), **_child_rows(key, analysis)}
    _check_integers(name, [tables["reports"], *(r for t in CHILD_TABLES for r in tables[t])])
    return tables


_INTEGER = range(-(1 << 63), 1 << 63)  # what SQLite's INTEGER holds


def _check_integers(name: str, rows: list[dict[str, Any]]) -> None:
    """A number SQLite can't hold (a hand-edited analysis.json, a sum of huge values) fails this
    report's row here, on the worker, rather than the whole batch where the database is written."""
    for row in rows:
        for column, value in row.items():
            if isinstance(value, int) and value not in _INTEGER:
                raise NsysanError(f"{name}: {column} = {value} is too large for nsysan.db (SQLite integers "
                                  "are 64-bit); is the analysis document hand-edited?")


def _report_facts(a: Analysis) -> dict[str, Any]:
    return {"source_name": a.source.name, "format": a.source.format, "size_bytes": a.source.size_bytes,
            "scope": a.scope, "nsys_version": a.capture.nsys_version, "duration_ns": a.capture.duration_ns,
            "session_start_utc_ns": a.capture.session_start_utc_ns,
            "memory_usage_collected": a.capture.memory_usage_collected, "backtraces": a.capture.backtraces,
            "peak_bytes": a.peak.peak_bytes if a.peak else None, "peak_pid": a.peak.pid if a.peak else None,
            "peak_gpu": a.peak.gpu if a.peak else None,
            "never_freed_bytes": a.never_freed_bytes,
            "never_freed_count": a.never_freed_total, "processes": len(a.capture.processes),
            "gpus": len(a.capture.gpus), "failed_calls": len(a.failed_calls), **_growth_facts(a),
            "warnings": ",".join(sorted({d.code for d in a.diagnostics if d.severity in ("warning", "error")}))}


def _growth_facts(a: Analysis) -> dict[str, Any]:
    """The largest growth per step of any process with judged steps, and its verdict (what
    `nsysan history` tracks); None without steps."""
    worst = max((g for g in a.growth if g.first_step is not None), key=lambda g: g.bytes_per_step, default=None)
    return {"growth_bytes_per_step": worst.bytes_per_step if worst else None,
            "growth_verdict": worst.verdict if worst else None}


def _child_rows(key: str, a: Analysis) -> dict[str, list[dict[str, Any]]]:
    procs = {p.pid: p for p in a.capture.processes}

    def who(pid: Optional[int]) -> dict[str, Any]:
        proc = procs.get(pid) if pid is not None else None
        return {"process": a.process_label(pid), "rank": proc.rank if proc else None}

    # a group's fields but the frees of memory allocated before the capture
    groups = [{"report_hash": key, **who(g.pid), **dataclasses.asdict(g)} for g in a.groups]
    for row in groups:
        del row["frees_without_alloc"], row["frees_without_alloc_bytes"]
    never_freed = [{"report_hash": key, "n": i, **who(x.pid), "pid": x.pid, "device": x.device, "kind": x.kind,
                    "api": x.api, "bytes": x.bytes, "address": x.address, "alloc_time_ns": x.alloc_time_ns,
                    "nvtx_range": x.nvtx_range, "site": x.site.label, "function": x.site.function}
                   for i, x in enumerate(a.never_freed)]
    sites = [{"report_hash": key, "label": s.site.label, "pid": s.pid, "kind": s.kind, "function": s.site.function,
              "module": s.site.module, "apis": ",".join(s.apis), "allocations": s.allocations,
              "allocated_bytes": s.allocated_bytes, "never_freed_bytes": s.never_freed_bytes,
              "never_freed_count": s.never_freed_count, "max_live_bytes": s.max_live_bytes} for s in a.sites]
    diagnostics = [{"report_hash": key, "n": i, **dataclasses.asdict(d)} for i, d in enumerate(a.diagnostics)]
    # per step of each process and device, the step's numbers (its `kept` holders are in the JSON document)
    steps = [{"report_hash": key, "pid": series.pid, "device": series.device, "gpu": series.gpu, **who(series.pid),
              "step": step.number, **{k: v for k, v in vars(step).items()
                                      if k != "number" and (v is None or isinstance(v, (bool, int, float, str)))}}
             for series in a.steps for step in series.steps]
    return {"groups": groups, "steps": steps, "never_freed": never_freed, "sites": sites, "diagnostics": diagnostics}
