"""Time nsysan against the floor and the other tools on the same exports, in one run.

    python benchmarks/run.py                       # 1e5, 1e6, 1e7 memory events, writes docs/performance.*
    python benchmarks/run.py --sizes 1e5,1e6 --repeat 3

For each size, on the export written by benchmarks/make_big_export.py (generated when missing):

- floor: the sqlite3 command-line shell running the same SELECTs nsysan runs (memory events, the
  memory-API rows of the API table, the NVTX push/pop ranges), output to /dev/null: reading the
  needed columns and nothing else;
- nsysan: `nsysan analyze FILE --format json` (everything: export probe, events, analyses, JSON);
- nsysan --quick: the memory-usage table alone (peaks, live at peak, never freed), against its own
  floor, the sqlite3 shell reading that table's columns;
- nsys stats: Nsight Systems' CUDA API summary (`cudaapisum` in 2022.4, `cuda_api_sum` later), the
  closest built-in report (call counts and times, no sizes);
- nsys-ai: its memory analysis (`get_memory_profile_diff`, peak VRAM and alloc/free counts), when
  `--nsys-ai-python` names an interpreter that has nsys-ai installed (a separate virtual env).

Both Python tools run from their own virtual environment, installed with pip (`--nsysan-python`
for nsysan, `pip install .` into an empty venv): an interpreter with many packages and .pth
hooks, or an editable checkout without byte-compiled modules, starts up to 0.1 s slower.

Every command runs `--repeat` times on a warm page cache, the tools taking turns; the median wall time and the peak
resident memory of the process (from wait4) are reported, with ratios to the floor. Then the
cached-export path: a .nsys-rep analyzed twice with a fresh cache (first run exports with nsys,
the second reuses the export). Results go to docs/performance.json, docs/performance.md and
docs/performance.png.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from make_big_export import make_big_export  # noqa: E402

from nsysan.base import apis  # noqa: E402

DATA = ROOT / "benchmarks" / "data"
DOCS = ROOT / "docs"
NSYS_AI_SCRIPT = ROOT / "benchmarks" / "nsysai_memory.py"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1e5,1e6,1e7", help="memory events per export, comma-separated")
    parser.add_argument("--repeat", type=int, default=5, help="runs per command (median reported)")
    parser.add_argument("--repeat-largest", type=int, default=3, help="runs per command at the largest size")
    parser.add_argument("--nsys", default=shutil.which("nsys"), help="nsys for `nsys stats` and the cache test")
    parser.add_argument("--nsys-ai-python", default=None, help="python of a venv with nsys-ai installed")
    parser.add_argument("--nsysan-python", default=sys.executable,
                        help="python of a venv with nsysan installed by pip (default: this one)")
    parser.add_argument("--out", type=Path, default=DOCS / "performance.json")
    args = parser.parse_args()
    sizes = [int(float(s)) for s in args.sizes.split(",")]

    results = {"machine": machine(), "sizes": [], "cache": []}
    for n in sizes:
        path = DATA / f"big_{n}.sqlite"
        if not path.exists():
            print(f"generating {path.name} ...", flush=True)
            make_big_export(path, n)
        repeat = args.repeat_largest if n == max(sizes) else args.repeat
        results["sizes"].append(measure_size(path, n, repeat, args))
        args.out.write_text(json.dumps(results, indent=2) + "\n")  # keep what is done so far
    if args.nsys:
        results["cache"] = measure_cache(args.nsys, args.repeat, args.nsysan_python)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


def machine() -> dict:
    nsys = shutil.which("nsys")
    version = subprocess.run([nsys, "--version"], capture_output=True, text=True).stdout.strip() if nsys else None
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "sqlite": sqlite3.sqlite_version, "nsys": version,
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)}


def run_once(command: list[str], stdin_text: str | None = None) -> tuple[float, float, int]:
    """Wall seconds, peak resident MiB of the process (and its children) and the exit code."""
    began = time.perf_counter()
    with open(os.devnull, "w") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.PIPE,
                                   stdin=subprocess.PIPE if stdin_text is not None else subprocess.DEVNULL,
                                   text=True)
        if stdin_text is not None:
            process.stdin.write(stdin_text)
            process.stdin.close()
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        err = process.stderr.read()
    elapsed = time.perf_counter() - began
    if process.returncode != 0:
        print(f"  ! {' '.join(command[:4])} ... exited {process.returncode}: {err.strip()[-300:]}", flush=True)
    return elapsed, usage.ru_maxrss / 1024, process.returncode


def summary(runs: list[tuple[float, float, int]]) -> dict:
    ok = [r for r in runs if r[2] == 0]
    if not ok:
        return {"ok": False}
    return {"ok": True, "seconds": statistics.median(r[0] for r in ok), "runs": [round(r[0], 3) for r in ok],
            "peak_mib": max(r[1] for r in ok)}


MEMORY_SELECT = ("SELECT start, globalPid, deviceId, address, bytes, memKind, memoryOperationType, correlationId, "
                 "localMemoryPoolAddress IS NOT NULL FROM CUDA_GPU_MEMORY_USAGE_EVENTS;")


def memory_floor_script() -> str:
    """The SELECT `nsysan analyze --quick` runs (the memory table alone), output discarded."""
    return ".output /dev/null\n" + MEMORY_SELECT + "\n"


def floor_script(path: Path) -> str:
    """The SELECTs nsysan runs, for the sqlite3 shell (output discarded)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    ids = [str(i) for i, v in conn.execute(
        "SELECT id, value FROM StringIds WHERE value LIKE 'cu%' AND length(value) < 64")
        if apis.base_name(v) in apis.FAMILIES]
    conn.close()
    return "\n".join([
        ".output /dev/null",
        MEMORY_SELECT,
        "SELECT start, end, globalTid, correlationId, nameId, returnValue, 0, NULL FROM CUPTI_ACTIVITY_KIND_RUNTIME "
        f"WHERE nameId IN ({','.join(ids)});",
        "SELECT n.start, n.end, n.globalTid, substr(coalesce(n.text, s.value, ''), 1, 200) FROM NVTX_EVENTS AS n "
        "LEFT JOIN StringIds AS s ON s.id = n.textId WHERE n.eventType IN (59, 70);",
    ]) + "\n"


