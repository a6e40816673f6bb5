"""The events frame: memory rows decoded, joined to their API calls, ordered, allocs paired with frees."""

from __future__ import annotations

import sqlite3
from typing import Optional

import numpy as np
import pandas as pd

from .arrays import factorize_in_parts, group_order, on_every_core, previous_in_group
from ..errors import NsysanError
from ..model import KINDS, LIVE_AT_START, Diagnostic
from ..sources.reader import PARALLEL_MIN_ROWS, read_converted
from ..sources.schema import Schema
from .columns import EVENT_COLUMNS, categorical_lookup, ints
from .read import MEMORY_COLUMNS, MEMORY_TABLE, _memory_select, no_memory_rows
from .read_pools import pool_usage


def read_decoded(conn: sqlite3.Connection, schema: Schema) -> tuple[dict[str, np.ndarray], pd.DataFrame]:
    """The memory table's rows decoded (decode_rows, with `pool`: a pool allocation or free) a
    chunk at a time as the reading threads read them, and its pool rows with their pool's reserve
    (read_pools.pool_usage, of the pool rows' raw columns kept from each chunk). Read whole, the
    raw columns (ten int64 values a row: 763 MiB at 1e7 events) were held next to the calls being
    read, then next to the decoded ones."""
    def convert(raw: pd.DataFrame) -> dict[str, np.ndarray]:
        is_pool = _ints_and_nulls(raw, "pool_address")[0] != 0
        kept = {f"pool_{name}": raw[name].to_numpy()[is_pool] for name in MEMORY_COLUMNS}
        # of the pool columns only is_pool is needed past here: not decoded a second time
        del raw["pool_address"], raw["pool_size"]
        rows = decode_rows(raw, schema)
        rows["pool"] = is_pool
        del rows["ts_bad"]
        return {**rows, **kept}

    if schema.memory_usage_collected:
        rows = read_converted(conn, MEMORY_TABLE, _memory_select(schema), MEMORY_COLUMNS, convert)
    else:
        rows = convert(no_memory_rows())
    pooled = pd.DataFrame({name: rows.pop(f"pool_{name}") for name in MEMORY_COLUMNS})
    return rows, pool_usage(pooled, schema)


