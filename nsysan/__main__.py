"""`python -m nsysan` and the `nsysan` command: the CLI.

The command line's own module (commands, pandas, numpy) takes a second to import on a small
machine: a Ctrl-C then is `nsysan: interrupted` and exit 130, as at any later moment, not a
traceback of the import under way.
"""

import gc
import os
import sys


def entry() -> None:
    # Imports make no garbage worth collecting: the cyclic collector's 170 passes over the
    # growing heap took 12% of the imports' CPU (issue 31). Resumed once the CLI is in.
    gc.disable()
    try:
        from .cli import run
    except KeyboardInterrupt:
        sys.stderr.write("nsysan: interrupted\n")
        sys.stderr.flush()
        # Not SystemExit(130): an interrupt that lands in code Python compiles from a string (namedtuple's
        # eval, while typer imports platform) is marked unhandled although it is caught here, and Python
        # then ends by SIGINT itself, whatever the exit code. Nothing is left to clean up this early.
        os._exit(130)
    finally:
        gc.enable()
    run()


if __name__ == "__main__":
    entry()
