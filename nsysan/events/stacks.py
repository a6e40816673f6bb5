"""Call sites: the frame of a call stack that names the caller, or API + NVTX range + thread."""

from __future__ import annotations

import re
import sqlite3
from pathlib import PurePosixPath

import numpy as np
import pandas as pd

from ..model import Diagnostic
from ..schema import Schema
from .columns import SITE_COLUMNS, empty_sites
from .read import read_call_stack_frames


# Frames that are not "the caller": CUDA runtime/driver, the profiler's injection, and the
# allocator layers between user code and cudaMalloc (PyTorch's caching allocator, ATen, the
# dispatcher, CPython's interpreter, libc start-up).
_NOT_CALLER_MODULES = re.compile(
    r"libcupti|libcuda\.so|libcudart|libToolsInjection|libnvToolsExt|libnvtx|libcublas|libcudnn|"
    r"libnccl|libc10|libtorch|libpython|ld-linux|/libc\.so|libstdc\+\+", re.I)


_NOT_CALLER_SYMBOLS = re.compile(
    r"^(cu[A-Z]\w*|cuda[A-Z]\w*|cudaError(_t)? cuda\w*|c10::|at::|torch::|caffe2::|_Py|Py[A-Z]|"
    r"__libc_start|_start$|__cuda|cudart::|std::|0x[0-9a-f]+$)")


_ALLOCATOR_SYMBOLS = re.compile(r"^(c10::|at::|torch::|caffe2::|cudaError(_t)? cuda\w*)")


def call_sites(conn: sqlite3.Connection, schema: Schema, events: pd.DataFrame, chains: pd.DataFrame,
                thread_names: dict[tuple[int, int], str],
                diagnostics: list[Diagnostic]) -> tuple[pd.DataFrame, pd.Categorical]:
    """A site label per event, and the table of sites (label -> function, symbol, module)."""
    n = len(events)
    if n == 0:
        return empty_sites(), pd.Categorical([], categories=[""])
    # Work on integer keys: one label per distinct key, never one string per event.
    key = np.full(n, -1, "int64")
    label_keys: dict[str, int] = {"": 0}  # label -> key; key 0 is "no site"

    def key_of(label: str) -> int:
        return label_keys.setdefault(label, len(label_keys))

    rows = []
    is_alloc = (events["op"] == "alloc").to_numpy()

    stack_sites = _stack_sites(conn, schema, events, diagnostics)  # callchain id -> site dict
    if stack_sites:
        chain_ids = np.array(sorted(stack_sites), dtype="int64")
        chain_key = np.array([key_of(stack_sites[c]["label"]) for c in chain_ids], dtype="int64")
        rows.extend(stack_sites.values())
        event_chain = events["callchain_id"].to_numpy()
        at = np.clip(np.searchsorted(chain_ids, event_chain), 0, len(chain_ids) - 1)
        has = is_alloc & (chain_ids[at] == event_chain)
        key[has] = chain_key[at[has]]

    # Without a stack: API name + innermost NVTX range + thread name.
    need = np.flatnonzero(is_alloc & (key < 0))
    if len(need):
        parts = pd.DataFrame({"api": events["api"].cat.codes.to_numpy()[need],
                              "nvtx": events["nvtx_range"].cat.codes.to_numpy()[need],
                              "pid": events["pid"].to_numpy()[need], "tid": events["tid"].to_numpy()[need]})
        group = parts.groupby(["api", "nvtx", "pid", "tid"], sort=False).ngroup().to_numpy()
        firsts = parts.groupby(group, sort=False).head(1)  # one row per distinct key
        api_names = events["api"].cat.categories
        nvtx_names = events["nvtx_range"].cat.categories
        group_key = np.empty(len(firsts), "int64")
        for i, (api, nvtx, pid, tid) in enumerate(firsts.itertuples(index=False)):  # per distinct key
            thread = thread_names.get((int(pid), int(tid)), "") if tid >= 0 else ""
            label = _fallback_label(str(api_names[api]) if api >= 0 else "?",
                                    str(nvtx_names[nvtx]) if nvtx >= 0 else "", thread)
            group_key[group[firsts.index[i]]] = key_of(label)
            rows.append({"label": label, "function": "", "symbol": "", "module": "", "from_stack": False})
        key[need] = group_key[group]

    # A free belongs to the site of the allocation it frees.
    partner = events["partner"].to_numpy()
    frees = np.flatnonzero(~is_alloc & (partner >= 0))
    key[frees] = key[partner[frees]]
    sites = pd.DataFrame(rows, columns=SITE_COLUMNS).drop_duplicates("label", ignore_index=True)
    return sites, pd.Categorical.from_codes(np.maximum(key, 0), categories=pd.Index(list(label_keys), dtype=object))


