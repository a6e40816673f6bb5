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

import datetime
import hashlib
from pathlib import Path
from typing import Any, Optional

from ..errors import NsysanError
from ..model import Analysis

CHILD_TABLES = ("groups", "steps", "never_freed", "sites", "diagnostics")
_KEYS = {"groups": ("report_hash", "pid", "device", "kind"), "steps": ("report_hash", "pid", "device", "step"),
         "never_freed": ("report_hash", "n"), "sites": ("report_hash", "label", "pid", "kind"),
         "diagnostics": ("report_hash", "n")}


class ResultsDatabase:
    """An open nsysan.db; `add(result, analysis)` writes one report, in one transaction."""

    def __init__(self, path: Path, tag: Optional[str] = None) -> None:
        import sqlite_utils

        self.path = Path(path)
        self.tag = tag
        if self.path.exists() and not _is_ours_or_empty(self.path):
            raise NsysanError(f"{self.path} is not an nsysan database (no reports table) and is never written "
                              "into; give --db a new file or an nsysan.db")
        try:
            self.db = sqlite_utils.Database(self.path)
            self.db.execute("PRAGMA journal_mode=WAL")  # readers (Datasette) don't block the batch
            # One commit per report: with WAL, NORMAL syncs at checkpoints instead of every commit
            # (a power cut may lose the last reports, never corrupt the file).
            self.db.execute("PRAGMA synchronous=NORMAL")
            if not self.db["steps"].exists():  # queries can name it before any analysis had steps
                self.db["steps"].create({"report_hash": str, "pid": int, "device": int, "step": int},
                                        pk=("report_hash", "pid", "device", "step"))
        except Exception as err:  # sqlite3.DatabaseError, OSError: not a database we can write
            raise NsysanError(f"{self.path} could not be opened as a SQLite database ({err})") from err

    def close(self) -> None:
        self.db.close()

    def add(self, result: dict[str, Any], analysis_file: Optional[str]) -> str:
        """Write one worker result (with the rows `database_rows` made on the worker); returns its key."""
        key = report_key(result)
        report = {"report_hash": key, "path": result["path"], "name": Path(result["path"]).name,
                  "ok": bool(result.get("ok")), "error": result.get("error"), "seconds": result.get("seconds"),
                  "tag": self.tag, "analyzed_at": datetime.datetime.now(datetime.timezone.utc).isoformat(
                      timespec="seconds"), "analysis_file": analysis_file}
        tables = result.get("tables") or {}
        report.update(tables.get("reports", {}))
        with self.db.conn:
            for table in CHILD_TABLES:
                if self.db[table].exists():
                    self.db[table].delete_where("report_hash = ?", [key])
            self.db["reports"].upsert(report, pk="report_hash", alter=True)
            for table in CHILD_TABLES:
                rows = tables.get(table)
                if rows:
                    self.db[table].insert_all(rows, pk=_KEYS[table], alter=True, replace=True)
        return key


def _is_ours_or_empty(path: Path) -> bool:
    """An empty file, or a SQLite database with nsysan's reports table (an export, a report or
    any other database must never be written into). Opened read-only."""
    import sqlite3

    if path.stat().st_size == 0:
        return True
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            names = {row[0] for row in conn.execute("select name from sqlite_master where type = 'table'")}
        finally:
            conn.close()
    except sqlite3.DatabaseError:
        return False
    return not names or "reports" in names


def report_key(result: dict[str, Any]) -> str:
    """The report's content hash, or (for a file that could not be read) one made from its path."""
    return result.get("hash") or "unreadable:" + hashlib.sha256(result["path"].encode()).hexdigest()


def database_rows(key: str, analysis: Analysis, name: str) -> dict[str, Any]:
    """What `add` writes for one analysis: the report's facts ("reports") and each child table's
    rows. Made on the worker, so the process writing the database only writes. `name`: the input
    file's, for the error of a number SQLite can't hold."""
    tables: dict[str, Any] = {"reports": _report_facts(analysis)}
    for table, rows, _ in _child_rows(key, analysis):
        tables[table] = rows
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
            "memory_usage_collected": a.capture.memory_usage_collected, "backtraces": a.capture.backtraces,
            "peak_bytes": a.peak.peak_bytes if a.peak else None, "peak_pid": a.peak.pid if a.peak else None,
            "peak_gpu": a.peak.gpu if a.peak else None,
            "never_freed_bytes": sum(g.never_freed_bytes for g in a.groups if g.kind not in ("static", "managed_static")),
            "never_freed_count": a.never_freed_total, "processes": len(a.capture.processes),
            "gpus": len(a.capture.gpus), "failed_calls": len(a.failed_calls),
            "warnings": ",".join(sorted({d.code for d in a.diagnostics if d.severity in ("warning", "error")}))}


def _child_rows(key: str, a: Analysis) -> list[tuple[str, list[dict[str, Any]], Any]]:
    procs = {p.pid: p for p in a.capture.processes}

    def who(pid: Optional[int]) -> dict[str, Any]:
        proc = procs.get(pid) if pid is not None else None
        return {"process": a.process_label(pid), "rank": proc.rank if proc else None}

    groups = [{"report_hash": key, **who(g.pid), "pid": g.pid, "device": g.device, "kind": g.kind, "gpu": g.gpu,
               "peak_bytes": g.peak_bytes, "peak_time_ns": g.peak_time_ns, "end_bytes": g.end_bytes,
               "allocations": g.allocations, "frees": g.frees, "allocated_bytes": g.allocated_bytes,
               "never_freed_bytes": g.never_freed_bytes, "never_freed_count": g.never_freed_count}
              for g in a.groups]
    never_freed = [{"report_hash": key, "n": i, **who(x.pid), "pid": x.pid, "device": x.device, "kind": x.kind,
                    "api": x.api, "bytes": x.bytes, "address": x.address, "alloc_time_ns": x.alloc_time_ns,
                    "nvtx_range": x.nvtx_range, "site": x.site.label, "function": x.site.function}
                   for i, x in enumerate(a.never_freed)]
    sites = [{"report_hash": key, "label": s.site.label, "pid": s.pid, "kind": s.kind, "function": s.site.function,
              "module": s.site.module, "apis": ",".join(s.apis), "allocations": s.allocations,
              "allocated_bytes": s.allocated_bytes, "never_freed_bytes": s.never_freed_bytes,
              "never_freed_count": s.never_freed_count, "max_live_bytes": s.max_live_bytes} for s in a.sites]
    diagnostics = [{"report_hash": key, "n": i, "severity": d.severity, "code": d.code, "message": d.message}
                   for i, d in enumerate(a.diagnostics)]
    return [("groups", groups, ("report_hash", "pid", "device", "kind")),
            ("steps", _step_rows(key, a), ("report_hash", "pid", "device", "step")),
            ("never_freed", never_freed, ("report_hash", "n")),
            ("sites", sites, ("report_hash", "label", "pid", "kind")),
            ("diagnostics", diagnostics, ("report_hash", "n"))]


def _step_rows(key: str, a: Analysis) -> list[dict[str, Any]]:
    """Per step of each process and device, when the analysis found steps: the step's numbers
    (its `kept` holders are in the JSON document, not here)."""
    rows = []
    for series in getattr(a, "steps", None) or []:
        for step in series.steps:
            row = {"report_hash": key, "pid": series.pid, "device": series.device, "gpu": series.gpu,
                   "process": a.process_label(series.pid), "step": step.number}
            row.update({k: v for k, v in vars(step).items()
                        if k != "number" and (v is None or isinstance(v, (bool, int, float, str)))})
            rows.append(row)
    return rows
