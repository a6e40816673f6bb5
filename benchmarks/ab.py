"""Time `nsysan analyze` of two checkouts (before / after a change) on the same exports, in one run.

    flock /tmp/nsysan-bench.lock python benchmarks/ab.py --before /tmp/base --after . \\
        benchmarks/data/big_1e7.sqlite --repeat 3

Each export is analyzed by both checkouts in turn (round robin over exports and checkouts, so that
a slow spell of a shared machine hits all alike); the median wall time of each, the ratio after /
before, and each export's time after the change relative to the first export's are printed (as
JSON with --json), with each one's median CPU time and peak resident memory. A checkout is a directory holding the `nsysan` package (a git worktree).
`--options=--max-memory 0` times the forced small batches (the streamed path) instead of the default command line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def run_once(checkout: Path, export: Path, options: tuple = ()) -> tuple[float, float, float]:
    """Wall time (s), CPU time of the process (user + system, s) and its peak resident memory (MiB).

    The CPU time moves less than the wall time when other processes load the machine (it is not
    the goal's measure: the analysis uses two cores where it can)."""
    env = dict(os.environ, PYTHONPATH=str(checkout.resolve()))
    began = time.perf_counter()
    # Run in the checkout: `python -m` puts the working directory first on sys.path, ahead of
    # PYTHONPATH, so from another checkout's root both sides would run that checkout's nsysan.
    process = subprocess.Popen([sys.executable, "-m", "nsysan", "analyze", str(export.resolve()), "--format", "json",
                                "--no-progress", *options], env=env, stdout=subprocess.DEVNULL, cwd=checkout.resolve())
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - began
    if status:
        raise SystemExit(f"{checkout}: nsysan analyze {export} failed ({status})")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("exports", nargs="+", type=Path)
    parser.add_argument("--before", type=Path, required=True, help="checkout without the change")
    parser.add_argument("--after", type=Path, required=True, help="checkout with the change")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--options", default="", help="more options of nsysan analyze, e.g. '--max-memory 0'")
    args = parser.parse_args()
    for export in args.exports:
        subprocess.run(["cat", str(export)], stdout=subprocess.DEVNULL, check=True)  # warm the page cache
    checkouts = (("before", args.before), ("after", args.after))
    times = {(export, name): [] for export in args.exports for name, _ in checkouts}
    cpu = {key: [] for key in times}
    peak = {key: [] for key in times}
    for _ in range(args.repeat):  # every export and checkout once, then again
        for export in args.exports:
            for name, checkout in checkouts:
                wall, used, rss = run_once(checkout, export, tuple(args.options.split()))
                times[(export, name)].append(wall)
                cpu[(export, name)].append(used)
                peak[(export, name)].append(rss)
    results = []
    first_after = statistics.median(times[(args.exports[0], "after")])
    for export in args.exports:
        before, after = (statistics.median(times[(export, name)]) for name, _ in checkouts)
        cpu_before, cpu_after = (statistics.median(cpu[(export, name)]) for name, _ in checkouts)
        rss_before, rss_after = (statistics.median(peak[(export, name)]) for name, _ in checkouts)
        row = {"export": export.name, "before_s": round(before, 2), "after_s": round(after, 2),
               "ratio": round(after / before, 3), "after_to_first_export": round(after / first_after, 3),
               "runs": {name: [round(t, 2) for t in times[(export, name)]] for name, _ in checkouts},
               "cpu_before_s": round(cpu_before, 2), "cpu_after_s": round(cpu_after, 2),
               "cpu_ratio": round(cpu_after / cpu_before, 3),
               "peak_rss_before_mib": round(rss_before), "peak_rss_after_mib": round(rss_after),
               "peak_rss_ratio": round(rss_after / rss_before, 3), "load_average": round(os.getloadavg()[0], 1),
               "options": args.options}
        print(f"{export.name:32s} before {before:7.2f} s   after {after:7.2f} s   ratio {after / before:.3f}   "
              f"after / first export {after / first_after:.3f}   runs {row['runs']}\n"
              f"{'':32s} CPU before {cpu_before:6.2f} s   after {cpu_after:6.2f} s   ratio {cpu_after / cpu_before:.3f}   "
              f"peak RSS before {rss_before:.0f} MiB   after {rss_after:.0f} MiB   ratio {rss_after / rss_before:.3f}",
              flush=True)
        results.append(row)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
