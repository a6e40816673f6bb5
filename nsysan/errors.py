"""The one exception type for anything a user can cause (bad input, missing nsys, ...)."""

from __future__ import annotations

import re
import unicodedata

# Shown as escapes: control characters (Cc: ESC, BEL, CR ...), format characters (Cf: the
# bidirectional overrides that reorder what a terminal shows, "Trojan Source"), lone surrogates
# (Cs: unprintable, they would crash the output) and line/paragraph separators.
_ESCAPED_CATEGORIES = ("Cc", "Cf", "Cs", "Zl", "Zp")
_LINE_BREAKS = re.compile(r"[ \t]*[\r\n\v\f\x1c-\x1e\x85\u2028\u2029]+[ \t]*")


def printable(text: str) -> str:
    """`text` with control and format characters shown as escapes (`\\x1b`, `\\u202e`).

    Strings from a profile (NVTX ranges, process and thread names, SQLite error messages that
    quote its table names) are written by someone else: printed raw, an ESC sequence could
    retitle or clear the reader's terminal, hide text or write to its clipboard.
    """
    if text.isprintable():
        return text
    return "".join(
        (f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")
        if unicodedata.category(ch) in _ESCAPED_CATEGORIES else ch
        for ch in text
    )


def one_line(text: str) -> str:
    """`text` as one printable line: each line break (with the blanks around it) becomes one space."""
    return printable(_LINE_BREAKS.sub(" ", str(text)).strip())


class NsysanError(Exception):
    """Something the user can fix. `message` is the one line they will read.

    Exit codes mean the same in every command: 0 done (or every limit held),
    1 a limit broke, 2 the input could not be analyzed. The message is kept to one printable
    line here, whatever text (an SQLite error quoting a hostile file, nsys output) went into it.

    >>> import nsysan
    >>> try:
    ...     nsysan.analyze("fixtures/no-such-report.sqlite")
    ... except nsysan.NsysanError as err:
    ...     print(err.exit_code, err.message)
    2 fixtures/no-such-report.sqlite: no such file...
    """

    def __init__(self, message: str, exit_code: int = 2) -> None:
        message = one_line(message)
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
