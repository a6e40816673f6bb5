"""`python -m nsysan` and the `nsysan` command: the CLI.

The command line's own module (commands, pandas, numpy) takes a second to import on a small
machine: a Ctrl-C then is `nsysan: interrupted` and exit 130, as at any later moment, not a
traceback of the import under way.
"""

import gc
import sys


def entry() -> None:
    # Imports make no garbage worth collecting: the cyclic collector's 170 passes over the
    # growing heap took 12% of the imports' CPU (issue 31). Resumed once the CLI is in.
    gc.disable()
    try:
        from .cli import run
    except KeyboardInterrupt:
        sys.stderr.write("nsysan: interrupted\n")
        raise SystemExit(130) from None
    finally:
        gc.enable()
    run()


if __name__ == "__main__":
    entry()
