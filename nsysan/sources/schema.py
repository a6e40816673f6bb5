"""Probe what an nsys SQLite export holds about its capture -> Schema.

Only this module, sqlite_file.py and `events/read*.py` know nsys table and column names. Exports from nsys 2020.3 to
2026 differ: the version table was renamed (`EXPORT_META_DATA` -> `META_DATA_EXPORT`), columns
were added mid-table, ENUM tables appeared in schema 3.0 and the 2022.4 `--lazy=false` export
leaves them empty, capture options are recorded only from 2023.3 on. So everything is probed by
name, with the known values as fallback (see ../shared/docs/nsys-schema.md).
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from ..errors import NsysanError
from .sqlite_file import COMPLETE_EXPORT_TABLES, EXPORT_META_TABLES, EXPORTED_TABLES, cell_text, connect_readonly, \
    tables_missing, tables_requested

if TYPE_CHECKING:
    # The model is imported where its classes are made, not with this module: the export imports this
    # module before nsys starts, and the model comes meanwhile, on the analyses' thread (issue 31).
    from ..model import Diagnostic, Gpu


def refuse_missing_tables(schema: "Schema", name: str) -> None:
    """Stop with one line when the export was made with `--tables` that leave out a table nsysan
    reads: read on, its numbers would be short with nothing to say so."""
    missing = tables_missing(tables_requested(schema.export_params))
    if missing:
        raise NsysanError(
            f"{name} was exported with --tables and may lack {', '.join(missing)}, which nsysan reads; "
            f"export the report again without --tables, or with --tables {','.join(EXPORTED_TABLES)}")


# ENUM_CUDA_MEM_KIND names -> nsysan kinds; the ids are the same in every schema seen (3.0 to
# 3.20) and are used when the ENUM table is missing (2.x) or empty (2022.4 --lazy=false).
MEM_KIND_BY_NAME = {
    "PAGEABLE": "pageable",
    "PINNED": "pinned",
    "DEVICE": "device",
    "ARRAY": "array",
    "MANAGED": "managed",
    "DEVICE_STATIC": "static",
    "MANAGED_STATIC": "managed_static",
    "UNKNOWN": "unknown",
}
MEM_KIND_FALLBACK = dict(enumerate(MEM_KIND_BY_NAME.values()))  # ids 0 to 7, in the order above
# ENUM_CUDA_DEV_MEM_EVENT_OPER: 0 allocation, 1 deallocation. Its `name` column does not start
# with ALLOC for frees, so map by id.
MEM_OP_FALLBACK = {0: "alloc", 1: "free"}

# Columns nsys writes NOT NULL in every schema seen (2.7.1 to 3.20) for the tables nsysan reads.
# A table that exists without one was altered or damaged: reading on with a default (every
# event an allocation, every kind "device") would give wrong numbers with no warning. Nullable
# or later columns (NVTX text, callchainId, streamId, ...) are optional and probed one by one.
REQUIRED_COLUMNS = {
    "CUDA_GPU_MEMORY_USAGE_EVENTS": ("start", "globalPid", "deviceId", "address", "bytes", "memKind",
                                     "memoryOperationType"),
    "CUPTI_ACTIVITY_KIND_RUNTIME": ("start", "globalTid", "correlationId", "nameId"),
    "NVTX_EVENTS": ("start", "eventType", "globalTid"),
    "CUDA_CALLCHAINS": ("id", "symbol", "module", "stackDepth"),
    "StringIds": ("id", "value"),
    "ThreadNames": ("nameId", "globalTid"),
}



@dataclass
class Schema:
    """What one export holds: tables, columns, versions, capture flags and lookup tables."""

    tables: dict[str, list[str]]  # table -> column names
    nsys_version: Optional[str] = None
    schema_version: Optional[str] = None
    export_params: dict[str, str] = field(default_factory=dict)
    memory_usage_requested: Optional[bool] = None
    backtraces_requested: Optional[bool] = None  # --cudabacktrace with memory calls, as recorded
    python_backtraces_requested: Optional[bool] = None  # --python-backtrace=cuda, as recorded
    sampling_requested: Optional[bool] = None  # CPU sampling (-s process-tree / system-wide), as recorded
    memory_backtrace_threshold_ns: Optional[int] = None  # --cudabacktrace=memory:<threshold>, as recorded
    # --cudabacktrace=all: stacks of kernel, synchronization and other calls too, as recorded
    all_backtraces_requested: Optional[bool] = None
    # --pytorch=autograd-nvtx or autograd-shapes-nvtx, as the trace shows it (nsys records no option
    # for it): PyTorch's operator ranges among the first NVTX rows; "" when none
    pytorch_nvtx: str = ""
    cuda_flush_ms: Optional[int] = None  # --cuda-flush-interval, as recorded (PROCESS_n:CUDA_FLUSH_PERIOD)
    # The program nsys launched (PROCESS_0:COMMAND and its ARGUMENT_n, never its environment) and
    # the traces the capture asked for (CAPTURE_EVENT_TYPE: Cuda, NvtxEvents, OSRuntime, ...):
    # what "capture again with" advice rebuilds the user's own command line from
    profiled_command: tuple[str, ...] = ()
    captured_event_types: tuple[str, ...] = ()
    has_backtraces: bool = False
    cuda_driver_version: Optional[str] = None
    duration_ns: Optional[int] = None
    session_start_utc_ns: Optional[int] = None  # when the capture's time 0 was, UTC epoch ns
    time_offset_ns: int = 0  # subtract from timestamps to get ns from the session start
    mem_kinds: dict[int, str] = field(default_factory=lambda: dict(MEM_KIND_FALLBACK))
    mem_ops: dict[int, str] = field(default_factory=lambda: dict(MEM_OP_FALLBACK))
    gpus: list[Gpu] = field(default_factory=list)
    cuda_device_to_gpu: dict[tuple[int, int], int] = field(default_factory=dict)  # (pid, ordinal)
    process_names: dict[int, str] = field(default_factory=dict)
    # PROCESS_<n> of META_DATA_CAPTURE -> {key: value} for the RANK_KEYS found in its recorded
    # environment, and PROCESS_<n> -> its PID as recorded (0 for a process nsys launched)
    rank_environment: dict[int, dict[str, str]] = field(default_factory=dict)
    launched_pids: dict[int, int] = field(default_factory=dict)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    # processes with blocks live when a capture begun while they ran started (events/read_start.py):
    # their steps may have no memory call at all, yet be found from their kernels
    capture_start_pids: tuple[int, ...] = ()

    def has(self, table: str, *columns: str) -> bool:
        cols = self.tables.get(table)
        return cols is not None and all(c in cols for c in columns)

    @property
    def memory_usage_collected(self) -> bool:
        return self.has("CUDA_GPU_MEMORY_USAGE_EVENTS", "start", "globalPid", "address", "bytes")

    @property
    def has_cuda_trace(self) -> bool:
        """The CUDA API trace was captured (its table exists, even empty)."""
        return "CUPTI_ACTIVITY_KIND_RUNTIME" in self.tables

    @property
    def has_nvtx_table(self) -> bool:
        """NVTX was traced (its table exists, even without push/pop ranges)."""
        return "NVTX_EVENTS" in self.tables



def open_readonly(path: Path, name: Optional[str] = None) -> sqlite3.Connection:
    """Open an export read-only (see connect_readonly), or say why it can't be read.
    `name` names the file in messages (a private snapshot stands for the user's file)."""
    try:
        conn = connect_readonly(path)
        conn.execute("SELECT name FROM sqlite_master LIMIT 1").fetchall()
    except sqlite3.DatabaseError as err:
        raise NsysanError(f"{name or Path(path).name} is not a readable SQLite file ({err}); it may be truncated "
                          "or damaged, so copy or export it again") from err
    return conn


def probe(conn: sqlite3.Connection, name: str = "the export") -> Schema:
    """Read the export's tables, versions, capture flags, GPUs and processes."""
    try:
        return _probe(conn, name)
    except sqlite3.DatabaseError as err:
        raise NsysanError(f"{name} could not be read as an nsys export ({err}); it may be truncated or "
                          "damaged, so copy or export it again") from err


def _probe(conn: sqlite3.Connection, name: str) -> Schema:
    table_names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    tables = {t: [r[1] for r in conn.execute(f"PRAGMA table_info({_quote(t)})")] for t in table_names}
    if not tables:
        raise NsysanError(f"{name} is an empty SQLite file, not an nsys export")
    if COMPLETE_EXPORT_TABLES.isdisjoint(tables):
        if set(tables) <= {"StringIds", "ProcessStreams"}:
            raise NsysanError(f"{name} is a partial nsys export (only StringIds/ProcessStreams): "
                              "the export failed; export the report again with an nsys at least "
                              "as new as the one that captured it")
        raise NsysanError(f"{name} is an SQLite file but not an nsys export (no nsys tables found)")
    _check_required_columns(tables, name)
    schema = Schema(tables=tables)
    _read_export_meta(conn, schema)
    _read_capture_meta(conn, schema)
    _read_rank_environment(conn, schema)
    _read_enums(conn, schema)
    _read_system_env(conn, schema)
    _read_session(conn, schema)
    _read_gpus(conn, schema)
    _read_processes(conn, schema)
    _read_nsys_diagnostics(conn, schema)
    schema.has_backtraces = "CUDA_CALLCHAINS" in tables and \
        conn.execute("SELECT 1 FROM CUDA_CALLCHAINS LIMIT 1").fetchone() is not None
    return schema


def _check_required_columns(tables: dict[str, list[str]], name: str) -> None:
    for table, required in REQUIRED_COLUMNS.items():
        missing = [c for c in required if table in tables and c not in tables[table]]
        if missing:
            raise NsysanError(f"{name} is a damaged nsys export: table {table} has no column "
                              f"{', '.join(missing)}, which every nsys export writes; export the report again")
    if "StringIds" not in tables and "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
        raise NsysanError(f"{name} is a damaged nsys export: it has CUDA API calls but no StringIds table "
                          "to name them; export the report again")


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


# A time shift (--ts-normalize: the session's UTC start, ~1.8e18 ns in 2026) is undone by a
# subtraction; beyond ±2^62 it would wrap 64-bit timestamps.
MAX_TIME_SHIFT_NS = 2**62


def _read_export_meta(conn: sqlite3.Connection, schema: Schema) -> None:
    from ..model import Diagnostic  # here: see the imports at the top

    for table in EXPORT_META_TABLES:
        if schema.has(table, "name", "value"):
            rows = conn.execute(f"SELECT name, value FROM {table}")
            schema.export_params.update((cell_text(name), cell_text(value)) for name, value in rows)
    schema.nsys_version = schema.export_params.get("EXPORT_PRODUCT_VERSION") or None
    schema.schema_version = schema.export_params.get("EXPORT_SCHEMA_VERSION") or None
    params = schema.export_params
    # --tables alone is no warning: an export lacking a table nsysan reads is refused (see
    # tables_missing), and one holding them all, as nsysan's own exports do, is complete for it.
    if params.get("EXPORT_PARAM_TIMES_TO_EXPORT"):
        schema.diagnostics.append(Diagnostic(
            "warning", "partial_export",
            "the export was made with --times, so it may hold only part of the capture; "
            "export the whole report for complete numbers"))
    if params.get("EXPORT_PARAM_TIME_NORMALIZE", "").lower() == "true" or _int(params.get("EXPORT_PARAM_TIME_SHIFT")):
        # --ts-normalize/--ts-shift moved every timestamp by EXPORT_CONFIG_TIME_SHIFT; undo it
        # so that times stay "ns from the session start" like in every other export.
        shift = _int(params.get("EXPORT_CONFIG_TIME_SHIFT")) or 0
        if abs(shift) < MAX_TIME_SHIFT_NS:
            schema.time_offset_ns = shift
        else:  # subtracting it would wrap 64-bit times: the export's record is damaged
            schema.diagnostics.append(Diagnostic(
                "warning", "bad_time_shift",
                f"the export says its times were shifted by {shift} ns, beyond ±2^62 ns (146 years); "
                "the shift was not undone, so times are as the export holds them"))


# The capture options read (META_DATA_CAPTURE names, 2023.x-2025.x): what advice about how to
# capture must know, so that it never asks for a flag the capture already used.
_CAPTURE_FLAGS = {":COLLECT_GPU_MEMORY_USAGE": "memory_usage_requested",
                  ":COLLECT_MEMORY_BACKTRACES": "backtraces_requested",
                  ":COLLECT_PYTHON_BACKTRACES": "python_backtraces_requested",
                  "LINUX_PERF_OPTIONS:COLLECT_IP_BACKTRACE_SAMPLES": "sampling_requested"}


def _read_capture_meta(conn: sqlite3.Connection, schema: Schema) -> None:
    # META_DATA_CAPTURE also holds PROCESS_n:ENVIRONMENT_VARIABLE rows (the profiled process's
    # whole environment, secrets included): they are left out in SQL, so no value of them ever
    # reaches Python, and only the flags named here are looked at.
    if not schema.has("META_DATA_CAPTURE", "name", "value"):
        return
    found: dict[str, list[bool]] = {}
    rows = conn.execute("SELECT name, CAST(substr(value, 1, 100) AS TEXT) FROM META_DATA_CAPTURE "
                        "WHERE name NOT GLOB '*ENVIRONMENT*'").fetchall()
    for name, value in rows:
        key, text = cell_text(name), cell_text(value).strip().lower()
        for suffix, attribute in _CAPTURE_FLAGS.items():
            if key.endswith(suffix):
                found.setdefault(attribute, []).append(text == "true")
        if key.endswith(":CUDA_FLUSH_PERIOD") and _int(text) is not None:
            schema.cuda_flush_ms = max(schema.cuda_flush_ms or 0, _int(text))
        if key.endswith(":MEMORY_BACKTRACES_THRESHOLD_NS") and _int(text) is not None:
            schema.memory_backtrace_threshold_ns = max(schema.memory_backtrace_threshold_ns or 0, _int(text))
    for attribute, flags in found.items():
        setattr(schema, attribute, any(flags))
    kinds = [[cell_text(value).strip().lower() == "true" for name, value in rows if cell_text(name).endswith(suffix)]
             for suffix in _OTHER_BACKTRACES]
    if all(kinds):
        schema.all_backtraces_requested = all(any(flags) for flags in kinds) and bool(schema.backtraces_requested)
    schema.pytorch_nvtx = _pytorch_nvtx(conn, schema)
    schema.captured_event_types = tuple(dict.fromkeys(cell_text(value) for name, value in rows
                                                      if cell_text(name) == "CAPTURE_EVENT_TYPE"))
    schema.profiled_command = _profiled_command(conn)


_OTHER_BACKTRACES = (":COLLECT_KERNEL_BACKTRACES", ":COLLECT_SYNCHRONOIZATION_BACKTRACES", ":COLLECT_OTHER_BACKTRACES")
# PyTorch's operator ranges (--pytorch) are looked for among this many first NVTX rows: a bounded
# read on any capture (a plain LIMIT, no filter that could scan the table); with the option on,
# operators (model.to(), the first forward) outnumber the user's ranges from the start.
PYTORCH_PROBE_ROWS = 5000


def _pytorch_nvtx(conn: sqlite3.Connection, schema: Schema) -> str:
    """`--pytorch=` value the trace shows: "autograd-shapes-nvtx" when operator ranges carry
    `sizes = `, "autograd-nvtx" without; "" when the first NVTX rows hold no operator."""
    if not schema.has("NVTX_EVENTS", "text"):
        return ""
    texts = [cell_text(t) for (t,) in conn.execute(
        "SELECT CAST(substr(text, 1, 200) AS TEXT) FROM (SELECT text FROM NVTX_EVENTS LIMIT ?)",
        (PYTORCH_PROBE_ROWS,)) if t is not None]
    operators = [t for t in texts if ", seq = " in t or ", op_id = " in t]
    if not operators:
        return ""
    return "autograd-shapes-nvtx" if any(", sizes = " in t for t in operators) else "autograd-nvtx"


# A command line shown in advice: at most this many arguments of at most this many characters
COMMAND_ARGUMENTS, COMMAND_ARGUMENT_CHARS = 40, 300


def _profiled_command(conn: sqlite3.Connection) -> tuple[str, ...]:
    """PROCESS_0's command and arguments as nsys recorded them, in order (empty when not recorded)."""
    rows = conn.execute("SELECT name, CAST(substr(value, 1, ?) AS TEXT) FROM META_DATA_CAPTURE "
                        "WHERE name = 'PROCESS_0:COMMAND' OR name GLOB 'PROCESS_0:ARGUMENT_[0-9]*'",
                        (COMMAND_ARGUMENT_CHARS,)).fetchall()
    parts = {}
    for name, value in rows:
        key = cell_text(name)
        position = -1 if key.endswith(":COMMAND") else _int(key.rsplit("_", 1)[-1])
        if position is not None and position < COMMAND_ARGUMENTS:
            parts[position] = cell_text(value)
    return tuple(parts[k] for k in sorted(parts)) if -1 in parts else ()


# The only environment variables nsysan ever reads: what names a process's place in a
# multi-process job (torchrun/torch.distributed, Open MPI, Slurm, PMI). Filtered in SQL, so no
# other variable of the profiled process's environment (tokens, keys) even reaches Python.
RANK_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
             "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "PMI_RANK", "PMI_SIZE")
_PROCESS_KEY = re.compile(r"^PROCESS_(\d+):")


def _read_rank_environment(conn: sqlite3.Connection, schema: Schema) -> None:
    """RANK_KEYS of each recorded process environment (nsys 2023.3+ writes the environment of the
    process it launched as `PROCESS_<n>:ENVIRONMENT_VARIABLE` rows, `KEY="value"`)."""
    if not schema.has("META_DATA_CAPTURE", "name", "value"):
        return
    # GLOB is case-sensitive and `[=]` ends the key, so RANK matches neither LOCAL_RANK nor RANKS
    keys = " OR ".join(f"value GLOB '{key}[=]*'" for key in RANK_KEYS)
    sql = ("SELECT name, CAST(substr(value, 1, 100) AS TEXT) FROM META_DATA_CAPTURE "
           f"WHERE name GLOB 'PROCESS_*:ENVIRONMENT_VARIABLE' AND ({keys})")
    for name, value in conn.execute(sql):
        index = _PROCESS_KEY.match(cell_text(name))
        key, _, raw = cell_text(value).partition("=")
        number = _int(raw.strip().strip('"'))
        if index and key in RANK_KEYS and number is not None:
            schema.rank_environment.setdefault(int(index.group(1)), {})[key] = str(number)
    for name, value in conn.execute("SELECT name, value FROM META_DATA_CAPTURE WHERE name GLOB 'PROCESS_*:PID'"):
        index, pid = _PROCESS_KEY.match(cell_text(name)), _int(value)
        if index and pid is not None:
            schema.launched_pids[int(index.group(1))] = pid


def _read_enums(conn: sqlite3.Connection, schema: Schema) -> None:
    if schema.has("ENUM_CUDA_MEM_KIND", "id", "name"):
        for enum_id, enum_name in conn.execute("SELECT id, name FROM ENUM_CUDA_MEM_KIND"):
            suffix = cell_text(enum_name).removeprefix("CUDA_MEMOPR_MEMORY_KIND_")
            if suffix in MEM_KIND_BY_NAME and isinstance(enum_id, int):
                schema.mem_kinds[enum_id] = MEM_KIND_BY_NAME[suffix]
    if schema.has("ENUM_CUDA_DEV_MEM_EVENT_OPER", "id", "name"):
        for enum_id, enum_name in conn.execute("SELECT id, name FROM ENUM_CUDA_DEV_MEM_EVENT_OPER"):
            text = cell_text(enum_name).upper()
            if isinstance(enum_id, int) and text.endswith("DEALLOCATION"):
                schema.mem_ops[enum_id] = "free"
            elif isinstance(enum_id, int) and text.endswith("ALLOCATION"):
                schema.mem_ops[enum_id] = "alloc"


def _read_system_env(conn: sqlite3.Connection, schema: Schema) -> None:
    # Only named, harmless rows are read: TARGET_INFO_SYSTEM_ENV also holds host names and, in
    # 2022.4, binary blobs (GpuInfo).
    if not schema.has("TARGET_INFO_SYSTEM_ENV", "name", "value"):
        return
    row = conn.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'CudaDriverVersion' "
                       "LIMIT 1").fetchone()
    version = _int(row[0]) if row else None
    if version:  # 13000 -> "13.0", 12020 -> "12.2"
        schema.cuda_driver_version = f"{version // 1000}.{(version % 1000) // 10}"


