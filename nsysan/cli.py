"""The `nsysan` command: builds the app from commands/ and handles errors once, in main()."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
import threading
import traceback
from typing import Any, Optional

import typer
import typer.main

from .commands import analyze as analyze_command
from .commands import batch as batch_command
from .commands import check as check_command
from .commands import compare as compare_command
from .commands import history as history_command
from .commands.common import OutputClosed, say_error
from .commands.metavars import name_values
from .errors import NsysanError, one_line
from .runtime.malloc_tuning import tune_allocator

# Help is click's plain layout (rich_markup_mode=None): at 80 columns rich's boxed panels left
# 20 characters for each option's text. -h is --help.
app = typer.Typer(add_completion=True, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
                  help="GPU-memory answers from NVIDIA Nsight Systems reports.")
app.command("analyze")(analyze_command.analyze)
app.command("compare")(compare_command.compare)
app.command("check")(check_command.check)
app.command("batch")(batch_command.batch)
app.command("history")(history_command.history)

def command() -> Any:
    """The click command typer builds from `app`, with one style of metavars in its help."""
    return name_values(typer.main.get_command(app))


_state = {"debug": False}
INTERRUPTED = 130  # 128 + SIGINT: what shells report after Ctrl-C
OUTPUT_CLOSED = 141  # 128 + SIGPIPE: stdout was a pipe its reader closed (`| head`)


class _Stopped(BaseException):
    """SIGTERM or SIGHUP arrived. A BaseException, so no `except Exception` swallows it on the way
    up, while every `finally` runs: nsys is killed and no temporary file is left in the cache."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stop(signum: int, frame: object) -> None:
    raise _Stopped(signum)


def _stop_on_termination() -> dict[int, object]:
    """Make SIGTERM (`kill`, a cancelled CI job) and SIGHUP (the terminal closed) raise _Stopped
    instead of killing the process on the spot; returns the handlers replaced."""
    if threading.current_thread() is not threading.main_thread():
        return {}  # signal handlers can only be set from the main thread
    return {signum: signal.signal(signum, _stop) for signum in _TERMINATION_SIGNALS
            if signal.getsignal(signum) == signal.SIG_DFL}  # `nohup` and the like keep theirs


# Windows has SIGTERM but no SIGHUP: handle the ones this platform has.
_TERMINATION_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


def _print_version(wanted: bool) -> None:
    if wanted:
        from . import __version__

        typer.echo(f"nsysan {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show Python tracebacks (for bug reports)."),
          version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                       help="Print nsysan's version and exit.")) -> None:
    """GPU-memory answers from NVIDIA Nsight Systems reports: peak, never-freed allocations, hot sites."""
    _state["debug"] = debug or os.environ.get("NSYSAN_DEBUG") == "1"


