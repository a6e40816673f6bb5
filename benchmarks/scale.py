"""Time and peak memory of `nsysan analyze` from 1e5 to 1e8 memory events (issue 14's scale test).

    flock /tmp/nsysan-bench.lock python benchmarks/scale.py benchmarks/data/big_1e5.sqlite ... \\
        --label after --json docs/scale.json

Runs `nsysan analyze FILE --format json` (and with `--quick`) on each export, `--repeat` times
(the median wall time; the peak resident memory of the process from wait4), and merges the rows
into the JSON file under `--label` (a checkout is chosen with `--checkout`, put first on
PYTHONPATH). `--max-memory` caps the address space of each run (setrlimit), so that an analysis
too large for the machine fails alone instead of bringing the out-of-memory killer onto other
processes (and marks the run as the process that killer takes first). `--streamed` adds
`--max-memory 0` to each command, so that every size takes the streamed path, the one whose memory
is bounded (the command line otherwise streams from 2e7 memory rows on, or when the whole frame
would not fit half of the machine's memory). benchmarks/report.py draws the rows into
docs/performance.png.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path


def events_in(export: Path) -> int:
    with sqlite3.connect(f"file:{export}?mode=ro", uri=True) as conn:
        return conn.execute("SELECT max(rowid) FROM CUDA_GPU_MEMORY_USAGE_EVENTS").fetchone()[0]


def run_once(checkout: Path, export: Path, quick: bool, max_memory: int | None, streamed: bool = False) -> dict:
    env = dict(os.environ, PYTHONPATH=str(checkout.resolve()))
    command = [sys.executable, "-m", "nsysan", "analyze", str(export), "--format", "json", "--no-progress"]
    if quick:
        command.append("--quick")
    if streamed:
        command += ["--max-memory", "0"]

    def cap() -> None:
        if max_memory:
            resource.setrlimit(resource.RLIMIT_AS, (max_memory, max_memory))
            # and, should the machine run short first, this run is the one the kernel stops
            with open("/proc/self/oom_score_adj", "w") as adj:
                adj.write("1000")

    began = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               preexec_fn=cap)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - began
    error = process.stderr.read().decode(errors="replace").strip().splitlines()[-1:] if status else []
    return {"seconds": seconds, "peak_mib": usage.ru_maxrss / 1024, "ok": status == 0,
            "error": error[0] if error else "", "user_s": usage.ru_utime, "system_s": usage.ru_stime}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("exports", nargs="+", type=Path)
    parser.add_argument("--checkout", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--label", required=True, help="name of this series in the JSON (e.g. the commit)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--no-quick", action="store_true", help="only the full analysis")
    parser.add_argument("--max-memory", type=float, help="GiB of address space per run")
    parser.add_argument("--streamed", action="store_true", help="stream at every size (--max-memory 0)")
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    cap = int(args.max_memory * 2**30) if args.max_memory else None
    results = json.loads(args.json.read_text()) if args.json.exists() else {}
    series = results.setdefault(args.label, [])
    for export in args.exports:
        subprocess.run(["cat", str(export)], stdout=subprocess.DEVNULL, check=True)  # warm the page cache
        for quick in ([False] if args.no_quick else [False, True]):
            runs = [run_once(args.checkout, export, quick, cap, args.streamed) for _ in range(args.repeat)]
            row = {"export": export.name, "events": events_in(export), "file_mib": round(export.stat().st_size / 2**20),
                   "mode": "quick" if quick else "full", "ok": all(r["ok"] for r in runs),
                   "seconds": round(statistics.median(r["seconds"] for r in runs), 2),
                   "peak_mib": round(max(r["peak_mib"] for r in runs)), "runs": runs}
            series[:] = [r for r in series if (r["export"], r["mode"]) != (row["export"], row["mode"])] + [row]
            print(f"{export.name:24s} {row['mode']:5s} {row['seconds']:8.2f} s {row['peak_mib']:7d} MiB "
                  f"{'ok' if row['ok'] else 'FAILED: ' + runs[-1]['error']}", flush=True)
            args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