def normalize(rows: dict[str, np.ndarray], calls: pd.DataFrame, chains: pd.DataFrame, schema: Schema,
              diagnostics: list[Diagnostic], no_call: str = "(no API call)",
              live_at_start: bool = True) -> pd.DataFrame:
    """The events frame: decoded, joined to API calls, in canonical order, allocs paired with frees.

    The memory rows decoded by read_decoded (as the streamed flow decodes each chunk), ordered,
    joined to their calls and paired. Consumes `rows`: each decoded column is dropped as it goes
    into the frame, so that a 10-million-event export never holds them and the normalized frame
    whole at the same time. Also marks in `calls` which calls caused a memory event
    (`has_event`). Events without a call get the API name `no_call`; with `live_at_start`,
    LIVE_AT_START at the session's first instant.
    """
    if not len(rows["ts"]):
        return _empty_events()
    is_pool = rows.pop("pool")
    reason = rows.pop("reason")
    bad = reason >= 0
    if bad.any():
        diagnostics.append(bad_rows_note(np.bincount(reason[bad], minlength=len(BAD_ROW_REASONS))))
    del reason
    check_sums_fit(allocated_bytes(rows["bytes"], rows["op"], bad))
    # Canonical order: time, then frees before allocs (a peak is never overstated by a free and
    # an alloc recorded at the same ns, and a block freed and handed out again in the same ns
    # pairs correctly), then the export's row order (a stable sort). nsys 2025.6 no longer writes
    # rows in time order, so the export's order is never relied on alone; it is nearly sorted in
    # older versions, which the stable sort exploits.
    kept = np.flatnonzero(~bad) if bad.any() else None  # None: every row
    del bad
    ts, op_code = rows["ts"], rows["op"]
    key = (ts if kept is None else ts[kept]) - schema.time_offset_ns
    key *= 2
    key += (op_code if kept is None else op_code[kept]) == 0
    by_key = None if (key[1:] >= key[:-1]).all() else np.argsort(key, kind="stable")
    # Exports are nearly in this order: when the sort moves few rows, it is applied in place to
    # those rows of each column instead of gathering every column (0.3 s less at 1e7 events).
    moved = _moved_rows(by_key) if kept is None else None
    if by_key is not None:
        key = _permuted(key, by_key, moved)
    order = by_key if kept is None else kept if by_key is None else kept[by_key]
    del kept, by_key, ts, op_code
    repeated = copies(key, rows, order)
    del key, rows["kind_null"], rows["correlation_null"]
    if len(repeated):  # left out: then no longer a reordering of every row
        diagnostics.append(copies_note(len(repeated)))
        kept = np.ones(len(rows["ts"]) if order is None else len(order), bool)
        kept[repeated] = False
        order, moved = np.flatnonzero(kept) if order is None else order[kept], None

    def take(column: str) -> np.ndarray:
        # each decoded column reordered once, and let go of (order None: every row, in the
        # export's order, so each column is used as it was decoded)
        values = rows.pop(column)
        return values if order is None else _permuted(values, order, moved)

    # The columns are gathered in a dict and made a frame once, without copying them: pandas
    # copies every array assigned to a frame's column (frame[name] = array), which held each
    # column twice for a while (1e7 events: the pid, correlation ids and partners, 190 MB, the
    # whole time the events were joined and paired).
    columns = {"ts_ns": take("ts") - schema.time_offset_ns}
    pid = ((take("global_pid") >> 24) & 0xFFFFFF).astype("int32")
    is_alloc = take("op") == 0
    correlation = take("correlation")
    kind = categorical_lookup(take("kind_id"), schema.mem_kinds, missing="unknown")
    kind = kind.set_categories([k for k in KINDS if k in kind.categories] +
                               [k for k in kind.categories if k not in KINDS])

    columns["pid"] = pid
    columns["device"] = take("device")
    columns["kind"] = kind
    columns["op"] = pd.Categorical.from_codes(is_alloc.view("int8") ^ 1, categories=["alloc", "free"])
    statics = kind.codes == (list(kind.categories).index("static") if "static" in kind.categories else -2)
    api_names = event_api_names(calls["api"].cat.categories, no_call)
    if len(calls):
        # Thread, API name and call stack come from the API call that caused the event.
        call_row = join_on_call(pid, correlation, calls["pid"].to_numpy(), calls["correlation_id"].to_numpy())
        has_event = np.zeros(len(calls) + 1, bool)
        has_event[call_row] = True  # an event without a call (-1) marks the spare last entry
        calls["has_event"] = has_event[:-1]
        columns["tid"] = _take(calls["tid"].to_numpy(), call_row, -1).astype("int32")
        api_codes = _take(calls["api"].cat.codes.to_numpy().astype("int64"), call_row, -1)
        del call_row, has_event
    else:  # no API calls (or not read): one pass instead of a join that finds nothing
        columns["tid"] = np.full(len(pid), -1, "int32")
        api_codes = np.full(len(pid), -1, "int64")
    at_start = columns["ts_ns"] <= 0 if live_at_start else np.zeros(len(pid), bool)
    api_codes = event_api_codes(api_codes, statics, at_start, len(api_names))
    del statics, at_start
    columns["api"] = _categorical_of_used(api_codes, api_names)
    del api_codes
    columns["address"] = take("address").view("uint64")  # the same bits as astype, without a copy
    columns["correlation_id"] = correlation
    columns["pool"] = is_pool if order is None else _permuted(is_pool, order, moved)
    del is_pool
    if len(chains):
        chain_row = join_on_call(pid, correlation, chains["pid"].to_numpy(), chains["correlation_id"].to_numpy())
        columns["callchain_id"] = _take(chains["callchain_id"].to_numpy(), chain_row, -1)
        del chain_row
    # without call stacks (most exports) no column: 8 bytes per event of -1 that nothing reads
    del correlation

    partner, superseded = pair_allocs_and_frees(pid, columns["address"], is_alloc)
    if len(superseded):
        diagnostics.append(overlapping_note(len(superseded)))
    alloc_bytes = take("bytes")
    columns["bytes"], columns["delta_bytes"] = _sizes_and_deltas(alloc_bytes, is_alloc, partner)
    columns["partner"] = partner
    return pd.DataFrame(columns, copy=False)


# Rows beyond which decode_rows lets go of each raw column as soon as it is decoded.
CONSUMED_ROWS = 1 << 20


