"""`nsysan analyze`: the timeline, peak, never-freed allocations and sites of one or more reports."""

from __future__ import annotations

import gc
import importlib
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, List, Optional

import typer

from ..errors import NsysanError
from ..runtime.memory_budget import budget_bytes
from ..sources.export import REPORT_SUFFIXES, analysis_export, files_read_for
from .outputs import check_output_dir, claim_outputs, one_run, write_atomic, write_report
from ..render.json import dumps, render_baseline, render_json
from ..base.units import check_step_range, parse_duration
from .common import out_console, progress_bar, say_error, shown, to_stdout

if TYPE_CHECKING:
    from ..model import Analysis
    from ..sources.smi_log import SmiLog

Progress = Callable[[str, float], None]

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
    capacity = None
    if what_if_gpu is not None:
        from ..analyses.what_if import what_if_bytes

        capacity = what_if_bytes(what_if_gpu)
    if smi and len(reports) > 1:
        raise NsysanError("--smi takes one report; lay nvidia-smi logs over one capture at a time")
    if smi_columns and not smi:
        raise NsysanError("--smi-columns names the columns of --smi logs, and none was given")
    if log and len(reports) > 1:
        raise NsysanError("--log takes one report; join a program's log with one capture at a time")
    smi_logs = []
    if smi:
        from ..sources.smi_log import read_smi_logs

        smi_logs = read_smi_logs(smi, smi_columns or (), smi_tz)  # before the long part
    how = HowToAnalyze(nsys=nsys, cache_dir=cache_dir, quick=quick, smi_logs=smi_logs, smi_tz=smi_tz,
                       step_range=step_range, spike_window=spike_window, max_memory=budget,
                       what_if_gpu=capacity, logs=log or [])
    outputs = Outputs(format=format, json_path=json_path, json_dir=json_dir, baseline_out=baseline_out,
                      output=output, top=top, stacks=stacks, full_paths=full_paths, progress=progress)
    # No output may replace an input, nor another output of this run.
    with one_run([*(path for report in reports for path in files_read_for(report)), *(smi or []), *(log or [])]):
        _analyze(reports, how, outputs)


@dataclass(frozen=True)
class HowToAnalyze:
    """How each report is analyzed: the options of pipeline.analyze_report, and --what-if-gpu."""

    nsys: Optional[Path]
    cache_dir: Optional[Path]
    quick: bool
    smi_logs: List["SmiLog"]
    smi_tz: str
    step_range: Optional[str]
    spike_window: str  # as given: read (and refused) before any output is claimed
    max_memory: Optional[int]
    what_if_gpu: Optional[int]  # bytes
    logs: List[Path]

    def check(self) -> int:
        """The spike window in ns; NsysanError for a --step-range or --spike-window that can't be used."""
        check_step_range(self.step_range)
        try:
            return parse_duration(self.spike_window, "--spike-window")
        except ValueError as err:
            raise NsysanError(str(err)) from None

    def analyze(self, report: Path, spike_window_ns: int, say: "Progress",
                renderers: tuple[str, ...] = ()) -> Analysis:
        """The report's `Analysis`; `renderers`: the output's modules, imported beside an export too."""
        exported = None
        if report.suffix.lower() in REPORT_SUFFIXES and not self.logs:
            # nsys exports while the analyses (pandas, pyarrow: 0.5-0.7 s of a start) are imported
            # beside it: analyze_report's checks before its export are the command's, done already,
            # but for --log's files (read first there, so a bad one fails before any export).
            # The imports start with nsys (the export's first progress): started before, they held
            # the GIL that the report's hash, the cache's lock and nsys's start each waited for, up
            # to 5 ms at a time (issue 31). An export found in the cache starts none: the analysis
            # imports them at once.
            exported = analysis_export(report, nsys=self.nsys, cache_dir=self.cache_dir,
                                       progress=_importing_on_progress(say, "nsysan.pipeline.stages",
                                                                       "nsysan.analyses.what_if", *renderers))
        _import_quietly("nsysan.pipeline.stages", "nsysan.analyses.what_if")  # waits for the thread's, if any
        from ..analyses.what_if import with_what_if
        from ..pipeline.stages import analyze_report

        analysis = analyze_report(report, nsys=self.nsys, cache_dir=self.cache_dir, progress=say, quick=self.quick,
                                  smi_logs=self.smi_logs, smi_tz=self.smi_tz, step_range=self.step_range,
                                  spike_window_ns=spike_window_ns,
                                  keep_events=False,  # the outputs never read the raw frames
                                  max_memory=self.max_memory, oom_logs=self.logs, exported=exported)
        return with_what_if(analysis, self.what_if_gpu) if self.what_if_gpu is not None else analysis