def measure_size(path: Path, n: int, repeat: int, args: argparse.Namespace) -> dict:
    print(f"== {n} memory events ({path.stat().st_size / 2**20:.0f} MiB), {repeat} runs each", flush=True)
    subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)  # warm the page cache
    row = {"events": n, "file_mib": round(path.stat().st_size / 2**20, 1), "tools": {}}
    tools = {
        "floor (sqlite3 shell)": (["sqlite3", "-readonly", str(path)], floor_script(path)),
        "nsysan analyze --format json": ([args.nsysan_python, "-m", "nsysan", "analyze", str(path), "--format",
                                          "json", "--no-progress"], None),
        "floor, memory table only (sqlite3 shell)": (["sqlite3", "-readonly", str(path)], memory_floor_script()),
        "nsysan analyze --quick --format json": ([args.nsysan_python, "-m", "nsysan", "analyze", str(path),
                                                  "--quick", "--format", "json", "--no-progress"], None),
    }
    if args.nsys:
        report = "cudaapisum" if "2022" in (subprocess.run([args.nsys, "--version"], capture_output=True,
                                                            text=True).stdout) else "cuda_api_sum"
        tools[f"nsys stats --report {report}"] = (
            [args.nsys, "stats", "--report", report, "--format", "csv", "--output", "-", str(path)], None)
    if args.nsys_ai_python:
        tools["nsys-ai memory profile (direct SQLite)"] = (
            [args.nsys_ai_python, str(NSYS_AI_SCRIPT), str(path), "direct"], None)
    # Round robin (each tool once, then again): a slow spell of the machine hits every tool alike.
    runs: dict[str, list] = {name: [] for name in tools}
    for _ in range(repeat):
        for name, (command, stdin_text) in tools.items():
            runs[name].append(run_once(command, stdin_text))
    for name in tools:
        result = summary(runs[name])
        row["tools"][name] = result
        if result["ok"]:
            print(f"  {name:42s} {result['seconds']:8.2f} s  {result['peak_mib']:8.0f} MiB  runs {result['runs']}",
                  flush=True)
    floor = row["tools"]["floor (sqlite3 shell)"]
    for result in row["tools"].values():
        if result.get("ok") and floor.get("ok"):
            result["ratio_to_floor"] = round(result["seconds"] / floor["seconds"], 2)
    return row


CACHE_REPORTS = [ROOT / "fixtures" / "known_mem_v22.nsys-rep",
                 # the largest corpus reports nsys 2022.4 can export (read in place, copied to a temp dir)
                 ROOT.parent / "shared" / "corpus" / "cqhcolorado__test-case-cori-gpu-omp-06212021" / "report1.qdrep",
                 ROOT.parent / "shared" / "corpus" / "zasdfgbnm-dumpster__tensoriterator" / "report2.qdrep"]


def measure_cache(nsys: str, repeat: int, python: str) -> list[dict]:
    """First and second analysis of a report with a fresh cache (export, then reuse).

    Each report is copied alone into a temporary folder, so that no sibling .sqlite is reused.
    """
    results = []
    for source in CACHE_REPORTS:
        if not source.exists():
            continue
        first, second = [], []
        for _ in range(repeat):
            with tempfile.TemporaryDirectory() as work:
                report = Path(work) / source.name
                shutil.copyfile(source, report)
                command = [python, "-m", "nsysan", "analyze", str(report), "--format", "json",
                           "--cache-dir", str(Path(work) / "cache"), "--nsys", nsys]
                first.append(run_once(command)[0])
                second.append(run_once(command)[0])
        result = {"report": source.name, "report_kib": round(source.stat().st_size / 1024),
                  "first_seconds": statistics.median(first), "second_seconds": statistics.median(second)}
        print(f"== cache: {source.name} first {result['first_seconds']:.2f} s, "
              f"second {result['second_seconds']:.2f} s", flush=True)
        results.append(result)
    return results


if __name__ == "__main__":
    main()
