"""Python call stacks recorded by `nsys profile --python-backtrace=cuda`.

nsys records the Python stack at each backtraced CUDA call as an NVTX mark in the domain
"Python Backtrace on CUDA", on the thread of the call and inside its [start, end]. The frames
are the mark's extended payload: a blob laid out by a schema in the export's payload-schema
tables ("Frames count", then "Frames": per frame "Function" and "File" as StringIds ids and
"Line"). The layout is read from those tables, never assumed: "Line" is a 4-byte integer in an
8-byte slot whose upper bytes are not zeroed, so reading the slot whole gives nonsense lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import pandas as pd

# Byte size of the NVTX payload entry types a backtrace uses (nvToolsExtPayload.h): the C integer
# types (1-10), the sized ones (11-18), size_t and addresses (22, 23), registered string handles (80).
_TYPE_SIZES = {1: 1, 2: 1, 3: 2, 4: 2, 5: 4, 6: 4, 7: 8, 8: 8, 9: 8, 10: 8, 11: 1, 12: 1, 13: 2, 14: 2,
               15: 4, 16: 4, 17: 8, 18: 8, 22: 8, 23: 8, 80: 8}
_SIGNED_TYPES = {1, 3, 5, 7, 9, 11, 13, 15, 17}
# A blob holds a count of payloads, then per payload (schema id, size, offset from the blob's
# start), each a u64 (observed in 2025.3: 1, schema id, size, 32).
_HEADER_ENTRY = 24


@dataclass(frozen=True)
class Field:
    offset: int
    size: int
    signed: bool = False


@dataclass(frozen=True)
class BacktraceLayout:
    """Where the frames are in a backtrace payload of one schema."""

    schema_id: int
    count: Field  # number of frames
    frames_offset: int
    stride: int  # bytes per frame
    function: Field  # StringIds id
    file: Field  # StringIds id
    line: Field


def backtrace_layouts(schemas: pd.DataFrame, entries: pd.DataFrame, domain_name: str) -> dict[tuple[int, int], BacktraceLayout]:
    """(domain id, schema id) -> layout, for the payload schemas named `domain_name` whose
    entries have every field a backtrace needs, with types of known sizes."""
    layouts = {}
    for domain, schema_id, name, _ in schemas.itertuples(index=False):  # a handful of schemas
        if name != domain_name:
            continue
        top = _fields(entries, domain, schema_id)
        frames = top.get("Frames")
        if frames is None or "Frames count" not in top:
            continue
        nested = _fields(entries, domain, frames[0])
        size = schemas[(schemas["domain_id"] == domain) & (schemas["schema_id"] == frames[0])]["payload_size"]
        layout = _layout(int(schema_id), top, nested, size)
        if layout is not None:
            layouts[(int(domain), int(schema_id))] = layout
    return layouts


def _fields(entries: pd.DataFrame, domain: int, schema_id: int) -> dict[str, tuple[int, int]]:
    """Entry name -> (type, offset) of one schema; the first entry's offset is 0 when not recorded."""
    mine = entries[(entries["domain_id"] == domain) & (entries["schema_id"] == schema_id)].sort_values("index")
    return {str(name): (entry_type, int(offset) if isinstance(offset, int) else 0)
            for _, _, index, entry_type, name, offset in mine.itertuples(index=False)
            if isinstance(entry_type, int) and (isinstance(offset, int) or index == 0)}


def _layout(schema_id: int, top: dict, nested: dict, nested_size: pd.Series) -> Optional[BacktraceLayout]:
    def field_of(fields: dict, name: str) -> Optional[Field]:
        if name not in fields or fields[name][0] not in _TYPE_SIZES:
            return None
        entry_type, offset = fields[name]
        return Field(offset, _TYPE_SIZES[entry_type], entry_type in _SIGNED_TYPES)

    count, function, file, line = (field_of(top, "Frames count"), field_of(nested, "Function"),
                                   field_of(nested, "File"), field_of(nested, "Line"))
    if None in (count, function, file, line):
        return None
    end_of_frame = max(f.offset + f.size for f in (function, file, line))
    stride = int(nested_size.iloc[0]) if len(nested_size) and isinstance(nested_size.iloc[0], (int, np.integer)) \
        else 0
    if stride < end_of_frame:  # no recorded size: frames are packed to 8-byte alignment
        stride = (end_of_frame + 7) // 8 * 8
    return BacktraceLayout(schema_id, count, top["Frames"][1], stride, function, file, line)


FRAME_COLUMNS = ["mark", "depth", "function_id", "file_id", "line"]


