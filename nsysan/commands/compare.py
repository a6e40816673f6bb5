"""`nsysan compare`: what grew, appeared or vanished between two runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

import typer

from ..base.units import check_step_range
from ..errors import NsysanError
from ..sources.export import files_read_for
from .outputs import check_output_dir, claim_outputs, one_run, write_comparison
from ..render.json import dumps
from .common import out_console, shown, to_stdout


def compare(
    base: Path = typer.Argument(..., help="The earlier run: a report, an export or an analysis.json.",
                                show_default=False),
    new: Path = typer.Argument(..., help="The later run, in any of the same forms.", show_default=False),
    format: str = typer.Option("text", "--format", "-f", help="text (the verdict and tables) or json "
                               "(the nsysan/compare@1 document)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write compare.html, compare.png and "
                                          "compare.json here."),
    top: int = typer.Option(10, "--top", min=1, help="Rows per table in the text summary."),
    nsys: Optional[Path] = typer.Option(None, "--nsys", help="nsys binary (or its folder) used to export reports."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="Where exports are cached."),
    step_range: Optional[str] = typer.Option(None, "--step-range", metavar="REGEX",
                                             help="NVTX ranges whose name matches this regular expression are the "
                                             "training steps of both runs (as in analyze)."),
) -> None:
    """Compare two runs: peak, end-of-run and never-freed bytes per process and GPU, sites and NVTX ranges.

    Example: nsysan compare base.analysis.json run.nsys-rep
    """
    if format not in ("text", "json"):
        raise NsysanError(f"unknown --format {format!r}; use text or json")
    check_step_range(step_range)
    with one_run([*files_read_for(base), *files_read_for(new)]):
        if output:
            check_output_dir(output)
            from ..render.compare_data import COMPARE_FILES

            claim_outputs((output / name, name) for name in COMPARE_FILES)  # no input behind a link there
        # here, not with the CLI: see commands/check.py
        from ..pipeline.report_or_document import load_or_analyze
        from ..runs.compare_runs import compare_analyses

        before, after = (load_or_analyze(run, nsys=nsys, cache_dir=cache_dir, keep_events=False, step_range=step_range)
                         for run in (base, new))
        comparison = compare_analyses(before, after)
        # Each run named by the file given: a committed baseline by its own name, not by the report it
        # was made of ("memory-baseline.json → new-baseline.json", not "run.sqlite → run.sqlite").
        comparison = dataclasses.replace(comparison, base=dataclasses.replace(comparison.base, name=base.name),
                                         new=dataclasses.replace(comparison.new, name=new.name))
        page = write_comparison(comparison, before, after, output) if output else None
    with to_stdout():
        if format == "json":
            typer.echo(dumps(comparison.to_dict()))
            return
        from ..render.compare_terminal import render_comparison_terminal

        render_comparison_terminal(comparison, out_console(), top=top)
        if page:
            out_console().print(f"Report: {shown(page)} (with compare.png and compare.json)", markup=False,
                                soft_wrap=True)
