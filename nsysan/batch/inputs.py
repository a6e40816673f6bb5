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
    and lines starting with # are skipped). A file named directly is taken whatever its name, so
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
            for match in matches:
                path = Path(match)
                found.extend(_in_folder(path, skip) if path.is_dir() else [path])
        else:
            path = Path(item)
            if path.is_dir():
                found.extend(_in_folder(path, skip))
            else:
                found.append(path)  # missing or unreadable: a failed row, with its reason
    unique: dict[str, Path] = {}
    for path in found:
        unique.setdefault(str(path.resolve()) if path.exists() else str(path), path)
    return list(unique.values())


def is_report_name(path: Path) -> bool:
    name = path.name.lower()
    return name.endswith(REPORT_SUFFIXES) or name.endswith(DOCUMENT_SUFFIX)


def _in_folder(folder: Path, skip: list[Path]) -> list[Path]:
    reports = []
    for path in sorted(folder.rglob("*")):
        if any(path.resolve().is_relative_to(s) for s in skip):
            continue
        if path.is_file() and is_report_name(path):
            reports.append(path)
    return reports


def _listed(list_file: Path) -> list[Path]:
    try:
        lines = list_file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise NsysanError(f"@{list_file}: could not be read ({err})") from err
    paths = []
    for line in lines:
        line = line.strip()
        if line and not line.startswith("#"):
            path = Path(line)
            paths.append(path if path.is_absolute() else list_file.parent / path)
    return paths
