"""Read query results into DataFrames, fast.

Measured on a 10-million-row memory table: Python's sqlite3 `fetchall` takes 15 s and
`pandas.read_sql` 25 s, while the ADBC SQLite driver hands the rows to Arrow in about the time
the sqlite3 shell needs to scan them (5 s). So large queries go through ADBC; the standard
library is the fallback when ADBC is not installed or gives up on a file (it infers a column's
type from its first rows and fails on a damaged export that mixes types in one column).
"""

from __future__ import annotations

import collections
import mmap
import os
import sqlite3
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Iterator, Optional

import numpy as np
import pandas as pd

from ..runtime.malloc_tuning import glibc

try:  # optional at import time, so a broken pyarrow install never stops the analysis
    # The driver's low-level API, not its DB-API module: that one imports pyarrow.dataset, 20 ms
    # of every start for nothing read here.
    import adbc_driver_manager as _adbc
    import adbc_driver_sqlite as _adbc_sqlite
    import pyarrow as _pa
    import pyarrow.compute as _pc
except Exception:  # pragma: no cover - depends on the environment
    _adbc = None
    _adbc_sqlite = None
    _pa = None
    _pc = None
# How the ADBC SQLite driver prints a REAL when it turns a mixed-type column into text ("%e").
_DRIVER_FLOAT_TEXT = r"^[-+]?(\d\.\d{6}e[-+]\d{2,}|inf|nan)$"


BATCH_ROWS = 1 << 18


def database_path(conn: sqlite3.Connection) -> Optional[str]:
    """The file behind a connection (for opening a second, faster one on it)."""
    # As bytes: a file name that is not UTF-8 must come back as the same bytes (os.fsdecode),
    # not with U+FFFD in place of them. (Not by switching the connection's text_factory: other
    # threads read through it at the same time.)
    row = conn.execute("SELECT CAST(file AS BLOB) FROM pragma_database_list WHERE name = 'main'").fetchone()
    return os.fsdecode(row[0]) if row and row[0] else None


def read_frame(conn: sqlite3.Connection, sql: str, columns: list[str]) -> pd.DataFrame:
    """Run a query and return its rows as a DataFrame with the given column names.

    Integer columns with NULLs come back as pandas nullable Int64 (never float64: globalTid and
    addresses need all 64 bits); text columns as Python strings.
    """
    path = database_path(conn) if _adbc is not None else None
    if path:
        try:
            return _read_with_adbc(path, sql, columns)
        except Exception:  # noqa: BLE001 - any driver failure falls back to the standard library
            pass
    rows = conn.execute(sql).fetchall()
    if not rows:
        return pd.DataFrame({c: pd.Series(dtype="object") for c in columns})
    return pd.DataFrame.from_records(rows, columns=columns)


