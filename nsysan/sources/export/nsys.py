"""Finding nsys (--nsys, $NSYSAN_NSYS, $PATH, installers' folders), its version and export options,
and which Nsight Systems version captured a report."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Optional, Sequence

from ...errors import NsysanError
from .input_files import REPORT_MAGIC, open_regular

# Where installers put nsys, searched after --nsys, $NSYSAN_NSYS and $PATH. Each pattern's
# matches are tried newest version first. The Debian package installs /usr/bin/nsys ->
# /usr/lib/nsight-systems/bin/nsys -> ../target-linux-x64/nsys; NVIDIA's installers use
# /opt/nvidia/nsight-systems[-cli]/<version>/; CUDA toolkits ship it under /usr/local/cuda*;
# Nsight Compute bundles one under host/target-linux-x64.
INSTALL_GLOBS = (
    "/opt/nvidia/nsight-systems/*/bin/nsys",
    "/opt/nvidia/nsight-systems/*/target-linux-x64/nsys",
    "/opt/nvidia/nsight-systems-cli/*/bin/nsys",
    "/opt/nvidia/nsight-systems-cli/*/target-linux-x64/nsys",
    "/usr/local/cuda*/bin/nsys",
    "/usr/local/cuda*/nsight-systems-*/bin/nsys",
    "/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys",
    "/usr/lib/nsight-systems/bin/nsys",
    "/usr/lib/nsight-systems/target-linux-x64/nsys",
    "/usr/lib/x86_64-linux-gnu/nsight-systems/target-linux-x64/nsys",
    # Windows: the installer's default folder, one per version ("Nsight Systems 2025.3.2").
    "C:/Program Files/NVIDIA Corporation/Nsight Systems */target-windows-x64/nsys.exe",
    # macOS: the host application ships nsys beside nsys-ui (its target-linux-x64 is for Linux).
    "/Applications/NVIDIA Nsight Systems*.app/Contents/MacOS/nsys",
)
# What the binary is called inside an install directory given with --nsys or $NSYSAN_NSYS.
NSYS_NAMES = ("nsys", "nsys.exe")
INSTALL_SUBDIRS = ("", "bin", "target-linux-x64", "target-windows-x64", "Contents/MacOS")

_VERSION_TIMEOUT_S = 60.0


# ---------------------------------------------------------------------------------------------
# Finding nsys


def find_nsys(explicit: str | Path | None = None, *, report: Path | None = None) -> Path:
    """Return the path of the nsys binary to use.

    Looks at `explicit` (the --nsys option), then $NSYSAN_NSYS (both may name the binary or an
    install directory holding `nsys`, `bin/nsys` or `target-linux-x64/nsys`), then $PATH, then
    INSTALL_GLOBS. `report` only makes the "not found" message name the file being read.
    """
    if explicit is not None and str(explicit) != "":
        return _nsys_at(Path(explicit).expanduser(), given_as=f"--nsys {explicit}")
    from_env = os.environ.get("NSYSAN_NSYS", "")
    if from_env:
        return _nsys_at(Path(from_env).expanduser(), given_as=f"NSYSAN_NSYS={from_env}")
    on_path = shutil.which("nsys")
    if on_path:
        return Path(on_path)
    for pattern in INSTALL_GLOBS:
        for candidate in sorted(glob.glob(pattern), key=_numbers_in, reverse=True):
            if _is_executable(Path(candidate)):
                return Path(candidate)
    name = report.name if report is not None else "<report>"
    raise NsysanError(
        f"Nsight Systems' nsys is needed to read {name}; install it, or pass --nsys PATH, "
        f"or export a .sqlite yourself with `nsys export --type sqlite {name}`"
    )


def _nsys_at(path: Path, given_as: str) -> Path:
    """The nsys binary at `path` (a binary or an install directory), or an error naming it."""
    candidates = [path / sub / name for sub in INSTALL_SUBDIRS for name in NSYS_NAMES]
    for candidate in candidates if path.is_dir() else [path]:
        if _is_executable(candidate):
            return candidate
    raise NsysanError(
        f"{given_as}: no runnable nsys there; point it at the nsys binary or at the "
        f"Nsight Systems install directory"
    )


def _is_executable(path: Path) -> bool:
    # Windows has no execute bit: os.access(X_OK) is true for any file there, as wanted.
    return path.is_file() and os.access(path, os.X_OK)


def _numbers_in(text: str) -> tuple[int, ...]:
    """All integers in `text`, for sorting versioned install paths newest first."""
    return tuple(int(n) for n in re.findall(r"\d+", text))


# What each nsys said, asked once per process, or learned from the memo of an earlier one
# (nsys_memo.py): the answers an export needs before it can start.
_VERSIONS: dict[Path, str] = {}
_OPTIONS: dict[Path, frozenset[str]] = {}


def learned(nsys: Path, version: str, options: frozenset[str]) -> None:
    """Take `version` and `options` as what `nsys --version` and `nsys export --help` say."""
    _VERSIONS[nsys] = version
    _OPTIONS[nsys] = options


def nsys_version(nsys: Path) -> str:
    """Return the version of the nsys at `nsys`, e.g. "2022.4.2.1" (from `nsys --version`)."""
    if nsys in _VERSIONS:
        return _VERSIONS[nsys]
    try:
        text = _output_of(nsys, "--version")
    except (OSError, subprocess.TimeoutExpired) as err:
        raise NsysanError(
            f"could not run `{nsys} --version` ({err}); check --nsys / NSYSAN_NSYS"
        ) from err
    # "NVIDIA Nsight Systems version 2022.4.2.1-df9881f"
    match = re.search(r"version\s+(\d{4}\.\d+\.\d+(?:\.\d+)?)", text)
    if match is None:
        raise NsysanError(
            f"`{nsys} --version` printed no Nsight Systems version; point --nsys at Nsight Systems' nsys"
        )
    _VERSIONS[nsys] = match.group(1)
    return match.group(1)


def _output_of(nsys: Path, *arguments: str) -> str:
    """What `nsys ARGUMENTS` prints, stdout then stderr; OSError or TimeoutExpired when it can't run."""
    done = subprocess.run([str(nsys), *arguments], stdin=subprocess.DEVNULL, capture_output=True,
                          timeout=_VERSION_TIMEOUT_S, check=False)
    return done.stdout.decode("utf-8", "replace") + done.stderr.decode("utf-8", "replace")


