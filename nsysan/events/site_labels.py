"""The call site of each allocation (the rules in stacks.py, best source first), labelled the same
way whether the events come as the whole frame (load.py, one call) or as a flow of batches
(the streamed full analysis, one call per batch).

The label of an allocation depends only on its own call (Python stack, native stack), the NVTX
and operator ranges open on its thread, its API name and its thread's name, so it is found batch
by batch. What depends on the whole capture is made once: the stacks, numbered from every
allocation's call-stack id (the whole frame's, or those the streamed first pass gathers); and
the order of the sites (`order`: by kind of source, then by first appearance), which is the
events frame's categories and breaks equal sites' ties in the sites table.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from ..model import Diagnostic, Stack
from ..sources.schema import Schema
from .arrays import category_codes, distinct_rows
from .columns import SITE_COLUMNS, empty_sites
from .normalize import join_on_call
from .stacks import Stacks, fallback_label, native_stack_table, python_stack_table, site_row


# allocations labelled at once by call_sites (the whole frame's)
LABEL_BLOCK = 1 << 20


class SiteLabeller:
    """Labels allocations with their sites, coded in order of first appearance (`labels`); `order`
    gives the sites' rows and their labels in the events frame's order.

    `api_names`, `range_names` and `operator_names` name the codes `label` is given (an
    operator code 0 is none, as a range code -1 is); `thread_names`: (pid, tid) -> name."""

    def __init__(self, conn: sqlite3.Connection, schema: Schema, wanted_chains: np.ndarray, calls_and_chains,
                 api_names: Sequence[str], range_names: Sequence[str], operator_names: Sequence[str],
                 thread_names: dict, diagnostics: list[Diagnostic]) -> None:
        """`wanted_chains`: the allocations' call-stack ids (sorted, distinct); `calls_and_chains()`:
        the calls and call-stack rows (stacks.python_stack_table)."""
        self.registry = Stacks()
        self.python = python_stack_table(conn, schema, calls_and_chains, self.registry, diagnostics)
        self.native = native_stack_table(conn, schema, wanted_chains, self.registry) \
            if schema.has_backtraces else None
        self.api_names, self.range_names, self.operator_names = api_names, range_names, operator_names
        self.thread_names = thread_names
        self.labels: dict[str, int] = {}  # label -> code, in order of first appearance
        self.fallback_codes: dict[tuple, int] = {}  # (source, name, range code, pid, tid) -> site code
        self.seen: dict[str, dict] = {"operator": {}, "api": {}}  # each fallback's labels, in order of appearance

    def label(self, pid: np.ndarray, tid: np.ndarray, correlation: np.ndarray, chain: np.ndarray, api: np.ndarray,
              nvtx: np.ndarray, operator: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The site code and own stack id (-1: none) of each allocation, in time order, from its
        call (process, thread, correlation id, call-stack id: -1 for none), its API name, innermost
        NVTX range name and operator range (codes of the names given at the start)."""
        n = len(pid)
        site, stack = np.full(n, -1, "int64"), np.full(n, -1, "int64")
        if n == 0:
            return site, stack
        if self.python is not None:
            mark_pid, mark_correlation, mark_stack, sites, site_of_stack = self.python
            match = join_on_call(pid, correlation, mark_pid, mark_correlation)
            found = np.flatnonzero(match >= 0)
            stack[found] = mark_stack[match[found]]
            site[found] = self._codes(sites)[site_of_stack[stack[found]]]
        machinery = np.full(n, -1, "int64")
        if self.native is not None:
            chain_list, stack_of_chain, callers, caller_of_stack, machines, machinery_of_stack = self.native
            rows = np.flatnonzero(chain >= 0)
            at = np.clip(np.searchsorted(chain_list, chain[rows]), 0, len(chain_list) - 1)
            has = chain_list[at] == chain[rows]
            rows, native = rows[has], stack_of_chain[at[has]]
            stack[rows] = np.where(stack[rows] < 0, native, stack[rows])  # a Python stack says more
            caller = caller_of_stack[native]
            take = (caller >= 0) & (site[rows] < 0)
            site[rows[take]] = self._codes(callers)[caller[take]]
            machine = machinery_of_stack[native]
            machinery[rows[machine >= 0]] = self._codes(machines)[machine[machine >= 0]]
        # An operator range, or else the API name, with the innermost user range and the thread.
        if len(self.operator_names) > 1:
            need = np.flatnonzero((site < 0) & (operator > 0))
            site[need] = self._fallbacks("operator", operator[need], self.operator_names, nvtx[need], pid[need],
                                         tid[need])
        site[:] = np.where((site < 0) & (machinery >= 0), machinery, site)
        need = np.flatnonzero(site < 0)
        if len(need):
            site[need] = self._fallbacks("api", api[need], self.api_names, nvtx[need], pid[need], tid[need])
        return site, stack

    def order(self) -> tuple[dict[str, int], list[dict]]:
        """Each label's place in the events frame's categories (sources best first, each in order
        of first appearance; "" first: no site) and the rows of the sites (SITE_COLUMNS), in the
        same order."""
        rows: list[dict] = []
        if self.python is not None:
            rows += self.python[3]
        callers, machines = (self.native[2], self.native[4]) if self.native is not None else ([], [])
        rows += callers
        rows += [site_row(label, "operator", function=label.split(" ")[0]) for label in self.seen["operator"]]
        rows += machines
        rows += [site_row(label, "api") for label in self.seen["api"]]
        order: dict[str, int] = {"": 0}
        for row in rows:
            order.setdefault(row["label"], len(order))
        return order, rows

    def table(self) -> pd.DataFrame:
        """The sites (SITE_COLUMNS), one row per label, in `order`."""
        return pd.DataFrame(self.order()[1], columns=SITE_COLUMNS).drop_duplicates("label", ignore_index=True)

    def _codes(self, sites: list[dict]) -> np.ndarray:
        return np.array([self.labels.setdefault(s["label"], len(self.labels)) for s in sites] or [0], "int64")

    def _fallbacks(self, source: str, name_codes: np.ndarray, names, nvtx: np.ndarray, pid: np.ndarray,
                   tid: np.ndarray) -> np.ndarray:
        """`<name> in <innermost NVTX range> [<thread>]`, one label per distinct (name, range name,
        thread), in order of first appearance (the order the events frame's categories keep)."""
        slot, firsts = distinct_rows(name_codes, nvtx, pid, tid)
        codes = []
        for name, row, p, t in zip(name_codes[firsts].tolist(), nvtx[firsts].tolist(), pid[firsts].tolist(),
                                   tid[firsts].tolist()):  # per distinct key: a few per thread
            key = (source, names[name], row, p, t)
            code = self.fallback_codes.get(key)
            if code is None:
                thread = self.thread_names.get((p, t), "") if t >= 0 else ""
                label = fallback_label(str(names[name]), str(self.range_names[row]) if row >= 0 else "", thread)
                self.seen[source].setdefault(label, None)
                code = self.fallback_codes[key] = self.labels.setdefault(label, len(self.labels))
            codes.append(code)
        return np.array(codes, "int64")[slot]


