"""Read the out-of-memory errors in a program's own log (its stderr, or a log file): `--log FILE`.

An allocator that refuses a request by itself (PyTorch under set_per_process_memory_fraction, XLA
inside its preallocated pool) calls no CUDA function, so nsys records nothing of the request;
the program's error message has it, with the cap and what the allocator held. This module finds
those messages and reads their numbers; analyses/oom_log.py joins them with the trace.

Wordings read (PyTorch's c10/cuda/CUDACachingAllocator.cpp has changed its message over the years):
- PyTorch 2.1 and later: "CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total
  capacity of 139.80 GiB of which 134.71 GiB is free. [Process 123 has 2.00 GiB memory in use.]
  Including non-PyTorch memory, this process has 5.08 GiB memory in use. [5.59 GiB allowed; ]Of
  the allocated memory 4.17 GiB is allocated by PyTorch, [with 1.00 GiB allocated in private
  pools (e.g., CUDA Graphs), ]and 155.95 MiB is reserved by PyTorch but unallocated."
- PyTorch 1.x-2.0: "CUDA out of memory. Tried to allocate 36.00 MiB (GPU 0; 7.93 GiB total
  capacity; 130.35 MiB already allocated; 47.06 MiB free; [2.80 GiB allowed; ]188.00 MiB reserved
  in total by PyTorch)";
- XLA (JAX, TensorFlow): "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184
  bytes", "... Failed to allocate request for 16.00GiB (17179869184B) on device ordinal 0",
  "Allocator (GPU_0_bfc) ran out of memory trying to allocate 16.00GiB (rounded to
  17179869184)", with the BFC allocator's "Limit:" and "InUse:" lines when it prints them.

Only the numbers are kept: nothing else of the log (which may hold secrets) is stored or printed.
Anything wrong with the file itself raises NsysanError (one line, exit 2).
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional, Sequence

from ..errors import NsysanError

MAX_LOG_BYTES = 1 << 30  # a log is scanned line by line; past this it is not one program's log of one run
MAX_LINE = 1 << 16  # a longer line is cut (a progress bar redrawn with \r for an hour is one line)
WINDOW_LINES = 40  # lines after the first one of a message that may still hold its numbers (XLA's stats)
WINDOW_CHARS = 8192
MAX_MESSAGES = 100  # messages kept per log (a retry loop may print thousands)

_UNITS = {"": 1, "b": 1, "bytes": 1, "byte": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
          "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12}
_SIZE = r"(\d+(?:\.\d+)?)\s*(bytes?|[KMGT]i?B|B)"

_TORCH = re.compile(r"(?:CUDA|HIP) out of memory\. Tried to allocate " + _SIZE, re.I)
# Each wording's GPU and capacity, then the sizes it prints, by the OomMessage field they fill
_TORCH_2_TOTAL = re.compile(r"GPU (\d+) has a total capacity of " + _SIZE + r" of which " + _SIZE + r" is free")
_TORCH_2 = {
    "process_bytes": re.compile(r"this process has " + _SIZE + r" memory in use"),
    "cap_bytes": re.compile(_SIZE + r" allowed;"),
    "allocated_bytes": re.compile(r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch"),
    "reserved_unallocated_bytes": re.compile(r"and " + _SIZE + r" is reserved by PyTorch but unallocated"),
}
_TORCH_1_TOTAL = re.compile(r"\(GPU (\d+); " + _SIZE + r" total capacity")
_TORCH_1 = {
    "allocated_bytes": re.compile(_SIZE + r" already allocated"),
    "free_bytes": re.compile(_SIZE + r" free;"),
    "cap_bytes": re.compile(_SIZE + r" allowed;"),
}
_TORCH_1_RESERVED = re.compile(_SIZE + r" reserved in total by PyTorch")
_OTHER_PROCESS = re.compile(r"Process (\d+) has " + _SIZE + r" memory in use")
_XLA = re.compile(r"RESOURCE_EXHAUSTED|ran out of memory trying to allocate", re.I)
_XLA_REQUEST = [
    ("xla_bfc", re.compile(r"Allocator \((?:GPU|gpu)_(\d+)_bfc\) ran out of memory trying to allocate "
                           r"(\d+(?:\.\d+)?)\s*([KMGT]?i?B)(?: \(rounded to (\d+)\))?")),
    ("xla", re.compile(r"Failed to allocate request for [\d.]+\s*[KMGT]?i?B \((\d+)B\) on device ordinal (\d+)")),
    ("xla", re.compile(r"Out of memory while trying to allocate (\d+) bytes")),
    ("xla", re.compile(r"Out of memory while trying to allocate (\d+(?:\.\d+)?)\s*([KMGT]i?B)"
                       r"(?: with allocator \w+)?(?: on device (\d+))?")),
    ("xla", re.compile(r"Out of memory allocating (\d+) bytes")),
    ("xla", re.compile(r"(?:Failed to|Could not) allocate (\d+) bytes")),
]
_XLA_STATS = {"limit": re.compile(r"\bLimit:\s+(\d+)\b"), "in_use": re.compile(r"\bInUse:\s+(\d+)\b")}
# XLA's scheduler names the device's memory limit (what its allocator may use: the
# XLA_PYTHON_CLIENT_MEM_FRACTION share) when a program's buffers exceed it: "… exceeds the base
# limit (7505707008)" (jax_oom_v25). Used as the cap when the BFC statistics are not printed.
_XLA_BASE_LIMIT = re.compile(r"exceeds the base limit \((\d+)\)")
_PID = re.compile(r"\bpid[=: ]\s*(\d+)\b", re.I)
# glog's prefix (XLA, TensorFlow): "W1201 21:21:45.914516     559 bfc_allocator.cc:598]", the
# number being the thread's id, the process's own for its main thread
_GLOG_THREAD = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+(\d+) ")
# torchrun's prefix of each line of a rank ("[rank1]: torch.OutOfMemoryError: ...")
_RANK = re.compile(r"\[rank(\d+)\]")


@dataclass
class OomMessage:
    """One out-of-memory error read from a log: its numbers (bytes; None when the wording has none)."""

    log: str  # the log's file name
    line: int  # the line it starts on, from 1
    framework: str  # pytorch | xla
    wording: str  # pytorch_2 | pytorch_1 | xla_bfc | xla
    pid: Optional[int] = None
    thread: Optional[int] = None  # glog's thread id on the line (the pid when it is the main thread)
    rank: Optional[int] = None  # torchrun's [rankN] prefix
    device: Optional[int] = None
    request_bytes: Optional[int] = None
    cap_bytes: Optional[int] = None
    total_bytes: Optional[int] = None
    free_bytes: Optional[int] = None
    process_bytes: Optional[int] = None
    allocated_bytes: Optional[int] = None
    reserved_unallocated_bytes: Optional[int] = None
    other_processes: dict[int, int] = field(default_factory=dict)  # pid -> bytes, as the message lists them

    def key(self) -> tuple:
        """What makes two messages the same error (a traceback printed twice, a logger echoing stderr)."""
        return (self.framework, self.pid, self.device, self.request_bytes, self.cap_bytes, self.allocated_bytes,
                self.reserved_unallocated_bytes, self.free_bytes)


def read_oom_logs(paths: Sequence[Path]) -> list[OomMessage]:
    """Every out-of-memory error in the logs, in order (the same error printed twice, once)."""
    names = [Path(p).name for p in paths]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise NsysanError(f"--log {twice[0]} is given twice")
    found: list[OomMessage] = []
    for path in paths:
        seen: set = set()
        for message in read_oom_log(Path(path)):
            if message.key() not in seen:
                seen.add(message.key())
                found.append(message)
    return found


def read_oom_log(path: Path) -> list[OomMessage]:
    """The out-of-memory errors in one log (at most MAX_MESSAGES)."""
    name = path.name
    try:
        info = os.stat(path)
    except OSError as err:
        raise NsysanError(f"--log {name} could not be read ({err.strerror or err})") from None
    if stat.S_ISDIR(info.st_mode):
        raise NsysanError(f"--log {name} is a directory; give the program's log or stderr file")
    if not stat.S_ISREG(info.st_mode):
        raise NsysanError(f"--log {name} is not a regular file (a pipe or device is read once and lost); save the "
                          "program's stderr to a file: python train.py 2> train.log")
    if info.st_size > MAX_LOG_BYTES:
        raise NsysanError(f"--log {name} is {info.st_size / (1 << 30):.1f} GiB, over the 1 GiB a log may be; give "
                          "its end, where the error is: tail -c 100M train.log > end.log")
    try:
        with open(path, "rb") as handle:
            return _scan(name, _lines(handle))
    except OSError as err:
        raise NsysanError(f"--log {name} could not be read ({err.strerror or err})") from None


def _lines(handle) -> Iterator[tuple[int, str]]:
    """(line number from 1, text) of the file's lines; a line longer than MAX_LINE comes in pieces
    of one number (readline with a limit: a file without newlines is never read whole), and a
    progress bar's \r redraws as pieces too."""
    number = 1
    while True:
        raw = handle.readline(MAX_LINE)
        if not raw:
            return
        text = raw.decode("utf-8", "replace").rstrip("\r\n")
        for piece in text.split("\r"):
            yield number, piece
        if raw.endswith(b"\n"):
            number += 1


