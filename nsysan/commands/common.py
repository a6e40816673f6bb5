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

from ..errors import NsysanError, one_line, printable

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

    # No markup, no :emoji: codes, no highlighting: every string is printed as it is.
    console = StdoutConsole(highlight=False, soft_wrap=False, markup=False, emoji=False)
    if not console.is_terminal:
        if "COLUMNS" not in os.environ:
            console.width = 120  # logs and files: wide enough for the tables, not the 80 of a pipe
        console.file = _WithoutTrailingSpaces()
    console.width = min(max(console.width, MIN_WIDTH), MAX_WIDTH)  # COLUMNS=1000000000 or 3
    return console


# Widths the summary is drawn at, whatever COLUMNS says: rich draws every table cell padded to
# the width, so a width of a billion is gigabytes of spaces.
MIN_WIDTH, MAX_WIDTH = 40, 1000


class _WithoutTrailingSpaces:
    """stdout for a reader that is not a terminal (a file, a pipe, a CI log): each line without
    the spaces rich pads tables to their width with, which diffs and `grep 'x$'` trip over."""

    encoding = "utf-8"

    def __init__(self) -> None:
        self._partial = ""

    def write(self, text: str) -> int:
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        if lines:
            sys.stdout.write("\n".join(line.rstrip(" ") for line in lines) + "\n")
        return len(text)

    def flush(self) -> None:
        if self._partial:
            sys.stdout.write(self._partial)
            self._partial = ""
        sys.stdout.flush()

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return sys.stdout.fileno()


@functools.cache
def err_console() -> "Console":
    from rich.console import Console

    # one error, one line; no markup, no :emoji: codes: a file named run[reverse]:fire:.sqlite stays so
    return Console(stderr=True, highlight=False, soft_wrap=True, markup=False, emoji=False)


def say_error(line: str) -> None:
    """One printable line on stderr, printed as it is (never read as markup or emoji codes).
    A stderr that can't be written (`2>/dev/full`) leaves nowhere to say it: the exit code tells."""
    try:
        err_console().print(one_line(line), markup=False, highlight=False, emoji=False)
    except (OSError, ValueError):
        pass


def shown(path: object) -> str:
    """A path as the terminal shows it: control characters and undecodable bytes as escapes."""
    return printable(str(path))


DESCRIPTION_CHARS = 80  # of a file name in the progress bar


@contextlib.contextmanager
def progress_bar(name: str, enabled: bool = True) -> Iterator[Callable[[str, float], None]]:
    """A transient progress bar on stderr when it is a terminal; a silent callback otherwise."""
    if not (enabled and _isatty(sys.stderr) and err_console().is_terminal):
        yield lambda stage, fraction: None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}", markup=False), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
               TimeElapsedColumn())
    name = shown(name)[:DESCRIPTION_CHARS]
    with Progress(*columns, console=err_console(), transient=True) as bar:
        task = bar.add_task(name, total=1.0)

        def say(stage: str, fraction: float) -> None:
            bar.update(task, completed=min(max(fraction, 0.0), 1.0), description=f"{name}: {shown(stage)}")

        yield say


@contextlib.contextmanager
def to_stdout() -> Iterator[None]:
    """Around a command's writes to stdout: a closed pipe becomes OutputClosed, any other failed
    write (a full disk, /dev/full, a closed descriptor) one NsysanError: never exit 0 with half
    an output, never a traceback. The output is flushed here, so that a failure shows here."""
    try:
        yield
        sys.stdout.flush()
    except BrokenPipeError:
        raise OutputClosed() from None
    except OSError as err:
        raise NsysanError(f"could not write to stdout ({err.strerror or err}); the output is incomplete") from None


def _isatty(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError):  # replaced by an object without it, or closed
        return False
