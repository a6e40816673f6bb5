"""The memory nobody can see: what fills the gap between nvidia-smi and the traced allocations
(docs/analyses.md, "The memory nobody can see").

nvidia-smi counts a process's CUDA context, the code it loaded (kernel images of every module
and library: cuModuleLoad*, cuLibraryLoadData) and the driver's own buffers, none of which has a
memory event. nsys records the loads (without sizes), the module statics they bring (the
`static` kind), and every allocation a library makes itself (named from call stacks when there
are some). This joins those with a finished `Analysis` (its steps, timeline, sites, reserved
memory and nvidia-smi overlay), so the whole-frame and streamed analyses give the same section:
- per process, the loads and unloads per phase (start-up, steps, after) and per step; a process
  that loads code in more than half of its steps after the first "keeps loading";
- library workspaces by library, from the sites' call stacks;
- with nvidia-smi logs, the gap (nvidia-smi minus the traced live bytes) at each step's end: it
  stays what nsys cannot size, given as a number with what would explain more.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional

import numpy as np
import pandas as pd

from ..events.read_code import CodeTrace
from ..model import Analysis, Answer
from ..model.hidden import HiddenMemory, LibraryMemory, ProcessCode, ProcessContext, StepLoads
from ..base.units import fmt_bytes
from .diagnostics import STACK_FLAGS, advice_flags
from .graphs import cuda_graphs, graph_severity, live_at, step_list

# Native modules of the CUDA libraries that allocate their own workspaces and buffers.
LIBRARIES = (("cuBLASLt", r"libcublasLt"), ("cuBLAS", r"libcublas"), ("cuDNN", r"libcudnn"), ("NCCL", r"libnccl"),
             ("cuFFT", r"libcufft"), ("cuSPARSE", r"libcusparse"), ("cuSOLVER", r"libcusolver"),
             ("cuRAND", r"libcurand"), ("TensorRT", r"libnvinfer"))
# Loads of an image from memory, and unloads: calls whose file nsys cannot name (known_bt_v25,
# captured with --cudabacktrace=all:1, has no call stack on its cuLibraryLoadData either).
FROM_MEMORY = frozenset({"cuLibraryLoadData", "cuModuleLoadData", "cuModuleLoadDataEx", "cuModuleLoadFatBinary",
                         "cuModuleUnload", "cuLibraryUnload"})
# The library a kernel's short name tells, first match: the names libraries sign (cuDNN's and
# cuBLAS's engines end in _cudnn / _cublas), then the kernels known to be theirs. Approximate:
# any other kernel is the program's own (or its framework's: PyTorch's elementwise kernels).
KERNEL_FAMILIES = (("NCCL", re.compile(r"nccl", re.I)), ("cuBLAS", re.compile(r"cublas", re.I)),
                   ("cuDNN", re.compile(r"cudnn", re.I)), ("Triton", re.compile(r"^triton_")),
                   ("cuFFT", re.compile(r"fft", re.I)),
                   ("cuDNN", re.compile(r"^(nchwTo|nhwcTo|foldedNhwc)|wgrad|dgrad|fprop|implicit_convolve|winograd"
                                        r"|scalePackedTensor")),
                   ("cuBLAS", re.compile(r"^(ampere|volta|turing|hopper|sm\d+)_.*gemm|gemv|^cutlass", re.I)))
OWN_KERNELS = "own"
SMI_FLAG = ("nvidia-smi --query-compute-apps=timestamp,gpu_uuid,pid,used_memory --format=csv -lms 100 "
            "beside the capture, then --smi LOG")
# Memory outside a framework's allocator from which the stacks that would name its library are worth a new capture.
LIBRARY_BYTES_WORTH_NAMING = 1 << 20


def with_unseen_memory(analysis: Analysis, trace: Optional[CodeTrace]) -> Analysis:
    """The analysis with its `hidden` and `graphs` sections and their answers, made from the finished
    analysis and the contexts, code-load and graph calls (events/read_code.py): pipeline/stages.py calls it
    the same way after the whole-frame and the streamed analyses. None (--quick): both stay empty."""
    if trace is None or (trace.calls.empty and not trace.contexts):
        return analysis
    hidden, graphs = hidden_memory(analysis, trace), cuda_graphs(analysis, trace.calls)
    answers = list(analysis.answers)
    after = max((i + 1 for i, a in enumerate(answers) if a.topic in ("peak", "growth", "what-if")), default=0)
    graph_answers = [Answer("graphs", graph_severity(p), "cuda_graphs", p.message) for p in graphs.processes
                     if p.captured_bytes]
    answers[after:after] = graph_answers
    after = max((i + 1 for i, a in enumerate(answers) if a.topic != "trust"), default=0)
    answers[after:after] = [Answer("unseen", "warning" if p.keeps_loading or _idle(p) else "info",
                                   "code_loads", p.message) for p in hidden.processes if _answers(p)]
    return dataclasses.replace(analysis, hidden=hidden, graphs=graphs, answers=answers)


def hidden_memory(analysis: Analysis, trace: CodeTrace) -> HiddenMemory:
    calls = trace.calls
    code = calls[calls["what"].isin(("context", "load", "unload"))]
    by_pid = dict(tuple(code.groupby("pid", sort=True)))
    pids = sorted({int(p) for p in by_pid} | set(trace.contexts))
    processes = [_process(analysis, pid, by_pid.get(pid, code.iloc[:0]), trace.contexts.get(pid, []))
                 for pid in pids]
    message = "; ".join(p.message for p in processes if _answers(p))
    return HiddenMemory(processes=processes, message=message)


def _answers(p: ProcessCode) -> bool:
    """Whether the process's sentence is an answer: it keeps loading, holds idle contexts, or was measured."""
    return p.keeps_loading or _idle(p) != [] or p.smi_gap_bytes is not None


