"""`nsysan analyze`: the timeline, peak, never-freed allocations and sites of one or more reports."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer

from ..errors import NsysanError
from ..memory_budget import budget_bytes
from ..export import files_read_for
from ..model import Analysis
from .outputs import check_output_dir, claim_outputs, one_run, write_atomic, write_report
from ..render.json import render_baseline, render_json, render_json_many
from ..units import parse_duration
from .common import out_console, progress_bar, say_error, shown, to_stdout

if TYPE_CHECKING:
    from ..smi_log import SmiLog

# The pipeline and the nvidia-smi reader (pandas: most of a start's time) are imported when a command
# runs, not when the CLI is built: `nsysan --version` and `--help` answer without them.


def analyze(
    reports: List[Path] = typer.Argument(..., help="Reports to analyze: .nsys-rep, .qdrep or .sqlite.",
                                         show_default=False),
    format: str = typer.Option("text", "--format", "-f", help="text (a summary) or json (the analysis document)."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Also write the JSON document to this file."),
    json_dir: Optional[Path] = typer.Option(None, "--json-dir", help="Write <report>.analysis.json per input here."),
    baseline_out: Optional[Path] = typer.Option(None, "--baseline-out", metavar="FILE",
                                                help="Write the run as a baseline to commit: only what check and "
                                                "compare read, tens of kB (no timeline)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the report here: report.html, "
                                          "timeline.png, sites.png, analysis.json (DIR/<report name>/ per input "
                                          "when there are several)."),
    nsys: Optional[Path] = typer.Option(None, "--nsys", help="nsys binary (or its folder) used to export reports."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="Where exports are cached."),
    top: int = typer.Option(10, "--top", min=1, help="Rows per table in the text summary."),
    stacks: bool = typer.Option(False, "--stacks", help="Print the whole call stack of each top site (text summary)."),
    quick: bool = typer.Option(False, "--quick", help="Read only the memory-usage table: peaks, live at peak, "
                               "never freed, in under half the time; no threads, API names, sites, NVTX "
                               "ranges or failed calls."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar on a terminal."),
    smi: Optional[List[Path]] = typer.Option(None, "--smi", help="An nvidia-smi CSV log (--query-gpu or "
                                             "--query-compute-apps) to lay over the trace; repeat for several.",
                                             show_default=False),
    smi_columns: Optional[List[str]] = typer.Option(None, "--smi-columns", help="Columns of a --smi log "
                                                    "written without header (noheader), comma-separated, e.g. "
                                                    "timestamp,index,memory.used; once for all, or once per log.",
                                                    show_default=False),
    smi_tz: str = typer.Option("UTC", "--smi-tz", help="Time zone of the --smi logs' timestamps (nvidia-smi "
                               "writes local time): an IANA name or an offset like +02:00."),
    spike_window: str = typer.Option("10ms", "--spike-window", metavar="DURATION",
                                     help="A rise of live memory within this long is a spike (10ms, 0.5s, 200us)."),
    step_range: Optional[str] = typer.Option(None, "--step-range", metavar="REGEX",
                                             help="NVTX ranges whose name matches this regular expression are the "
                                             "training steps (default: ranges repeated 3+ times, such as 'step 3')."),
    max_memory: Optional[str] = typer.Option(None, "--max-memory", metavar="SIZE", show_default=False,
                                             help="Memory the analysis may take (8GiB, 900MB): an export whose "
                                             "events would not fit is streamed, in bounded memory and two to three "
                                             "times the time, with the same results (default: half of what nsysan "
                                             "may use here)."),
    what_if_gpu: Optional[str] = typer.Option(None, "--what-if-gpu", metavar="SIZE", show_default=False,
                                              help="Replay the run against a GPU of SIZE (80GiB): the first moment "
                                              "and NVTX range that would not fit, and how many steps its growth "
                                              "allows."),
    log: Optional[List[Path]] = typer.Option(None, "--log", metavar="FILE", show_default=False,
                                             help="The program's stderr or log: its out-of-memory errors (the "
                                             "request, the cap, what the allocator held) are joined with the "
                                             "trace; repeat for several."),
    full_paths: bool = typer.Option(False, "--full-paths", help="Show the report's path in report.html, not only "
                                    "its file name (a page attached to a ticket then tells where it was made)."),
) -> None:
    """Analyze GPU memory: peak per process and GPU, what was live then, never-freed allocations, top sites.

    Example: nsysan analyze run.nsys-rep -o report/

    With nvidia-smi logs: nsysan analyze run.nsys-rep --smi gpu.csv --smi apps.csv

    With the program's error message: nsysan analyze run.nsys-rep --log train.stderr.txt
    """
    budget = budget_bytes(max_memory)
    from ..analyses.what_if import what_if_bytes

    capacity = what_if_bytes(what_if_gpu) if what_if_gpu is not None else None
    if smi and len(reports) > 1:
        raise NsysanError("--smi takes one report; lay nvidia-smi logs over one capture at a time")
    if smi_columns and not smi:
        raise NsysanError("--smi-columns names the columns of --smi logs, and none was given")
    if log and len(reports) > 1:
        raise NsysanError("--log takes one report; join a program's log with one capture at a time")
    from ..smi_log import read_smi_logs

    smi_logs = read_smi_logs(smi, smi_columns or (), smi_tz) if smi else []  # before the long part
    # No output may replace an input, nor another output of this run.
    with one_run([*(path for report in reports for path in files_read_for(report)), *(smi or []), *(log or [])]):
        _analyze(reports, format, json_path, json_dir, output, nsys, cache_dir, top, quick, progress,
                 smi_logs, smi_tz, stacks, step_range, full_paths, spike_window, budget, baseline_out, capacity,
                 log or [])


def _analyze(reports: List[Path], format: str, json_path: Optional[Path], json_dir: Optional[Path],
             output: Optional[Path], nsys: Optional[Path], cache_dir: Optional[Path], top: int, quick: bool,
             progress: bool, smi_logs: List["SmiLog"], smi_tz: str, stacks: bool = False,
             step_range: Optional[str] = None, full_paths: bool = False,
             spike_window: str = "10ms", max_memory: Optional[int] = None,
             baseline_out: Optional[Path] = None,
             what_if_gpu: Optional[int] = None, logs: List[Path] = ()) -> None:
    from ..analyses.what_if import with_what_if
    from ..pipeline import analyze_report, check_pattern

    if format not in ("text", "json"):
        raise NsysanError(f"unknown --format {format!r}; use text or json")
    if json_path and len(reports) > 1:
        raise NsysanError("--json takes one report; with several, use --json-dir DIR")
    if baseline_out and len(reports) > 1:
        raise NsysanError("--baseline-out takes one report")
    if baseline_out and quick:
        raise NsysanError("--baseline-out needs the full analysis: --quick reads no sites, NVTX ranges or failed "
                          "calls, which compare and check read from a baseline")
    if step_range is not None:
        check_pattern(step_range, "--step-range")
    try:
        spike_window_ns = parse_duration(spike_window, "--spike-window")
    except ValueError as err:
        raise NsysanError(str(err)) from None
    if json_dir:
        _check_unique_names(reports, "--json-dir writes DIR/<report name>.analysis.json")
    planned = [(json_dir / f"{report.name}.analysis.json", f"analysis {report}") for report in reports] \
        if json_dir else []
    if json_path:
        planned.append((json_path, f"analysis {reports[0]}"))
    if baseline_out:
        planned.append((baseline_out, "--baseline-out"))
    if output:
        _check_report_dirs(output, reports)
        from ..render.html import REPORT_FILES  # matplotlib and jinja: 0.4 s, paid only for -o

        # The JSON in -o's folder and --json hold the same document: both may name one file.
        planned += [(folder / name, f"analysis {report}" if name == "analysis.json" else f"{name} {report}")
                    for folder, report in zip(_report_dirs(output, reports), reports) for name in REPORT_FILES]
    claim_outputs(planned)  # before the analysis: no output is an input, no two outputs name one file
    results: list[Analysis] = []
    failures = 0
    for report in reports:
        try:
            with progress_bar(report.name, enabled=progress) as say:
                analysis = analyze_report(report, nsys=nsys, cache_dir=cache_dir, progress=say, quick=quick,
                                          smi_logs=smi_logs, smi_tz=smi_tz,
                                          step_range=step_range, spike_window_ns=spike_window_ns,
                                          keep_events=False,  # the outputs never read the raw frames
                                          max_memory=max_memory, oom_logs=logs)
        except NsysanError as err:
            if len(reports) == 1:
                raise
            say_error(f"nsysan: {err.message}")
            failures += 1
            continue
        if what_if_gpu is not None:
            analysis = with_what_if(analysis, what_if_gpu)
        results.append(analysis)
        if json_path:
            write_atomic(json_path, render_json(analysis))
        if baseline_out:
            write_atomic(baseline_out, render_baseline(analysis))
        if json_dir:
            write_atomic(json_dir / f"{report.name}.analysis.json", render_json(analysis))
        page = write_report(analysis, _report_dirs(output, [report], several=len(reports) > 1)[0],
                            full_paths=full_paths) if output else None
        if format == "text":
            from ..render.terminal import render_terminal  # rich's tables: not needed for JSON

            with to_stdout():
                render_terminal(analysis, out_console(), top=top, stacks=stacks)
                if page:
                    out_console().print(f"Report: {shown(page)} (with timeline.png, sites.png and analysis.json)",
                                      markup=False, soft_wrap=True)  # a path never wraps
    if format == "json" and results:
        text = render_json(results[0]) if len(reports) == 1 else render_json_many(results)
        with to_stdout():
            typer.echo(text, nl=False)
            sys.stdout.flush()  # a closed pipe shows here, not at exit
    if failures:
        raise typer.Exit(2)


def _report_dirs(output: Path, reports: List[Path], several: Optional[bool] = None) -> list[Path]:
    """The folder of each report's files: -o DIR itself for one report, DIR/<report name>/ for several."""
    several = len(reports) > 1 if several is None else several
    return [output / report.name if several else output for report in reports]


def _check_unique_names(reports: List[Path], what: str) -> None:
    """Two reports of one name would write the same output file: the second would replace the first."""
    names = [r.name for r in reports]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise NsysanError(f"several reports are named {twice[0]}; {what} for each, "
                          "so give them different names or run them one at a time")


def _check_report_dirs(output: Path, reports: List[Path]) -> None:
    """Fail before the analysis, not after it, when the reports can't be written where asked."""
    if len(reports) > 1:
        _check_unique_names(reports, "-o writes DIR/<report name>/")
    check_output_dir(output)
