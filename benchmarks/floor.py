"""nsysan against the two-core floor (issue 14's time goal), in one run.

    python benchmarks/floor.py benchmarks/data/big_10000000.sqlite --repeat 3 \\
        --json docs/floor.json

The floor is what reading the export costs at best on this machine: the sqlite3 shell running the
SELECTs nsysan runs (benchmarks/run.py's floor scripts), output discarded. benchmarks/run.py
times one shell; nsysan reads on two threads, so the fair floor on two cores is two shells at
once, each reading half of every table's rowids, timed until both are done. Against it, in
turns (a slow spell of the machine hits every command alike):

- `nsysan analyze FILE --format json` as the command line runs it (the whole frame below
  pipeline.STREAM_QUICK_FROM_ROWS memory rows, streamed above), and with `--quick`;
- the same forced through the streamed path (`--max-memory 0`: no whole frame fits), which is
  what bounds memory.

Each command's median wall time, CPU seconds (user + system of it and its children) and peak
resident memory (from wait4) are printed and written to `--json`, with ratios to the floors.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from run import MEMORY_SELECT, floor_script, machine  # noqa: E402

def halves(script: str, conn: sqlite3.Connection) -> list[str]:
    """The floor script split in two: each SELECT restricted to one half of its table's rowids."""
    parts = [[], []]
    for line in script.splitlines():
        if not line.startswith("SELECT"):
            parts[0].append(line)
            parts[1].append(line)
            continue
        table = line.split(" FROM ")[1].split()[0].rstrip(";")
        alias = line.split(" FROM ")[1].split()[2] + "." if " AS " in line.split(" FROM ")[1][:60] else ""
        low, high = conn.execute(f"SELECT min(rowid), max(rowid) FROM {table}").fetchone()
        middle = (low + high) // 2 if low is not None else 0
        base = line.rstrip(";")
        joiner = " AND " if " WHERE " in base else " WHERE "
        parts[0].append(f"{base}{joiner}{alias}rowid <= {middle};")
        parts[1].append(f"{base}{joiner}{alias}rowid > {middle};")
    return ["\n".join(p) + "\n" for p in parts]


def run_once(command: list[str], stdins: list[str | None]) -> tuple[float, float, float, int]:
    """Wall seconds until every process of `command` (one per stdin) is done, their CPU seconds,
    the largest peak resident MiB among them, and the worst exit code."""
    began = time.perf_counter()
    processes = []
    for text in stdins:
        p = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             stdin=subprocess.PIPE if text is not None else subprocess.DEVNULL)
        processes.append((p, text))
    for p, text in processes:
        if text is not None:
            p.stdin.write(text)
            p.stdin.close()
    cpu, peak, code = 0.0, 0.0, 0
    for p, _ in processes:
        _, status, usage = os.wait4(p.pid, 0)
        cpu += usage.ru_utime + usage.ru_stime
        peak = max(peak, usage.ru_maxrss / 1024)
        exit_code = os.waitstatus_to_exitcode(status)
        if exit_code:
            print(f"  ! {' '.join(command[:5])} ... exited {exit_code}: {p.stderr.read().strip()[-300:]}", flush=True)
        code = max(code, exit_code)
    return time.perf_counter() - began, cpu, peak, code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-streamed", action="store_true", help="leave out the forced streamed runs")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    path = args.export.resolve()
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    full, memory_only = floor_script(path), ".output /dev/null\n" + MEMORY_SELECT + "\n"
    shell = ["sqlite3", "-readonly", str(path)]
    nsysan = [sys.executable, "-m", "nsysan", "analyze", str(path), "--format", "json", "--no-progress"]
    streamed = nsysan + ["--max-memory", "0"]
    commands = {
        "floor, one shell": (shell, [full]),
        "floor, two shells": (shell, halves(full, conn)),
        "nsysan analyze": (nsysan, [None]),
        "floor --quick, one shell": (shell, [memory_only]),
        "floor --quick, two shells": (shell, halves(memory_only, conn)),
        "nsysan analyze --quick": (nsysan + ["--quick"], [None]),
    }
    if not args.no_streamed:
        commands["nsysan analyze, streamed"] = (streamed, [None])
        commands["nsysan analyze --quick, streamed"] = (streamed + ["--quick"], [None])
    conn.close()
    subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)  # warm the page cache
    runs: dict[str, list] = {name: [] for name in commands}
    with tempfile.TemporaryDirectory() as home:
        os.environ.setdefault("XDG_CACHE_HOME", home)
        for round_ in range(args.repeat):
            for name, (command, stdins) in commands.items():
                runs[name].append(run_once(command, stdins))
                wall, cpu, peak, _ = runs[name][-1]
                print(f"  round {round_ + 1} {name:36s} {wall:7.2f} s  {cpu:7.2f} CPU s  {peak:7.0f} MiB", flush=True)
    result = {"export": path.name, "machine": machine(), "load_at_start": os.getloadavg(), "commands": {}}
    for name, done in runs.items():
        ok = [r for r in done if r[3] == 0]
        result["commands"][name] = {"ok": len(ok) == len(done), "seconds": statistics.median(r[0] for r in ok) if ok else None,
                                    "runs": [round(r[0], 2) for r in done], "cpu": [round(r[1], 2) for r in done],
                                    "peak_mib": max((r[2] for r in ok), default=None)}
    c = result["commands"]
    for name, entry in c.items():
        floor = c["floor --quick, two shells" if "--quick" in name else "floor, two shells"]["seconds"]
        if entry["seconds"] and floor:
            entry["ratio_to_two_core_floor"] = round(entry["seconds"] / floor, 2)
    print(json.dumps(c, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