def _scan(name: str, lines: Iterator[tuple[int, str]]) -> list[OomMessage]:
    found: list[OomMessage] = []
    window: list[str] = []  # the lines after an XLA message's first, where its numbers may follow
    pending: Optional[OomMessage] = None
    base_limit: Optional[int] = None  # XLA's device memory limit, when its scheduler said it
    for number, line in lines:
        limit = _XLA_BASE_LIMIT.search(line) if "base limit" in line else None
        if limit is not None:
            base_limit = int(limit.group(1))
        if pending is not None:
            window.append(line)
            if len(window) >= WINDOW_LINES or sum(map(len, window)) > WINDOW_CHARS:
                _xla_stats(pending, window)
                pending, window = None, []
        torch = _TORCH.search(line)
        if torch is not None and len(found) < MAX_MESSAGES:
            found.append(_where(_pytorch(name, number, line[torch.start():], _pid(line)), line))
            continue
        if _XLA.search(line) and "not a failure" not in line and len(found) < MAX_MESSAGES:
            xla = _xla(name, number, line)
            if xla is not None and _same_error(found[-1] if found else None, xla):
                found[-1].device = found[-1].device if found[-1].device is not None else xla.device
                found[-1].pid = found[-1].pid if found[-1].pid is not None else xla.pid
            elif xla is not None:
                xla.cap_bytes = base_limit
                _where(xla, line)
                if pending is not None:
                    _xla_stats(pending, window)
                pending, window = xla, []
                found.append(xla)
    if pending is not None:
        _xla_stats(pending, window)
    return found