def _idle(p: ProcessCode) -> list[int]:
    """The devices the process holds a context on without allocating there."""
    return [c.device for c in p.contexts if c.allocates is False]


def _process(analysis: Analysis, pid: int, rows: pd.DataFrame, contexts: list[int]) -> ProcessCode:
    loads, unloads = rows[rows["what"] == "load"], rows[rows["what"] == "unload"]
    context = rows.loc[rows["what"] == "context", "ts_ns"]
    steps = step_list(analysis, pid)
    statics = [s for s in analysis.timeline.series if s.pid == pid and s.kind == "static" and s.ts_ns]
    gaps = _smi_gaps(analysis, pid)
    # Every step at once (a pandas mask per step took 0.2 s for 150 steps): the calls in
    # [start, end) by binary search on their sorted times, the statics at both ends in one pass.
    starts = np.array([step.start_ns for step in steps], "int64")
    ends = np.array([step.end_ns for step in steps], "int64")
    load_counts, unload_counts = (_within(part["ts_ns"], starts, ends) for part in (loads, unloads))
    static = live_at(statics, np.stack([starts, ends], axis=1).ravel()).reshape(-1, 2)
    listed = [StepLoads(name=step.name, start_ns=step.start_ns, end_ns=step.end_ns, loads=int(load_counts[i]),
                        unloads=int(unload_counts[i]), static_bytes=int(static[i, 1] - static[i, 0]),
                        smi_gap_bytes=_gap_at(gaps, step.end_ns)) for i, step in enumerate(steps)]
    first, last = (steps[0].start_ns, steps[-1].end_ns) if steps else (None, None)
    load_ts = loads["ts_ns"]
    before = int((load_ts < first).sum()) if first is not None else len(loads)
    after = int((load_ts >= last).sum()) if last is not None else 0
    later = listed[1:]
    with_loads = sum(1 for s in listed if s.loads)
    keeps = len(later) >= 2 and sum(1 for s in later if s.loads) * 2 > len(later)
    gpus = sorted({g.gpu for g in analysis.groups if g.pid == pid and g.gpu is not None})
    # Module statics are loaded on every context's device: only what the program allocated counts.
    used = {g.device for g in analysis.groups if g.pid == pid and g.kind in ("device", "array", "managed")}
    gpu_of = {g.device: g.gpu for g in analysis.groups if g.pid == pid}
    sized = analysis.capture.memory_usage_collected
    outside = [a.outside_at_peak_bytes for a in analysis.reserved.allocators if a.pid == pid]
    median_gap = _median_gap(analysis, pid, gpus)
    with_gaps = [s.smi_gap_bytes for s in listed if s.smi_gap_bytes is not None]
    found = ProcessCode(
        pid=pid, process=analysis.process_label(pid),
        context_ns=int(context.iloc[0]) if len(context) else None,
        contexts=[ProcessContext(device=d, gpu=gpu_of.get(d), allocates=(d in used) if sized else None)
                  for d in contexts],
        loads=len(loads), unloads=len(unloads),
        apis={str(k): int(v) for k, v in rows.loc[rows["what"] != "context", "api"].value_counts().sort_index().items()},
        loads_before_steps=before, loads_in_steps=len(loads) - before - after, loads_after_steps=after,
        steps_with_loads=with_loads, keeps_loading=keeps,
        # only a process that keeps loading has its loads named: the kernel table they are named
        # from is exported for it alone (pipeline/stages.py)
        **(_named_loads(loads if not steps else loads[(load_ts >= first) & (load_ts < last)]) if keeps else {}),
        # a step list that says something: loads, unloads, statics or nvidia-smi gaps in some step
        steps=listed if any(s.loads or s.unloads or s.static_bytes or s.smi_gap_bytes is not None
                            for s in listed) else [],
        static_bytes=sum(g.end_bytes for g in analysis.groups if g.pid == pid and g.kind == "static"),
        libraries=_libraries(analysis, pid), outside_allocator_bytes=sum(outside) if outside else None,
        smi_gap_bytes=median_gap, smi_gap_growth_bytes=(with_gaps[-1] - with_gaps[0]) if len(with_gaps) >= 2 else None,
        unexplained_bytes=median_gap)
    flags = [] if analysis.smi is not None else [SMI_FLAG]
    stack_flags = advice_flags(analysis.capture.flags_used, STACK_FLAGS)  # never a flag the capture used
    if not analysis.capture.backtraces and stack_flags and \
            (found.outside_allocator_bytes or 0) >= LIBRARY_BYTES_WORTH_NAMING:
        flags.insert(0, " ".join(stack_flags))
    found = dataclasses.replace(found, capture_flags="; ".join(flags))
    return dataclasses.replace(found, message=_sentence(found, bool(steps)))


