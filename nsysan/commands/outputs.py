"""The one guard of every output of every command, and the writing itself.

Every file a command writes (analyze's JSON and report folder, check's JSON, JUnit and
Markdown and the GitHub step summary, compare's folder, batch's summary and database) goes
through here: no output may replace an input of the run (followed through links, compared by
inode), two outputs of one run may not name one file, and a file is written atomically with
one clear error when the place can't be written."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Optional, Union

from ..errors import NsysanError
from ..sources.export.input_files import NO_WAITING, describe_file_type

if TYPE_CHECKING:
    from ..model import Analysis, Comparison

# Files no output may replace, by (device, inode): the inputs of this run and what SQLite reads
# beside them. An inode, not a name: a symlink, a hard link or `./x` vs `x` name the same file.
_inputs: dict[tuple[int, int], str] = {}
# What this run wrote, by inode: the sha256 of the bytes. A second, different document for the
# same file (two reports of one name in --json-dir, --json inside -o) would silently keep one.
# None outside a command's run: a notebook may rewrite a report folder as often as it likes.
_written: Optional[dict[tuple[int, int], tuple[str, str]]] = None


@contextlib.contextmanager
def one_run(inputs: Iterable[Path]) -> Iterator[None]:
    """Around one command's run: no output replaces one of `inputs` (those that exist), and no
    output replaces another output of the same run with different bytes."""
    global _written
    saved = dict(_inputs), _written
    _written = {}
    try:
        for path in inputs:  # those that exist
            key = _inode(path)
            if key is not None:
                _inputs.setdefault(key, str(path))
        _refuse_stdout_onto_an_input()
        yield
    finally:
        _inputs.clear()
        _inputs.update(saved[0])
        _written = saved[1]


def _refuse_stdout_onto_an_input() -> None:
    """`nsysan analyze run.sqlite --format json >> run.sqlite`: the shell opened the input as
    stdout, and what is printed would be appended to it. (With `>` the shell has emptied it before
    nsysan starts; the input then reads as empty.)"""
    try:
        found = os.fstat(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):  # no descriptor (captured)
        return
    source = _inputs.get((found.st_dev, found.st_ino)) if stat.S_ISREG(found.st_mode) else None
    if source is not None:
        raise NsysanError(f"refusing to write to stdout: it is the input {source} (sent there by the shell's >>), "
                          "which nsysan never writes into; send stdout to another file")


def _inode(path: Path) -> Optional[tuple[int, int]]:
    """(device, inode) of the file `path` names, through links; None when it is not there (yet), or
    is a name the OS can't take."""
    try:
        found = os.stat(path)
    except (OSError, ValueError):
        return None
    return found.st_dev, found.st_ino


def claim_outputs(outputs: Iterable[tuple[Path, str]]) -> None:
    """Before anything is computed: refuse an output that is an input of the run (directly, through
    a symlink or a hard link) and two outputs naming one file. Each output comes with the name of
    the document it will hold: two names for one document (`analyze --json DIR/analysis.json -o DIR`)
    are one output written twice, with the same bytes."""
    seen: dict[object, tuple[Path, str]] = {}
    for path, document in outputs:
        path = Path(path)
        _refuse_if_input(path)
        key = _identity(path)
        earlier = seen.get(key)
        if earlier is not None and earlier[1] != document:
            raise NsysanError(f"refusing to write {path} ({document}): it is the file of {earlier[1]} too "
                              f"({earlier[0]}), and one would be lost; give each output its own name")
        seen.setdefault(key, (path, document))


def _identity(path: Path) -> object:
    """What two names of one file share: its (device, inode) when it exists (hard links, symlinks),
    else the absolute path with every link resolved (a file yet to be made)."""
    return _inode(path) or os.path.realpath(path)


def _refuse_if_input(path: Path) -> None:
    source = _inputs.get(_inode(path))  # through symlinks: the file that would be replaced
    if source is not None:
        same = "" if os.path.abspath(path) == os.path.abspath(source) else " (the same file under another name)"
        raise NsysanError(f"refusing to write {path}: it is the input {source}{same}, which nsysan never "
                          "overwrites; choose another output path")


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
    payloads = [(Path(path), data.encode("utf-8") if isinstance(data, str) else data) for path, data in files.items()]
    digests = [hashlib.sha256(payload).hexdigest() for _, payload in payloads]
    claim_outputs((path, digest) for (path, _), digest in zip(payloads, digests))
    staged: list[tuple[Path, Path, Path, str]] = []  # (temporary file, target, path as given, sha256)
    try:
        for (path, payload), digest in zip(payloads, digests):
            tmp_and_target = _stage(path, payload, digest)
            if tmp_and_target is not None:
                staged.append((*tmp_and_target, path, digest))
        for tmp, target, path, digest in staged:
            try:
                os.replace(tmp, target)
                written = os.stat(target)
            except OSError as err:
                raise NsysanError(f"could not write {path}: {err.strerror or err}") from err
            if _written is not None:
                _written[(written.st_dev, written.st_ino)] = (str(path), digest)
    finally:
        for tmp, _, _, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(tmp)  # renamed already: nothing there any more