def _same_error(before: Optional[OomMessage], message: OomMessage) -> bool:
    """XLA says one failure several times: the BFC allocator's warning, then the exception
    (RESOURCE_EXHAUSTED) that carries it, a few lines apart, asking for the same bytes."""
    return (before is not None and before.framework == "xla" and before.request_bytes == message.request_bytes
            and message.line - before.line <= 4 * WINDOW_LINES)


def _bytes(value: str, unit: str) -> int:
    return int(round(float(value) * _UNITS[unit.lower()]))


def _size(pattern: re.Pattern, text: str) -> Optional[int]:
    match = pattern.search(text)
    return _bytes(match.group(1), match.group(2)) if match else None


def _where(message: OomMessage, line: str) -> OomMessage:
    """The message with the thread and rank its line names."""
    thread, rank = _GLOG_THREAD.match(line), _RANK.search(line)
    message.thread = int(thread.group(1)) if thread else None
    message.rank = int(rank.group(1)) if rank else None
    return message


def _pid(line: str) -> Optional[int]:
    match = _PID.search(line)
    return int(match.group(1)) if match else None


def _pytorch(name: str, number: int, text: str, pid: Optional[int]) -> OomMessage:
    request = _TORCH.match(text)
    message = OomMessage(log=name, line=number, framework="pytorch", wording="pytorch_2", pid=pid,
                         request_bytes=_bytes(request.group(1), request.group(2)) if request else None)
    text = text[:WINDOW_CHARS]
    total = _TORCH_2_TOTAL.search(text)
    if total is not None:
        message.device = int(total.group(1))
        message.total_bytes = _bytes(total.group(2), total.group(3))
        message.free_bytes = _bytes(total.group(4), total.group(5))
        for field_name, pattern in _TORCH_2.items():
            setattr(message, field_name, _size(pattern, text))
        message.other_processes = {int(m.group(1)): _bytes(m.group(2), m.group(3))
                                   for m in _OTHER_PROCESS.finditer(text)}
        return message
    old = _TORCH_1_TOTAL.search(text)
    message.wording = "pytorch_1"
    if old is not None:
        message.device = int(old.group(1))
        message.total_bytes = _bytes(old.group(2), old.group(3))
    for field_name, pattern in _TORCH_1.items():
        setattr(message, field_name, _size(pattern, text))
    reserved = _size(_TORCH_1_RESERVED, text)
    if reserved is not None and message.allocated_bytes is not None:
        message.reserved_unallocated_bytes = max(reserved - message.allocated_bytes, 0)
    return message


def _xla(name: str, number: int, line: str) -> Optional[OomMessage]:
    for wording, pattern in _XLA_REQUEST:
        match = pattern.search(line)
        if match is None:
            continue
        message = OomMessage(log=name, line=number, framework="xla", wording=wording, pid=_pid(line))
        if wording == "xla_bfc":
            message.device = int(match.group(1))
            message.request_bytes = int(match.group(4)) if match.group(4) else _bytes(match.group(2), match.group(3))
        elif pattern.groups == 3:  # a size with its unit, then the device
            message.request_bytes = _bytes(match.group(1), match.group(2))
            message.device = int(match.group(3)) if match.group(3) else None
        else:
            message.request_bytes = int(match.group(1))
            if match.lastindex and match.lastindex >= 2:
                message.device = int(match.group(2))
        return message
    return None


def _xla_stats(message: OomMessage, window: list[str]) -> None:
    """The BFC allocator's statistics printed after its error: Limit (its pool) and InUse."""
    text = "\n".join(window)[:WINDOW_CHARS]
    limit, in_use = _XLA_STATS["limit"].search(text), _XLA_STATS["in_use"].search(text)
    if limit is not None:
        message.cap_bytes = int(limit.group(1))
    if in_use is not None:
        message.allocated_bytes = int(in_use.group(1))