def _importing_on_progress(say: "Progress", *modules: str) -> "Progress":
    """`say`, which at its first call imports `modules` on a daemon thread (_import_in_background)."""
    started = []

    def progress(stage: str, fraction: float) -> None:
        if not started:
            started.append(True)
            _import_in_background(*modules)
        say(stage, fraction)

    return progress


_BACKGROUND: list[threading.Thread] = []  # the imports' thread, once started


def _import_in_background(*modules: str) -> None:
    """Import `modules` on a daemon thread. The main thread waits for it before importing them
    itself (_import_quietly) and, should an import have failed, fails again there, where errors
    are handled: nothing is printed from this thread."""
    def run() -> None:
        try:
            _import_quietly(*modules)
        except BaseException:  # noqa: BLE001 (see above)
            pass

    thread = threading.Thread(target=run, name="nsysan-imports", daemon=True)
    _BACKGROUND.append(thread)
    thread.start()


def _import_quietly(*modules: str) -> None:
    """Import `modules` with the cyclic garbage collector paused, then keep what is there out of
    its later passes (gc.freeze): imports make no garbage worth collecting, and the collector's
    passes over the growing heap took 12% of the analyses' imports' CPU (issue 31). For the
    command line only: a library leaves its host's collector alone. Once per process: a later
    report's analysis finds them imported (or being imported, by the thread: its import waits),
    and what an earlier analysis left is not frozen.

    The main thread first waits for the imports' thread: a module that thread is still importing
    is in sys.modules half-made, and two threads importing the same modules in different orders
    can each wait for a module lock the other holds, which Python breaks by handing one of them
    the half-made module ("cannot import name ... from partially initialized module", seen once
    on a corpus report)."""
    if threading.current_thread() is threading.main_thread():
        for thread in _BACKGROUND:
            thread.join()
    if all(module in sys.modules for module in modules):
        return
    gc.disable()
    try:
        for module in modules:
            importlib.import_module(module)
    finally:
        gc.freeze()
        gc.enable()


