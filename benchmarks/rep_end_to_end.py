"""From a .nsys-rep to the answer (issue 31): `nsysan analyze REPORT` against `nsys stats --report
cuda_api_sum` (`cudaapisum` in 2022.4) on the same reports, with the nsys found here, in one run.

    python benchmarks/rep_end_to_end.py --repeat 3 --json docs/rep_end_to_end.json

Per report (each copied alone into a temporary folder, so no export beside it is reused), taking
turns `--repeat` times, each command's wall time and CPU time (its process and children, wait4):

- nsys export: `nsys export --type sqlite` of the report as nsysan runs it (the floor of every
  tool that reads the SQLite export);
- nsysan, cold: `nsysan analyze REPORT --format json` with an empty cache (it exports, then
  analyzes);
- nsysan, export cached: the same with the export already in the cache (a second analysis);
- nsys stats: `nsys stats --report <cuda api summary> --format csv --output - --force-export true`
  (it exports the report itself, then runs its SQL report);
- with `--nsys-ai-python` (an interpreter with nsys-ai installed, see benchmarks/nsysai_memory.py):
  `nsys export` then nsys-ai's memory profile of that export (it reads no .nsys-rep itself). A
  report it refuses (nsys-ai needs a kernel table) is recorded with its error, not timed.

Medians and the ratios of nsysan to nsys stats are printed (and written with --json), with the
load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORTS = [ROOT / "fixtures" / "known_mem_v22.nsys-rep",
           # the largest corpus reports nsys 2022.4 can export (read in place, copied to a temp dir)
           ROOT.parent / "shared" / "corpus" / "cqhcolorado__test-case-cori-gpu-omp-06212021" / "report1.qdrep",
           ROOT.parent / "shared" / "corpus" / "zasdfgbnm-dumpster__tensoriterator" / "report2.qdrep"]


def run(command: list[str], env: dict) -> tuple[float, float] | None:
    """(wall s, CPU s of the process and its children), None when the command failed."""
    began = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    if status:
        return None
    return time.perf_counter() - began, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--nsys", default=shutil.which("nsys"))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--nsys-ai-python", help="python of a venv with nsys-ai installed")
    args = parser.parse_args()
    if not args.nsys:
        raise SystemExit("no nsys found: pass --nsys")
    version = subprocess.run([args.nsys, "--version"], capture_output=True, text=True).stdout.strip()
    summary = "cudaapisum" if " 2022." in version or " 2021." in version else "cuda_api_sum"
    env = dict(os.environ, PYTHONPATH=str(ROOT), NSYSAN_ANALYSIS_CACHE="0")
    env.pop("NSYSAN_CACHE_DIR", None)
    work = Path(tempfile.mkdtemp(prefix="nsysan-rep-e2e-"))
    result = {"nsys": version, "summary_report": summary, "repeat": args.repeat, "load_before": os.getloadavg(),
              "started": time.strftime("%Y-%m-%d %H:%M:%S"), "reports": []}
    try:
        for source in [r for r in REPORTS if r.exists()]:
            folder = work / source.stem
            folder.mkdir()
            report = Path(shutil.copy2(source, folder / source.name))
            warm_cache = work / f"{source.stem}-cache"
            nsysan = [sys.executable, "-m", "nsysan", "analyze", str(report), "--format", "json", "--no-progress"]
            subprocess.run(nsysan, env=dict(env, NSYSAN_CACHE_DIR=str(warm_cache)), stdout=subprocess.DEVNULL,
                           check=True)
            commands = {
                "nsys export": ([args.nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "--output",
                                 str(work / "floor.sqlite"), str(report)], env),
                "nsysan analyze, cold": (nsysan, None),
                "nsysan analyze, export cached": (nsysan, dict(env, NSYSAN_CACHE_DIR=str(warm_cache))),
                f"nsys stats --report {summary}": ([args.nsys, "stats", "--report", summary, "--format", "csv",
                                                    "--output", "-", "--force-export", "true", str(report)], env),
            }
            if args.nsys_ai_python:
                theirs = work / "nsys-ai.sqlite"
                commands["nsys export + nsys-ai memory profile"] = (["sh", "-c", " ".join(shlex.quote(part) for part in [
                    args.nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "--output", str(theirs),
                    str(report)]) + " && " + " ".join(shlex.quote(part) for part in [
                    args.nsys_ai_python, str(ROOT / "benchmarks" / "nsysai_memory.py"), str(theirs), "direct"])], env)
            times: dict[str, list] = {name: [] for name in commands}
            for _ in range(args.repeat):
                for name, (command, command_env) in commands.items():
                    cold = work / "cold-cache"
                    shutil.rmtree(cold, ignore_errors=True)
                    report.with_suffix(".sqlite").unlink(missing_ok=True)  # nsys stats writes it beside
                    times[name].append(run(command, command_env or dict(env, NSYSAN_CACHE_DIR=str(cold))))
            report.with_suffix(".sqlite").unlink(missing_ok=True)
            row = {"report": source.name, "bytes": source.stat().st_size, "tools": {}}
            for name, runs in times.items():
                if None in runs:
                    row["tools"][name] = {"failed": True}
                    continue
                row["tools"][name] = {"wall_s": round(statistics.median(w for w, _ in runs), 3),
                                      "cpu_s": round(statistics.median(c for _, c in runs), 3),
                                      "runs_wall_s": [round(w, 3) for w, _ in runs]}
            stats = row["tools"][f"nsys stats --report {summary}"]
            for name, tool in row["tools"].items():
                if tool.get("failed"):
                    continue
                tool["wall_vs_nsys_stats"] = round(tool["wall_s"] / stats["wall_s"], 3)
                tool["cpu_vs_nsys_stats"] = round(tool["cpu_s"] / stats["cpu_s"], 3)
            result["reports"].append(row)
            print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["load_after"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