def _stage(path: Path, payload: bytes, digest: str) -> Optional[tuple[Path, Path]]:
    """The payload (whose sha256 is `digest`) in a new temporary file beside the target, on disk;
    (temporary, target). None when the target is no regular file and was written in place."""
    try:
        try:
            found: os.stat_result | None = os.stat(path)  # through symlinks, /proc/self/fd/1 included
        except FileNotFoundError:
            found = None
        if found is not None and stat.S_ISDIR(found.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if found is not None and not stat.S_ISREG(found.st_mode):
            _write_into(path, payload)
            return None
        earlier = _written.get((found.st_dev, found.st_ino)) if found is not None and _written is not None else None
        if earlier is not None and earlier[1] != digest:
            raise NsysanError(f"refusing to write {path}: this run already wrote another document "
                              f"there ({earlier[0]}); give each output its own name")
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


def _write_into(path: Path, payload: bytes) -> None:
    """Write into what is no regular file (/dev/stdout, a pipe, a terminal), opened without
    waiting: a FIFO that nobody reads is one error line, never a wait for a reader that never comes."""
    try:
        fd = os.open(path, os.O_WRONLY | NO_WAITING)
    except OSError as err:
        if err.errno == errno.ENXIO:  # a FIFO without a reader
            raise OSError(errno.ENXIO, "a FIFO (named pipe) nobody reads", str(path)) from None
        raise
    try:
        _write_all(fd, payload)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    """All of `data` into `fd`, opened without waiting and now made blocking: a pipe takes it in parts."""
    if hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)
    while data:
        data = data[os.write(fd, data):]


def _new_temp_file(target: Path) -> tuple[int, Path]:
    """A new, empty hidden file beside `target`, created with mode 0666 less the umask like any
    new file (tempfile.mkstemp would make it 0600, and the report unreadable to others)."""
    # O_BINARY: on Windows a descriptor from os.open is in text mode, which would turn every \n
    # written into \r\n, in PNGs too (tempfile adds it for the same reason).
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = target.parent / f".{target.name}.{os.urandom(4).hex()}.tmp"
        try:
            return os.open(tmp, flags, 0o666), tmp
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
    chain = [path, *path.parents]
    ancestor = next((folder for folder in chain if folder.exists()), chain[-1])
    if ancestor.exists() and not ancestor.is_dir():
        raise NsysanError(f"could not write {path}: {ancestor} is not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise NsysanError(f"could not write {path}: {ancestor} is not writable")


def append_text(path: Path, text: str, what: str) -> None:
    """Append `text` to a regular file (the GitHub step summary), made if missing: never an input,
    never a FIFO or a device (opened without waiting, its type checked on the open file)."""
    path = Path(path)
    _refuse_if_input(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | NO_WAITING, 0o666)
    except OSError as err:
        reason = "a FIFO (named pipe) nobody reads" if err.errno == errno.ENXIO else (err.strerror or str(err))
        raise NsysanError(f"could not write {what} ({path}): {reason}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NsysanError(f"could not write {what} ({path}): it is {describe_file_type(mode)}, not a file")
        _write_all(fd, text.encode("utf-8"))
    except OSError as err:
        raise NsysanError(f"could not write {what} ({path}): {err.strerror or err}") from None
    finally:
        os.close(fd)


def write_report(analysis: "Analysis", out_dir: Path, full_paths: bool = False) -> Path:
    """Write report.html, timeline.png, sites.png and analysis.json into `out_dir` (all or none: a
    full disk leaves the last run's report whole); return the page's path."""
    from ..render.html import report_files  # matplotlib and jinja: 0.4 s, paid only for -o

    check_output_dir(out_dir)
    write_all_or_none({Path(out_dir) / name: data for name, data in report_files(analysis, full_paths).items()})
    return Path(out_dir) / "report.html"


def write_comparison(c: "Comparison", base: "Analysis", new: "Analysis", out_dir: Path) -> Path:
    """Write compare.png, compare.json and compare.html into `out_dir` (all or none); the page's path."""
    from ..render.compare_data import comparison_files

    check_output_dir(out_dir)
    write_all_or_none({Path(out_dir) / name: data for name, data in comparison_files(c, base, new).items()})
    return Path(out_dir) / "compare.html"