MAX_KERNELS = 5


def _named_loads(loads: pd.DataFrame) -> dict:
    """The loads by the kernel that ran first after each (events/read_code.kernels_after_loads),
    at most MAX_KERNELS, and by the library those kernels' names tell, most loads first."""
    if "kernel" not in loads:
        return {}
    named = loads.loc[loads["kernel"] != "", "kernel"].astype(str)
    kernels = _most_first(named.value_counts())
    families = _most_first(named.map(kernel_family).value_counts())
    return {"kernels_after_loads": dict(list(kernels.items())[:MAX_KERNELS]), "libraries_after_loads": families}


def _most_first(counts: pd.Series) -> dict[str, int]:
    return {str(k): int(n) for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))}


def kernel_family(name: str) -> str:
    """The library a kernel's short name tells (KERNEL_FAMILIES), else OWN_KERNELS."""
    return next((family for family, pattern in KERNEL_FAMILIES if pattern.search(name)), OWN_KERNELS)


def _named(p: ProcessCode) -> str:
    """"; named by the first kernel each load ran (approximate ...): cuDNN 54, ..." or, with no kernel
    after any load, what the trace cannot name."""
    if not p.libraries_after_loads:
        if set(p.apis) <= FROM_MEMORY:
            return ("; the trace names none of them (images loaded from memory: nsys records no file, and no "
                    "call stack on a load, even with --cudabacktrace=all)")
        return ""
    families = ", ".join(f"{'own kernels' if name == OWN_KERNELS else name} {n}"
                         for name, n in p.libraries_after_loads.items())
    kernels = ", ".join(f"{name if len(name) <= 40 else name[:39] + '…'} {n}"
                        for name, n in list(p.kernels_after_loads.items())[:3])
    unnamed = p.loads_in_steps - sum(p.libraries_after_loads.values())
    none = f", {unnamed} followed by no kernel within 1 s" if unnamed else ""
    return (f"; named by the first kernel each load ran (approximate: an image loaded from memory names no file): "
            f"{families}{none} (most: {kernels})")