def _silence_stdout() -> None:
    """Send what is left for stdout to /dev/null: flushing into the closed pipe at exit would
    print "Exception ignored ... BrokenPipeError" on stderr."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout has no descriptor (captured in tests): nothing to flush into
        pass


def _usage_errors() -> tuple[type[BaseException], ...]:
    """The exception classes of command-line usage errors. Recent typer vendors click (its errors
    derive from typer.TyperException); older typer raises click's own, and has imported click then.
    (Not imported here: 9 ms of every start, before the export, for errors a typer that vendors
    click never raises; issue 31.)"""
    found: list[type[BaseException]] = [typer.TyperException] if hasattr(typer, "TyperException") else []
    click = sys.modules.get("click")
    if click is not None:
        found.append(click.ClickException)
    return tuple(found)


_USAGE_ERRORS = _usage_errors()


def main(argv: Optional[list[str]] = None) -> None:
    replaced = _stop_on_termination()
    try:
        # standalone_mode=False lets errors reach the handlers below instead of click's own.
        code = command().main(args=argv, prog_name="nsysan", standalone_mode=False)
    except _USAGE_ERRORS as err:  # a usage error: wrong option, missing argument
        if hasattr(err, "show"):
            err.show()
        else:
            say_error(f"nsysan: {one_line(str(err))}")
        raise SystemExit(2) from None
    except (typer.Abort, KeyboardInterrupt):
        say_error("nsysan: interrupted")
        raise SystemExit(INTERRUPTED) from None
    except NsysanError as err:
        if _state["debug"]:
            traceback.print_exc()
        say_error(f"nsysan: {err.message}")
        raise SystemExit(err.exit_code) from None
    except OutputClosed:
        # The reader has what it wanted; what a shell reports for a process ended by SIGPIPE.
        _silence_stdout()
        raise SystemExit(OUTPUT_CLOSED) from None
    except _Stopped as stopped:
        say_error(f"nsysan: stopped by {signal.Signals(stopped.signum).name}")
        raise SystemExit(128 + stopped.signum) from None
    except SystemExit:
        raise
    except Exception as err:  # a bug in nsysan, never the user's input
        if _state["debug"] or os.environ.get("NSYSAN_DEBUG") == "1":
            traceback.print_exc()
        # str(err) may quote profile data: one printable line, never terminal escapes.
        say_error(f"nsysan: internal error ({type(err).__name__}: {one_line(str(err))[:200]}); "
                  "please report it with the output of --debug")
        raise SystemExit(3) from None
    finally:
        for signum, handler in replaced.items():
            signal.signal(signum, handler)
    if code == INTERRUPTED:  # typer turns Ctrl-C into a silent exit code 130 (typer >= 0.16)
        say_error("nsysan: interrupted")
    if isinstance(code, int) and code:
        raise SystemExit(code)


def _replace_what_the_output_cannot_encode() -> None:
    """A profile's strings (an NVTX range named in Chinese) must not end the run where stdout
    can't encode them: on Windows, output redirected to a file is in the ANSI code page (cp1252);
    PYTHONIOENCODING=ascii anywhere. There such characters are written as `\\u6b65` escapes, as is
    a file name's undecodable byte (a lone surrogate) even on UTF-8; everything else is unchanged."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


def _open_closed_standard_descriptors() -> set[int]:
    """Put /dev/null on stdin, stdout or stderr where the command was started without them
    (`>&-`, `2>&-`); return the ones that were closed.

    Otherwise the next file nsysan opens would get descriptor 1 or 2, and a message meant for
    the terminal would be written into it. Python starts such a stream as None.
    """
    closed = set()
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            closed.add(fd)
    for fd in sorted(closed):  # os.open takes the lowest free descriptor: the first closed one
        null = os.open(os.devnull, os.O_RDWR)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        if fd in closed:
            setattr(sys, name, open(fd, mode, closefd=False))
    return closed


def _write_whole() -> None:
    """With PYTHONUNBUFFERED=1 (python -u) stdout writes straight to the descriptor, and a write
    the OS takes only in part (a signal, a full pipe) is silently cut short. A buffered writer
    retries until every byte is out; line buffering keeps the output as prompt."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        raw = getattr(stream, "buffer", None)
        if isinstance(raw, io.RawIOBase) and isinstance(stream, io.TextIOWrapper):
            setattr(sys, name, io.TextIOWrapper(io.BufferedWriter(raw), encoding=stream.encoding,
                                                errors=stream.errors, line_buffering=True))


def run() -> None:
    """The `nsysan` command: main(), then leave at once.

    After an analysis the process holds gigabytes in millions of objects and arrays; tearing
    them down one by one only delays the exit (0.1 to 0.3 s at 1e7 events). Every file nsysan
    writes is closed and in place before main() returns.
    """
    closed = _open_closed_standard_descriptors()
    _write_whole()
    tune_allocator()
    _replace_what_the_output_cannot_encode()
    if 1 in closed:
        say_error("nsysan: stdout is closed (the command was started with >&-), so nothing could be printed; "
                  "run it with stdout open, or send it to a file or to /dev/null")
        os._exit(2)
    try:
        main(sys.argv[1:])
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        if isinstance(done.code, str):
            say_error(done.code)
    try:
        sys.stdout.flush()
    except BrokenPipeError:  # the reader went away (`| head`) before the last bytes
        _silence_stdout()
        code = code or OUTPUT_CLOSED
    except OSError as err:  # a full disk, /dev/full: the output is not whole
        if not code:  # else it was said already, by the write that failed first
            say_error(f"nsysan: could not write to stdout ({err.strerror or err}); the output is incomplete")
            code = 2
    with contextlib.suppress(OSError, ValueError):  # nowhere left to say anything
        sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
