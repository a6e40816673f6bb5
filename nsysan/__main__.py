"""`python -m nsysan` runs the CLI."""

from .cli import run

run()
