"""What the commands share: consoles, the progress bar, atomic writes."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from ..errors import NsysanError

out_console = Console(highlight=False, soft_wrap=False)
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


def write_atomic(path: Path, text: str) -> None:
    """Write a file so that a failed run never leaves a half-written one that looks complete."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as err:
        raise NsysanError(f"could not write {path}: {err.strerror or err}") from err


def stdout_is_terminal() -> bool:
    return sys.stdout.isatty()
