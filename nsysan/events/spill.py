"""Columns kept for a later pass in a temporary file of Arrow IPC streams, read back memory-mapped:
the second look's batches (stream._BatchFile) and the API calls' chunks (stream_calls.MemoryCalls),
each decoded once and read again without reading or decoding their table again."""

from __future__ import annotations

import os
import tempfile
import weakref
from typing import IO, Optional

import numpy as np
import pyarrow as pa


class ColumnSpill:
    """Entries appended to a temporary file (made at the first, removed by `close` or when the
    spill goes), each a dict of groups of equal-length numpy columns; `read(i)` gives the i-th back
    with the same names and dtypes, as read-only arrays over the file's pages. `complete` until a
    write fails (a full disk): from then on nothing more is written."""

    def __init__(self) -> None:
        self.path: Optional[str] = None
        self.file: Optional[IO[bytes]] = None
        # per entry, per group: (offset, size, numpy dtypes) of its IPC stream
        self.written: list[dict] = []
        self.complete = True

    def __len__(self) -> int:
        return len(self.written)

    def add(self, groups: dict[str, dict[str, np.ndarray]]) -> None:
        if not self.complete:
            return
        try:
            if self.file is None:
                fd, self.path = tempfile.mkstemp(prefix="nsysan-spill-", suffix=".arrows")
                self.file = os.fdopen(fd, "wb")
                self._remove = weakref.finalize(self, _remove, self.file, self.path)
            self.written.append({name: _write_columns(self.file, columns) for name, columns in groups.items()})
        except OSError:  # a full disk: the caller reads its table again
            self.complete = False

    def read(self, entry: int) -> dict[str, dict[str, np.ndarray]]:
        self.file.flush()
        # mapped anew for each entry: its arrays hold their pages mapped until they go, so the
        # pages read stay as many as the entries alive, not the whole file
        with pa.memory_map(self.path) as source:
            return {name: _read_columns(source, *where) for name, where in self.written[entry].items()}

    def close(self) -> None:
        if self.file is not None:
            self._remove()
            self.file = None


def _remove(file: IO[bytes], path: str) -> None:
    file.close()
    os.unlink(path)


def _write_columns(file: IO[bytes], columns: dict) -> tuple[int, int, dict]:
    """Columns of one length written at the end of `file` as one Arrow IPC stream: where it lies,
    and the numpy dtypes (booleans go as bytes, which Arrow would pack into bits)."""
    start = file.tell()
    record = pa.record_batch([pa.array(v.view("uint8") if v.dtype == bool else v) for v in columns.values()],
                             names=list(columns))
    with pa.ipc.new_stream(file, record.schema) as writer:
        writer.write_batch(record)
    return start, file.tell() - start, {name: values.dtype for name, values in columns.items()}


def _read_columns(source: pa.MemoryMappedFile, start: int, size: int, dtypes: dict) -> dict:
    source.seek(start)
    record = pa.ipc.open_stream(source.read_buffer(size)).read_next_batch()
    return {name: record.column(i).to_numpy(zero_copy_only=True).view(dtype) for i, (name, dtype) in
            enumerate(dtypes.items())}
