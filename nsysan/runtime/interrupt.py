"""Ctrl-C while the `nsysan` command starts or ends: one line, exit 130, never a traceback.

cli.main() handles an interrupt while a command runs. Before it (Python importing nsysan, typer,
rich: a third of a second) and after it, an interrupt would reach Python's own handler, which
prints a traceback; this hook says `nsysan: interrupted` instead. It is installed only when
nsysan runs as the command (`nsysan ...`, `python -m nsysan ...`), never when a program imports
the library.
"""

from __future__ import annotations

import os
import sys
from types import TracebackType
from typing import Optional

INTERRUPTED = 130  # 128 + SIGINT: what shells report after Ctrl-C


def started_as_the_command(argv0: str) -> bool:
    """Whether this process is the `nsysan` command: its script, or `python -m nsysan` (Python sets
    argv[0] to "-m" while it imports the package to find its __main__)."""
    name = os.path.basename(argv0)
    return argv0 == "-m" or name in ("nsysan", "nsysan.exe", "nsysan-script.py")


def _hook(kind: type[BaseException], value: BaseException, tb: Optional[TracebackType]) -> None:
    if issubclass(kind, KeyboardInterrupt):
        try:
            sys.stderr.write("\nnsysan: interrupted\n")
            sys.stderr.flush()
        finally:
            os._exit(INTERRUPTED)
    _previous(kind, value, tb)


_previous = sys.excepthook


def quiet_interrupts() -> None:
    """Make an uncaught KeyboardInterrupt one line on stderr and exit code 130."""
    global _previous
    if sys.excepthook is not _hook:
        _previous, sys.excepthook = sys.excepthook, _hook


if sys.argv and started_as_the_command(sys.argv[0]):
    quiet_interrupts()
