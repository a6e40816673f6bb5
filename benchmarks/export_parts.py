"""What each part of nsysan's `nsys export` costs, on a machine with nsys 2023.4 or later (issue 31):

    python benchmarks/export_parts.py NSYS REPORT OUT.json [--rounds N]

Run from the repository root with nsysan importable (PYTHONPATH). Every export is run as nsysan
runs it (`--type sqlite --include-blobs true --tables ...`), in wall seconds, the sets taking turns
(ABBA), a warm-up first. It measures:

- the rows of each table nsysan reads, from one export of every table;
- each big table's own cost: exported alone, and nsysan's first list without it; an export naming
  no table that the report holds (what loading the report costs nsys before any table);
- nsysan's first list cut by table over 2 or 3 `nsys export` processes run at once (one SQLite file
  each): a gain only if the export's cost is spread over the tables;
- the API table cut by time (`--times`, by the start of each call) over 2-4 processes beside one for
  the other tables, the parts appended into one SQLite file afterwards; the cut points are the API
  table's quantiles, read from the whole export (nothing tells them before an export), and the
  merged table is compared row for row, in order, with the whole export's;
- the API table alone in the other formats nsys writes (arrow, arrowdir, parquetdir).

Results: docs/performance.md, "What the export's time is made of".
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import tempfile
import time

from nsysan.sources.sqlite_file import EXPORTED_TABLES, FIRST_EXPORT_TABLES

API = "CUPTI_ACTIVITY_KIND_RUNTIME"


class Exports:
    """Starts `nsys export` processes into numbered files of one temporary folder."""

    def __init__(self, nsys: str, report: str) -> None:
        self.nsys, self.report = nsys, report
        self.folder = tempfile.mkdtemp(prefix="export-parts-")
        self.made = 0

    def start(self, tables: list[str] | None, times: str | None = None,
              kind: str = "sqlite") -> tuple[subprocess.Popen, str]:
        self.made += 1
        target = os.path.join(self.folder, f"x{self.made}" + (".sqlite" if kind == "sqlite" else ""))
        command = [self.nsys, "export", "--type", kind, "--force-overwrite", "true", "--include-blobs", "true",
                   *(["--tables", ",".join(tables)] if tables else []), *(["--times", times] if times else []),
                   "--output", target, self.report]
        return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), target

    def at_once(self, *parts: tuple[list[str] | None, str | None]) -> tuple[dict, list[str]]:
        """Export `parts` ((tables, times) each) at once: the wall time until the last one ends,
        each one's end and CPU seconds, and the files written."""
        began = time.perf_counter()
        started = [self.start(tables, times) for tables, times in parts]
        row: dict = {"ends_s": [], "cpu_s": [], "rc": []}
        for process, _ in started:
            _, status, usage = os.wait4(process.pid, 0)
            process.returncode = os.waitstatus_to_exitcode(status)
            row["ends_s"].append(round(time.perf_counter() - began, 3))
            row["cpu_s"].append(round(usage.ru_utime + usage.ru_stime, 3))
            row["rc"].append(process.returncode)
        row["wall_s"] = round(time.perf_counter() - began, 3)
        files = [target for _, target in started]
        row["bytes"] = sum(os.path.getsize(f) for f in files if os.path.exists(f))
        return row, files


def remove(files: list[str]) -> None:
    for name in files:
        if os.path.isdir(name):  # arrowdir, parquetdir
            shutil.rmtree(name)
        elif os.path.exists(name):
            os.unlink(name)


def append_api_tables(into: str, parts: list[str]) -> None:
    """The API table of each of `parts`, in order, appended into `into` (one transaction, no journal)."""
    with sqlite3.connect(into, isolation_level=None) as conn:
        conn.execute("PRAGMA journal_mode=OFF")
        conn.execute("PRAGMA synchronous=OFF")
        for i, part in enumerate(parts):
            conn.execute(f"ATTACH ? AS part{i}", (part,))
        create = conn.execute("SELECT sql FROM part0.sqlite_master WHERE name = ?", (API,)).fetchone()[0]
        conn.execute("BEGIN")
        conn.execute(create)
        for i in range(len(parts)):
            conn.execute(f"INSERT INTO main.{API} SELECT * FROM part{i}.{API}")
        conn.execute("COMMIT")
    conn.close()


