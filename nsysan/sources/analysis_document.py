"""An analysis JSON document (`nsysan analyze --format json`, schema nsysan/analysis@1) read
back into an `Analysis`: the one reader of the documents that compare, check, batch and the
analysis cache take."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Union

from ..errors import NsysanError
from ..model import Analysis

# An analysis document of 5,000 processes is 20 MB; this is far beyond any real one, and short of
# what json would need gigabytes of memory to read.
MAX_DOCUMENT_BYTES = 512 << 20


def load_analysis(path: Union[str, Path]) -> Analysis:
    """Read an analysis JSON document (schema nsysan/analysis@1) back into an `Analysis`.

    Documents written by older nsysan versions load (fields added since read as empty); a
    malformed one raises NsysanError naming the file and the field. The raw frames (`events`,
    `calls`, `nvtx_ranges`) are not in the JSON and are None.

    >>> import nsysan
    >>> analysis = nsysan.load_analysis("tests/golden/known_mem_v25.analysis.json")
    >>> analysis.peak.peak_bytes, len(analysis.frame("never_freed")), analysis.events is None
    (952107008, 6, True)
    >>> nsysan.load_analysis("pyproject.toml")
    Traceback (most recent call last):
    nsysan.errors.NsysanError: pyproject.toml could not be read as an analysis JSON (Expecting value: ...)
    """
    from .export import read_regular

    name = as_path(path, "path").name
    text = read_regular(Path(path), name, MAX_DOCUMENT_BYTES)  # never a FIFO or /dev/zero
    try:
        data = json.loads(text.decode("utf-8"), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise NsysanError(f"{name} could not be read as an analysis JSON ({err})") from err
    except RecursionError:  # json's decoder recurses once per nesting level: '[[[[...'
        raise NsysanError(f"{name} could not be read as an analysis JSON (nested too deeply)") from None
    try:
        return Analysis.from_dict(data)
    except NsysanError as err:
        raise NsysanError(f"{name}: {err.message}", err.exit_code) from None


def _refuse_constant(name: str) -> float:
    """NaN and ±Infinity are not JSON: Python reads them, but a number that is one would be
    written back into every document and database built from this one, which strict readers refuse."""
    raise json.JSONDecodeError(f"{name} is not a JSON number", name, 0)


def as_path(value: object, what: str) -> Path:
    """A path argument of the API as a Path; NsysanError for anything else (None, a number), as
    the command line can only give paths."""
    if isinstance(value, (str, Path)) or (hasattr(value, "__fspath__") and not isinstance(value, bytes)):
        return Path(value)  # type: ignore[arg-type]
    also = " or an Analysis" if what == "run" else ""
    raise NsysanError(f"{what} {value!r:.60}: give a path (a str or a pathlib.Path){also}")