def decode_rows(raw: pd.DataFrame, schema: Schema) -> dict[str, np.ndarray]:
    """The one decoder of memory rows (read.MEMORY_COLUMNS, with `position` and the pool columns
    when `raw` has them) into event columns: of each chunk read for the events frame (read_decoded)
    and for the streamed flow (stream.EventFlow). Consumes the columns of a `raw` of more than
    CONSUMED_ROWS rows, each dropped once decoded.

    Integers with NULLs and unreadable values as 0 (`ts_bad`, `kind_null`, `correlation_null`:
    which were); `op` 0 alloc, 1 free, -1 unknown or unreadable; `device` int16 (clipped: only
    rows left out change); `kind_id` 7 (unknown) for NULL; `reason` why a row is left out (an
    index into BAD_ROW_REASONS, -1 for a good row)."""
    columns = dict(raw.items())
    # A table read as one frame (without the fast driver): each column let go once decoded. Not
    # for a chunk, whose few MB don't matter: a `del` rebuilds the frame's columns and blocks, a
    # third of the time to decode a chunk of 65,536 rows.
    if len(raw) > CONSUMED_ROWS:
        for column in columns:
            del raw[column]

    def take(column: str) -> tuple[np.ndarray, np.ndarray]:
        return _series_ints_and_nulls(columns.pop(column))

    rows = {column: take(column)[0] for column in ("position", "pool_address", "pool_size") if column in columns}
    rows["ts"], ts_bad = take("start")
    rows["global_pid"], pid_bad = take("global_pid")
    rows["bytes"], size_bad = take("bytes")
    op_id, op_bad = take("op_type")
    op = np.full(len(op_id), -1, "int8")
    for enum_id, name in schema.mem_ops.items():
        op[op_id == enum_id] = 0 if name == "alloc" else 1
    del op_id
    if op_bad.any():  # NULL reads as 0, which may be an operation's id
        op[op_bad] = -1
    device, _ = take("device")
    rows["address"], address_bad = take("address")
    rows["reason"] = bad_row_reasons(rows["ts"], ts_bad | pid_bad | size_bad | op_bad | address_bad, op,
                                     rows["bytes"], device, schema.time_offset_ns)
    rows["ts_bad"], rows["op"] = ts_bad, op
    rows["device"] = np.clip(device, -1, np.iinfo("int16").max).astype("int16")
    del device
    rows["kind_id"], rows["kind_null"] = take("mem_kind")
    if rows["kind_null"].any():
        rows["kind_id"][rows["kind_null"]] = 7
    rows["correlation"], rows["correlation_null"] = take("correlation_id")
    return rows


def copies(key: np.ndarray, rows: dict, order: Optional[np.ndarray] = None) -> np.ndarray:
    """The positions in canonical order (`key`: the sort keys of decode_rows' rows `order`, all
    of them for None) of the rows that repeat an earlier row exactly.

    An export written twice into one file (`nsys export --append`) holds every event twice, which
    would double the peak and turn every free into an orphan. No two real events are identical
    (same time, process, device, address, size, kind, operation and API call). Only rows that
    share their time and operation with a neighbour can be copies, so the full comparison runs on
    those few."""
    tied = tied_to_a_neighbour(key)
    if tied is None:
        return np.zeros(0, "int64")
    at = np.flatnonzero(tied)
    row = at if order is None else order[at]
    repeated = pd.DataFrame({
        "ts": rows["ts"][row], "op": rows["op"][row], "pid": rows["global_pid"][row], "address": rows["address"][row],
        "bytes": rows["bytes"][row], "device": rows["device"][row],
        "kind": np.where(rows["kind_null"][row], -1, rows["kind_id"][row]),
        "call": np.where(rows["correlation_null"][row], -1, rows["correlation"][row]),
    }).duplicated().to_numpy()  # in canonical order: the first copy is kept
    return at[repeated]


# Rows computed at a time by _sizes_and_deltas: its temporaries are a few arrays of one chunk.
SIZE_CHUNK = 1 << 20


