"""Call sites: which code allocated each block, from the best source the capture has.

Best first, per allocation:
1. its Python stack (`--python-backtrace=cuda`): the innermost frame of the user's own code;
2. its native stack (`--cudabacktrace`): the first frame outside the machinery (frames.py);
3. the innermost PyTorch operator range open on its thread (`--pytorch=autograd-nvtx`);
4. a native stack that is machinery all the way: the operator it serves (`at::native::empty_cuda
   ← at::_ops::addmm::call`);
5. the API name, the innermost NVTX range and the thread name.
Sites are keyed by their label; each carries one of its stacks, and every allocation its own.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import pandas as pd

from ..model import Diagnostic, Frame, Stack
from ..sources.schema import Schema
from .columns import SITE_COLUMNS, empty_sites
from ..base.units import fmt_frame
from .frames import (module_name, native_machinery, operator_label, python_context_frame, python_function,
                     python_site_frame, short_function, without_templates)
from .normalize import join_on_call
from .pystacks import backtrace_layouts, calls_of_marks, decode_frames
from .read import (PYTHON_BACKTRACE_DOMAIN, read_call_stack_frames, read_payload_schemas,
                   read_python_backtrace_marks, read_strings)


@dataclass
class Stacks:
    """The distinct call stacks of one export, each stored once."""

    stacks: list[Stack] = field(default_factory=list)
    _ids: dict[tuple, int] = field(default_factory=dict)

    def add(self, source: str, frames: tuple[Frame, ...]) -> int:
        key = (source, frames)
        if key not in self._ids:
            self._ids[key] = len(self.stacks)
            self.stacks.append(Stack(id=len(self.stacks), source=source, frames=list(frames)))
        return self._ids[key]


@dataclass
class SiteSources:
    """What call_sites found: a label and stack per event, the table of sites, the stacks."""

    sites: pd.DataFrame  # SITE_COLUMNS, one row per label
    labels: pd.Categorical  # per event
    stack: np.ndarray  # per event: id of its own stack in `stacks`, -1 without one
    stacks: list[Stack]


def call_sites(conn: sqlite3.Connection, schema: Schema, events: pd.DataFrame, calls: pd.DataFrame,
               chains: pd.DataFrame, thread_names: dict[tuple[int, int], str], diagnostics: list[Diagnostic]) -> SiteSources:
    """A site label and stack per event, the table of sites and the stacks they refer to."""
    n = len(events)
    if n == 0:
        return SiteSources(empty_sites(), pd.Categorical([], categories=[""]), np.zeros(0, "int32"), [])
    # Work on integer keys: one label per distinct key, never one string per event.
    key = np.full(n, -1, "int64")
    stack = np.full(n, -1, "int32")
    label_keys: dict[str, int] = {"": 0}  # label -> key; key 0 is "no site"
    rows: list[dict] = []
    registry = Stacks()
    is_alloc = (events["op"] == "alloc").to_numpy()

    def assign(event_rows: np.ndarray, site_index: np.ndarray, sites: list[dict]) -> None:
        """Give the events without a site yet the site sites[site_index]."""
        free = key[event_rows] < 0
        site_keys = np.array([label_keys.setdefault(s["label"], len(label_keys)) for s in sites], dtype="int64")
        key[event_rows[free]] = site_keys[site_index[free]]
        rows.extend(sites)

    python = _python_stacks(conn, schema, events, is_alloc, calls, chains, registry, diagnostics)
    if python is not None:
        event_rows, stack_ids, sites, site_of_stack = python
        stack[event_rows] = stack_ids
        assign(event_rows, site_of_stack[stack_ids], sites)

    native = _native_stacks(conn, schema, events, is_alloc, registry)
    if native is not None:
        event_rows, stack_ids, caller_sites, caller_of_stack, machinery_sites, machinery_of_stack = native
        no_stack_yet = stack[event_rows] < 0  # a Python stack says more than the native one
        stack[event_rows[no_stack_yet]] = stack_ids[no_stack_yet]
        has_caller = caller_of_stack[stack_ids] >= 0
        assign(event_rows[has_caller], caller_of_stack[stack_ids[has_caller]], caller_sites)

    # An operator range, or else the API name, with the innermost user range and the thread.
    need = np.flatnonzero(is_alloc & (key < 0))
    operators = events["operator"] if "operator" in events else None
    if operators is not None and len(operators.cat.categories) > 1:
        with_operator = need[operators.cat.codes.to_numpy()[need] > 0]
        _labelled_by(events, with_operator, operators, "operator", thread_names, assign)

    if native is not None:
        has_label = machinery_of_stack[stack_ids] >= 0
        assign(event_rows[has_label], machinery_of_stack[stack_ids[has_label]], machinery_sites)

    need = np.flatnonzero(is_alloc & (key < 0))
    _labelled_by(events, need, events["api"], "api", thread_names, assign)

    # A free belongs to the site of the allocation it frees.
    partner = events["partner"].to_numpy()
    frees = np.flatnonzero(~is_alloc & (partner >= 0))
    key[frees] = key[partner[frees]]
    sites = pd.DataFrame(rows, columns=SITE_COLUMNS).drop_duplicates("label", ignore_index=True)
    labels = pd.Categorical.from_codes(np.maximum(key, 0), categories=pd.Index(list(label_keys), dtype=object))
    return SiteSources(sites, labels, stack, registry.stacks)


def _site(label: str, source: str, function: str = "", symbol: str = "", module: str = "", file: str = "",
          line: Optional[int] = None, context: str = "", stack_id: Optional[int] = None) -> dict:
    return {"label": label, "function": function, "symbol": symbol, "module": module,
            "from_stack": source in ("python", "native"), "source": source, "file": file, "line": line,
            "context": context, "stack_id": stack_id}


def _labelled_by(events: pd.DataFrame, rows: np.ndarray, names: pd.Series, source: str,
                 thread_names: dict[tuple[int, int], str], assign) -> None:
    """Sites named `<name> in <innermost NVTX range> [<thread>]`, one per distinct triple."""
    if len(rows) == 0:
        return
    parts = pd.DataFrame({"name": names.cat.codes.to_numpy()[rows],
                          "nvtx": events["nvtx_range"].cat.codes.to_numpy()[rows],
                          "pid": events["pid"].to_numpy()[rows], "tid": events["tid"].to_numpy()[rows]})
    group = parts.groupby(["name", "nvtx", "pid", "tid"], sort=False).ngroup().to_numpy()
    firsts = parts.groupby(group, sort=False).head(1)  # one row per distinct key
    all_names, nvtx_names = names.cat.categories, events["nvtx_range"].cat.categories
    sites = []
    for name, nvtx, pid, tid in firsts.itertuples(index=False):  # per distinct key
        thread = thread_names.get((int(pid), int(tid)), "") if tid >= 0 else ""
        label = _fallback_label(str(all_names[name]) if name >= 0 else "?",
                                str(nvtx_names[nvtx]) if nvtx >= 0 else "", thread)
        sites.append(_site(label, source, function=label.split(" ")[0] if source == "operator" else ""))
    site_of_group = np.empty(len(firsts), "int64")
    site_of_group[group[firsts.index.to_numpy()]] = np.arange(len(firsts))
    assign(rows, site_of_group[group], sites)


def _fallback_label(api: str, nvtx: str, thread: str) -> str:
    label = api
    if nvtx:
        label += f" in {nvtx}"
    if thread:
        label += f" [{thread}]"
    return label


# --- Python stacks -------------------------------------------------------------------------

def _python_stacks(conn: sqlite3.Connection, schema: Schema, events: pd.DataFrame, is_alloc: np.ndarray,
                   calls: pd.DataFrame, chains: pd.DataFrame, registry: Stacks, diagnostics: list[Diagnostic]):
    """For the allocations whose call carries a Python stack: their rows, stack ids, and the
    sites (with the site index of each stack id)."""
    table = python_stack_table(conn, schema, lambda: (calls, chains), registry, diagnostics)
    if table is None:
        return None
    mark_pid, mark_correlation, mark_stack, sites, site_lookup = table
    # Each call's stack, then each allocation's, through the (pid, correlation id) of its call.
    allocs = np.flatnonzero(is_alloc)
    match = join_on_call(events["pid"].to_numpy()[allocs], events["correlation_id"].to_numpy()[allocs],
                         mark_pid, mark_correlation)
    found = match >= 0
    return allocs[found], mark_stack[match[found]].astype("int32"), sites, site_lookup


def python_stack_table(conn: sqlite3.Connection, schema: Schema, calls_and_chains, registry: Stacks,
                       diagnostics: list[Diagnostic]):
    """The Python stacks of the export's memory calls (None without any): each stack's call as
    (pid, correlation id) and stack id, the sites, and the site index of each stack id.
    `calls_and_chains()`: the calls and call-stack rows (read only when there are Python stacks)."""
    marks = read_python_backtrace_marks(conn, schema)
    if marks.empty:
        return None
    has_payload = marks["payload"].notna().to_numpy()
    if not has_payload.any():
        diagnostics.append(Diagnostic(
            "warning", "python_stacks_not_exported",
            f"the capture recorded {len(marks)} Python call stacks (--python-backtrace), but the export left "
            "their payloads out; export the report again with `nsys export --type sqlite --include-blobs=true` "
            "(nsysan does this itself when given the .nsys-rep) to see which Python line allocated"))
        return None
    marks = marks[has_payload].reset_index(drop=True)
    frames = decode_frames(marks, backtrace_layouts(*read_payload_schemas(conn, schema), PYTHON_BACKTRACE_DOMAIN))
    if frames.empty:
        diagnostics.append(Diagnostic(
            "warning", "python_stacks_unreadable",
            f"the capture holds {len(marks)} Python call stacks, but their layout is not one nsysan can read "
            "(no usable payload schema); sites come from native stacks and NVTX ranges instead"))
        return None
    strings = read_strings(conn, schema, np.concatenate([frames["function_id"].to_numpy(),
                                                         frames["file_id"].to_numpy()]))
    # One stack per distinct sequence of (function, file, line): the same line allocates many times.
    triples = frames[["function_id", "file_id", "line"]].to_numpy(dtype="int64")
    bounds = np.searchsorted(frames["mark"].to_numpy(), np.arange(len(marks) + 1))
    stack_of_mark = np.full(len(marks), -1, "int64")
    sites: list[dict] = []
    site_of_stack: list[int] = []
    site_index: dict[str, int] = {}
    seen: dict[bytes, int] = {}
    for mark in range(len(marks)):  # per mark; the frames are built once per distinct stack
        if bounds[mark] == bounds[mark + 1]:
            continue
        own = triples[bounds[mark]:bounds[mark + 1]]
        content = own.tobytes()
        if content not in seen:
            stack_frames = tuple(Frame(function=python_function(strings.get(int(f), "?")), file=strings.get(int(p), ""),
                                       line=int(line)) for f, p, line in own)
            stack_id = registry.add("python", stack_frames)
            seen[content] = stack_id
            site = _python_site(stack_frames, stack_id)
            if site["label"] not in site_index:
                site_index[site["label"]] = len(sites)
                sites.append(site)
            site_of_stack.extend([-1] * (stack_id + 1 - len(site_of_stack)))
            site_of_stack[stack_id] = site_index[site["label"]]
        stack_of_mark[mark] = seen[content]
    # The calls and the backtrace rows that copy them (a mark is inside the copy).
    spans = pd.concat([frame[["ts_ns", "end_ns", "pid", "tid", "correlation_id"]] for frame in calls_and_chains()],
                      ignore_index=True)
    call_row = calls_of_marks(marks, spans)
    usable = (call_row >= 0) & (stack_of_mark >= 0)
    if not usable.any():
        return None
    mark_pid = spans["pid"].to_numpy()[call_row[usable]]
    mark_correlation = spans["correlation_id"].to_numpy()[call_row[usable]]
    site_lookup = np.full(len(registry.stacks), -1, "int64")
    site_lookup[:len(site_of_stack)] = site_of_stack
    return mark_pid, mark_correlation, stack_of_mark[usable], sites, site_lookup


def _python_site(frames: tuple[Frame, ...], stack_id: int) -> dict:
    """The site of a Python stack: its user frame, with the frame it called as context."""
    at = python_site_frame([f.file for f in frames])
    frame = frames[at]
    called = python_context_frame([f.function for f in frames], at)
    context = fmt_frame(frames[called].function, frames[called].file, frames[called].line) if called >= 0 else ""
    return _site(fmt_frame(frame.function, frame.file, frame.line), "python", function=frame.function,
                 file=frame.file, line=frame.line, context=context, stack_id=stack_id)


# --- native stacks -------------------------------------------------------------------------

def _native_stacks(conn: sqlite3.Connection, schema: Schema, events: pd.DataFrame, is_alloc: np.ndarray,
                   registry: Stacks):
    """For the allocations with a native stack: their rows and stack ids, the caller sites and
    the machinery-only sites (each with the site index per stack id, -1 for none)."""
    if not (schema.has_backtraces and "callchain_id" in events):
        return None
    chain_ids = events["callchain_id"].to_numpy()
    table = native_stack_table(conn, schema, np.unique(chain_ids[is_alloc & (chain_ids >= 0)]), registry)
    if table is None:
        return None
    chain_list, stack_of_chain, caller_sites, caller_of_stack, machinery_sites, machinery_of_stack = table
    event_rows = np.flatnonzero(is_alloc & (chain_ids >= 0))
    at = np.clip(np.searchsorted(chain_list, chain_ids[event_rows]), 0, len(chain_list) - 1)
    has = chain_list[at] == chain_ids[event_rows]
    event_rows, at = event_rows[has], at[has]
    return (event_rows, stack_of_chain[at].astype("int32"), caller_sites, caller_of_stack, machinery_sites,
            machinery_of_stack)


def native_stack_table(conn: sqlite3.Connection, schema: Schema, wanted: np.ndarray, registry: Stacks):
    """The native stacks of the call-stack ids `wanted` (sorted, distinct; None when none is
    found): the ids found, each one's stack id, the caller sites and the machinery-only sites,
    each with the site index per stack id (-1 for none)."""
    if len(wanted) == 0:
        return None
    frames = read_call_stack_frames(conn, schema, wanted)
    if frames.empty:
        return None
    # Rules run once per distinct symbol and module, not per frame (stacks repeat them).
    symbol_code, symbols = pd.factorize(frames["symbol"].fillna("").astype(str), use_na_sentinel=False)
    module_code, modules = pd.factorize(frames["module"].fillna("").astype(str), use_na_sentinel=False)
    functions = pd.Series([short_function(s) for s in symbols], dtype=object)  # per distinct symbol
    module_names = [module_name(m) for m in modules]
    readable = [without_templates(f) for f in functions]  # a stack's frames, without template arguments
    unresolved = pd.to_numeric(frames["unresolved"], errors="coerce").fillna(0).to_numpy() != 0
    machinery = native_machinery(pd.Series(functions.to_numpy()[symbol_code], dtype=object),
                                 pd.Series(np.asarray(modules, dtype=object)[module_code], dtype=object), unresolved)
    ids = frames["id"].to_numpy(dtype="int64")
    bounds = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1], True])
    caller_sites: list[dict] = []
    machinery_sites: list[dict] = []
    caller_index: dict[str, int] = {}
    machinery_index: dict[str, int] = {}
    stack_of_chain = np.full(len(bounds) - 1, -1, "int64")
    chain_of_stack: dict[int, tuple[int, int]] = {}
    pairs = np.stack([symbol_code, module_code], axis=1).astype("int64")
    seen: dict[bytes, int] = {}
    for i in range(len(bounds) - 1):  # per stack; frames are built once per distinct stack
        lo, hi = bounds[i], bounds[i + 1]
        content = pairs[lo:hi].tobytes()
        if content in seen:
            stack_of_chain[i] = seen[content]
            continue
        stack_frames = tuple(Frame(function=readable[s], module=module_names[m])
                             for s, m in zip(symbol_code[lo:hi], module_code[lo:hi]))
        stack_id = seen[content] = stack_of_chain[i] = registry.add("native", stack_frames)
        callers = np.flatnonzero(~machinery[lo:hi])
        caller = machinery_site = -1
        if len(callers):
            at = lo + callers[0]
            function, module = functions[symbol_code[at]], module_names[module_code[at]]
            label = f"{function} ({module})" if module else function
            if label not in caller_index:
                caller_index[label] = len(caller_sites)
                caller_sites.append(_site(label, "native", function=function, symbol=str(symbols[symbol_code[at]]),
                                          module=module, stack_id=stack_id))
            caller = caller_index[label]
        else:
            label = operator_label([functions[s] for s in symbol_code[lo:hi]])
            if label:
                if label not in machinery_index:
                    machinery_index[label] = len(machinery_sites)
                    machinery_sites.append(_site(label, "native", function=label.split(" ")[0], stack_id=stack_id))
                machinery_site = machinery_index[label]
        chain_of_stack[stack_id] = (caller, machinery_site)
    caller_of_stack = np.full(len(registry.stacks), -1, "int64")
    machinery_of_stack = np.full(len(registry.stacks), -1, "int64")
    for stack_id, (caller, machinery_site) in chain_of_stack.items():
        caller_of_stack[stack_id], machinery_of_stack[stack_id] = caller, machinery_site
    return ids[bounds[:-1]], stack_of_chain, caller_sites, caller_of_stack, machinery_sites, machinery_of_stack
