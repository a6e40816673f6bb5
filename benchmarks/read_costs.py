"""Where the time of a whole-frame analysis goes, against what reading the export costs at least.

    flock /tmp/nsysan-bench.lock python benchmarks/read_costs.py benchmarks/data/big_10000000.sqlite \\
        --repeat 3 --json docs/read_costs.json

Issue 14 asks for the full analysis within 1.25x of the two-core sqlite3 floor (benchmarks/floor.py).
This measures the parts of that comparison, one core each unless said, medians of `--repeat`:

- per big SELECT of the floor (the memory table; the memory-API rows of the API table):
  the sqlite3 shell writing the rows to /dev/null (the floor's own cost), the shell summing every
  selected column instead (SQLite decoding each value, nothing printed), and the ADBC driver
  handing the rows to Arrow in this process (nsysan's reader, before any work of its own);
- the first touch of fresh memory in a new process (what building the frames costs the kernel,
  per GiB: page faults and zeroing);
- the stages of `nsysan analyze FILE --format json` in this process (its imports done, so without
  the interpreter's start-up), with the command line's allocator settings: the read (both
  tables at once: read_calls returns when both are in), normalizing, NVTX ranges, call sites and
  the analyses, each with the CPU seconds of the whole process meanwhile.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from run import floor_script, machine  # noqa: E402


def cpu_seconds(who: int = resource.RUSAGE_SELF) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def shell_seconds(path: Path, script: str) -> float:
    """CPU seconds of one sqlite3 shell running `script` (one core: its wall time too)."""
    before = cpu_seconds(resource.RUSAGE_CHILDREN)
    subprocess.run(["sqlite3", "-readonly", str(path)], input=script, text=True, check=True,
                   stdout=subprocess.DEVNULL)
    return cpu_seconds(resource.RUSAGE_CHILDREN) - before


def summed(select: str) -> str:
    """The SELECT with each column summed: SQLite decodes every value and prints one row."""
    head, rest = select.split(" FROM ", 1)
    columns = [c.strip() for c in head[len("SELECT "):].split(",")]
    return "SELECT " + ", ".join(f"total({c})" for c in columns) + " FROM " + rest


def adbc_seconds(path: Path, select: str) -> float:
    """CPU seconds of the ADBC driver handing the rows of `select` to Arrow, on this thread."""
    import adbc_driver_manager as manager
    import adbc_driver_sqlite as driver
    import pyarrow

    began = time.thread_time()
    with driver.connect(f"file:{path}?mode=ro&immutable=1") as database, manager.AdbcConnection(database) as conn, \
            manager.AdbcStatement(conn) as statement:
        statement.set_options(**{"adbc.sqlite.query.batch_rows": str(1 << 18)})
        statement.set_sql_query(select.rstrip(";"))
        stream, _ = statement.execute_query()
        with pyarrow.RecordBatchReader._import_from_c(stream.address) as batches:
            for _ in batches:
                pass
    return time.thread_time() - began


FIRST_TOUCH = """
import resource, numpy as np
from nsysan.runtime.malloc_tuning import avoid_transparent_huge_pages, keep_large_arrays_on_the_heap
keep_large_arrays_on_the_heap()  # as the command line runs
avoid_transparent_huge_pages()
before = resource.getrusage(resource.RUSAGE_SELF)
block = np.ones({size} // 8, "int64")
after = resource.getrusage(resource.RUSAGE_SELF)
print(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, after.ru_minflt - before.ru_minflt)
"""


def first_touch(size: int) -> tuple[float, int]:
    """CPU seconds and page faults of writing `size` bytes of fresh memory in a new process."""
    done = subprocess.run([sys.executable, "-c", FIRST_TOUCH.format(size=size)], capture_output=True, text=True,
                          check=True, cwd=ROOT)
    seconds, faults = done.stdout.split()
    return float(seconds), int(faults)


def stages(path: Path) -> list[dict]:
    """`nsysan analyze PATH --format json` in this process, timed stage by stage."""
    from nsysan import cli
    from nsysan.pipeline import stages as pipeline
    from nsysan.events import load

    marks: list[dict] = []
    began, cpu_before = time.perf_counter(), cpu_seconds()

    def timed(module, name: str) -> None:
        work = getattr(module, name)

        @functools.wraps(work)
        def wrapper(*args, **kwargs):
            start, cpu = time.perf_counter(), cpu_seconds()
            try:
                return work(*args, **kwargs)
            finally:
                marks.append({"stage": name, "from_s": round(start - began, 2),
                              "seconds": round(time.perf_counter() - start, 2),
                              "process_cpu_s": round(cpu_seconds() - cpu, 2)})
        setattr(module, name, wrapper)

    for name in ("read_calls", "normalize", "attribute_ranges", "call_sites"):
        timed(load, name)
    timed(pipeline, "load_events")
    timed(pipeline, "run_analyses")
    sys.argv = ["nsysan", "analyze", str(path), "--format", "json", "--no-progress"]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        cli.main()
    marks.append({"stage": "whole command", "from_s": 0.0, "seconds": round(time.perf_counter() - began, 2),
                  "process_cpu_s": round(cpu_seconds() - cpu_before, 2)})
    return marks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    path = args.export.resolve()
    subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)  # warm the page cache
    selects = [line for line in floor_script(path).splitlines() if line.startswith("SELECT")][:2]
    tables = {}
    for select in selects:
        table = select.split(" FROM ")[1].split()[0].rstrip(";")
        runs = {"shell, rows to /dev/null": [], "shell, every column summed": [], "ADBC to Arrow": []}
        for _ in range(args.repeat):
            runs["shell, rows to /dev/null"].append(shell_seconds(path, ".output /dev/null\n" + select + "\n"))
            runs["shell, every column summed"].append(shell_seconds(path, summed(select) + "\n"))
            runs["ADBC to Arrow"].append(adbc_seconds(path, select))
        tables[table] = {name: round(statistics.median(values), 2) for name, values in runs.items()}
        print(table, tables[table], flush=True)
    touch_bytes = 2 << 30
    touches = [first_touch(touch_bytes) for _ in range(args.repeat)]
    touch = {"bytes": touch_bytes, "cpu_s": round(statistics.median(t[0] for t in touches), 2),
             "page_faults": int(statistics.median(t[1] for t in touches))}
    print("first touch of 2 GiB", touch, flush=True)
    analysis = stages(path)
    for mark in analysis:
        print(f"  {mark['stage']:20s} from {mark['from_s']:6.2f} s  {mark['seconds']:6.2f} s  "
              f"{mark['process_cpu_s']:6.2f} CPU s (process)", flush=True)
    result = {"export": path.name, "machine": machine(), "one_core_cpu_s": tables, "first_touch": touch,
              "stages": analysis}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
