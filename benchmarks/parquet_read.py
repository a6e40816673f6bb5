"""The read side of issue 31's question, SQLite or Parquet/Arrow: the same tables read into Arrow
through the ADBC SQLite driver (what nsysan does, reader.py) and with pyarrow from Parquet files
and from Arrow IPC files (what `nsys export --type parquetdir` / `arrowdir` write: one file per
table), in one run.

    python benchmarks/parquet_read.py benchmarks/data/big_1000000.sqlite --repeat 3 --json out.json

The Parquet and Arrow files are made here from the export itself (through ADBC, every column, one
file per table, pyarrow's defaults: snappy Parquet, uncompressed IPC), so the three read the same
rows and columns; nsys's own writer may choose other encodings. Each way is timed per table, taking
turns, `--repeat` times: wall time and this process's CPU time (all threads), median. The files
are read once before, so all three come from the page cache.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import adbc_driver_sqlite.dbapi as adbc
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq

# The tables nsysan reads row by row (the rest are a few rows each): memory events, API calls,
# NVTX ranges, strings.
TABLES = ("CUDA_GPU_MEMORY_USAGE_EVENTS", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS", "StringIds")


def read_sqlite(path: Path, table: str) -> pa.Table:
    with adbc.connect(f"file:{path}?mode=ro") as conn, conn.cursor() as cursor:
        cursor.execute(f'SELECT * FROM "{table}"')
        return cursor.fetch_arrow_table()


def timed(read) -> tuple[float, float, int]:
    wall, cpu = time.perf_counter(), time.process_time()
    rows = read().num_rows
    return time.perf_counter() - wall, time.process_time() - cpu, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nsysan-parquet-") as scratch:
        folder = Path(scratch)
        sizes = {}
        for table in TABLES:
            data = read_sqlite(args.export, table)
            pq.write_table(data, folder / f"{table}.parquet")
            feather.write_feather(data, folder / f"{table}.arrow", compression="uncompressed")
            sizes[table] = {"rows": data.num_rows, "parquet_bytes": (folder / f"{table}.parquet").stat().st_size,
                            "arrow_bytes": (folder / f"{table}.arrow").stat().st_size}
        ways = {
            "sqlite_adbc": lambda t: read_sqlite(args.export, t),
            "parquet_pyarrow": lambda t: pq.read_table(folder / f"{t}.parquet"),
            "arrow_ipc_pyarrow": lambda t: feather.read_table(folder / f"{t}.arrow"),
        }
        for way in ways.values():  # warm the page cache and the imports
            for table in TABLES:
                way(table)
        runs: dict[str, dict[str, list]] = {w: {t: [] for t in TABLES} for w in ways}
        for _ in range(args.repeat):
            for table in TABLES:
                for name, way in ways.items():
                    runs[name][table].append(timed(lambda: way(table)))
    result = {"export": args.export.name, "export_bytes": args.export.stat().st_size, "repeat": args.repeat,
              "load": os.getloadavg(), "cpus": os.cpu_count(), "tables": sizes, "ways": {}}
    for name, by_table in runs.items():
        per = {t: {"wall_s": round(statistics.median(r[0] for r in rs), 3),
                   "cpu_s": round(statistics.median(r[1] for r in rs), 3)} for t, rs in by_table.items()}
        result["ways"][name] = {"tables": per, "wall_s": round(sum(p["wall_s"] for p in per.values()), 3),
                                "cpu_s": round(sum(p["cpu_s"] for p in per.values()), 3)}
    base = result["ways"]["sqlite_adbc"]
    for name, way in result["ways"].items():
        way["wall_vs_sqlite"] = round(way["wall_s"] / base["wall_s"], 3)
        way["cpu_vs_sqlite"] = round(way["cpu_s"] / base["cpu_s"], 3)
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
