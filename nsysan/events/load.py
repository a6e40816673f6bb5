"""load_events: one export's memory events, API calls, NVTX ranges and call sites, as frames.

The memory events are joined to their API calls on (pid, correlationId): correlation ids are
unique per process only.
"""

from __future__ import annotations

import sqlite3
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import pandas as pd

from ..errors import NsysanError
from ..model import Diagnostic, Stack
from ..sources.reader import release_memory
from ..sources.schema import Schema
from .columns import EVENT_COLUMNS, empty_calls, empty_chains, empty_ranges, empty_sites
from .normalize import normalize, read_decoded
from .nvtx import attribute_operators, attribute_ranges
from .read_nvtx import read_nvtx_ranges
from .read import last_calls_tail, last_cuda_calls, latest_ends, read_alone, read_calls_and_rows, \
    read_thread_names
from .read_code import code_call_ids, read_code_calls
from .read_launches import empty_launches
from .read_pools import empty_pool_events, empty_pool_usage, read_pool_events
from .site_labels import call_sites


Progress = Callable[[str, float], None]


@dataclass
class LoadedEvents:
    """Frames from one export: memory events, memory API calls, NVTX ranges and call sites."""

    events: pd.DataFrame  # EVENT_COLUMNS
    calls: pd.DataFrame  # CALL_COLUMNS: every memory API call (not the backtrace twin rows)
    ranges: pd.DataFrame  # the user's NVTX push/pop ranges: pid, tid, start_ns, end_ns, name, depth, parent
    sites: pd.DataFrame  # SITE_COLUMNS: label -> function, symbol, module, source, context, stack_id, ...
    thread_names: dict[tuple[int, int], str]
    # pid -> end of its last CUDA API call of any kind, for the processes whose NVTX ranges go
    # on after their last memory call (see `last_cuda_calls`)
    last_cuda_call_ns: dict[int, int] = field(default_factory=dict)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    quick: bool = False  # only the memory-usage table was read (see load_events)
    # PyTorch's operator ranges (--pytorch=autograd-nvtx), named by operator; columns as `ranges`
    operator_ranges: pd.DataFrame = field(default_factory=empty_ranges)
    stacks: list[Stack] = field(default_factory=list)  # the call stacks events["stack"] refers to
    # stream-ordered pools: their allocations with the pool's reserve, and their lifecycle
    # (read_pools.POOL_USAGE_COLUMNS, read_pools.POOL_EVENT_COLUMNS); empty without pools
    pool_usage: pd.DataFrame = field(default_factory=empty_pool_usage)
    pool_events: pd.DataFrame = field(default_factory=empty_pool_events)
    # the launch sequences (read_launches.LAUNCH_COLUMNS) of the processes whose NVTX ranges give
    # no steps, and their tokens' names: read after loading, when wanted (pipeline._read)
    launches: pd.DataFrame = field(default_factory=empty_launches)
    launch_names: dict[int, str] = field(default_factory=dict)
    # steps.memory_threads(calls) when already found (pipeline._read, to choose whose launches to
    # read): 0.2 s at 1e7 calls, not spent twice
    memory_threads: Optional[np.ndarray] = None
    # and steps.find_step_ranges(ranges, memory_threads) without --step-range: 0.1 s per 10,000 ranges
    nvtx_steps: Optional[dict] = None
    # read_code.read_code_calls' frame, from the rows read with the memory calls (None: not read)
    code_calls: Optional[pd.DataFrame] = None


# The decoded memory rows are given back to the system (release_memory: malloc_trim and Arrow's
# pool) after a read of at least this many: about 70 bytes a row stay resident otherwise (700 MB
# at 1e7). Below it there is little to give back, and the call itself took 0.6-13 ms of the GPT-2
# capture's analysis (1,353 rows, 2 cores, its API table's tail read beside it): a fixed cost of
# each small analysis, paid after the export (issue 31).
RELEASE_FROM_ROWS = 1_000_000


def load_events(conn: sqlite3.Connection, schema: Schema, progress: Optional[Progress] = None, *,
                quick: bool = False) -> LoadedEvents:
    """Read and normalize the export's memory events, API calls and NVTX ranges.

    `quick` reads the memory-usage table alone: the events keep their times, processes, devices,
    kinds, sizes and pairs, but have no thread, API name, NVTX range or call site (see QUICK_API).
    """
    try:
        load = _load_quick if quick else _load
        return load(conn, schema, progress or (lambda stage, fraction: None))
    except sqlite3.DatabaseError as err:
        raise NsysanError(f"the export could not be read ({err}); it may be truncated or damaged") from err


