"""Tiny hand-made nsys exports for edge cases (same tables and columns as real 2025.3 exports)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

PID = 4242
GLOBAL_PID = (1 << 48) | (PID << 24)  # VM id 1, as in real captures


def global_tid(tid: int = PID, pid: int = PID) -> int:
    return (1 << 48) | (pid << 24) | tid


def make_export(path: Path, memory: list[tuple] | None = None, calls: list[tuple] | None = None,
                nvtx: list[tuple] | None = None, memory_table: bool = True) -> Path:
    """Write a minimal export.

    memory: (start, address, bytes, op 0/1, correlationId[, memKind=2, pid=PID, device=0])
    calls:  (start, end, api name, correlationId[, returnValue=0, tid=PID, pid=PID])
    nvtx:   (start, end, text[, tid=PID, pid=PID])  push/pop ranges
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

    for row in calls or []:
        start, end, api, corr, *rest = row
        ret, tid, pid = (rest + [0, PID, PID][len(rest):])[:3]
        conn.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 0, ?, ?, ?, ?, NULL)",
                     (start, end, global_tid(tid, pid), corr, string_id(api), ret))
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