def _read_session(conn: sqlite3.Connection, schema: Schema) -> None:
    if schema.has("ANALYSIS_DETAILS", "duration"):
        row = conn.execute("SELECT max(duration) FROM ANALYSIS_DETAILS").fetchone()
        schema.duration_ns = _int(row[0]) if row else None
    if schema.has("TARGET_INFO_SESSION_START_TIME", "utcEpochNs"):
        # Time 0 of every timestamp (verified with --ts-normalize, nsys-schema.md 2.2): what puts
        # wall-clock logs such as nvidia-smi's on the trace's clock.
        row = conn.execute("SELECT max(utcEpochNs) FROM TARGET_INFO_SESSION_START_TIME").fetchone()
        schema.session_start_utc_ns = _int(row[0]) if row else None


def _read_gpus(conn: sqlite3.Connection, schema: Schema) -> None:
    from ..model import Gpu  # here: see the imports at the top

    if schema.has("TARGET_INFO_GPU", "id"):
        cols = schema.tables["TARGET_INFO_GPU"]
        want = [c for c in ("id", "name", "totalMemory", "uuid", "busLocation") if c in cols]
        for row in conn.execute(f"SELECT {', '.join(want)} FROM TARGET_INFO_GPU ORDER BY id"):
            rec = dict(zip(want, row))
            gpu_id = _int(rec.get("id"))
            if gpu_id is None or any(gpu.id == gpu_id for gpu in schema.gpus):  # a GPU once
                continue
            schema.gpus.append(Gpu(id=gpu_id, name=cell_text(rec.get("name")) or f"GPU {gpu_id}",
                                   total_memory_bytes=_int(rec.get("totalMemory")) or None,
                                   uuid=cell_text(rec.get("uuid")) or None,
                                   bus=cell_text(rec.get("busLocation")) or None))
    if schema.has("TARGET_INFO_CUDA_DEVICE", "gpuId", "cudaId", "pid"):
        for row in conn.execute("SELECT gpuId, cudaId, pid FROM TARGET_INFO_CUDA_DEVICE"):
            gpu_id, cuda_id, pid = (_int(v) for v in row)
            if None not in (gpu_id, cuda_id, pid):
                schema.cuda_device_to_gpu[(pid, cuda_id)] = gpu_id