def decode_frames(marks: pd.DataFrame, layouts: dict[tuple[int, int], BacktraceLayout]) -> pd.DataFrame:
    """One row per frame of each mark's payload (FRAME_COLUMNS, `mark` its row in `marks`,
    depth 0 = innermost). Blobs that are cut short, of an unknown schema or claim more frames
    than they hold give what they hold; nothing is read beyond a blob's end."""
    blobs = [b if isinstance(b, bytes) else b"" for b in marks["payload"]]
    if not blobs or not layouts:
        return pd.DataFrame({c: np.zeros(0, "int64") for c in FRAME_COLUMNS})
    lengths = np.fromiter((len(b) for b in blobs), "int64", len(blobs))
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    buffer = np.frombuffer(b"".join(blobs) + b"\0" * 8, dtype=np.uint8)  # 8 spare bytes for reads at the end
    ends = starts + lengths

    def read(at: np.ndarray, field: Field) -> np.ndarray:
        """The little-endian integer of `field.size` bytes at each position (0 past the end)."""
        inside = at + field.size <= len(buffer) - 8
        at = np.where(inside, at, 0)
        raw = buffer[at[:, None] + np.arange(field.size)]
        values = raw.view(f"<{'i' if field.signed else 'u'}{field.size}").ravel().astype("int64")
        return np.where(inside, values, 0)

    u64 = Field(0, 8)
    payloads = read(starts, u64)
    schema_ids = read(starts + 8, u64)
    sizes = read(starts + 16, u64)
    offsets = read(starts + 24, u64)
    domains = marks["domain_id"].to_numpy()
    parts = []
    for (domain, schema_id), layout in layouts.items():  # one or two layouts
        mine = np.flatnonzero((lengths >= 8 + _HEADER_ENTRY) & (payloads >= 1) & (domains == domain)
                              & (schema_ids == schema_id) & (offsets >= 8 + _HEADER_ENTRY)
                              & (offsets <= lengths) & (sizes <= lengths - offsets))
        if len(mine) == 0:
            continue
        base = starts[mine] + offsets[mine]
        payload_end = np.minimum(base + sizes[mine], ends[mine])
        count = np.where(base + layout.count.offset + layout.count.size <= payload_end,
                         read(base + layout.count.offset, layout.count), 0)
        room = np.maximum(payload_end - base - layout.frames_offset, 0) // layout.stride
        count = np.clip(count, 0, room)
        mark = np.repeat(mine, count)
        first = np.repeat(np.cumsum(count) - count, count)
        depth = np.arange(len(mark)) - first
        frame = np.repeat(base, count) + layout.frames_offset + depth * layout.stride
        parts.append(pd.DataFrame({
            "mark": mark, "depth": depth, "function_id": read(frame + layout.function.offset, layout.function),
            "file_id": read(frame + layout.file.offset, layout.file), "line": read(frame + layout.line.offset, layout.line),
        }))
    if not parts:
        return pd.DataFrame({c: np.zeros(0, "int64") for c in FRAME_COLUMNS})
    return pd.concat(parts, ignore_index=True).sort_values(["mark", "depth"], kind="stable", ignore_index=True)


def calls_of_marks(marks: pd.DataFrame, calls: pd.DataFrame) -> np.ndarray:
    """For each mark, the row of the memory API call on its thread whose [start, end] holds it
    (the latest-starting one), -1 when none does."""
    result = np.full(len(marks), -1, "int64")
    if len(marks) == 0 or len(calls) == 0:
        return result
    left = pd.DataFrame({"ts": marks["ts_ns"].to_numpy(dtype="int64"), "pid": marks["pid"].to_numpy(dtype="int64"),
                         "tid": marks["tid"].to_numpy(dtype="int64"), "mark": np.arange(len(marks))})
    right = pd.DataFrame({"ts": calls["ts_ns"].to_numpy(dtype="int64"), "pid": calls["pid"].to_numpy(dtype="int64"),
                          "tid": calls["tid"].to_numpy(dtype="int64"), "call": np.arange(len(calls))})
    matched = pd.merge_asof(left.sort_values("ts", kind="stable"), right.sort_values("ts", kind="stable"),
                            on="ts", by=["pid", "tid"], direction="backward")
    call = matched["call"].to_numpy(dtype="float64")
    found = ~np.isnan(call)
    rows = call[found].astype("int64")
    inside = calls["end_ns"].to_numpy()[rows] >= matched["ts"].to_numpy()[found]
    marks_found = matched["mark"].to_numpy()[found]
    result[marks_found[inside]] = rows[inside]
    return result