def read_table(conn: sqlite3.Connection, table: str, select: str, columns: list[str], where: str = "",
               workers: Optional[int] = None) -> pd.DataFrame:
    """`SELECT {select} FROM {table} [WHERE {where}]` as a DataFrame, rows in rowid order, read by
    several threads at once, each scanning its own rowid range on its own connection.

    SQLite decodes rows on one core per connection, and the ADBC driver releases the GIL while it
    does: on a 10-million-row memory table, one scan takes 4.6 s and two threads on two cores
    2.5 s. Small tables, in-memory databases and tables without a usable rowid are read in one go.
    """
    one_scan = f"SELECT {select} FROM {table}" + (f" WHERE {where}" if where else "")
    path = database_path(conn) if _adbc is not None else None
    ranges = _rowid_ranges(conn, table, workers or usable_cpus()) if path else None
    if not ranges:
        return read_frame(conn, one_scan, columns)
    # Each range writes into its own slice of one array per column, sized for the rowid span:
    # np.empty pages cost nothing until written, and when every rowid is a row (exports are
    # written by appending, so they are) the arrays come out whole, without a 700 MB copy.
    span = ranges[-1][1] - ranges[0][0] + 1
    try:
        whole = [np.empty(span, "int64") for _ in columns]
    except MemoryError:  # rowids far apart (a hand-made file) on a machine that does not overcommit
        return read_frame(conn, one_scan, columns)
    slices = []
    for low, high in ranges:
        at = low - ranges[0][0]
        slices.append([_Filled(high - low + 1, column[at:at + high - low + 1]) for column in whole])
    sqls = _range_queries(table, select, ranges, where)
    try:
        with ThreadPoolExecutor(max_workers=len(sqls)) as pool:
            chunks = list(pool.map(lambda job: _read_parts(path, job[0], columns, job[1]), zip(sqls, slices)))
    except Exception:  # noqa: BLE001 - any driver failure: the one-scan path, with its own fallback
        return read_frame(conn, one_scan, columns)
    data = {}
    for i, name in enumerate(columns):
        filled = [chunk_slices[i] for chunk_slices in slices]
        if all(f is not None and f.complete_view() for f in filled):
            data[name] = whole[i]
        else:  # gaps (a WHERE, deleted rows), NULLs or text: join what each range read
            data[name] = _concatenate([part for f, chunk in zip(filled, chunks)
                                       for part in (f.parts() if f is not None else []) + chunk[i]])
        whole[i] = None
        for f in filled:
            if f is not None:  # its slice and mask: freed once the column is joined
                f.values, f.mask = np.zeros(0, "int64"), None
    return pd.DataFrame(data, copy=False)


# Rowids per chunk of read_converted: a chunk's raw columns (8 bytes a value) stay a few dozen MB.
CHUNK_ROWIDS = 1 << 20
# A smaller table is cut into one chunk per core, of at least this many rowids (a connection and
# a thread each): the GPT-2 capture's 258k API rows were one 35 ms scan on one core while the
# others waited (issue 31).
SPLIT_MIN_ROWIDS = 1 << 16