@dataclass
class SiteSources:
    """What call_sites found: a label and stack per event, the table of sites, the stacks."""

    sites: pd.DataFrame  # SITE_COLUMNS, one row per label
    labels: pd.Categorical  # per event
    stack: np.ndarray  # per event: id of its own stack in `stacks`, -1 without one
    stacks: list[Stack]


def call_sites(conn: sqlite3.Connection, schema: Schema, events: pd.DataFrame, calls: pd.DataFrame,
               chains: pd.DataFrame, thread_names: dict[tuple[int, int], str],
               diagnostics: list[Diagnostic]) -> SiteSources:
    """A site label and stack per event of the whole frame (its allocations labelled as one batch;
    a free belongs to the site of the allocation it frees), the table of sites and the stacks
    they refer to."""
    n = len(events)
    if n == 0:
        return SiteSources(empty_sites(), pd.Categorical([], categories=[""]), np.zeros(0, "int32"), [])
    allocs = np.flatnonzero((events["op"] == "alloc").to_numpy())
    chain = events["callchain_id"].to_numpy()[allocs] if "callchain_id" in events else np.full(len(allocs), -1)
    named = ("api", "nvtx_range", "operator")  # the frame's categories name the codes
    labeller = SiteLabeller(conn, schema, np.unique(chain[chain >= 0]), lambda: (calls, chains),
                            *(events[name].cat.categories for name in named), thread_names, diagnostics)
    site, own = np.empty(len(allocs), "int64"), np.empty(len(allocs), "int64")
    columns = [events[name].to_numpy() for name in ("pid", "tid", "correlation_id")] + \
        [category_codes(events[name]) for name in named]
    # A block of allocations at a time, as the flow labels its batches: the label's temporaries
    # (each allocation's call columns, n-long masks) are a block's, not 5e6 allocations' (at 1e7
    # events the whole frame's loading peaked here, 567 MiB above the frames)
    for low in range(0, len(allocs), LABEL_BLOCK):
        rows = allocs[low:low + LABEL_BLOCK]
        block = slice(low, low + len(rows))
        site[block], own[block] = labeller.label(*(column[rows] for column in columns[:3]), chain[block],
                                                 *(column[rows] for column in columns[3:]))
    order = labeller.order()[0]
    stack = np.full(n, -1, "int32")
    stack[allocs] = own
    key = np.zeros(n, "int32")  # the categorical's codes take the smallest type after (< 2^31 sites)
    key[allocs] = np.array([order[label] for label in labeller.labels], "int32")[site]
    del own, site, chain, allocs
    partner = events["partner"].to_numpy()
    frees = np.flatnonzero((events["op"] == "free").to_numpy() & (partner >= 0))
    key[frees] = key[partner[frees]]
    labels = pd.Categorical.from_codes(key, categories=pd.Index(list(order), dtype=object))
    return SiteSources(labeller.table(), labels, stack, labeller.registry.stacks)
