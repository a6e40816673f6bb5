"""What the commands share: the consoles and the progress bar."""

from __future__ import annotations

import contextlib
import os
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn


class OutputClosed(Exception):
    """The reader of stdout went away (`nsysan analyze ... | head`). Not an OSError on purpose:
    typer turns a broken pipe into exit code 1, which in nsysan means "a limit broke"; the CLI
    exits with 141, as a shell reports a process ended by SIGPIPE."""


class _StdoutConsole(Console):
    def on_broken_pipe(self) -> None:
        # rich's own handling exits with 1, which in nsysan means "a limit broke"
        self.quiet = True
        raise OutputClosed()


out_console = _StdoutConsole(highlight=False, soft_wrap=False)
if not out_console.is_terminal and "COLUMNS" not in os.environ:
    out_console.width = 120  # logs and files: wide enough for the tables, not the 80 of a pipe
err_console = Console(stderr=True, highlight=False, soft_wrap=True)  # one error, one line


@contextlib.contextmanager
def progress_bar(name: str, enabled: bool = True) -> Iterator[Callable[[str, float], None]]:
    """A transient progress bar on stderr when it is a terminal; a silent callback otherwise."""
    if not (enabled and err_console.is_terminal):
        yield lambda stage, fraction: None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
               TimeElapsedColumn())
    with Progress(*columns, console=err_console, transient=True) as bar:
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
