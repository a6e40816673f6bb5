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
from ..base.units import fmt_frame
from .frames import (module_name, native_machinery, operator_label, python_context_frame, python_function,
                     python_site_frame, short_function, without_templates)
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


def site_row(label: str, source: str, function: str = "", symbol: str = "", module: str = "", file: str = "",
                line: Optional[int] = None, context: str = "", stack_id: Optional[int] = None) -> dict:
    return {"label": label, "function": function, "symbol": symbol, "module": module,
            "from_stack": source in ("python", "native"), "source": source, "file": file, "line": line,
            "context": context, "stack_id": stack_id}


def fallback_label(api: str, nvtx: str, thread: str) -> str:
    """`<api> in <innermost NVTX range> [<thread>]`, each part when known."""
    return api + (f" in {nvtx}" if nvtx else "") + (f" [{thread}]" if thread else "")


# --- Python stacks -------------------------------------------------------------------------

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
    return site_row(fmt_frame(frame.function, frame.file, frame.line), "python", function=frame.function,
                 file=frame.file, line=frame.line, context=context, stack_id=stack_id)


# --- native stacks -------------------------------------------------------------------------

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
                caller_sites.append(site_row(label, "native", function=function, symbol=str(symbols[symbol_code[at]]),
                                          module=module, stack_id=stack_id))
            caller = caller_index[label]
        else:
            label = operator_label([functions[s] for s in symbol_code[lo:hi]])
            if label:
                if label not in machinery_index:
                    machinery_index[label] = len(machinery_sites)
                    machinery_sites.append(site_row(label, "native", function=label.split(" ")[0], stack_id=stack_id))
                machinery_site = machinery_index[label]
        chain_of_stack[stack_id] = (caller, machinery_site)
    caller_of_stack = np.full(len(registry.stacks), -1, "int64")
    machinery_of_stack = np.full(len(registry.stacks), -1, "int64")
    for stack_id, (caller, machinery_site) in chain_of_stack.items():
        caller_of_stack[stack_id], machinery_of_stack[stack_id] = caller, machinery_site
    return ids[bounds[:-1]], stack_of_chain, caller_sites, caller_of_stack, machinery_sites, machinery_of_stack
