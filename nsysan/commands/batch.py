"""`nsysan batch`: many reports in parallel (local processes or Dask), one summary and one database."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional

import typer

from ..base.units import check_step_range
from ..errors import NsysanError, printable
from .common import err_console, out_console, to_stdout

INTERRUPTED = 130
MAX_JOBS = 1024  # analyses at once on one machine: processes, each with its own interpreter


def batch(
    inputs: List[str] = typer.Argument(..., help="Reports, exports or analysis.json files; folders (searched "
                                       "recursively), globs, or @list.txt (one path a line).", show_default=False),
    output: Path = typer.Option(..., "--output", "-o", help="Write summary.csv, summary.html, fleets.json, "
                                "analyses/*.json and nsysan.db here.", show_default=False),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1, help="Analyses at once on this machine "
                                       "(default: its cores)."),
    dask: Optional[str] = typer.Option(None, "--dask", help="Run on Dask: 'local' starts a LocalCluster of -j "
                                       "processes on this machine, tcp://host:8786 uses an existing scheduler."),
    db: Optional[Path] = typer.Option(None, "--db", help="Append to this SQLite database instead of "
                                      "DIR/nsysan.db (a history across CI runs)."),
    tag: Optional[List[str]] = typer.Option(None, "--tag", metavar="KEY=VALUE", show_default=False,
                                            help="Stored with each report in the database, repeatable: "
                                            "--tag commit=$GITHUB_SHA --tag date=2026-12-01 (`nsysan history` "
                                            "orders and filters runs by them)."),
    fail_on_error: bool = typer.Option(False, "--fail-on-error", help="Exit 1 when a report could not be "
                                       "analyzed (default: 0, the failure is a row)."),
    nsys: Optional[Path] = typer.Option(None, "--nsys", help="nsys binary (or its folder) used to export reports."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="Where exports are cached."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar on a terminal."),
    max_memory: Optional[str] = typer.Option(None, "--max-memory", metavar="SIZE", show_default=False,
                                             help="Memory each analysis may take (4GiB): a report whose events "
                                             "would not fit is streamed, slower, same results (default: on this "
                                             "machine, half of its memory shared among the -j analyses; on a Dask "
                                             "worker, half of what it may use)."),
    step_range: Optional[str] = typer.Option(None, "--step-range", metavar="REGEX",
                                             help="NVTX ranges whose name matches this regular expression are the "
                                             "training steps of every report (as in analyze)."),
    log: Optional[List[Path]] = typer.Option(None, "--log", metavar="FILE", show_default=False,
                                             help="A program's stderr or log, joined with the report it is named "
                                             "after (run1.stderr.txt with run1.nsys-rep): its out-of-memory "
                                             "errors; repeat for several."),
) -> None:
    """Analyze many reports in parallel and gather them: summary.csv, summary.html (with the fleet view), nsysan.db.

    Example: nsysan batch reports/ -o batch-out/ -j 2
    """
    from ..batch.engines import DASK_MISSING, default_jobs
    from ..batch.report_paths import expand_inputs
    from ..sources.export import files_read_for
    from .outputs import check_output_dir, claim_outputs, one_run, write_all_or_none
    from ..runtime.memory_budget import budget_bytes
    from ..batch.database import parse_tags

    budget = budget_bytes(max_memory)
    if jobs is not None and jobs > MAX_JOBS:  # `--dask local` would start that many worker processes
        raise NsysanError(f"--jobs {str(jobs)[:20]}{'...' if len(str(jobs)) > 20 else ''} is more than the "
                          f"{MAX_JOBS} analyses at once this machine can run; give at most its number of cores")
    parse_tags(tag or ())  # a bad tag stops the batch before any analysis
    check_step_range(step_range)
    if dask:
        try:
            import distributed  # noqa: F401
        except ImportError:
            raise NsysanError(DASK_MISSING) from None
        if dask != "local" and "://" not in dask:
            raise NsysanError(f"--dask {dask!r}: give 'local' or a scheduler address like tcp://host:8786")
    check_output_dir(output)
    paths = expand_inputs(inputs, exclude=[output])
    if not paths:
        raise NsysanError("no reports found in the inputs (.nsys-rep, .qdrep, .sqlite or *.analysis.json)")
    from ..batch.orchestrate import run_batch

    logs = _logs_by_report(paths, log or [])
    with one_run([*(path for report in paths for path in files_read_for(report)), *(log or [])]):
        # Before the analyses: no output is an input (also through a link in DIR), none named twice.
        claim_outputs([(output / "summary.csv", "summary.csv"), (output / "summary.html", "summary.html"),
                       (output / "fleets.json", "fleets.json"),
                       (db if db is not None else output / "nsysan.db", "the database")])
        with _counter(len(paths), enabled=progress) as count:
            result = run_batch(paths, output, jobs=jobs or default_jobs(), dask=dask, db_path=db, tags=tag or (),
                               nsys=str(nsys) if nsys else None, cache_dir=str(cache_dir) if cache_dir else None,
                               progress=count, max_memory=budget, step_range=step_range,
                               logs=logs)
        from ..render.batch_summary import render_csv, render_fleets_json, render_summary_html

        write_all_or_none({output / "summary.csv": render_csv(result.rows),
                           output / "summary.html": render_summary_html(result),
                           output / "fleets.json": render_fleets_json(result.fleets)})
    with to_stdout():
        _print_summary(result)
    if result.interrupted:
        raise typer.Exit(INTERRUPTED)
    if result.analyzed == 0:
        raise typer.Exit(2)
    if result.failed and fail_on_error:
        raise typer.Exit(1)


def _logs_by_report(paths: List[Path], logs: List[Path]) -> dict[str, list[str]]:
    """Each --log joined with the report it is named after: the log's name starts with the
    report's (its suffixes off) and a '.', '_' or '-' (run1.stderr.txt, run1_rank0.log for
    run1.nsys-rep); the longest such name when several fit. A log that fits none is an error."""
    from ..sources.oom_log import read_oom_logs

    read_oom_logs(logs)  # a log that can't be read fails now, not once per report
    stems = {str(p): _stem(p.name) for p in paths}
    joined: dict[str, list[str]] = {}
    for log in logs:
        fits = [(len(stem), path) for path, stem in stems.items()
                if log.name.startswith(stem) and log.name[len(stem):len(stem) + 1] in (".", "_", "-")]
        if not fits:
            raise NsysanError(f"--log {log.name} is named after none of the reports; name it after its report "
                              "(run1.stderr.txt for run1.nsys-rep)")
        joined.setdefault(max(fits)[1], []).append(str(log))
    return joined


def _stem(name: str) -> str:
    suffixes = (".analysis.json", ".nsys-rep", ".qdrep", ".sqlite", ".json")
    return next((name[:-len(suffix)] for suffix in suffixes if name.lower().endswith(suffix)), name)


def _print_summary(result: Any) -> None:
    def say(line: str) -> None:
        out_console().print(printable(line), markup=False, soft_wrap=True)

    say(f"analyzed {result.analyzed} of {result.reports} reports"
        + (f", {result.failed} failed" if result.failed else "")
        + (", interrupted: the summary holds what was done" if result.interrupted else "")
        + f" in {result.seconds:.1f} s on {result.engine}")
    for row in result.rows:
        if row.status == "failed":
            say(f"  failed  {row.report}: {row.error}")
    peaks = [r for r in result.rows if r.peak_bytes is not None]
    if peaks:
        from ..base.units import fmt_bytes

        top = max(peaks, key=lambda r: r.peak_bytes)
        say(f"  highest peak: {fmt_bytes(top.peak_bytes)}, {top.process} on GPU {top.gpu} of {top.report}")
    for fleet in result.fleets:
        say(f"  fleet   {fleet.line}")
        if fleet.departure is not None:
            say(f"  first   {fleet.departure.line}")
        for outlier in fleet.outliers:
            say(f"  outlier {outlier.line}")
    say(f"Results: {result.out_dir}/summary.html, summary.csv, fleets.json, analyses/, database {result.db_path}")


@contextlib.contextmanager
def _counter(total: int, enabled: bool) -> Iterator[Callable[[dict], None]]:
    """A progress bar counting reports on stderr when it is a terminal; silent otherwise."""
    if not (enabled and sys.stderr.isatty()):
        yield lambda result: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("analyzing"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), console=err_console(), transient=True) as bar:
        task = bar.add_task("", total=total)

        def count(result: dict) -> None:
            name = printable(("failed: " if not result["ok"] else "") + Path(result["path"]).name)
            bar.update(task, advance=1, description=name[:60])

        yield count
