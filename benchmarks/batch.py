"""Batch throughput: `nsysan batch` on the local pool and on Dask against `nsysan analyze` run on
the same reports one after another, in one run.

    flock /tmp/nsysan-bench.lock python benchmarks/batch.py            # writes docs/batch-performance.json
    python benchmarks/batch.py --small 50 --large 5 --repeat 1        # a quicker look

Two workloads, each copied (hard links where possible) into a temporary folder:

- small: `--small` copies (200) of fixtures/known_mem_v25.sqlite (300 kB, about 100 memory
  events): what a batch of many short CI captures costs per report;
- large: `--large` copies (20) of benchmarks/data/big_1000000.sqlite (1e6 memory events,
  127 MiB, from make_big_export.py): whether the analyses themselves run in parallel.

For each, three commands, taking turns `--repeat` times, median wall time:

- sequential: `nsysan analyze <every copy> --json-dir D --format json`: one process analyzing one
  report after another (the fair baseline: no process start per report);
- local pool: `nsysan batch <folder> -o D -j <cores>`;
- dask: `nsysan batch <folder> -o D -j <cores> --dask local` (a LocalCluster started and stopped
  inside the measured time).

Reported: reports per second, the speed-up of each engine over sequential (goal on the large
exports: at least 0.8 x cores) and Dask's overhead over the local pool ((dask - pool) / pool,
goal under 10%).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data"


def copies(source: Path, count: int, folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    made = []
    for i in range(count):
        target = folder / f"{source.stem}-{i:03d}{source.suffix}"
        try:
            os.link(source.resolve(), target)
        except OSError:  # another file system
            shutil.copyfile(source, target)
        made.append(target)
    return made


def timed(command: list[str], env: dict) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:4])} ... failed ({done.returncode}): {done.stderr[-500:]}")
    return seconds


def measure(name: str, reports: list[Path], folder: Path, jobs: int, repeat: int, env: dict) -> dict:
    nsysan = [sys.executable, "-m", "nsysan"]
    scratch = Path(tempfile.mkdtemp(prefix=f"nsysan-bench-{name}-"))
    commands = {
        "sequential": nsysan + ["analyze", *map(str, reports), "--json-dir", str(scratch / "seq"), "--format", "json",
                                "--no-progress"],
        "local pool": nsysan + ["batch", str(folder), "-o", str(scratch / "pool"), "-j", str(jobs), "--no-progress"],
        "dask": nsysan + ["batch", str(folder), "-o", str(scratch / "dask"), "-j", str(jobs), "--dask", "local",
                          "--no-progress"],
    }
    times: dict[str, list[float]] = {k: [] for k in commands}
    # The 1-minute load average before each command: on a shared machine it says how many other
    # threads wanted the cores while it ran (an idle 2-core machine shows about 0).
    loads: dict[str, list[float]] = {k: [] for k in commands}
    for round_ in range(repeat):
        for label, command in commands.items():
            shutil.rmtree(scratch / label.split()[0], ignore_errors=True)
            loads[label].append(round(os.getloadavg()[0], 2))
            seconds = timed(command, env)
            times[label].append(seconds)
            print(f"  {name} {label}: {seconds:.1f} s (round {round_ + 1}, load {loads[label][-1]})", flush=True)
    shutil.rmtree(scratch, ignore_errors=True)
    median = {k: statistics.median(v) for k, v in times.items()}
    return {
        "workload": name, "reports": len(reports), "jobs": jobs, "runs": times, "load_before": loads,
        "median_s": median,
        "reports_per_s": {k: len(reports) / v for k, v in median.items()},
        "speedup_pool": median["sequential"] / median["local pool"],
        "speedup_dask": median["sequential"] / median["dask"],
        "dask_overhead": (median["dask"] - median["local pool"]) / median["local pool"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=200)
    parser.add_argument("--large", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--only", choices=("small", "large"), help="measure one workload")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "batch-performance.json")
    args = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    big = DATA / "big_1000000.sqlite"
    if not big.exists():
        raise SystemExit(f"{big} is missing: python benchmarks/make_big_export.py (or link /work/bench-data)")
    work = Path(tempfile.mkdtemp(prefix="nsysan-batch-bench-"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a `kill` still removes the copies
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()
        results = {"commit": commit, "machine": {"cores": os.cpu_count(), "jobs": args.jobs,
                                                 "python": platform.python_version(),
                                                 "load_before": os.getloadavg()}, "workloads": []}
        for name, source, count in (("small", ROOT / "fixtures" / "known_mem_v25.sqlite", args.small),
                                    ("large", big, args.large)):
            if args.only and name != args.only:
                continue
            folder = work / name
            reports = copies(source, count, folder)
            results["workloads"].append(measure(name, reports, folder, args.jobs, args.repeat, env))
            args.out.write_text(json.dumps(results, indent=2) + "\n")
        results["machine"]["load_after"] = os.getloadavg()
        args.out.write_text(json.dumps(results, indent=2) + "\n")
        for w in results["workloads"]:
            print(f"{w['workload']}: {w['reports']} reports, sequential {w['median_s']['sequential']:.1f} s, "
                  f"pool {w['median_s']['local pool']:.1f} s ({w['speedup_pool']:.2f}x), dask "
                  f"{w['median_s']['dask']:.1f} s ({w['speedup_dask']:.2f}x), dask overhead "
                  f"{100 * w['dask_overhead']:+.1f}%")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