def _sizes_and_deltas(alloc_bytes: np.ndarray, is_alloc: np.ndarray, partner: np.ndarray,
                      first: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Each event's block size and live-bytes change from row `first` on (pair_allocs_and_frees'
    `partner`), SIZE_CHUNK rows at a time (at once, the gathers and selections took 0.4 GB at 1e7
    events)."""
    sizes, deltas = alloc_bytes[first:].copy(), np.empty(len(alloc_bytes) - first, "int64")
    for low in range(first, len(alloc_bytes), SIZE_CHUNK):
        out = slice(low - first, low - first + SIZE_CHUNK)
        size, delta = sizes[out], deltas[out]  # views: written in place
        # A free takes the size of its allocation (older exports leave bytes 0 on free rows); a
        # free with no allocation in the capture changes nothing we counted. Only the frees are
        # gathered (at 1e7 events, 0.1 s less than choosing between gathers of every row).
        frees = np.flatnonzero(~is_alloc[low:low + SIZE_CHUNK])
        paired = partner[low:low + SIZE_CHUNK][frees]
        found = paired >= 0
        size[frees[found]] = alloc_bytes[paired[found]]
        delta[:] = size
        delta[frees] = np.where(found, -size[frees], 0)
    return sizes, deltas


def _moved_rows(order: Optional[np.ndarray]) -> Optional[np.ndarray]:
    """The rows a reordering of every row moves, when they are few (else None)."""
    if order is None:
        return None
    moved = np.flatnonzero(order != np.arange(len(order)))
    return moved if len(moved) <= len(order) // 64 else None


def _permuted(values: np.ndarray, order: np.ndarray, moved: Optional[np.ndarray]) -> np.ndarray:
    """values[order]; with `moved` (the rows order moves), done in place on those rows alone.

    Only for arrays nothing else reads any more: the columns taken out of the raw frame (pandas
    hands them out read-only; the data are ours once the frame has let go of them).
    """
    if moved is None:
        return values[order]
    if not values.flags.writeable:
        try:
            values.flags.writeable = True
        except ValueError:  # memory we do not own: a copy, then in place
            values = values.copy()
    values[moved] = values[order[moved]]  # the right side is gathered before anything is written
    return values


def _categorical_of_used(codes: np.ndarray, categories: list) -> pd.Categorical:
    """categories[codes] as a categorical with only the categories in use: a count per code
    instead of pandas' hash pass over every value (0.4 s at 1e7 events)."""
    used = np.bincount(codes, minlength=len(categories)) > 0
    new_code = (np.cumsum(used) - 1).astype("int32")
    return pd.Categorical.from_codes(new_code[codes], categories=[c for c, u in zip(categories, used) if u])


def _take(values: np.ndarray, rows: np.ndarray, fill: int) -> np.ndarray:
    """values[rows], with `fill` where rows is -1 (no match)."""
    if len(values) == 0:
        return np.full(len(rows), fill, dtype="int64")
    # `fill` after the last value, where row -1 finds it: one gather instead of a clip, a
    # gather and a choice (0.1 s at 1e7 events)
    with_fill = np.empty(len(values) + 1, values.dtype)
    with_fill[:-1], with_fill[-1] = values, fill
    return with_fill[rows]


def _ints_and_nulls(frame: pd.DataFrame, column: str) -> tuple[np.ndarray, np.ndarray]:
    """A column as int64 (NULLs as 0) and the mask of its NULLs."""
    return _series_ints_and_nulls(frame[column])


