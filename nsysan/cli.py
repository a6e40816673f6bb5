"""The `nsysan` command: builds the app from commands/ and handles errors once, in main()."""

from __future__ import annotations

import os
import sys
import traceback
from typing import Optional

import click
import typer
from rich.markup import escape

from .commands import analyze as analyze_command
from .commands.common import err_console
from .errors import NsysanError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="GPU-memory answers from NVIDIA Nsight Systems reports.")
app.command("analyze")(analyze_command.analyze)

_state = {"debug": False}


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show Python tracebacks (for bug reports).")) -> None:
    """GPU-memory answers from NVIDIA Nsight Systems reports: peak, never-freed allocations, hot sites."""
    _state["debug"] = debug or os.environ.get("NSYSAN_DEBUG") == "1"


def main(argv: Optional[list[str]] = None) -> None:
    try:
        # standalone_mode=False lets errors reach the handlers below instead of click's own.
        code = app(args=argv, prog_name="nsysan", standalone_mode=False)
    except click.ClickException as err:  # a usage error: wrong option, missing argument
        err.show()
        raise SystemExit(2) from None
    except click.exceptions.Abort:
        err_console.print("nsysan: interrupted", highlight=False)
        raise SystemExit(130) from None
    except NsysanError as err:
        if _state["debug"]:
            traceback.print_exc()
        err_console.print(f"nsysan: {escape(err.message)}", highlight=False)
        raise SystemExit(err.exit_code) from None
    except KeyboardInterrupt:
        err_console.print("nsysan: interrupted", highlight=False)
        raise SystemExit(130) from None
    except SystemExit:
        raise
    except Exception as err:  # a bug in nsysan, never the user's input
        if _state["debug"] or os.environ.get("NSYSAN_DEBUG") == "1":
            traceback.print_exc()
        err_console.print(f"nsysan: internal error ({escape(type(err).__name__)}: {escape(str(err)[:200])}); "
                          "please report it with the output of --debug", highlight=False)
        raise SystemExit(3) from None
    if isinstance(code, int) and code:
        raise SystemExit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
