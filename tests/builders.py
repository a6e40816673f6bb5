"""Tiny hand-made nsys exports for edge cases (same tables and columns as real 2025.3 exports)."""

from __future__ import annotations

import sqlite3
import struct
from pathlib import Path

PID = 4242
GLOBAL_PID = (1 << 48) | (PID << 24)  # VM id 1, as in real captures


def global_tid(tid: int = PID, pid: int = PID) -> int:
    return (1 << 48) | (pid << 24) | tid


def make_export(path: Path, memory: list[tuple] | None = None, calls: list[tuple] | None = None,
                nvtx: list[tuple] | None = None, memory_table: bool = True,
                stacks: dict[int, list[tuple[str, str]]] | None = None,
                python_stacks: dict[int, list[tuple[str, str, int]]] | None = None) -> Path:
    """Write a minimal export.

    memory: (start, address, bytes, op 0/1, correlationId[, memKind=2, pid=PID, device=0])
    calls:  (start, end, api name, correlationId[, returnValue=0, tid=PID, pid=PID])
    nvtx:   (start, end, text[, tid=PID, pid=PID])  push/pop ranges
    stacks: correlationId -> native frames (symbol, module), innermost first (CUDA_CALLCHAINS)
    python_stacks: correlationId -> Python frames (function, file, line), innermost first: an NVTX
            mark of the "Python Backtrace on CUDA" domain at the call's start, laid out as 2025.3 does
    """
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE META_DATA_EXPORT (name TEXT NOT NULL, value TEXT);
        CREATE TABLE ANALYSIS_DETAILS (globalVid INTEGER, duration INTEGER, startTime INTEGER, stopTime INTEGER);
        CREATE TABLE TARGET_INFO_GPU (vmId INTEGER, id INTEGER, name TEXT, totalMemory INTEGER, uuid TEXT,
                                      busLocation TEXT);
        CREATE TABLE PROCESSES (globalPid INTEGER, pid INTEGER, name TEXT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL,
            eventClass INTEGER NOT NULL, globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL,
            returnValue INTEGER NOT NULL, callchainId INTEGER);
        CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL,
            rangeId INTEGER, category INTEGER, color INTEGER, text TEXT, globalTid INTEGER,
            endGlobalTid INTEGER, textId INTEGER, domainId INTEGER);
    """)
    conn.executemany("INSERT INTO META_DATA_EXPORT VALUES (?, ?)",
                     [("EXPORT_PRODUCT_VERSION", "2025.3.2.0"), ("EXPORT_SCHEMA_VERSION", "3.20.3")])
    conn.execute("INSERT INTO ANALYSIS_DETAILS VALUES (?, ?, ?, ?)", (1 << 48, 10_000_000, 0, 10_000_000))
    conn.execute("INSERT INTO TARGET_INFO_GPU VALUES (?, 0, 'Test GPU', ?, 'uuid', '0000:00:01.0')",
                 (1 << 48, 1 << 30))
    conn.execute("INSERT INTO PROCESSES VALUES (?, ?, 'app')", (GLOBAL_PID, PID))
    if memory_table:
        conn.execute("""CREATE TABLE CUDA_GPU_MEMORY_USAGE_EVENTS (start INTEGER NOT NULL,
            globalPid INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL,
            address INTEGER NOT NULL, pc INTEGER NOT NULL, bytes INTEGER NOT NULL, memKind INTEGER NOT NULL,
            memoryOperationType INTEGER NOT NULL, name TEXT, correlationId INTEGER, streamId INTEGER,
            localMemoryPoolAddress INTEGER)""")
    names: dict[str, int] = {}

    def string_id(text: str) -> int:
        if text not in names:
            names[text] = len(names) + 1
            conn.execute("INSERT INTO StringIds VALUES (?, ?)", (names[text], text))
        return names[text]

    if stacks:
        conn.execute("""CREATE TABLE CUDA_CALLCHAINS (id INTEGER NOT NULL, symbol INTEGER NOT NULL,
            module INTEGER NOT NULL, unresolved INTEGER, originalIP INTEGER, stackDepth INTEGER NOT NULL)""")
    chain_of = {corr: chain for chain, corr in enumerate(sorted(stacks or {}))}
    for corr, frames in (stacks or {}).items():
        for depth, (symbol, module) in enumerate(frames):
            conn.execute("INSERT INTO CUDA_CALLCHAINS VALUES (?, ?, ?, ?, 0, ?)",
                         (chain_of[corr], string_id(symbol), string_id(module),
                          1 if symbol.startswith("0x") else None, depth))
    if python_stacks:
        _python_backtrace_tables(conn)
    for row in calls or []:
        start, end, api, corr, *rest = row
        ret, tid, pid = (rest + [0, PID, PID][len(rest):])[:3]
        conn.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 0, ?, ?, ?, ?, ?)",
                     (start, end, global_tid(tid, pid), corr, string_id(api), ret, chain_of.get(corr)))
        if corr in (python_stacks or {}):
            frames = [(string_id(function), string_id(file), line) for function, file, line in python_stacks[corr]]
            conn.execute("INSERT INTO NVTX_EVENTS (start, eventType, globalTid, domainId, binaryData) "
                         "VALUES (?, 34, ?, 1, ?)", (start, global_tid(tid, pid), python_backtrace_blob(frames)))
    for row in memory or []:
        start, address, size, op, corr, *rest = row
        kind, pid, device = (rest + [2, PID, 0][len(rest):])[:3]
        conn.execute("INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS VALUES (?, ?, ?, 1, ?, 0, ?, ?, ?, NULL, ?, NULL, NULL)",
                     (start, (1 << 48) | (pid << 24), device, address, size, kind, op, corr))
    for row in nvtx or []:
        start, end, text, *rest = row
        tid, pid = (rest + [PID, PID][len(rest):])[:2]
        conn.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES (?, ?, 59, ?, ?)",
                     (start, end, text, global_tid(tid, pid)))
    conn.commit()
    conn.close()
    return path


PYTHON_BACKTRACE_SCHEMA, PYTHON_FRAME_SCHEMA = 4294967301, 4294967299  # the ids 2025.3 gave them


def _python_backtrace_tables(conn: sqlite3.Connection) -> None:
    """The domain, payload schemas and entries of --python-backtrace=cuda, as in torch_pybt_v25."""
    conn.executescript("""
        ALTER TABLE NVTX_EVENTS ADD COLUMN binaryData TEXT;
        CREATE TABLE NVTX_PAYLOAD_SCHEMAS (domainId INTEGER, schemaId INTEGER, name TEXT, type INTEGER,
            flags INTEGER, numEntries INTEGER, payloadSize INTEGER, alignTo INTEGER);
        CREATE TABLE NVTX_PAYLOAD_SCHEMA_ENTRIES (domainId INTEGER, schemaId INTEGER, idx INTEGER, flags INTEGER,
            type INTEGER, name TEXT, description TEXT, arrayOrUnionDetail INTEGER, "offset" INTEGER);
    """)
    conn.execute("INSERT INTO NVTX_EVENTS (start, eventType, text, globalTid, domainId) VALUES (0, 75, ?, ?, 1)",
                 ("Python Backtrace on CUDA", global_tid()))
    conn.executemany("INSERT INTO NVTX_PAYLOAD_SCHEMAS VALUES (1, ?, ?, ?, NULL, ?, ?, NULL)", [
        (PYTHON_BACKTRACE_SCHEMA, "Python Backtrace on CUDA", 2, 4, None), (PYTHON_FRAME_SCHEMA, None, 1, 3, 24)])
    conn.executemany("INSERT INTO NVTX_PAYLOAD_SCHEMA_ENTRIES VALUES (1, ?, ?, ?, ?, ?, NULL, ?, ?)", [
        (PYTHON_BACKTRACE_SCHEMA, 0, None, 18, "Thread state ID", None, None),
        (PYTHON_BACKTRACE_SCHEMA, 1, None, 4294967300, "Thread state", None, 8),
        (PYTHON_BACKTRACE_SCHEMA, 2, None, 16, "Frames count", None, 12),
        (PYTHON_BACKTRACE_SCHEMA, 3, 48, PYTHON_FRAME_SCHEMA, "Frames", 2, 16),
        (PYTHON_FRAME_SCHEMA, 0, None, 80, "Function", None, None),
        (PYTHON_FRAME_SCHEMA, 1, None, 80, "File", None, 8),
        (PYTHON_FRAME_SCHEMA, 2, None, 15, "Line", None, 16)])


def python_backtrace_blob(frames: list[tuple[int, int, int]]) -> bytes:
    """A mark's payload: a 32-byte header (payloads, schema id, size, offset), then thread state id,
    state, frame count and the frames (function id, file id, line), as nsys 2025.3 writes them. The
    4 bytes after each 4-byte line are not zeroed there, so they are not here either."""
    payload = struct.pack("<QII", 1, 1, len(frames)) + b"".join(
        struct.pack("<QQi", function, file, line) + b"\xa7\x69\x72\x69" for function, file, line in frames)
    return struct.pack("<QQQQ", 1, PYTHON_BACKTRACE_SCHEMA, len(payload), 32) + payload