@dataclass(frozen=True)
class Outputs:
    """What is written for each report, and where: the text summary or JSON on stdout, --json,
    --json-dir, --baseline-out and -o's report folder."""

    format: str
    json_path: Optional[Path]
    json_dir: Optional[Path]
    baseline_out: Optional[Path]
    output: Optional[Path]
    top: int
    stacks: bool
    full_paths: bool
    progress: bool

    def check(self, reports: List[Path], quick: bool) -> None:
        if self.format not in ("text", "json"):
            raise NsysanError(f"unknown --format {self.format!r}; use text or json")
        if self.json_path and len(reports) > 1:
            raise NsysanError("--json takes one report; with several, use --json-dir DIR")
        if self.baseline_out and len(reports) > 1:
            raise NsysanError("--baseline-out takes one report")
        if self.baseline_out and quick:
            raise NsysanError("--baseline-out needs the full analysis: --quick reads no sites, NVTX ranges or "
                              "failed calls, which compare and check read from a baseline")

    def planned(self, reports: List[Path]) -> list[tuple[Path, str]]:
        """Every file this run will write, with what it holds (for claim_outputs)."""
        if self.json_dir:
            _check_unique_names(reports, "--json-dir writes DIR/<report name>.analysis.json")
        planned = [(self.json_dir / f"{report.name}.analysis.json", f"analysis {report}") for report in reports] \
            if self.json_dir else []
        if self.json_path:
            planned.append((self.json_path, f"analysis {reports[0]}"))
        if self.baseline_out:
            planned.append((self.baseline_out, "--baseline-out"))
        if self.output:
            # Fail before the analysis, not after it, when the reports can't be written where asked.
            if len(reports) > 1:
                _check_unique_names(reports, "-o writes DIR/<report name>/")
            check_output_dir(self.output)
            from ..render.html import REPORT_FILES  # matplotlib and jinja: 0.4 s, paid only for -o

            # The JSON in -o's folder and --json hold the same document: both may name one file.
            planned += [(self.folder(report, len(reports) > 1) / name,
                         f"analysis {report}" if name == "analysis.json" else f"{name} {report}")
                        for report in reports for name in REPORT_FILES]
        return planned

    def folder(self, report: Path, several: bool) -> Path:
        """The folder of a report's files: -o DIR itself for one report, DIR/<report name>/ for several."""
        assert self.output is not None
        return self.output / report.name if several else self.output

    def renderers(self) -> tuple[str, ...]:
        """The modules that write the summary, when it is the format: rich's tables (35 ms of a
        start on 2 cores) are then imported while nsys exports, not after the analysis (issue 31)."""
        return ("nsysan.render.terminal",) if self.format == "text" else ()

    def write(self, analysis: Analysis, report: Path, several: bool) -> None:
        """The files of one report, and its text summary when that is the format."""
        if self.json_path:
            write_atomic(self.json_path, render_json(analysis))
        if self.baseline_out:
            write_atomic(self.baseline_out, render_baseline(analysis))
        if self.json_dir:
            write_atomic(self.json_dir / f"{report.name}.analysis.json", render_json(analysis))
        page = write_report(analysis, self.folder(report, several), full_paths=self.full_paths) if self.output else None
        if self.format == "text":
            from ..render.terminal import render_terminal  # rich's tables: not needed for JSON

            with to_stdout():
                render_terminal(analysis, out_console(), top=self.top, stacks=self.stacks)
                if page:
                    out_console().print(f"Report: {shown(page)} (with timeline.png, sites.png and analysis.json)",
                                        markup=False, soft_wrap=True)  # a path never wraps


def _analyze(reports: List[Path], how: HowToAnalyze, outputs: Outputs) -> None:
    outputs.check(reports, how.quick)
    spike_window_ns = how.check()
    claim_outputs(outputs.planned(reports))  # before the analysis: no output is an input, no two outputs name one file
    results: list[Analysis] = []
    failures = 0
    for report in reports:
        try:
            with progress_bar(report.name, enabled=outputs.progress) as say:
                analysis = how.analyze(report, spike_window_ns, say, outputs.renderers())
        except NsysanError as err:
            if len(reports) == 1:
                raise
            say_error(f"nsysan: {err.message}")
            failures += 1
            continue
        results.append(analysis)
        outputs.write(analysis, report, several=len(reports) > 1)
    if outputs.format == "json" and results:
        # several analyses: one JSON array, a document per input
        text = render_json(results[0]) if len(reports) == 1 else dumps([a.to_dict() for a in results]) + "\n"
        with to_stdout():
            typer.echo(text, nl=False)
    if failures:
        raise typer.Exit(2)


def _check_unique_names(reports: List[Path], what: str) -> None:
    """Two reports of one name would write the same output file: the second would replace the first."""
    names = [r.name for r in reports]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise NsysanError(f"several reports are named {twice[0]}; {what} for each, "
                          "so give them different names or run them one at a time")

