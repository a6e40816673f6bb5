"""nsysan against nsys-ai's memory summary on one SQLite export, taking turns (issue 31): `nsysan
analyze EXPORT --format json`, the same with --quick, and nsys-ai's `get_memory_profile_diff`
(benchmarks/nsysai_memory.py, `direct` mode), each a fresh process, median of the rounds.

    python benchmarks/nsysai_same_export.py EXPORT.sqlite OUT.json --nsysan-python V/bin/python \\
        --nsys-ai-python W/bin/python [--rounds 3]

Each tool runs from its own virtual environment (docs/performance.md says why).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def timed(command: list[str]) -> dict:
    began = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    return {"wall_s": round(time.perf_counter() - began, 3), "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
            "peak_mib": round(usage.ru_maxrss / 1024), "rc": status, "out": out}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("export", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--nsysan-python", required=True)
    parser.add_argument("--nsys-ai-python", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    commands = {
        "nsysan": [args.nsysan_python, "-m", "nsysan", "analyze", str(args.export), "--format", "json", "--no-progress"],
        "nsysan_quick": [args.nsysan_python, "-m", "nsysan", "analyze", str(args.export), "--quick", "--format", "json",
                         "--no-progress"],
        "nsys_ai": [args.nsys_ai_python, str(HERE / "nsysai_memory.py"), str(args.export), "direct"],
    }
    runs: dict[str, list] = {name: [] for name in commands}
    answers = {}
    for round_ in range(-1, args.rounds):  # round -1 warms the page cache and is not counted
        for name, command in commands.items():
            row = timed(command)
            answers[name] = row.pop("out")
            if round_ >= 0:
                runs[name].append(row)
    result = {"export": args.export.name, "bytes": args.export.stat().st_size, "load_before": os.getloadavg(),
              "runs": runs, "median_wall_s": {n: statistics.median(r["wall_s"] for r in rows) for n, rows in runs.items()},
              "median_cpu_s": {n: statistics.median(r["cpu_s"] for r in rows) for n, rows in runs.items()},
              "nsys_ai_answer": json.loads(answers["nsys_ai"] or "null")}
    document = json.loads(answers["nsysan"])
    result["nsysan_peak_bytes"] = document["peak"]["peak_bytes"]
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("median_wall_s", "median_cpu_s", "nsysan_peak_bytes")}))


if __name__ == "__main__":
    main()
