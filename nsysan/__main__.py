"""`python -m nsysan` and the `nsysan` command: the CLI.

The command line's own module (commands, pandas, numpy) takes a second to import on a small
machine: a Ctrl-C then is `nsysan: interrupted` and exit 130, as at any later moment, not a
traceback of the import under way.
"""

import sys


def entry() -> None:
    try:
        from .cli import run
    except KeyboardInterrupt:
        sys.stderr.write("nsysan: interrupted\n")
        raise SystemExit(130) from None
    run()


if __name__ == "__main__":
    entry()
