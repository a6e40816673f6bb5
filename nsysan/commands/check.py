"""`nsysan check`: a memory gate for CI, with exit codes 0 (limits hold), 1 (one broke), 2 (bad input)."""

from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer

from ..base.units import check_step_range
from ..errors import NsysanError
from ..sources.export import files_read_for
from .outputs import append_text, claim_outputs, one_run, write_all_or_none, write_atomic
from .common import out_console, say_error, to_stdout

if TYPE_CHECKING:
    from ..model import Verdict


def check(
    report: Path = typer.Argument(..., help="The run to check: a report, an export or an analysis.json.",
                                  show_default=False),
    baseline: Optional[Path] = typer.Option(None, "--baseline", "-b", help="The run to compare with (a report, "
                                            "an export or a committed analysis.json)."),
    max_peak: Optional[str] = typer.Option(None, "--max-peak", help="Highest allowed peak, e.g. 8GiB."),
    max_peak_increase: Optional[str] = typer.Option(None, "--max-peak-increase", help="Highest allowed peak "
                                                    "increase over the baseline: 5% or 512MiB."),
    max_never_freed: Optional[str] = typer.Option(None, "--max-never-freed", help="Most device bytes allowed "
                                                  "to stay allocated at the end, e.g. 0."),
    max_growth_per_step: Optional[str] = typer.Option(None, "--max-growth-per-step", help="Most growth of live "
                                                      "bytes per training step, e.g. 16MiB."),
    no_failed_allocations: Optional[bool] = typer.Option(
        None, "--no-failed-allocations/--allow-failed-allocations", show_default=False,
        help="Fail when an allocation call failed or the allocator ran out of memory without one "
        "(--allow-failed-allocations switches off the config's setting)."),
    no_warnings: Optional[str] = typer.Option(None, "--no-warnings", help="Fail on these diagnostic codes "
                                              "(comma-separated), or on any warning: all."),
    allow_unmeasured: Optional[bool] = typer.Option(None, "--allow-unmeasured", show_default=False,
                                                    help="A limit that cannot be measured (no sizes, no steps, "
                                                    "no baseline match) is a note, not exit code 2."),
    per: Optional[str] = typer.Option(None, "--per", help="Where limits apply: process (each process on each "
                                      "GPU, the default), gpu (all processes of a GPU together) or all."),
    config: Optional[Path] = typer.Option(None, "--config", help="Read limits from this nsysan.toml or "
                                          "pyproject.toml (default: the nearest one from here up)."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the verdict as JSON here."),
    junit: Optional[Path] = typer.Option(None, "--junit", help="Write a JUnit XML file here (one test case "
                                         "per limit and place)."),
    markdown: Optional[Path] = typer.Option(None, "--markdown", help="Write a Markdown summary here."),
    baseline_out: Optional[Path] = typer.Option(None, "--baseline-out", metavar="FILE",
                                                help="Also write the checked run as a baseline (what check and "
                                                "compare read, tens of kB): the refresh to review and commit."),
    github_summary: bool = typer.Option(False, "--github-summary", help="Append the Markdown summary to "
                                        "$GITHUB_STEP_SUMMARY when it is set."),
    nsys: Optional[Path] = typer.Option(None, "--nsys", help="nsys binary (or its folder) used to export reports."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="Where exports are cached."),
    step_range: Optional[str] = typer.Option(None, "--step-range", metavar="REGEX",
                                             help="NVTX ranges whose name matches this regular expression are the "
                                             "training steps, in the run and its baseline (as in analyze)."),
    log: Optional[List[Path]] = typer.Option(None, "--log", metavar="FILE", show_default=False,
                                             help="The run's stderr or log: its out-of-memory errors are joined "
                                             "with the trace (a run that died of one shows in the analysis' "
                                             "oom.fatal); repeat for several."),
) -> None:
    """Check a run against memory limits; exit 0 if every limit holds, 1 if one broke, 2 if one could not be
    measured or the input is bad (the --junit, --json and --markdown files say why in every case).

    A limit set in the config is switched off on the command line with the value none:
    --max-peak-increase none.

    Example: nsysan check run.nsys-rep --baseline base.analysis.json --max-peak-increase 10%
    """
    summary_file = os.environ.get("GITHUB_STEP_SUMMARY") if github_summary else None
    summary = Path(summary_file) if summary_file else None
    # No output (the verdicts, the new baseline) may replace the run, its baseline or the config
    # (through any link), and no two outputs may name one file: said before anything is analyzed.
    with one_run([*files_read_for(report), *(files_read_for(baseline) if baseline else []),
                  *([config] if config is not None else []), *(log or [])]):
        claim_outputs([(path, what) for path, what in ((json_path, "--json"), (junit, "--junit"),
                                                        (markdown, "--markdown"), (baseline_out, "--baseline-out"),
                                                        (summary, "$GITHUB_STEP_SUMMARY"))
                       if path])
        try:
            # The gate's modules are imported here, not with the CLI: every command builds the app, and
            # `nsysan analyze` waits for its imports before its export can start (issue 31).
            from ..pipeline.report_or_document import load_or_analyze
            from ..runs.gate import evaluate_limits
            from ..runs.limits import Limits, load_config, read_named_config

            defaults = read_named_config(config, "--config") if config is not None else load_config(Path.cwd())[1]
            limits = Limits.parse(per=per, max_peak=max_peak, max_peak_increase=max_peak_increase,
                                  max_never_freed=max_never_freed, max_growth_per_step=max_growth_per_step,
                                  no_failed_allocations=no_failed_allocations, no_warnings=no_warnings,
                                  allow_unmeasured=allow_unmeasured, defaults=defaults)
            if limits.max_peak_increase is not None and baseline is None:
                raise NsysanError("--max-peak-increase needs a baseline: add --baseline BASE (a report or its "
                                  "analysis.json)")
            check_step_range(step_range)
            load = functools.partial(load_or_analyze, nsys=nsys, cache_dir=cache_dir, keep_events=False,
                                     step_range=step_range)
            analysis = load(report, oom_logs=log or [])
            verdict = evaluate_limits(analysis, load(baseline) if baseline else None, limits,
                                      (report.name, baseline.name if baseline else None))
        except NsysanError as err:
            from ..model import Verdict

            # The CI page shows the files, not the log: they say why the check could not run.
            with contextlib.suppress(NsysanError):  # the error that stopped the check is the one to tell
                _write(Verdict.of_error(report.name, baseline.name if baseline else None, err.message), json_path,
                       junit, markdown, summary)
            raise
        _write(verdict, json_path, junit, markdown, summary)
        if baseline_out:
            from ..render.json import render_baseline

            write_atomic(baseline_out, render_baseline(analysis))
    from ..render.check_verdict import render_verdict_terminal

    with to_stdout():
        render_verdict_terminal(verdict, out_console())
    if verdict.status == "not_measured":
        count = len(verdict.unmeasured)
        say_error(f"nsysan: {count} limit check{'s' if count > 1 else ''} could not be measured (the lines "
                  "'not measured' say why); --allow-unmeasured lets the others decide")
    if verdict.exit_code:
        raise typer.Exit(verdict.exit_code)


def _write(verdict: Verdict, json_path: Optional[Path], junit: Optional[Path], markdown: Optional[Path],
           summary: Optional[Path]) -> None:
    """The verdict's files, all or none, and the Markdown appended to the GitHub step summary."""
    from ..render.check_verdict import render_junit, render_markdown, render_verdict_json

    files = {path: render(verdict) for path, render in ((json_path, render_verdict_json), (junit, render_junit),
                                                         (markdown, render_markdown)) if path}
    if files:
        write_all_or_none(files)
    if summary:  # a regular file only, never an input: commands/outputs.py
        append_text(summary, render_markdown(verdict), "$GITHUB_STEP_SUMMARY")
