"""What the commands share: the consoles and the progress bar.

rich is imported when a console is first needed (22 ms of every start): a JSON analysis whose
stderr is not a terminal never needs one.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from typing import TYPE_CHECKING, Callable, Iterator

if TYPE_CHECKING:
    from rich.console import Console


class OutputClosed(Exception):
    """The reader of stdout went away (`nsysan analyze ... | head`). Not an OSError on purpose:
    typer turns a broken pipe into exit code 1, which in nsysan means "a limit broke"; the CLI
    exits with 141, as a shell reports a process ended by SIGPIPE."""


@functools.cache
def out_console() -> "Console":
    """The console of the text summary, on stdout."""
    from rich.console import Console

    class StdoutConsole(Console):
        def on_broken_pipe(self) -> None:
            # rich's own handling exits with 1, which in nsysan means "a limit broke"
            self.quiet = True
            raise OutputClosed()

    console = StdoutConsole(highlight=False, soft_wrap=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = 120  # logs and files: wide enough for the tables, not the 80 of a pipe
    return console


@functools.cache
def err_console() -> "Console":
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)  # one error, one line


def say_error(line: str) -> None:
    """One line on stderr, printed as it is (profile strings in it are never read as markup)."""
    err_console().print(line, markup=False, highlight=False)


@contextlib.contextmanager
def progress_bar(name: str, enabled: bool = True) -> Iterator[Callable[[str, float], None]]:
    """A transient progress bar on stderr when it is a terminal; a silent callback otherwise."""
    if not (enabled and _isatty(sys.stderr) and err_console().is_terminal):
        yield lambda stage, fraction: None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
               TimeElapsedColumn())
    with Progress(*columns, console=err_console(), transient=True) as bar:
        task = bar.add_task(name, total=1.0)

        def say(stage: str, fraction: float) -> None:
            bar.update(task, completed=min(max(fraction, 0.0), 1.0), description=f"{name}: {stage}")

        yield say


@contextlib.contextmanager
def to_stdout() -> Iterator[None]:
    """Around a command's writes to stdout: a closed pipe becomes OutputClosed."""
    try:
        yield
    except BrokenPipeError:
        raise OutputClosed() from None


def _isatty(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError):  # replaced by an object without it, or closed
        return False
