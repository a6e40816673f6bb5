"""`python -m nsysan` runs the CLI."""

from .cli import main

main()
