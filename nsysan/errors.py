"""The one exception type for anything a user can cause (bad input, missing nsys, ...)."""

from __future__ import annotations


class NsysanError(Exception):
    """Something the user can fix. `message` is the one line they will read.

    Exit codes mean the same in every command: 0 done (or every limit held),
    1 a limit broke, 2 the input could not be analyzed.
    """

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
