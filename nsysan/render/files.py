"""Writing outputs: atomically, and with one clear error when the place can't be written."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path
from typing import Optional, Union

from ..errors import NsysanError


def write_atomic(path: Path, data: Union[str, bytes]) -> None:
    """Write a file so that a failed run never leaves a half-written one that looks complete.

    `str` is written as UTF-8 text, `bytes` as they are. The bytes go to a temporary file beside
    the target, reach the disk (fsync), and only then take the target's name. A symlink is
    followed (the file it points to is replaced, the link stays), and a target that is no regular
    file (/dev/stdout, a pipe, /dev/full) is written into, never replaced: as root, replacing
    /dev/stdout by a file would break the machine.
    """
    write_all_or_none({Path(path): data})


def write_all_or_none(files: dict[Path, Union[str, bytes]]) -> None:
    """write_atomic for several files that belong together (a report's page, plots and JSON).

    Every file is first written whole to its temporary file; only when all are on disk do they
    take their names, and renaming needs no space. A full disk or a failure half-way leaves every
    old file in place and no new one, never a page of this run beside the plots of the last.
    """
    staged: list[tuple[Path, Path, Path]] = []  # (temporary file, target, path as given)
    try:
        for path, data in files.items():
            payload = data.encode("utf-8") if isinstance(data, str) else data
            tmp_and_target = _stage(Path(path), payload)
            if tmp_and_target is not None:
                staged.append((*tmp_and_target, Path(path)))
        for tmp, target, path in staged:
            try:
                os.replace(tmp, target)
            except OSError as err:
                raise NsysanError(f"could not write {path}: {err.strerror or err}") from err
    finally:
        for tmp, _, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(tmp)  # renamed already: nothing there any more


def _stage(path: Path, payload: bytes) -> Optional[tuple[Path, Path]]:
    """The payload in a new temporary file beside the target, on disk; (temporary, target).
    None when the target is no regular file and was written in place."""
    try:
        try:
            mode: int | None = os.stat(path).st_mode  # through symlinks, /proc/self/fd/1 included
        except FileNotFoundError:
            mode = None
        if mode is not None and stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if mode is not None and not stat.S_ISREG(mode):
            with open(path, "wb") as handle:
                handle.write(payload)
            return None
        target = Path(os.path.realpath(path))  # a regular file or none yet: replace what a link points to
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except FileExistsError:  # a file where a folder should be: say that, not "File exists"
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(target.parent)) from None
        fd, tmp = _new_temp_file(target)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(payload)
                handle.flush()
                os.fsync(handle.fileno())
            if target.exists():  # keep the mode of the file being replaced
                os.chmod(tmp, stat.S_IMODE(target.stat().st_mode))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return tmp, target
    except OSError as err:
        raise NsysanError(f"could not write {path}: {err.strerror or err}") from err


def _new_temp_file(target: Path) -> tuple[int, Path]:
    """A new, empty hidden file beside `target`, created with mode 0666 less the umask like any
    new file (tempfile.mkstemp would make it 0600, and the report unreadable to others)."""
    for _ in range(100):
        tmp = target.parent / f".{target.name}.{secrets.token_hex(4)}.tmp"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(target))


def check_output_dir(path: Path) -> None:
    """Raise NsysanError now, before a long analysis, if `path` can't become a folder we write to.

    Nothing is created: the nearest existing ancestor must be a writable folder.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise NsysanError(f"{path} exists and is not a folder; give -o/--output a folder to write the report into")
    ancestor = path
    while not ancestor.exists():
        if ancestor.parent == ancestor:
            break
        ancestor = ancestor.parent
    if ancestor.exists() and not ancestor.is_dir():
        raise NsysanError(f"could not write {path}: {ancestor} is not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise NsysanError(f"could not write {path}: {ancestor} is not writable")