def export_options(nsys: Path) -> frozenset[str]:
    """The long options `nsys export --help` lists ("include-blobs", "lazy", ...), read once per nsys.

    Newer options are passed only where they exist: an unknown option fails the whole export.
    An nsys whose help can't be read gets none of them.
    """
    if nsys not in _OPTIONS:
        try:
            text = _output_of(nsys, "export", "--help")
        except (OSError, subprocess.TimeoutExpired):
            text = ""
        _OPTIONS[nsys] = frozenset(re.findall(r"(?<![\w-])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)", text))
    return _OPTIONS[nsys]


def export_arguments(nsys: Path, tables: Optional[Sequence[str]] = None) -> list[str]:
    """What nsysan adds to `nsys export --type sqlite`: `--include-blobs true` where that nsys
    knows it, because without it the export drops NVTX payloads, and with them the Python call
    stacks of `--python-backtrace=cuda` (2022.4 has no such option and no such stacks); and
    `--tables` with `tables` when they are given (see exports_tables)."""
    options = export_options(nsys)
    blobs = ["--include-blobs", "true"] if "include-blobs" in options else []
    return blobs + (["--tables", ",".join(tables)] if tables and "tables" in options else [])


def exports_tables(nsys: Path) -> bool:
    """Whether this nsys exports only the tables it is given (`--tables`, 2023.4 on; not in 2022.4)."""
    return "tables" in export_options(nsys)


# ---------------------------------------------------------------------------------------------
# Which Nsight Systems wrote a report

_HEADER_VERSION = re.compile(rb"^NVIDIA Tegra Profiler Report (\d{4})@(\d+)@(\d+)@(\d+)")
# The session record at the end of a report holds the product version as a length-prefixed
# protobuf string (field 6, tag byte 0x32): b"2\x122022.4.2.1-df9881f", b"2\n2025.3.1.0".
_TRAILER_VERSION = re.compile(
    rb"\x32([\x05-\x40])((\d{4}\.\d{1,2}\.\d{1,2}(?:\.\d{1,6})?)(?:-[0-9A-Za-z]+)?)"
)
# Fallback: a build string anywhere, "2021.2.1.58-642947b" or "2024.2.3.38-242334140272v0".
_BUILD_STRING = re.compile(
    rb"(?<![\d.])(20\d\d\.\d{1,2}\.\d{1,2}\.\d{1,6})-(?:[0-9a-f]{7}|\d{12}v\d)"
)
_HEAD_BYTES = 4 << 20
_TAIL_BYTES = 1 << 20


def report_version(report: Path) -> str | None:
    """Return the Nsight Systems version that captured a .nsys-rep/.qdrep, as "YYYY.M.P[.B]".

    Reads at most the first 4 MiB and the last 1 MiB. Reports from 2023.3.3 on name the version
    in their first line (`... Report 2024@2@3@38-...`); older ones (`Report 1.`) and 2025.3
    (`Report 36398880.`) keep it in the session record at the end of the file. Returns None
    when the file is unreadable, is not a report, or names no version.
    """
    head, tail = _report_ends(report)
    header = _HEADER_VERSION.match(head)
    if header:
        return ".".join(str(int(part)) for part in header.groups())
    trailer = [m for m in _TRAILER_VERSION.finditer(tail) if m.group(1)[0] == len(m.group(2))]
    if trailer:
        return trailer[-1].group(3).decode("ascii")
    build = _BUILD_STRING.search(tail) or _BUILD_STRING.search(head)
    return build.group(1).decode("ascii") if build else None


def _report_ends(report: Path) -> tuple[bytes, bytes]:
    """The first 4 MiB and the last 1 MiB of a report, both empty when it is no readable report."""
    try:
        with open_regular(report) as handle:  # a FIFO or a device could block forever
            head = handle.read(_HEAD_BYTES)
            handle.seek(max(0, os.fstat(handle.fileno()).st_size - _TAIL_BYTES))
            tail = handle.read(_TAIL_BYTES)
    except OSError:
        return b"", b""
    return (head, tail) if head.startswith(REPORT_MAGIC) else (b"", b"")


def _is_version(text: str) -> bool:
    return re.fullmatch(r"\d+(\.\d+)*", text) is not None


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def _major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])