def _series_ints_and_nulls(column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """A column (a named Series) as int64 (NULLs as 0) and the mask of its NULLs."""
    dtype = column.dtype
    if isinstance(dtype, np.dtype) and dtype.kind in "iu":  # plain numpy ints: no NULLs
        return column.to_numpy().astype("int64", copy=False), np.zeros(len(column), bool)
    values = ints(column.to_frame(), column.name)
    return values.to_numpy(dtype="int64", na_value=0), values.isna().to_numpy()


# events of one process joined to their calls at a time (join_on_call)
JOIN_BLOCK = 1 << 20


def join_on_call(pid: np.ndarray, correlation: np.ndarray, call_pid: np.ndarray,
                  call_correlation: np.ndarray) -> np.ndarray:
    """Row of the call with the same (pid, correlationId) for each event, -1 if none.

    correlationId is unique per process only; ids of 0 or less (module statics, damaged exports)
    never match. The first call of a key wins.
    """
    result = np.full(len(pid), -1, "int64")
    if len(call_pid) == 0 or len(pid) == 0:
        return result
    # Per process (a counting sort brings each process's calls together, still in export order),
    # correlation ids nearly always come in increasing order, so a binary search needs no sort.
    # (the codes let go of once grouped, and a process's events looked up a block at a time: the
    # whole frame's join held 0.56 GB above its inputs at 1e7 events, the loading's highest)
    call_codes, call_pids = pd.factorize(call_pid)
    call_order, call_bounds = _grouped(call_codes, len(call_pids))
    del call_codes
    event_codes = pd.Index(call_pids).get_indexer(pid)
    event_codes += 1  # 0: a process with no calls at all
    event_order, event_bounds = _grouped(event_codes, len(call_pids) + 1)
    del event_codes

    def join_process(code: int) -> None:  # each process's events alone: their rows of `result`
        rows = call_order[call_bounds[code]:call_bounds[code + 1]]
        keys = call_correlation[rows]
        if len(keys) > 1 and not (keys[1:] >= keys[:-1]).all():
            by_key = np.argsort(keys, kind="stable")  # out of order: sort (first call of a key wins)
            rows, keys = rows[by_key], keys[by_key]
        events = event_order[event_bounds[code + 1]:event_bounds[code + 2]]
        for low in range(0, len(events), JOIN_BLOCK):
            mine = events[low:low + JOIN_BLOCK]
            wanted = correlation[mine]
            at = np.clip(np.searchsorted(keys, wanted, side="left"), 0, len(keys) - 1)
            hit = (keys[at] == wanted) & (wanted > 0)  # correlation id 0: no call (module statics)
            result[mine[hit]] = rows[at[hit]]

    # the processes (the ranks of a distributed job) on every core, the largest first
    on_every_core(join_process, np.argsort(-np.diff(call_bounds), kind="stable").tolist(),
                  parallel=len(pid) >= PARALLEL_MIN_ROWS)
    return result


def _grouped(codes: np.ndarray, groups: int) -> tuple[np.ndarray, np.ndarray]:
    """group_order(codes, groups), and where each group's rows start in it (then their end): from
    a count per group, not a search in the codes gathered in that order (0.3 s at 1e7 events)."""
    bounds = np.zeros(groups + 1, "int64")
    np.cumsum(np.bincount(codes, minlength=groups), out=bounds[1:])
    return group_order(codes, groups), bounds


# Every byte count (live, allocated, never freed, per group, range or site) is a sum of sizes
# of allocations; int64 holds 8 EiB. 4 EiB is far beyond any machine and keeps every sum exact.
MAX_TOTAL_BYTES = 2**62


# Why a memory row is left out, in the order a row is charged to the first that applies.
BAD_ROW_REASONS = ("a missing or unreadable time, process, address, size or operation (NULL, text, REAL)",
                   "an unknown operation", "a size below 0 or above 1 PiB", "a time beyond ±2^61 ns",
                   "a device id below -1 or above 32767")


def bad_row_reasons(ts: np.ndarray, unreadable: np.ndarray, op_code: np.ndarray, size: np.ndarray,
                    device: np.ndarray, time_offset_ns: int) -> np.ndarray:
    """Per memory row, the index in BAD_ROW_REASONS of why it is left out, or -1 for a good row
    (the streamed path asks the same of each chunk). Sizes beyond 1 PiB or below zero are not
    real allocations and would overflow the running sums; times beyond ±2^61 ns (73 years),
    before or after the export's time shift, would wrap the sort key; device ids beyond the
    frame's int16 would be merged into one device."""
    if time_offset_ns:  # |shift| < 2^62 (schema.py): clipped at ±2^62, the difference can't wrap
        far = np.abs(np.clip(ts, -2**62, 2**62) - time_offset_ns) > 2**61
    else:
        far = (ts > 2**61) | (ts < -2**61)  # not np.abs: |-2^63| wraps to -2^63
    checks = [unreadable, op_code < 0, (size < 0) | (size > 2**50), far,
              (device < -1) | (device > np.iinfo("int16").max)]
    reason = np.full(len(ts), -1, "int8")
    for index in reversed(range(len(checks))):  # the first reason that applies wins
        reason[checks[index]] = index
    return reason


def bad_rows_note(counts: np.ndarray) -> Diagnostic:
    """bad_memory_rows' warning from the rows left out for each of BAD_ROW_REASONS."""
    said = [f"{int(n)} with {why}" for n, why in zip(counts, BAD_ROW_REASONS) if n]
    return Diagnostic("warning", "bad_memory_rows", f"{int(counts.sum())} memory events had missing or impossible "
                      "values and were left out: " + "; ".join(said))


def copies_note(copies: int) -> Diagnostic:
    return Diagnostic("warning", "bad_memory_rows", f"{copies} memory events were exact copies of others (an export "
                      "written twice into one file?) and were left out")


def overlapping_note(overlapping: int) -> Diagnostic:
    return Diagnostic(
        "warning", "overlapping_allocations",
        f"{overlapping} allocations were followed by another allocation at the same address while "
        "still allocated (a free is missing from the capture, or the export is damaged); each "
        "free closes the latest allocation at its address, so the live bytes may be overstated")


def allocated_bytes(size: np.ndarray, op: np.ndarray, bad: np.ndarray) -> float:
    """What the good allocations among decoded rows allocate, summed in floats (which cannot wrap)."""
    return float(np.sum(size, where=~bad & (op == 0), dtype=np.float64))


def check_sums_fit(total: float) -> None:
    """Stop with one line when the allocations kept add up to more than any sum can hold: each
    size is at most 1 PiB, but 4,096 of them pass 4 EiB, and int64 sums would wrap to negative
    peaks and never-freed bytes without a word."""
    if total >= MAX_TOTAL_BYTES:
        raise NsysanError(f"its memory events allocate {total / 2**60:,.1f} EiB in all, more than 64-bit byte "
                          "counts hold and far beyond any machine: the export is damaged, so export the report again")


def event_api_names(call_names, no_call: str = "(no API call)") -> list[str]:
    """The API names of the events: their calls' names, then what an event without a call is
    named (event_api_codes)."""
    return list(call_names) + ["(module load)", no_call, LIVE_AT_START]


def event_api_codes(call_api: np.ndarray, statics: np.ndarray, at_start: np.ndarray, names: int) -> np.ndarray:
    """Each event's code into event_api_names (`names` of them): its call's API (-1: no call), else
    LIVE_AT_START `at_start` (live when the capture began), "(module load)" for a module's
    statics, `no_call` for the others."""
    none = np.where(at_start, names - 1, np.where(statics, names - 3, names - 2))
    return np.where(call_api >= 0, call_api, none)


def _empty_events() -> pd.DataFrame:
    frame = pd.DataFrame({c: pd.Series(dtype=t) for c, t in EVENT_COLUMNS.items()})
    frame["callchain_id"] = pd.Series(dtype="int64")
    return frame


def pair_allocs_and_frees(pid: np.ndarray, address: np.ndarray, is_alloc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The one pairing rule, of the whole frame and of each streamed batch with the allocations
    still live before it: for each event, the row of its partner (an alloc's free, a free's
    alloc; -1 if none); and the rows of the allocations followed by another allocation at their
    address while still allocated, in the order of those later allocations.

    Events are in canonical time order. Addresses are reused, so pairing is by order per
    (process, address): a free closes the allocation immediately before it at that address. A
    free after a free, or first at its address, has no allocation in the capture (allocated
    before it started). Two allocations in a row at one address mean a free was lost.
    """
    n = len(pid)
    partner = np.full(n, -1, "int64")
    if n == 0:
        return partner, np.zeros(0, "int64")
    pid_code, pids = pd.factorize(pid)
    address = address.astype("uint64", copy=False)
    if len(pids) < 2**15 and (address >> np.uint64(48)).max() == 0:
        # User-space addresses have at most 48 bits (x86-64, ARM64): process and address fit in
        # one 64-bit key, so a single hash pass numbers the blocks.
        # (made in place, the process codes let go first: each n-long step is 80 MB at 1e7 events)
        key = pid_code.astype("uint64")
        del pid_code
        key <<= np.uint64(48)
        key |= address
        block_code, blocks = factorize_in_parts(key)
        del key
    else:  # damaged exports with wider addresses or absurd pid counts: two passes
        address_code, _ = pd.factorize(address)
        block_code, blocks = pd.factorize(address_code.astype("int64") * len(pids) + pid_code)
    previous = previous_in_group(block_code, len(blocks))  # the event before, at the same block
    after_alloc = np.append(is_alloc, False)[previous]  # previous -1 (none) finds the False
    # a free pairs with the event before it at its block when that one is an alloc
    frees = np.flatnonzero(~is_alloc & after_alloc)
    partner[frees] = previous[frees]
    partner[previous[frees]] = frees
    return partner, previous[is_alloc & after_alloc]


def tied_to_a_neighbour(key: np.ndarray) -> Optional[np.ndarray]:
    """Which entries of the sorted `key` equal the one before or after them (the only rows that
    can be copies of another); None when none does, the common case, found in one comparison."""
    if len(key) < 2:
        return None
    equal_next = key[1:] == key[:-1]
    if not equal_next.any():
        return None
    tied = np.zeros(len(key), bool)
    tied[1:] |= equal_next
    tied[:-1] |= equal_next
    return tied
