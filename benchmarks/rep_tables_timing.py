"""A report to the answer, end to end, on a machine with nsys 2023.4 or later (issue 31): `nsysan
analyze REPORT --format json` with a cold export cache, exporting every table (nsys's `--tables`
hidden from nsysan by a wrapper, as an nsys without it) against nsysan's own choice (the tables it
reads, the kernel table only when a process's steps must come from its kernels), and `nsys stats
--report cuda_api_sum` on a fresh copy of the same report (it exports it too), taking turns, median
of the rounds; then the bare `nsys export` of each table list, and whether the two documents are
the same byte for byte (for every report given).

    python benchmarks/rep_tables_timing.py NSYS OUT.json REPORT [MORE_REPORTS...] [--rounds N]
        [--bare-rounds N] [--keep-export DIR] [--no-stats]

Run from the repository root with nsysan importable (PYTHONPATH). The first report is timed; the
others are only checked for identical documents. --keep-export writes the every-table export of the
first report, xz-compressed, into DIR (for tools that can't run there, docs/performance.md).
--bare-rounds 0 leaves the bare exports out; --no-stats leaves `nsys stats` out (2 s a round: more
rounds of the two ways in a device call's minutes). Each analysis starts with a cold export cache but,
after the warm-up round, with what nsysan remembered of that nsys (its version and export options,
`nsys-probes/` in the cache, sources/export/nsys_memo.py), as a user's next report with their usual
nsys does; --cold-nsys-memo starts every analysis without it (nsys asked again each time). The JSON records whether Python could cache its
bytecode (PYTHONDONTWRITEBYTECODE, PYTHONPYCACHEPREFIX): a Python that can't compiles every
module it imports on every start, numpy, pandas and nsysan included (docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nsysan.sources.export import export_arguments
try:
    from nsysan.sources.export.nsys_memo import MEMO_SUBDIR
except ImportError:  # a tree from before the memo: nothing to keep
    MEMO_SUBDIR = "nsys-probes"
from nsysan.sources.sqlite_file import EXPORTED_TABLES, FIRST_EXPORT_TABLES


def timed(command: list[str], env: dict[str, str] | None = None, stdout=subprocess.DEVNULL) -> dict:
    """Wall and CPU seconds (user + system of every process it started) of one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    done = subprocess.run(command, env=env, stdout=stdout, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "rc": done.returncode,
            **({"stderr": done.stderr[-400:]} if done.returncode else {})}