def api_rows(path: str) -> list[tuple]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute(f"SELECT * FROM {API} ORDER BY rowid").fetchall()
    conn.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("nsys")
    parser.add_argument("report")
    parser.add_argument("out")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    exports = Exports(args.nsys, os.path.abspath(args.report))
    result: dict = {"nsys": subprocess.run([args.nsys, "--version"], capture_output=True, text=True).stdout.strip(),
                    "cpus": os.cpu_count(), "report": os.path.basename(args.report), "rounds": args.rounds}

    made, (whole,) = exports.at_once((None, None))
    if made["rc"] != [0]:
        raise SystemExit(f"nsys export of every table failed (exit {made['rc'][0]})")
    with sqlite3.connect(whole) as conn:
        held = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        rows = {t: conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in held if t in EXPORTED_TABLES}
    conn.close()
    truth = api_rows(whole)
    remove([whole])
    result["rows"] = rows
    starts = sorted(row[0] for row in truth)

    def cut(parts: int) -> list[str]:
        """`--times` ranges by the calls' starts, one per part, each holding about as many calls:
        a strict start and a loose end (`S/E:`) take the calls that start in [S, E]."""
        points = [starts[len(starts) * i // parts] for i in range(1, parts)]
        lows = ["", *(str(p + 1) for p in points)]
        highs = [f"{p}:" for p in points] + [""]
        return [f"{low}/{high}" for low, high in zip(lows, highs)]

    rest = [t for t in FIRST_EXPORT_TABLES if t != API]
    big = [t for t in rest if rows.get(t, 0) > 5000]
    small = [t for t in rest if t not in big]
    sets: dict[str, list] = {
        "first_export_tables": [(list(FIRST_EXPORT_TABLES), None)],
        "no_table_of_the_report": [(["NO_SUCH_TABLE"], None)],
        "by_table_2: api | the rest": [([API, "StringIds", "META_DATA_EXPORT"], None), (rest, None)],
        "by_table_3: api | big | small": [([API, "StringIds", "META_DATA_EXPORT"], None), (["StringIds", *big], None),
                                          (small, None)],
    }
    for table in EXPORTED_TABLES:
        if rows.get(table, 0) > 1000:
            sets[f"alone: {table}"] = [([table], None)]
            if table in FIRST_EXPORT_TABLES:
                sets[f"first_export_tables without {table}"] = [([t for t in FIRST_EXPORT_TABLES if t != table], None)]
    for parts in (2, 3, 4):
        sets[f"by_time_{parts}: the rest | api cut in {parts}"] = [(rest, None), *(([API], c) for c in cut(parts))]

    def measure(name: str) -> dict:
        """One run of set `name`, in wall seconds (a time cut's: until its parts are appended)."""
        began = time.perf_counter()
        if name.startswith("api as "):
            process, target = exports.start([API], kind=name[len("api as "):])
            process.wait()
            remove([target])
            return {"wall_s": round(time.perf_counter() - began, 3), "rc": [process.returncode]}
        row, files = exports.at_once(*sets[name])
        if name.startswith("by_time_"):
            append_api_tables(files[0], files[1:])
            row["exported_s"], row["wall_s"] = row["wall_s"], round(time.perf_counter() - began, 3)
        remove(files)
        return row

    # Each time cut once, checked row for row, in order, against the whole export's API table.
    result["time_cuts"] = {}
    for parts in (2, 3, 4):
        name = f"by_time_{parts}: the rest | api cut in {parts}"
        _, files = exports.at_once(*sets[name])
        append_api_tables(files[0], files[1:])
        merged = api_rows(files[0])
        result["time_cuts"][name] = {"ranges": cut(parts), "rows": len(merged), "whole_export_rows": len(truth),
                                     "identical_in_order": merged == truth}
        remove(files)
        print(name, result["time_cuts"][name], flush=True)

    names = [*sets, *(f"api as {kind}" for kind in ("arrow", "arrowdir", "parquetdir"))]
    runs: dict[str, list] = {name: [] for name in names}
    remove(exports.at_once((list(FIRST_EXPORT_TABLES), None))[1])  # warm-up
    for round_ in range(args.rounds):
        for name in (names if round_ % 2 == 0 else names[::-1]):
            runs[name].append(measure(name))
    result["sets"] = {name: {"median_wall_s": statistics.median(r["wall_s"] for r in rows_), "parts": sets.get(name),
                             "runs": rows_} for name, rows_ in runs.items()}
    for name, value in result["sets"].items():
        print(f"{name:60s} {value['median_wall_s']:.3f} s  (runs {sorted(r['wall_s'] for r in value['runs'])})",
              flush=True)
    shutil.rmtree(exports.folder, ignore_errors=True)
    with open(args.out, "w") as out:
        json.dump(result, out, indent=1)


if __name__ == "__main__":
    main()