def read_converted(conn: sqlite3.Connection, table: str, select: str, columns: list[str],
                   convert: Callable[[pd.DataFrame], dict[str, np.ndarray]], where: str = "") -> dict[str, np.ndarray]:
    """`convert` applied to `SELECT {select} FROM {table} [WHERE {where}]`, chunk by chunk: the
    arrays it returns for each chunk of rows (in rowid order), joined.

    For tables read only to be turned into fewer, smaller columns: read_table would hold every
    raw column of every row (8 bytes a value) next to the result; here only the chunks being
    read are raw (at 1e7 memory API calls among 2e7 API rows: 0.9 GB of raw columns avoided).
    `convert` works on one chunk's rows alone and runs on the reading threads. A table without
    a usable rowid, or one the fast driver can't read, is read whole and converted once.
    """
    path = database_path(conn) if _adbc is not None else None
    ranges = _rowid_ranges(conn, table, 1) if path else None
    if ranges:
        low, high = ranges[0]
        cores = usable_cpus()
        step = min(CHUNK_ROWIDS, max(SPLIT_MIN_ROWIDS, -(-(high - low + 1) // cores)))
        grid = chunk_grid(conn, table, low, high, step)
        sqls = _range_queries(table, select, grid, where)
        try:
            with ThreadPoolExecutor(max_workers=min(len(sqls), cores)) as pool:
                return _joined_in_order(pool.map(lambda sql: convert(_read_with_adbc(path, sql, columns)), sqls), grid)
        except Exception:  # noqa: BLE001 - any driver failure: the whole-table path, with its own fallback
            pass
    return convert(read_table(conn, table, select, columns, where=where))


def read_chunks(conn: sqlite3.Connection, table: str, select: str, columns: list[str],
                chunk_rowids: Optional[int] = None, rowids: Optional[tuple[int, int]] = None,
                where: str = "", ahead: int = 1) -> Iterator[pd.DataFrame]:
    """`SELECT {select} FROM {table} [WHERE {where}]` (`rowids`: those between two rowids alone)
    as frames of `chunk_rowids` rowids (CHUNK_ROWIDS), in rowid order; the next chunk (the next
    `ahead` ones, each on a thread of its own) is read while the caller works on this one (the
    driver releases the GIL while SQLite scans). A table without a usable rowid, or one the fast
    driver can't read, comes as one frame."""
    path = database_path(conn) if _adbc is not None else None
    ranges = _rowid_ranges(conn, table, 1) if path else None
    if not ranges:
        span = f"rowid BETWEEN {rowids[0]} AND {rowids[1]}" if rowids else ""
        both = " AND ".join(f"({c})" for c in (span, where) if c)
        yield read_frame(conn, f"SELECT {select} FROM {table}" + (f" WHERE {both}" if both else ""), columns)
        return
    low, high = rowids or ranges[0]
    grid = chunk_grid(conn, table, low, high, chunk_rowids or CHUNK_ROWIDS)
    yield from _read_ahead(conn, path, _range_queries(table, select, grid, where), columns, ahead)


def chunk_grid(conn: sqlite3.Connection, table: str, low: int, high: int, step: int) -> list[tuple[int, int]]:
    """The rowid ranges read_chunks reads between `low` and `high`: `step` rowids each, the next
    starting at the first rowid after the last one that holds a row (one b-tree descent). In an
    export every rowid is a row and the chunks are `low + k * step`; in a table whose rowids jump
    (a row moved to rowid 2^32, rows deleted) the empty stretches are stepped over instead of read
    as thousands of empty chunks (12,000 rows ending at rowid 2^32: 16,000 queries and a minute
    of streaming, now as many chunks as the rows fill). Every reader of the chunks of one table
    (the events, their first starts, their runs) gets the same grid from here."""
    chunks: list[tuple[int, int]] = []
    start = low
    while start <= high:
        end = min(start + step, high + 1) - 1
        chunks.append((start, end))
        if end >= high:
            break
        try:
            (following,) = conn.execute(f"SELECT min(rowid) FROM {table} WHERE rowid > ?", (end,)).fetchone()
        except sqlite3.Error:  # a damaged page: the rest in plain steps, whose reads meet it and say so
            chunks += [(a, min(a + step, high + 1) - 1) for a in range(end + 1, high + 1, step)]
            break
        if not isinstance(following, int) or following > high:
            break
        start = following
    return chunks


def read_rowid_ranges(conn: sqlite3.Connection, table: str, select: str, columns: list[str],
                      ranges: list[tuple[int, int]], where: str = "") -> Iterator[pd.DataFrame]:
    """`SELECT {select} FROM {table} WHERE {where}` of the rows of each rowid range in `ranges`
    (read_chunks' chunks, in any order), one frame per range in that order, the next read on a
    second thread while the caller works on this one."""
    path = database_path(conn) if _adbc is not None else None
    yield from _read_ahead(conn, path, _range_queries(table, select, ranges, where), columns)


def _range_queries(table: str, select: str, ranges: list[tuple[int, int]], where: str = "") -> list[str]:
    """`SELECT {select} FROM {table} [WHERE {where}]` of the rows of each rowid range, one query each."""
    condition = f" AND ({where})" if where else ""
    return [f"SELECT {select} FROM {table} WHERE rowid BETWEEN {low} AND {high}{condition}" for low, high in ranges]


def _read_ahead(conn: sqlite3.Connection, path: Optional[str], sqls: list[str],
                columns: list[str], ahead: int = 1) -> Iterator[pd.DataFrame]:
    """The frame of each query, the next `ahead` ones read by the fast driver on threads of their
    own (without it, or when it fails, through the standard library on this one)."""
    if not sqls:
        return

    def fast(sql: str) -> Optional[pd.DataFrame]:
        if path is None:
            return None
        try:
            return _read_with_adbc(path, sql, columns)
        except Exception:  # noqa: BLE001 - read again through the standard library below
            return None

    with ThreadPoolExecutor(max_workers=ahead) as pool:
        reads = collections.deque(pool.submit(fast, sql) for sql in sqls[:ahead])
        for i, sql in enumerate(sqls):
            frame = reads.popleft().result()
            if i + ahead < len(sqls):
                reads.append(pool.submit(fast, sqls[i + ahead]))
            yield frame if frame is not None else read_frame(conn, sql, columns)


def reads_in_chunks(conn: sqlite3.Connection, table: str) -> bool:
    """Whether read_chunks reads `table` chunk by chunk (else as one frame)."""
    return _adbc is not None and database_path(conn) is not None and _rowid_ranges(conn, table, 1) is not None


def _joined_in_order(parts: Iterable[dict[str, np.ndarray]], grid: list[tuple[int, int]]) -> dict[str, np.ndarray]:
    """The chunks' arrays (`parts`, one per rowid range of `grid`, in its order) joined column by
    column: each written, chunk by chunk as each comes, into an array with room for every rowid
    (_room_for: pages of its own, none of them memory until written), and the chunk let go. A
    column with fewer rows (the rows of a WHERE) keeps the room it did not fill as address space
    only. Kept until every chunk was read, then joined, the chunks and the joined columns were held
    together (1e7 memory events: 0.5 GiB of the memory table's chunks; the memory API calls' 371 MiB
    twice, the command line's highest memory). A column whose chunks differ in type (a damaged
    export's), or for which there is no room, is joined at the end from its chunks, each column's
    let go once it is joined."""
    rows = sum(high - low + 1 for low, high in grid)
    joined: dict[str, object] = {}  # name -> _Filled, or the list of its chunks
    for part in parts:
        for name, values in part.items():
            if name not in joined:
                joined[name] = _room_for(rows, values)
            into = joined[name]
            if isinstance(into, _Filled) and (values.dtype != into.values.dtype or not into.add(values)):
                joined[name] = into = into.parts()
            if isinstance(into, list):
                into.append(values)
        part.clear()
    done = {}
    for name in list(joined):
        into = joined.pop(name)
        done[name] = _concatenate(into) if isinstance(into, list) else _filled_part(into.values, into.offset)
        del into
    return done


def _room_for(rows: int, values: object) -> object:
    """A _Filled with room for `rows` values of the type of `values` (a list for _concatenate when
    there is none: text, or no memory or address space for it).

    In a mapping of its own, not in the C heap: the reading threads' raw chunks and Arrow batches
    come and go between the columns written there, and what they leave is not handed back (the
    command's allocator keeps large arrays on the heap, runtime/malloc_tuning.py): measured at 1e7
    events, the command line's peak 1,811-1,837 -> 1,550-1,570 MiB, the columns the same. Its pages are memory
    once written, and go back to the system the moment the column is let go."""
    if not isinstance(values, np.ndarray) or values.dtype == object:
        return []
    try:
        if os.name != "posix":
            return _Filled(rows, np.empty(rows, values.dtype))
        mapping = mmap.mmap(-1, max(1, rows * values.dtype.itemsize), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        return _Filled(rows, np.frombuffer(mapping, values.dtype, rows))
    except (MemoryError, OSError, ValueError):  # a table far larger than its rows, on a machine that doesn't overcommit
        return []


def _filled_part(values: np.ndarray, used: int) -> np.ndarray:
    """The `used` values written at the start of `values`, an array nothing else refers to."""
    if used == len(values):
        return values
    if values.base is None:  # the C heap's (np.empty): cut in place, the rest given back
        values.resize(used, refcheck=False)
        return values
    return values[:used]  # a mapping's: the pages never written are no memory


# Below this many rows a table is read in one scan: a second connection and thread cost more
# than they save. Memory tables of benchmarks/make_big_export.py, median of 15, one scan against
# two ranges on 2 CPUs: 52 rows 1.3 ms / 2.0 ms, 10,000 rows 6.5 / 4.8 ms, 100,000 rows 50 / 28 ms.
PARALLEL_MIN_ROWS = 10_000


# Set by `nsysan batch` in its workers (limit_threads): with one analysis per core already, an
# analysis that also reads on every core only makes them wait for each other.
_thread_limit: Optional[int] = None


def limit_threads(threads: Optional[int]) -> None:
    """Use at most `threads` threads per analysis in this process (None: as many as CPUs)."""
    global _thread_limit
    _thread_limit = threads


def usable_cpus() -> int:
    try:
        cpus = max(1, min(8, len(os.sched_getaffinity(0))))
    except (AttributeError, OSError):  # not Linux
        cpus = max(1, min(8, os.cpu_count() or 1))
    return min(cpus, _thread_limit) if _thread_limit else cpus


def rowid_span(conn: sqlite3.Connection, table: str) -> Optional[int]:
    """How many rowids `table` spans (its rows, unless some were deleted), from two b-tree
    descents; None when the rowid cannot be used."""
    whole = _rowid_ranges(conn, table, 1)
    return whole[0][1] - whole[0][0] + 1 if whole else None


def _rowid_ranges(conn: sqlite3.Connection, table: str, parts: int) -> Optional[list[tuple[int, int]]]:
    """Up to `parts` equal rowid ranges covering the table (one for a small table), or None when
    the rowid cannot be used."""
    try:
        # A column of that name would hide the real rowid (never in nsys exports; in hand-made files).
        if {str(row[1]).lower() for row in conn.execute(f"PRAGMA table_info({table})")} & {"rowid", "_rowid_", "oid"}:
            return None
        # Two queries: each is one b-tree descent, while "SELECT min(rowid), max(rowid)" scans
        # the whole table (SQLite's min/max shortcut takes a single aggregate only).
        (low,) = conn.execute(f"SELECT min(rowid) FROM {table}").fetchone()
        (high,) = conn.execute(f"SELECT max(rowid) FROM {table}").fetchone()
    except sqlite3.Error:  # a WITHOUT ROWID table or a view (damaged or odd exports)
        return None
    if not isinstance(low, int) or not isinstance(high, int) or not 0 <= high - low < 2**32:
        return None
    if high - low + 1 < PARALLEL_MIN_ROWS:
        parts = 1
    edges = np.linspace(low, high + 1, parts + 1).astype("int64")
    return [(int(edges[i]), int(edges[i + 1]) - 1) for i in range(parts)]


def _read_with_adbc(path: str, sql: str, columns: list[str]) -> pd.DataFrame:
    parts = _read_parts(path, sql, columns)
    data = {}
    for i, name in enumerate(columns):
        data[name] = _concatenate(parts[i])
        parts[i] = []  # free this column's batches before the next column is joined
    return pd.DataFrame(data, copy=False)


def _read_parts(path: str, sql: str, columns: list[str], filled: Optional[list] = None) -> list[list]:
    """Each column's converted batches (written into `filled[i]` instead, while they fit it)."""
    uri = "file:" + urllib.parse.quote(os.fsencode(path)) + "?mode=ro&immutable=1"
    parts: list[list] = [[] for _ in columns]
    filled = filled or [None] * len(columns)
    with _adbc_sqlite.connect(uri) as database, _adbc.AdbcConnection(database) as connection, \
            _adbc.AdbcStatement(connection) as statement:
        # Large batches: per-batch Python work stays negligible (the driver's default is 1024 rows).
        statement.set_options(**{"adbc.sqlite.query.batch_rows": str(BATCH_ROWS)})
        statement.set_sql_query(sql)
        stream, _ = statement.execute_query()
        # Batch by batch, so that the Arrow result and the numpy arrays never both hold the
        # whole result: on 10 million rows that is the difference between 1x and 2x the memory.
        # pyarrow's reader releases the GIL while the driver steps SQLite.
        batches = _pa.RecordBatchReader._import_from_c(stream.address)
        try:
            for batch in batches:
                for i, column in enumerate(batch.columns):
                    converted = _convert(column)
                    if filled[i] is None or not filled[i].add(converted):
                        if filled[i] is not None:  # the count was wrong: fall back to joining parts
                            parts[i], filled[i] = filled[i].parts(), None
                        parts[i].append(converted)
                del batch
        finally:  # the stream before the statement it reads from
            batches.close()
    return parts


class _Filled:
    """One integer column written batch by batch into `values`, its rows' slice of the column."""

    def __init__(self, rows: int, values: np.ndarray) -> None:
        self.rows, self.offset = rows, 0
        self.values = values
        self.mask: Optional[np.ndarray] = None

    def complete_view(self) -> bool:
        """Every row written, no NULLs: the slice it was given holds the whole answer."""
        return self.offset == self.rows and self.mask is None

    def add(self, part: object) -> bool:
        values, mask = part if isinstance(part, tuple) else (part, None)
        if not isinstance(values, np.ndarray) or self.offset + len(values) > self.rows:
            return False
        self.values[self.offset:self.offset + len(values)] = values
        if mask is not None or self.mask is not None:
            if self.mask is None:
                self.mask = np.zeros(self.rows, bool)
            if mask is not None:
                self.mask[self.offset:self.offset + len(values)] = mask
        self.offset += len(values)
        return True

    def parts(self) -> list:
        """What was written, as one part for _concatenate."""
        done = self.values[:self.offset]
        return [(done, self.mask[:self.offset]) if self.mask is not None else done]


def _convert(column) -> object:
    """One Arrow column of one batch -> a numpy array, (values, null mask), or a list of str."""
    kind = column.type
    if _pa.types.is_integer(kind) and column.null_count == 0:
        return column.to_numpy().astype("int64", copy=False)
    if _pa.types.is_integer(kind) or _pa.types.is_null(kind):
        # Nullable integers without a detour through float64 (globalTid needs all 64 bits).
        values = column.fill_null(0).to_numpy() if _pa.types.is_integer(kind) else np.zeros(len(column), "int64")
        return values.astype("int64", copy=False), column.is_null().to_numpy(zero_copy_only=False)
    is_binary = _pa.types.is_binary(kind) or _pa.types.is_large_binary(kind)
    if (is_binary or _pa.types.is_string(kind) or _pa.types.is_large_string(kind)) and \
            _pc.any(_pc.match_substring_regex(column, _DRIVER_FLOAT_TEXT)).as_py():
        # A column mixing REALs with other types (a damaged export: 1e300 among byte counts) comes
        # back as text or bytes, its numbers printed with 7 digits (134217728 -> "1.342177e+08"):
        # exact values are lost. The sqlite3 path keeps every value as it is stored.
        raise ValueError("ADBC turned a mixed-type column into rounded text")
    if is_binary:
        # BLOBs where text belongs (damaged or odd exports): decode like the sqlite3 path does.
        return [None if v is None else v.decode("utf-8", "replace") for v in column.to_pylist()]
    return column.to_pylist()


def _concatenate(parts: list) -> object:
    if not parts:
        return np.zeros(0, "int64")
    if all(isinstance(p, np.ndarray) for p in parts):
        return np.concatenate(parts)
    if all(isinstance(p, (np.ndarray, tuple)) for p in parts):
        values = np.concatenate([p[0] if isinstance(p, tuple) else p for p in parts])
        mask = np.concatenate([p[1] if isinstance(p, tuple) else np.zeros(len(p), bool) for p in parts])
        return pd.arrays.IntegerArray(values, mask)
    # Text (or a column whose type changed between batches): plain Python objects.
    items: list = []
    for p in parts:
        if isinstance(p, tuple):
            items.extend(None if m else int(v) for v, m in zip(*p))
        else:
            items.extend(p.tolist() if isinstance(p, np.ndarray) else p)
    return np.asarray(items, dtype=object)


def release_memory() -> None:
    """Give memory freed after a big read back to the system.

    The ADBC driver builds its result in many small allocations, and glibc keeps such freed
    memory in its heap: measured on a 10-million-row read, 700 MB stayed resident after the
    table was freed, and the analysis after it would have stacked on top.
    """
    if _pa is not None:
        _pa.default_memory_pool().release_unused()
    if _malloc_trim is not None:
        _malloc_trim(0)


_malloc_trim = getattr(glibc(), "malloc_trim", None)