def every_table_nsys(nsys: Path, directory: Path) -> Path:
    """An nsys that hides `--tables` from `export --help`: nsysan then exports every table, as it
    does with an nsys before 2023.4. Everything else goes to the real one."""
    script = directory / "nsys"
    script.write_text("#!/bin/sh\n"
                      f'if [ "$1" = "export" ] && [ "$2" = "--help" ]; then "{nsys}" export --help | grep -v -- --tables; '
                      "exit 0; fi\n"
                      f'exec "{nsys}" "$@"\n')
    script.chmod(0o755)
    return script


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("nsys", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("reports", type=Path, nargs="+")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--bare-rounds", type=int, default=3)
    parser.add_argument("--keep-export", type=Path)
    parser.add_argument("--cold-nsys-memo", action="store_true")
    parser.add_argument("--no-stats", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rep-tables-"))
    (work / "bin").mkdir()
    every = every_table_nsys(args.nsys.absolute(), work / "bin")
    env = {**os.environ, "NSYSAN_ANALYSIS_CACHE": "0"}
    runs = 0

    def analyze(report: Path, nsys: Path, cache: Path, document: Path) -> dict:
        with open(document, "w") as out:
            return timed([sys.executable, "-m", "nsysan", "analyze", str(report), "--format", "json", "--nsys", str(nsys)],
                         env={**env, "NSYSAN_CACHE_DIR": str(cache)}, stdout=out)

    def with_memo(way: str, cache: Path) -> bool:
        """Put into `cache` the memo that `way`'s nsys left in an earlier round's cache; whether there was one."""
        kept = work / f"memo-{way}"
        if args.cold_nsys_memo or not kept.is_dir():
            return False
        shutil.copytree(kept, cache / MEMO_SUBDIR)
        return True

    def keep_memo(way: str, cache: Path) -> None:
        if (cache / MEMO_SUBDIR).is_dir() and not (work / f"memo-{way}").exists():
            shutil.copytree(cache / MEMO_SUBDIR, work / f"memo-{way}")

    def fresh(name: str) -> Path:
        nonlocal runs
        runs += 1
        path = work / f"{name}{runs}"
        path.mkdir()
        return path

    result: dict = {"nsys": subprocess.run([str(args.nsys), "--version"], capture_output=True, text=True).stdout.strip(),
                    "cpus": os.cpu_count(), "python": platform.python_version(), "rounds": args.rounds,
                    "nsys_memo": "cold every time" if args.cold_nsys_memo else "warm after the warm-up round",
                    "bytecode": {"dont_write": bool(sys.flags.dont_write_bytecode),
                                 "pycache_prefix": sys.pycache_prefix},
                    "first_export_tables": list(FIRST_EXPORT_TABLES), "exported_tables": list(EXPORTED_TABLES),
                    "reports": {}}
    for index, source in enumerate(args.reports):
        report = work / "in" / source.name
        report.parent.mkdir(exist_ok=True)
        shutil.copyfile(source, report)
        rounds = args.rounds if index == 0 else 1
        rows: dict[str, list] = {"every_table": [], "nsysan_choice": [], "nsysan_cached": [], "nsys_stats": []}
        documents = {}
        for round_ in range(-1 if index == 0 else 0, rounds):  # round -1: warm-up, not counted
            # the two ways take turns going first (ABBA): the one after an every-table export
            # found the machine still busy with it (nsys's writes), which a fixed order charged
            # to nsysan's choice alone
            ways = (("every_table", every), ("nsysan_choice", args.nsys))
            for way, nsys in (ways if round_ % 2 else ways[::-1]):
                cache = fresh("cache")
                memo_before = with_memo(way, cache)
                documents[way] = fresh("doc") / "analysis.json"
                row = analyze(report, nsys, cache, documents[way])
                row["nsys_memo_before"] = memo_before
                keep_memo(way, cache)
                records = list(cache.glob("*.tables.json"))
                row["tables_exported"] = json.loads(records[0].read_text())["tables"] if records else "no record"
                if round_ >= 0:
                    rows[way].append(row)
                if way == "nsysan_choice" and index == 0:
                    again = analyze(report, nsys, cache, fresh("doc") / "analysis.json")
                    if round_ >= 0:
                        rows["nsysan_cached"].append(again)
            if index == 0 and not args.no_stats:
                alone = fresh("stats") / report.name
                shutil.copyfile(report, alone)
                row = timed([str(args.nsys), "stats", "--report", "cuda_api_sum", "--format", "csv", str(alone)])
                if round_ >= 0:
                    rows["nsys_stats"].append(row)
        ran = all(t["rc"] == 0 for timings in rows.values() for t in timings)
        summary = {"all_ran": ran,
                   "identical_documents": ran and documents["every_table"].read_bytes() == documents["nsysan_choice"].read_bytes(),
                   "document_bytes": documents["nsysan_choice"].stat().st_size,
                   "kernel_table_exported": "CUPTI_ACTIVITY_KIND_KERNEL" in (rows["nsysan_choice"][-1]["tables_exported"]
                                                                             or EXPORTED_TABLES)}
        for way, timings in rows.items():
            if timings:
                summary[f"{way}_median_wall_s"] = statistics.median(t["wall_s"] for t in timings)
                summary[f"{way}_median_cpu_s"] = statistics.median(t["cpu_s"] for t in timings)
        if index == 0:
            # round by round (the two ways of one round ran back to back): how robust a 2x is
            ratios = [round(e["wall_s"] / c["wall_s"], 2) for e, c in zip(rows["every_table"], rows["nsysan_choice"])]
            summary["every_table_over_choice_by_round"] = ratios
            summary["every_table_over_choice_round_median"] = statistics.median(ratios)
            summary["rounds_at_2x_or_more"] = sum(ratio >= 2 for ratio in ratios)
            choice = summary["nsysan_choice_median_wall_s"]
            summary["every_table_over_choice"] = round(summary["every_table_median_wall_s"] / choice, 2)
        if rows["nsys_stats"]:
            summary["choice_over_nsys_stats"] = round(choice / summary["nsys_stats_median_wall_s"], 2)
            summary["every_table_over_nsys_stats"] = round(summary["every_table_median_wall_s"]
                                                           / summary["nsys_stats_median_wall_s"], 2)
        result["reports"][source.name] = {"size_bytes": source.stat().st_size, "summary": summary, "runs": rows}
        print(source.name, json.dumps(summary), flush=True)

    # The bare exports of the first report, taking turns: every table, nsysan's first list, its whole list.
    report = work / "in" / args.reports[0].name
    lists = {"every_table": None, "first_export_tables": FIRST_EXPORT_TABLES, "exported_tables": EXPORTED_TABLES}
    exports: dict[str, list] = {name: [] for name in lists}
    whole = None
    for _ in range(args.bare_rounds):
        for name, tables in lists.items():
            target = fresh("export") / "x.sqlite"
            row = timed([str(args.nsys), "export", "--type", "sqlite", "--force-overwrite", "true",  # as nsysan runs it
                         *export_arguments(args.nsys, tables), "--output", str(target), str(report)])
            row["bytes"] = target.stat().st_size if target.exists() else 0
            whole = whole or (target if tables is None else None)
            exports[name].append(row)
    if args.bare_rounds:
        result["bare_exports"] = {name: {"median_wall_s": statistics.median(r["wall_s"] for r in rows), "runs": rows}
                                  for name, rows in exports.items()}
        print("bare exports", {name: v["median_wall_s"] for name, v in result["bare_exports"].items()}, flush=True)

    if args.keep_export:
        args.keep_export.mkdir(parents=True, exist_ok=True)
        with open(whole, "rb") as src, lzma.open(args.keep_export / f"{args.reports[0].stem}.sqlite.xz", "wb",
                                                 preset=6) as dst:
            shutil.copyfileobj(src, dst)
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
