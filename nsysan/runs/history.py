"""`nsysan history`: the runs a batch database holds (`batch --db`, one row per report), in order,
and the change points of their peak, growth per step and never-freed bytes.

A change point is the first run whose value moved beyond the noise of the runs before it: the
runs since the metric's previous change (at most NOISE_WINDOW of them) give a median and a
spread (the largest distance of any of them from that median); a run is a change when it is
further from the median than the larger of twice that spread, RELATIVE_FLOOR of the median and
ABSOLUTE_FLOOR_BYTES. After a change, the runs before it no longer count: the change starts the
new baseline. Each change names the call sites and NVTX ranges whose bytes moved most between
the run before it and the change.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import statistics
from pathlib import Path
from typing import Any, Optional, Sequence

from ..errors import NsysanError, printable
from ..model.history import HISTORY_SCHEMA, METRICS, ChangePoint, History, HistoryRun, Mover
from ..base.units import fmt_bytes

NOISE_WINDOW = 10
RELATIVE_FLOOR = 0.02
ABSOLUTE_FLOOR_BYTES = 1 << 20
MOVERS = 3


def load_history(database: Path, *, order_by: Optional[str] = None, where: Sequence[str] = ()) -> History:
    """Read `database` (never written) and find its change points. `order_by`: a tag key whose
    values order the runs (default: the tag `date` when every run has one, else when each report
    was analyzed); `where`: KEY=VALUE tags a run must have (the name of the report: name=FILE)."""
    conditions = [_condition(w) for w in where]
    conn = _open(database)
    try:
        rows, skipped = _report_rows(conn, database, conditions)
        ordered_by = _order(rows, order_by)
        runs = [_run(i + 1, row) for i, row in enumerate(rows)]
        changes = [_with_movers(conn, runs, change) for metric, _ in METRICS for change in _change_points(runs, metric)]
    finally:
        conn.close()
    changes.sort(key=lambda c: (c.run, [m for m, _ in METRICS].index(c.metric)))
    return History(schema=HISTORY_SCHEMA, database=database.name, ordered_by=ordered_by,
                   series=" ".join(f"{k}={v}" for k, v in conditions) or None, runs=runs, changes=changes,
                   skipped=skipped)


def _condition(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise NsysanError(f"--where {printable(text)!r}: give KEY=VALUE, a tag of `batch --tag` or name=FILE")
    return key, value


def _open(database: Path) -> sqlite3.Connection:
    try:
        mode = os.stat(database).st_mode
    except OSError as err:
        raise NsysanError(f"{database}: {err.strerror or err}") from None
    if not stat.S_ISREG(mode):
        raise NsysanError(f"{database} is not a regular file; give the nsysan.db a batch wrote")
    try:
        conn = sqlite3.connect(f"{Path(database).resolve().as_uri()}?mode=ro", uri=True)
        tables = {r[0] for r in conn.execute("select name from sqlite_master where type = 'table'")}
    except sqlite3.DatabaseError as err:
        raise NsysanError(f"{database} could not be read as a SQLite database ({err})") from None
    if "reports" not in tables:
        conn.close()
        raise NsysanError(f"{database} is not an nsysan database (no reports table); give the nsysan.db "
                          "that `nsysan batch --db` wrote")
    return conn


def _report_rows(conn: sqlite3.Connection, database: Path,
                 conditions: list[tuple[str, str]]) -> tuple[list[dict[str, Any]], int]:
    try:
        cursor = conn.execute("select rowid as _rowid, * from reports order by rowid")
        names = [d[0] for d in cursor.description]
        rows = [dict(zip(names, r)) for r in cursor]
    except sqlite3.DatabaseError as err:
        raise NsysanError(f"{database} could not be read ({err})") from None
    for row in rows:
        row["_tags"] = tags_of(row)
    kept = [row for row in rows if row.get("ok") and all(
        (row.get("name") if key == "name" else row["_tags"].get(key)) == value for key, value in conditions)]
    return kept, len(rows) - len(kept)


def tags_of(row: dict[str, Any]) -> dict[str, str]:
    """A report row's tags: the `tags` JSON object `batch --tag KEY=VALUE` writes, else the bare
    `tag` of older databases as {"tag": value}."""
    text = row.get("tags")
    if isinstance(text, str):
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if isinstance(value, dict):
            return {str(k): str(v) for k, v in value.items()}
    return {"tag": str(row["tag"])} if row.get("tag") not in (None, "") else {}


def _order(rows: list[dict[str, Any]], order_by: Optional[str]) -> str:
    key = order_by
    if key is None and rows and all("date" in r["_tags"] for r in rows):
        key = "date"
    if key is None:
        rows.sort(key=lambda r: (r.get("analyzed_at") or "", r["_rowid"]))
        return "analyzed_at"
    missing = [r["name"] for r in rows if key not in r["_tags"]]
    if missing:
        raise NsysanError(f"--order-by {printable(key)}: {len(missing)} run(s) have no tag {printable(key)!r} "
                          f"(e.g. {printable(str(missing[0]))}); tag every run with `batch --tag {printable(key)}=...` "
                          "or choose them with --where")
    values = [r["_tags"][key] for r in rows]
    numeric = all(_is_number(v) for v in values)
    rows.sort(key=lambda r: ((float(r["_tags"][key]) if numeric else r["_tags"][key]), r["_rowid"]))
    return f"tag:{key}"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _int_or_none(value: Any) -> Optional[int]:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _run(index: int, row: dict[str, Any]) -> HistoryRun:
    return HistoryRun(index=index, report_hash=str(row["report_hash"]), name=str(row.get("name") or ""),
                      tags=row["_tags"], analyzed_at=str(row.get("analyzed_at") or ""),
                      peak_bytes=_int_or_none(row.get("peak_bytes")),
                      growth_bytes_per_step=_int_or_none(row.get("growth_bytes_per_step")),
                      growth_verdict=row.get("growth_verdict"),
                      never_freed_bytes=(_int_or_none(row.get("never_freed_bytes"))
                                         if row.get("memory_usage_collected") != 0 else None))


def noise_bytes(values: Sequence[int]) -> tuple[int, int]:
    """The median of `values` and how far a new value may be from it and still be noise."""
    center = statistics.median(values)
    spread = max(abs(v - center) for v in values)
    return int(center), int(max(2 * spread, RELATIVE_FLOOR * abs(center), ABSOLUTE_FLOOR_BYTES))


def _change_points(runs: list[HistoryRun], metric: str) -> list[ChangePoint]:
    changes: list[ChangePoint] = []
    baseline: list[int] = []
    for run in runs:
        value = getattr(run, metric)
        if value is None:
            continue
        if baseline:
            center, noise = noise_bytes(baseline[-NOISE_WINDOW:])
            if abs(value - center) > noise:
                changes.append(ChangePoint(metric=metric, run=run.index, before_bytes=center, after_bytes=value,
                                           noise_bytes=noise, runs_before=len(baseline[-NOISE_WINDOW:])))
                baseline = []
        baseline.append(value)
    return changes


def _with_movers(conn: sqlite3.Connection, runs: list[HistoryRun], change: ChangePoint) -> ChangePoint:
    after = runs[change.run - 1]
    before = next((r for r in reversed(runs[:change.run - 1]) if getattr(r, change.metric) is not None), None)
    movers: list[Mover] = []
    if before is not None:
        measure = "max_live_bytes" if change.metric == "peak_bytes" else "never_freed_bytes"
        movers = _moved(conn, "site", "select label, sum({m}) from sites where report_hash = ? group by label",
                        measure, before.report_hash, after.report_hash)
        if measure == "never_freed_bytes":
            movers += _moved(conn, "range", "select nvtx_range, sum(bytes) from never_freed where report_hash = ? "
                             "group by nvtx_range", measure, before.report_hash, after.report_hash)
        rising = change.after_bytes >= change.before_bytes
        movers.sort(key=lambda m: (m.after_bytes - m.before_bytes) * (-1 if rising else 1))
        movers = [m for m in movers if (m.after_bytes > m.before_bytes) == rising][:MOVERS]
    return ChangePoint(**{**change.__dict__, "movers": movers, "message": _message(change, after, movers)})


def _moved(conn: sqlite3.Connection, what: str, query: str, measure: str, before: str,
           after: str) -> list[Mover]:
    def sums(key: str) -> dict[str, int]:
        try:
            return {str(label or ""): int(total or 0) for label, total in conn.execute(query.format(m=measure), [key])}
        except sqlite3.DatabaseError:  # a database written before the table existed
            return {}

    old, new = sums(before), sums(after)
    return [Mover(what=what, label=label, before_bytes=old.get(label, 0), after_bytes=new.get(label, 0),
                  measure=measure)
            for label in sorted(set(old) | set(new)) if old.get(label, 0) != new.get(label, 0)]


def _message(change: ChangePoint, run: HistoryRun, movers: list[Mover]) -> str:
    name = dict(METRICS)[change.metric]
    delta = change.after_bytes - change.before_bytes
    text = (f"{name} {'rose' if delta > 0 else 'fell'} {fmt_bytes(abs(delta))} "
            f"({fmt_bytes(change.before_bytes)} -> {fmt_bytes(change.after_bytes)}) at run {run.index} "
            f"({run.label}), beyond the noise of the {change.runs_before} run{'s' if change.runs_before != 1 else ''} "
            f"before it (+/-{fmt_bytes(change.noise_bytes)})")
    if change.runs_before < 3:
        text += "; too few runs before it to know their noise well"
    if movers:
        top = movers[0]
        text += (f"; the {top.what} that moved most: {top.label or '(no NVTX range)'} "
                 f"{'+' if top.after_bytes >= top.before_bytes else '-'}"
                 f"{fmt_bytes(abs(top.after_bytes - top.before_bytes))}")
    return printable(text)
