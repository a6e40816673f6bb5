"""`nsysan history`: the peak, growth and never-freed bytes of the runs a batch database holds,
and the first run at which each moved beyond the noise of the runs before it."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from ..errors import NsysanError
from ..sources.export import SQLITE_SIDE_FILES
from .common import out_console, shown, to_stdout
from .outputs import claim_outputs, one_run, write_atomic


def history(
    database: Path = typer.Argument(..., metavar="DB", help="The nsysan.db that `nsysan batch --db` appends to.",
                                    show_default=False),
    order_by: Optional[str] = typer.Option(None, "--order-by", metavar="KEY", show_default=False,
                                           help="Order the runs by this tag of `batch --tag KEY=VALUE` (default: "
                                           "the tag date when every run has one, else when each was analyzed)."),
    where: Optional[List[str]] = typer.Option(None, "--where", metavar="KEY=VALUE", show_default=False,
                                              help="Only runs with this tag (repeatable), or name=FILE: one "
                                              "workload's series."),
    format: str = typer.Option("text", "--format", "-f", metavar="[text|json]",
                               help="text (change points and runs) or json (the nsysan/history@1 document)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", metavar="FILE.html", show_default=False,
                                          help="Also write the history as a page with a trend chart per metric."),
) -> None:
    """The peak, growth per step and never-freed bytes across the runs of a batch database, and the run where each changed.

    Example: nsysan batch run.nsys-rep -o out --db history.db --tag commit=$GITHUB_SHA --tag date=$(date -I);
    nsysan history history.db
    """
    if format not in ("text", "json"):
        raise NsysanError(f"unknown --format {format!r}; use text or json")
    if output is not None:
        _check_output(output, database)
    with one_run([database, *(Path(f"{database}{tail}") for tail in SQLITE_SIDE_FILES)]):
        if output is not None:
            claim_outputs([(output, "the history page")])  # the one guard: never the database, by any link
        from ..runs.history import load_history

        found = load_history(database, order_by=order_by, where=where or ())
        if output is not None:
            from ..render.history import render_history_html

            write_atomic(output, render_history_html(found))
    with to_stdout():
        if format == "json":
            from ..render.json import dumps

            typer.echo(dumps(found.to_dict()))
            return
        from ..render.history import render_history_terminal

        render_history_terminal(found, out_console())
        if output is not None:
            out_console().print(f"Page: {shown(output)}", markup=False, soft_wrap=True)


def _check_output(output: Path, database: Path) -> None:
    """The page never replaces the database it is drawn from (also through a link)."""
    try:
        same = output.exists() and output.resolve().samefile(database.resolve())
    except OSError:
        same = False
    if same:
        raise NsysanError(f"--output {shown(output)} is the database itself; give the page another name")
    if output.exists() and output.is_dir():
        raise NsysanError(f"--output {shown(output)} is a folder; give a file name like history.html")