def _within(ts_ns: pd.Series, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """How many of the times fall in each [start, end) (none where end <= start)."""
    ts = np.sort(ts_ns.to_numpy("int64"))
    counts = np.searchsorted(ts, ends, side="left") - np.searchsorted(ts, starts, side="left")
    return np.maximum(counts, 0)


def _smi_gaps(analysis: Analysis, pid: int) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """(sample times, nvidia-smi minus traced, interval) of the log that sees this process best:
    its own row of an apps log, else its GPUs' memory.used (every process on them)."""
    if analysis.smi is None:
        return []
    own = [s for s in analysis.smi.series if s.pid == pid]
    gpus = {g.gpu for g in analysis.groups if g.pid == pid}
    chosen = own or [s for s in analysis.smi.series if s.pid is None and s.gpu in gpus]
    interval = {log.name: log.interval_ns for log in analysis.smi.logs}
    return [(np.asarray(s.ts_ns, "int64"), np.asarray(s.used_bytes, "int64") - np.asarray(s.traced_bytes, "int64"),
             interval.get(s.log, 0)) for s in chosen[:1] if s.ts_ns]


def _gap_at(gaps: list, at_ns: int) -> Optional[int]:
    """The gap at the last sample at or before `at_ns`, when it is at most two intervals old."""
    for ts, gap, interval in gaps:
        i = int(np.searchsorted(ts, at_ns, side="right")) - 1
        if i >= 0 and at_ns - ts[i] <= 2 * max(interval, 1):
            return int(gap[i])
    return None


def _median_gap(analysis: Analysis, pid: int, gpus: list[int]) -> Optional[int]:
    if analysis.smi is None:
        return None
    own = [n for n in analysis.smi.not_in_trace if n.pid == pid]
    chosen = own or [n for n in analysis.smi.not_in_trace if n.pid is None and n.gpu in gpus]
    return chosen[0].median_bytes if chosen else None


def _libraries(analysis: Analysis, pid: int) -> list[LibraryMemory]:
    """Device memory of the sites whose call stack passes through a CUDA library."""
    stacks = {s.id: s for s in analysis.stacks}
    totals: dict[str, list[int]] = {}
    for site in analysis.sites:
        stack = stacks.get(site.site.stack_id) if site.site.stack_id is not None else None
        if site.pid != pid or site.kind != "device" or stack is None:
            continue
        library = _library_of([f.module for f in stack.frames])
        if library:
            t = totals.setdefault(library, [0, 0, 0, 0])
            for i, v in enumerate((site.allocations, site.allocated_bytes, site.max_live_bytes, site.never_freed_bytes)):
                t[i] += v
    found = [LibraryMemory(library=name, allocations=t[0], allocated_bytes=t[1], max_live_bytes=t[2],
                           never_freed_bytes=t[3]) for name, t in totals.items()]
    return sorted(found, key=lambda lib: (-lib.max_live_bytes, lib.library))


def _library_of(modules: list[str]) -> Optional[str]:
    """The innermost CUDA library in a stack's modules (innermost frame first)."""
    for module in modules:
        for name, pattern in LIBRARIES:
            if module and re.search(pattern, module):
                return name
    return None


def _sentence(p: ProcessCode, has_steps: bool) -> str:
    parts = []
    if _idle(p):
        idle = ", ".join(str(d) for d in _idle(p))
        parts.append(f"has a CUDA context on device{'s' if len(_idle(p)) > 1 else ''} {idle} without "
                     "allocating there: each context holds hundreds of MiB that nvidia-smi counts (a stray "
                     "torch.cuda call or tensor on the default device; set CUDA_VISIBLE_DEVICES per process)")
    if p.loads or p.unloads:
        kinds = ", ".join(f"{n} {api}" for api, n in sorted(p.apis.items(), key=lambda kv: -kv[1])
                          if api not in ("cuModuleUnload", "cuLibraryUnload"))
        loads = f"{_count(p.loads, 'code load')} ({kinds})" if p.loads else "no code loads"
        if p.keeps_loading:
            counts = ", ".join(str(s.loads) for s in p.steps[:12]) + (", ..." if len(p.steps) > 12 else "")
            parts.append(f"keeps loading CUDA code step after step: {loads}, {p.loads_in_steps} of them in "
                         f"{p.steps_with_loads} of {len(p.steps)} steps ({counts}), and {p.unloads} unloads{_named(p)}; "
                         "each load adds kernel images that nvidia-smi counts and no allocation shows")
        elif has_steps:
            parts.append(f"{loads}, {p.loads_before_steps} before the first step, {p.loads_in_steps} in steps, "
                         f"and {_count(p.unloads, 'unload')}")
        else:
            parts.append(f"{loads} and {_count(p.unloads, 'unload')}")
    for lib in p.libraries[:3]:
        parts.append(f"{lib.library} allocated {fmt_bytes(lib.allocated_bytes)} itself ({lib.allocations} allocations)")
    if p.smi_gap_bytes is not None:
        growth = ""
        if p.smi_gap_growth_bytes is not None and p.steps:
            growth = f", {_signed(p.smi_gap_growth_bytes)} from the first step's end to the last's"
        parts.append(f"nvidia-smi shows {fmt_bytes(p.smi_gap_bytes)} more than the traced allocations (median{growth}): "
                     "the CUDA context, code images and the driver's own buffers, which nsys does not size")
    if p.capture_flags:
        parts.append(f"to measure more: {p.capture_flags}")
    return f"{p.process}: " + "; ".join(parts) if parts else ""


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _signed(value: int) -> str:
    return f"+{fmt_bytes(value)}" if value >= 0 else f"-{fmt_bytes(-value)}"
