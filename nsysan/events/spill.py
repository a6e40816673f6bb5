"""What a later pass reads again, kept instead of read and decoded from its table again: the second
look's batches (stream.EventFlow) and the API calls' chunks (stream_calls.MemoryCalls). A table
of a chunk or so stays in memory; past that, a temporary file of Arrow IPC streams, read back
memory-mapped."""

from __future__ import annotations

import os
import tempfile
import weakref
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Callable, Generic, Iterator, Optional, TypeVar

import numpy as np

try:  # optional at import time, as in sources/reader.py: without a working pyarrow nothing is
    # spilled, and a later pass reads its table again
    import pyarrow as pa
except Exception:  # pragma: no cover - depends on the environment
    pa = None


T = TypeVar("T")


class Kept(Generic[T]):
    """Entries kept in order for a later pass: as they are while they hold `most` rows in all (by
    `rows(entry)`), past that every one written to a ColumnSpill as `groups(entry)` and made again
    by `entry(groups)` as it is read; `complete` until a write fails (a full disk)."""

    def __init__(self, most: int, rows: Callable[[T], int], groups: Callable[[T], dict],
                 entry: Callable[[dict], T]) -> None:
        self.most, self.rows, self.groups, self.entry = most, rows, groups, entry
        self.held: list[T] = []
        self.held_rows = 0
        self.spill: Optional[ColumnSpill] = None

    @property
    def complete(self) -> bool:
        return self.spill is None or self.spill.complete

    def __len__(self) -> int:
        return len(self.held) if self.spill is None else len(self.spill)

    def add(self, entry: T) -> None:
        if self.spill is None and self.held_rows + self.rows(entry) <= self.most:
            self.held.append(entry)
            self.held_rows += self.rows(entry)
            return
        self.spill = self.spill or ColumnSpill()
        for each in self.held + [entry]:
            self.spill.add(self.groups(each))
        self.held = []

    def __getitem__(self, i: int) -> T:
        return self.held[i] if self.spill is None else self.entry(self.spill.read(i))

    def __iter__(self) -> Iterator[T]:
        return (self[i] for i in range(len(self)))

    def close(self) -> None:
        self.held = []
        if self.spill is not None:
            self.spill.close()


class ColumnSpill:
    """Entries appended to a temporary file (made at the first, removed by `close` or when the
    spill goes), each a dict of groups of equal-length numpy columns; `read(i)` gives the i-th back
    with the same names, dtypes and values (integer columns stored narrowed: _narrowed), those
    stored as they are as read-only arrays over the file's pages. `complete` until a
    write fails (a full disk): from then on nothing more is written.

    The writes go on a thread of their own, through Arrow's own file (which lets go of the GIL
    while it copies), while the caller makes the next entry: at 1e7 events some 0.5 GB go to the
    page cache (1.5 GB before narrowing). Up to WRITES_AHEAD entries wait for their write (their arrays held meanwhile)."""

    WRITES_AHEAD = 1

    def __init__(self) -> None:
        self.path: Optional[str] = None
        self.file: Optional["pa.NativeFile"] = None
        # per entry, the write of its groups: per group (offset, size, per column its numpy dtype and base) of its IPC stream
        self.written: list[Future] = []
        self.failed = False
        self._writer: Optional[ThreadPoolExecutor] = None

    @property
    def complete(self) -> bool:
        """No write failed (the writes waited for)."""
        if self.written:
            wait(self.written)
        return not self.failed

    def __len__(self) -> int:
        return len(self.written)

    def add(self, groups: dict[str, dict[str, np.ndarray]]) -> None:
        if self.failed or pa is None:
            self.failed = True
            return
        if self.file is None:
            try:
                fd, self.path = tempfile.mkstemp(prefix="nsysan-spill-", suffix=".arrows")
                os.close(fd)
                self.file = pa.OSFile(self.path, "wb")
            except OSError:  # a full disk: the caller reads its table again
                self.failed = True
                return
            self._writer = ThreadPoolExecutor(max_workers=1)
            self._remove = weakref.finalize(self, _remove, self.file, self.path, self._writer)
        if len(self.written) >= self.WRITES_AHEAD:
            self.written[-self.WRITES_AHEAD].result()  # the arrays of at most WRITES_AHEAD entries wait
        self.written.append(self._writer.submit(self._write, groups))

    def _write(self, groups: dict) -> Optional[dict]:
        if self.failed:
            return None
        try:
            return {name: _write_columns(self.file, columns) for name, columns in groups.items()}
        except OSError:  # a full disk: nothing more is written
            self.failed = True
            return None

    def read(self, entry: int) -> dict[str, dict[str, np.ndarray]]:
        where = self.written[entry].result()
        # mapped anew for each entry: its arrays hold their pages mapped until they go, so the
        # pages read stay as many as the entries alive, not the whole file
        with pa.memory_map(self.path) as source:
            return {name: _read_columns(source, *at) for name, at in where.items()}

    def close(self) -> None:
        if self.file is not None:
            self._remove()
            self.file = None


def _remove(file: "pa.NativeFile", path: str, writer: ThreadPoolExecutor) -> None:
    writer.shutdown(wait=True)  # the writes under way end first
    file.close()
    os.unlink(path)


def _write_columns(file: "pa.NativeFile", columns: dict) -> tuple[int, int, dict]:
    """Columns of one length written at the end of `file` as one Arrow IPC stream: where it lies,
    and per column its numpy dtype and the base it is stored from (None: stored as it is; booleans
    go as bytes, which Arrow would pack into bits)."""
    start = file.tell()
    stored = {name: _narrowed(values) for name, values in columns.items()}
    record = pa.record_batch([pa.array(v.view("uint8") if v.dtype == bool else v) for v, _ in stored.values()],
                             names=list(columns))
    with pa.ipc.new_stream(file, record.schema) as writer:
        writer.write_batch(record)
    return start, file.tell() - start, {name: (values.dtype, stored[name][1]) for name, values in columns.items()}


def _narrowed(values: np.ndarray) -> tuple[np.ndarray, Optional[int]]:
    """An integer column as its distance from its lowest value, in the fewest bytes that hold the
    distances, and that lowest value (None: `values` as they are). A batch's columns span little
    (times, sequence numbers, sizes, process and kind codes): at 1e7 events the second look's file
    was 1.1 GB, whose writes into the page cache cost more CPU than the few passes that narrow it."""
    if values.dtype.kind not in "iu" or values.itemsize == 1 or not len(values):
        return values, None
    low, high = int(values.min()), int(values.max())
    narrow = next((t for t in (np.uint8, np.uint16, np.uint32) if high - low <= np.iinfo(t).max), None)
    if narrow is None or np.dtype(narrow).itemsize >= values.itemsize:
        return values, None
    # the distances wrap around in the narrow type to what they are: each below its largest value
    distances = values.astype(narrow)
    distances -= narrow(low & np.iinfo(narrow).max)
    return distances, low


def _read_columns(source: "pa.MemoryMappedFile", start: int, size: int, stored: dict) -> dict:
    source.seek(start)
    record = pa.ipc.open_stream(source.read_buffer(size)).read_next_batch()
    columns = {}
    for i, (name, (dtype, low)) in enumerate(stored.items()):
        values = record.column(i).to_numpy(zero_copy_only=True)
        # a narrowed column back in its own type: its distances added to its lowest value
        columns[name] = values.view(dtype) if low is None else np.add(values, np.array(low, dtype), dtype=dtype)
    return columns