def _read_processes(conn: sqlite3.Connection, schema: Schema) -> None:
    if schema.has("PROCESSES", "pid", "name"):
        for pid, name in conn.execute("SELECT pid, name FROM PROCESSES"):
            if isinstance(pid, int):
                schema.process_names[pid] = cell_text(name)[:200]


_NSYS_TROUBLE = re.compile(r"lost|drop|overflow|truncat|fail|not supported|incomplete|corrupt", re.I)


def _read_nsys_diagnostics(conn: sqlite3.Connection, schema: Schema) -> None:
    """Carry nsys's own warnings about lost or missing data into the analysis."""
    from ..model import Diagnostic  # here: see the imports at the top

    if not schema.has("DIAGNOSTIC_EVENT", "severity", "text"):
        return
    # Severity 2 = Warning, 3 = Error (ENUM_DIAGNOSTIC_SEVERITY_LEVEL); most rows are Info.
    rows = conn.execute("SELECT DISTINCT severity, substr(text, 1, 300) FROM DIAGNOSTIC_EVENT "
                        "WHERE severity IN (2, 3) LIMIT 200").fetchall()
    for severity, text in rows:
        text = cell_text(text)
        if severity == 3 or _NSYS_TROUBLE.search(text):
            one_line = " ".join(text.split())[:300]
            schema.diagnostics.append(Diagnostic("warning", "nsys_diagnostic",
                                                 f"nsys reported during the capture: {one_line}"))


def _int(value: object) -> Optional[int]:
    """An integer cell as int, or None when it is NULL, not a whole number or beyond 64 bits
    (damaged exports put text, REALs and blobs anywhere; numpy would overflow on the rest)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, float):  # a REAL where nsys writes integers: only whole, finite ones count
        value = int(value) if value.is_integer() else None
    elif not isinstance(value, int):
        try:
            value = int(cell_text(value).strip())
        except ValueError:
            return None
    return value if value is not None and -2**63 <= value < 2**63 else None