def _fallback_label(api: str, nvtx: str, thread: str) -> str:
    label = api
    if nvtx:
        label += f" in {nvtx}"
    if thread:
        label += f" [{thread}]"
    return label


def _stack_sites(conn: sqlite3.Connection, schema: Schema, events: pd.DataFrame,
                 diagnostics: list[Diagnostic]) -> dict[int, dict]:
    """Callchain id -> site of the allocation calls that have a stack."""
    if not (schema.has_backtraces and "callchain_id" in events):
        return {}
    chain_ids = events["callchain_id"].to_numpy()
    wanted = np.unique(chain_ids[(events["op"] == "alloc").to_numpy() & (chain_ids >= 0)])
    if len(wanted) == 0:
        return {}
    frames = read_call_stack_frames(conn, schema, wanted)
    if frames.empty:
        return {}
    frames["symbol"] = frames["symbol"].fillna("").astype(str)
    frames["module"] = frames["module"].fillna("").astype(str)
    unresolved_frame = pd.to_numeric(frames["unresolved"], errors="coerce").fillna(0).to_numpy() != 0
    cuda_layer = frames["module"].str.contains(_NOT_CALLER_MODULES).to_numpy() \
        | frames["symbol"].str.match(_NOT_CALLER_SYMBOLS).to_numpy() | unresolved_frame
    allocator_layer = frames["symbol"].str.match(_ALLOCATOR_SYMBOLS).to_numpy()
    frames["is_caller"] = ~cuda_layer
    frames["is_fallback"] = ~unresolved_frame & ~frames["symbol"].str.match(r"^(cu[A-Z]|cuda[A-Z]|0x)").to_numpy() \
        & ~allocator_layer
    # First frame from the innermost outwards that is user code; if a stack is all library and
    # interpreter code (PyTorch without Python backtraces), the first frame above the allocator.
    firsts = frames[frames["is_caller"]].groupby("id", sort=False).head(1)
    fallbacks = frames[frames["is_fallback"]].groupby("id", sort=False).head(1)
    chosen = pd.concat([firsts, fallbacks[~fallbacks["id"].isin(firsts["id"])]])
    sites = {}
    for chain_id, symbol, module in chosen[["id", "symbol", "module"]].itertuples(index=False):  # per stack
        function = short_function(symbol)
        module_name = PurePosixPath(module).name if module else ""
        label = f"{function} ({module_name})" if module_name else function
        sites[int(chain_id)] = {"label": label, "function": function, "symbol": symbol,
                                "module": module_name, "from_stack": True}
    return sites


def short_function(symbol: str) -> str:
    """`alloc_weights(unsigned long)` -> `alloc_weights`; `ns::f<int>(x) const` -> `ns::f<int>`."""
    depth, cut = 0, len(symbol)
    for i, ch in enumerate(symbol):
        if ch in "<[":
            depth += 1
        elif ch in ">]":
            depth = max(0, depth - 1)
        elif ch == "(" and depth == 0 and i > 0:
            cut = i
            break
    name = symbol[:cut].strip()
    # Drop a leading return type ("cudaError cudaMalloc<char>") at template depth 0.
    depth, last_space = 0, -1
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == " " and depth == 0:
            last_space = i
    return name[last_space + 1:] if last_space >= 0 else name
