"""The reports of a batch: folders (searched recursively), globs and `@list.txt` files."""

from __future__ import annotations

import glob
from pathlib import Path
from typing import Iterable

from ..errors import NsysanError

REPORT_SUFFIXES = (".nsys-rep", ".qdrep", ".sqlite")
# In a folder, analysis documents count only under this name (a folder can hold other JSON).
DOCUMENT_SUFFIX = ".analysis.json"
_GLOB_CHARACTERS = set("*?[")


def expand_inputs(inputs: Iterable[str], exclude: Iterable[Path] = ()) -> list[Path]:
    """Each input as report paths, in the order given, each path once.

    A folder gives the reports under it (sorted), a pattern with * ? [ the files it matches,
    `@FILE` the paths listed in FILE (one a line, relative to that file's folder; blank lines
    and lines starting with # are skipped). In a folder or a pattern's matches, a report and its
    own export beside it count once (`_one_per_capture`). A file named directly is taken whatever its name, so
    that a bad one becomes a failed row instead of being left out. Folders in `exclude` (the
    batch's own output) are never searched.
    """
    skip = [p.resolve() for p in exclude]
    found: list[Path] = []
    for item in inputs:
        if item.startswith("@"):
            found.extend(_listed(Path(item[1:])))
        elif _GLOB_CHARACTERS & set(item) and not Path(item).exists():
            matches = sorted(glob.glob(item, recursive=True))
            if not matches:
                raise NsysanError(f"{item} matches no file")
            paths = [Path(match) for match in matches]
            for folder in (path for path in paths if path.is_dir()):
                found.extend(_in_folder(folder, skip))
            found.extend(_one_per_capture([path for path in paths if not path.is_dir()]))
        else:
            path = Path(item)
            if path.is_dir():
                found.extend(_in_folder(path, skip))
            else:
                found.append(path)  # missing or unreadable: a failed row, with its reason
    unique: dict[str, Path] = {}
    for path in found:
        resolved = _resolved(path)
        unique.setdefault(str(resolved) if resolved is not None else str(path), path)
    return list(unique.values())


def _resolved(path: Path) -> "Path | None":
    """The path with its links resolved, or None when it can't be (missing, a symlink loop, a
    name too long, a NUL in a listed line): such a path becomes a failed row with the reason."""
    try:
        return path.resolve(strict=True)
    except (OSError, RuntimeError, ValueError):  # RuntimeError: a symlink loop before Python 3.13
        return None


def is_report_name(path: Path) -> bool:
    name = path.name.lower()
    return name.endswith(REPORT_SUFFIXES) or name.endswith(DOCUMENT_SUFFIX)


def _in_folder(folder: Path, skip: list[Path]) -> list[Path]:
    """The reports under `folder`: regular files with a report's name, and links with one that
    lead nowhere (a loop, a missing target), which fail with the reason. Linked folders are not
    entered (a link to `..` would find the same reports again, or never end). A `<stem>.sqlite`
    that provably is the export of the `<stem>.nsys-rep` beside it stands for both: one capture,
    one row (its analysis is what analyzing the report would read)."""
    reports = []
    for path in sorted(folder.rglob("*")):
        if not is_report_name(path):
            continue
        resolved = _resolved(path)
        if resolved is not None and any(resolved.is_relative_to(s) for s in skip):
            continue
        if path.is_file() or (resolved is None and path.is_symlink()):
            reports.append(path)
    return _one_per_capture(reports)


def _one_per_capture(reports: list[Path]) -> list[Path]:
    from ..sources.export.sibling import sibling_mismatch

    names = set(reports)
    kept = []
    for path in reports:
        if path.suffix.lower() in (".nsys-rep", ".qdrep"):
            sibling = path.with_suffix(".sqlite")
            if sibling in names and sibling_mismatch(path, sibling) is None:
                continue  # read through its export, listed on its own
        kept.append(path)
    return kept


# A list names one path a line: 16 MiB is 4,000 lines of 4,096 bytes (PATH_MAX) each.
LIST_MAX_BYTES = 16 << 20


def _listed(list_file: Path) -> list[Path]:
    """The paths in an @list file. Opened without waiting (a FIFO or a terminal is refused, not
    read forever) and read up to LIST_MAX_BYTES. A line that can't be a path (one holding a NUL,
    a name longer than the system takes) is kept: it becomes a failed row saying why."""
    from ..sources.export.input_files import open_regular

    try:
        with open_regular(list_file) as handle:
            data = handle.read(LIST_MAX_BYTES + 1)
    except (OSError, ValueError) as err:
        why = getattr(err, "strerror", None) or str(err)
        raise NsysanError(f"@{list_file}: could not be read ({why}); give a file of paths, one a line") from err
    if len(data) > LIST_MAX_BYTES:
        raise NsysanError(f"@{list_file}: is over {LIST_MAX_BYTES >> 20} MiB, too long for a list of paths "
                          "(one a line); is it the right file?")
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise NsysanError(f"@{list_file}: could not be read ({err})") from err
    named = [Path(line) for line in map(str.strip, lines) if line and not line.startswith("#")]
    return [path if path.is_absolute() else list_file.parent / path for path in named]