def _load(conn: sqlite3.Connection, schema: Schema, progress: Progress) -> LoadedEvents:
    diagnostics: list[Diagnostic] = []
    thread_names = read_thread_names(conn, schema)
    progress("reading memory events and API calls", 0.0)
    # The tables are read at the same time: the driver releases the GIL while SQLite scans, so
    # on two cores this halves the longest part of a large analysis (measured: 1.18 s -> 0.60 s
    # for both reads of the 1e6-event benchmark export). The NVTX ranges, and the API table's
    # tail (last_cuda_calls) while the events are matched, too: on the GPT-2 capture 8 and 25 ms
    # of scans, beside the 258k API rows' (issue 31).
    with ThreadPoolExecutor(max_workers=2) as pool:
        memory_rows = pool.submit(read_alone, read_decoded, conn, schema)
        nvtx = pool.submit(read_alone, read_nvtx_ranges, conn, schema)
        calls, chains, code_rows = read_calls_and_rows(conn, schema, code_call_ids(conn, schema))
        ranges, operator_ranges = nvtx.result()
        last_memory_calls = latest_ends(calls["pid"].to_numpy(), calls["end_ns"].to_numpy(), {})
        tail = pool.submit(read_alone, last_calls_tail, conn, schema, last_memory_calls, ranges)
        rows, pools = memory_rows.result()
        # No release_memory() here: the reads convert batch by batch, so little is left to give
        # back, and what malloc_trim gives back is faulted in again by the normalizing just after
        # (1e7 events, command line: 0.6 s, for 15 MB less peak). After it, the decoded rows are gone.
        progress("matching allocations and frees", 0.5)
        events = normalize(rows, calls, chains, schema, diagnostics)
        del rows
        if len(events) >= RELEASE_FROM_ROWS:  # the rows, less any written twice
            release_memory()
        progress("attributing NVTX ranges and sites", 0.8)
        events["nvtx_range"], events["nvtx_path"] = attribute_ranges(events, ranges)
        events["operator"] = attribute_operators(events, operator_ranges)
        found = call_sites(conn, schema, events, calls, chains, thread_names, diagnostics)
        events["site"], events["stack"] = found.labels, found.stack
        events = events[list(EVENT_COLUMNS)]
        last_calls = last_cuda_calls(conn, schema, last_memory_calls, ranges, tail.result())
    pool_events = read_pool_events(conn, schema)
    progress("done", 1.0)
    return LoadedEvents(events=events, calls=calls, ranges=ranges, sites=found.sites, thread_names=thread_names,
                        last_cuda_call_ns=last_calls, diagnostics=diagnostics, operator_ranges=operator_ranges,
                        stacks=found.stacks, pool_usage=pools, pool_events=pool_events,
                        code_calls=None if code_rows is None else read_code_calls(conn, schema, code_rows))


# The API name of every event in a quick load, whose API table is not read.
QUICK_API = "(not read)"


def _load_quick(conn: sqlite3.Connection, schema: Schema, progress: Progress) -> LoadedEvents:
    if not schema.memory_usage_collected:
        raise NsysanError("--quick reads only the memory-usage table, and this export has none (capture with "
                          "--cuda-memory-usage=true); run without --quick to count the memory API calls")
    diagnostics: list[Diagnostic] = []
    progress("reading memory events", 0.0)
    # correlationId too: no API call is joined, but it tells two real events at the same time,
    # address and size from a row written twice (see normalize.copies)
    rows, pools = read_decoded(conn, schema)
    progress("matching allocations and frees", 0.5)  # no release_memory() yet: see _load
    events = normalize(rows, empty_calls(), empty_chains(), schema, diagnostics, no_call=QUICK_API, live_at_start=False)
    del rows
    if len(events) >= RELEASE_FROM_ROWS:
        release_memory()
    blank = pd.Categorical.from_codes(np.zeros(len(events), "int8"), categories=[""])
    events["nvtx_range"] = events["nvtx_path"] = events["site"] = events["operator"] = blank
    events["stack"] = np.full(len(events), -1, "int32")
    progress("done", 1.0)
    return LoadedEvents(events=events[list(EVENT_COLUMNS)], calls=empty_calls(), ranges=empty_ranges(),
                        sites=empty_sites(), thread_names={}, diagnostics=diagnostics, quick=True,
                        pool_usage=pools, pool_events=read_pool_events(conn, schema))
