"""How far the numbers can be trusted: diagnostics about the capture and the export."""

from __future__ import annotations

import re
import shlex
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from ..engine import Reducer
from ..model import ApiCallStat, Diagnostic, FailedCall, GroupSummary, Peak, PoolUse
from ..events.read import TRACE_GOES_ON
from ..sources.schema import Schema
from ..base.units import fmt_bytes, fmt_percent
from .never_freed import NOT_LEAKS

CAPTURE_COMMAND = ("nsys profile -t cuda,nvtx --cuda-memory-usage=true --cudabacktrace=memory:1 "
                   "-s process-tree -o <report> <your program>")
# The flags advice may ask for, the name Capture.flags_used gives each, and the Schema field
# recording whether the capture used it (None: not recorded, as before 2023).
_ADVISED = (("--cuda-memory-usage=true", "--cuda-memory-usage=true", "memory_usage_requested"),
            ("--cudabacktrace=memory:1", "--cudabacktrace=memory", "backtraces_requested"),
            ("-s process-tree", "-s process-tree", "sampling_requested"),
            ("--python-backtrace=cuda", "--python-backtrace=cuda", "python_backtraces_requested"))
STACK_FLAGS = ("--cudabacktrace=memory:1", "-s process-tree")


def flags_used(schema: Schema) -> Optional[list[str]]:
    """Capture.flags_used: the advised flags the capture recorded using; None when it recorded none."""
    if all(getattr(schema, field) is None for _, _, field in _ADVISED):
        return None
    return [name for _, name, field in _ADVISED if getattr(schema, field) is True]


def advice_flags(used: Optional[list[str]], wanted: tuple[str, ...]) -> list[str]:
    """Of the `wanted` flags, those the capture did not use (`used`: Capture.flags_used): capture
    advice never asks for a flag already given. Every renderer and analysis that advises asks here."""
    given = {flag for flag, name, _ in _ADVISED if name in (used or [])}
    return [flag for flag in wanted if flag not in given]


def missing_flags(schema: Schema, wanted: tuple[str, ...] = tuple(f for f, _, _ in _ADVISED[:3])) -> list[str]:
    """advice_flags of the capture behind `schema`."""
    return advice_flags(flags_used(schema), wanted)


def capture_advice(schema: Schema) -> str:
    """'capture again adding …: nsys profile …' with the flags of CAPTURE_COMMAND the capture
    lacks, then the whole line to run, built from the capture's own (rerun_command)."""
    missing = missing_flags(schema)
    if not schema.has_cuda_trace:
        missing = ["-t cuda,nvtx"] + missing
    line = rerun_command(schema)
    return f"capture again adding {' '.join(missing)}: {line}" if missing else f"capture with: {line}"


# CAPTURE_EVENT_TYPE -> the `-t` name that asked for it
_TRACES = {"Cuda": "cuda", "NvtxEvents": "nvtx", "OSRuntime": "osrt", "Cudnn": "cudnn", "Cublas": "cublas",
           "Cusparse": "cusparse", "Mpi": "mpi", "Ucx": "ucx", "OpenGL": "opengl", "Vulkan": "vulkan",
           "Oshmem": "oshmem", "Openacc": "openacc", "Openmp": "openmp"}


# nsys writes the CUDA trace in buffers; a process that crashes loses the last ones unless they are
# written at an interval (nsys profile --cuda-flush-interval, in ms; 0 by default: when full)
FLUSH_FLAG = "--cuda-flush-interval=100"


def rerun_command(schema: Schema, flags: tuple[str, ...] = tuple(f for f, _, _ in _ADVISED[:3]),
                  crash: bool = False) -> str:
    """The `nsys profile` line to run instead (issue 30, section 7): the capture's own traces
    (CAPTURE_EVENT_TYPE; cuda and nvtx always) and program (PROCESS_0:COMMAND and its arguments,
    never its environment), with `flags` (the memory capture: sizes and memory-call stacks) and the
    capture's own options that shape what is seen (kept_options); what got in the way (a capture
    range, a delay) is left out. `<your program>` when not recorded. `crash`: the line to run after a
    run that may have crashed, with the CUDA buffers written every 100 ms (FLUSH_FLAG) unless the
    capture already wrote them at an interval."""
    traces = list(dict.fromkeys(["cuda", "nvtx"] + [_TRACES[t] for t in schema.captured_event_types
                                                    if t in _TRACES]))
    program = shlex.join(schema.profiled_command) if schema.profiled_command else "<your program>"
    if schema.all_backtraces_requested:  # the capture's stacks of every kind, kept (at threshold 1)
        flags = tuple("--cudabacktrace=all:1" if f == "--cudabacktrace=memory:1" else f for f in flags)
    if crash and not schema.cuda_flush_ms:
        flags = (*flags, FLUSH_FLAG)
    return " ".join(["nsys profile", f"-t {','.join(traces)}", *flags, *kept_options(schema), "-o <report>", program])


def kept_options(schema: Schema) -> list[str]:
    """The options of the capture that the line to run keeps: Python call stacks
    (--python-backtrace=cuda, as recorded) and PyTorch's operator ranges (--pytorch=..., as the
    trace shows them)."""
    kept = []
    if schema.python_backtraces_requested:
        kept.append("--python-backtrace=cuda")
    if schema.pytorch_nvtx:
        kept.append(f"--pytorch={schema.pytorch_nvtx}")
    return kept


# First nsys release line known to trace each CUDA major version (approximate release order).
_NSYS_FOR_CUDA = {12: (2022, 5), 13: (2025, 3)}


def capture_diagnostics(schema: Schema, ranges: pd.DataFrame, last_cuda_call_ns: dict[int, int],
                        groups: list[GroupSummary], peaks: list[Peak], failed: list[FailedCall],
                        report_version: Optional[str], api_calls: Sequence[ApiCallStat] = (), quick: bool = False,
                        vmm_events: int = 0, allocations_with_events: int = 0,
                        pools: Sequence[PoolUse] = ()) -> list[Diagnostic]:
    """The same on both paths, from what the analyses answered: `api_calls` (CallStatSums'),
    `vmm_events` (VmmEvents'), `allocations_with_events` (the successful allocation calls that
    caused a memory event: calls.allocations_with_events of the calls frame, or as the streamed
    flow's CallWindow joins them), `pools` (pools.PoolUses')."""
    found: list[Diagnostic] = []
    found += _collection(schema, groups, api_calls, quick)
    found += _incomplete_trace(schema, last_cuda_call_ns, ranges, report_version)
    found += _orphan_frees(groups)
    found += _allocations_without_events(schema, api_calls, allocations_with_events)
    found += _static_memory(groups)
    found += _caching_allocator(schema, groups, ranges, pools)
    found += _vmm(vmm_events)
    found += _capacity(peaks)
    found += _failures(failed)
    return found


def _collection(schema: Schema, groups: list[GroupSummary], api_calls: Sequence[ApiCallStat],
                quick: bool) -> list[Diagnostic]:
    found = []
    if quick:
        found.append(Diagnostic("info", "quick",
                                "quick analysis (--quick): only the memory-usage table was read, so there are no "
                                "threads, API names, call sites, NVTX ranges, API call counts or failed calls, and "
                                "the trace was not checked for completeness; run without --quick for them"))
    if not schema.has_cuda_trace:
        found.append(Diagnostic("warning", "no_cuda_trace",
                                "the capture holds no CUDA API trace (CUDA tracing was off or failed): "
                                f"nothing about GPU memory can be said; {capture_advice(schema)}"))
    if schema.captured_event_types and "NvtxEvents" not in schema.captured_event_types and schema.has_cuda_trace:
        found.append(Diagnostic("warning", "nvtx_not_traced",
                                "NVTX was not traced (the capture's -t lacks nvtx): steps and phases can only be "
                                "found from the kernel sequence, and the program's own ranges are not in the "
                                f"capture; capture again adding nvtx to -t{_and(missing_flags(schema))}: "
                                f"{rerun_command(schema)}"))
    if not schema.memory_usage_collected:
        if schema.memory_usage_requested:
            found.append(Diagnostic("warning", "no_memory_events",
                                    "--cuda-memory-usage was on, but no memory events were recorded (no allocation "
                                    "was traced, or the process ended before nsys flushed them)"))
        else:
            n_alloc = sum(stat.calls for stat in api_calls if stat.family == "alloc")
            found.append(Diagnostic("warning", "sizes_not_collected",
                                    "sizes were not collected: the capture did not use --cuda-memory-usage=true, so "
                                    f"only API calls can be counted ({n_alloc} allocation calls); "
                                    f"{capture_advice(schema)}"))
    elif not schema.has_backtraces and groups and not quick:
        found.append(Diagnostic("info", "no_backtraces",
                                "no call stacks were collected, so sites are named by API, NVTX range and thread; "
                                + _backtrace_advice(schema)))
    return found


def _and(flags: list[str]) -> str:
    return f" (and {' '.join(flags)})" if flags else ""


def _backtrace_advice(schema: Schema) -> str:
    """How to get call stacks, given what the capture already asked for."""
    missing = missing_flags(schema, STACK_FLAGS)
    threshold = schema.memory_backtrace_threshold_ns
    line = rerun_command(schema)
    if missing == ["-s process-tree"]:
        return ("the capture asked for them (--cudabacktrace) with CPU sampling off, and nsys records CUDA call "
                f"stacks only with sampling on: add -s process-tree: {line}")
    if missing:
        return f"add {' '.join(missing)} to the capture for function names: {line}"
    if threshold is not None and threshold > 1000:
        return (f"the capture asked for them only for memory calls longer than {threshold / 1000:g} µs "
                f"(--cudabacktrace=memory:<threshold>), and no call was: use --cudabacktrace=memory:1: {line}")
    return "the capture asked for them (--cudabacktrace, sampling on), yet none were recorded"


def _version_tuple(version: Optional[str]) -> Optional[tuple[int, int]]:
    match = re.match(r"(\d{4})\.(\d+)", version or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def _incomplete_trace(schema: Schema, last_cuda_call_ns: dict[int, int], ranges: pd.DataFrame,
                      report_version: Optional[str]) -> list[Diagnostic]:
    """A CUDA trace that stops while the process visibly goes on (NVTX ranges after it)."""
    found = []
    capture_version = report_version or schema.nsys_version
    nsys = _version_tuple(capture_version)
    if nsys and schema.cuda_driver_version:
        major = int(schema.cuda_driver_version.split(".")[0])
        needed = _NSYS_FOR_CUDA.get(major)
        if needed and nsys < needed:
            found.append(Diagnostic("warning", "nsys_older_than_cuda",
                                    f"the capture was made with Nsight Systems {capture_version}, older than the "
                                    f"CUDA {schema.cuda_driver_version} driver it traced; such captures often miss "
                                    f"CUDA events: profile again with a current nsys: {rerun_command(schema)}"))
    finite = ranges[ranges["end_ns"] < np.iinfo("int64").max // 4]
    for pid, last in sorted(last_cuda_call_ns.items()):  # one per process
        later = finite[(finite["pid"] == pid) & (finite["start_ns"] > last)]
        if len(later) >= TRACE_GOES_ON:
            gap_ms = (later["end_ns"].max() - last) / 1e6
            names = ", ".join(repr(n) for n in later.sort_values("start_ns")["name"].drop_duplicates().head(3))
            found.append(Diagnostic("warning", "cuda_trace_incomplete",
                                    f"process {pid}: the CUDA trace stops at {last / 1e6:.1f} ms, yet {len(later)} "
                                    f"NVTX ranges ({names}, ...) follow for another {gap_ms:.1f} ms; the CUDA trace "
                                    "looks incomplete, so the numbers cover only its beginning (a crash before nsys "
                                    "wrote its buffers, or an nsys too old for the driver); capture again with a "
                                    "current nsys, writing the buffers every 100 ms: "
                                    + rerun_command(schema, crash=True)))
    return found


def _orphan_frees(groups: list[GroupSummary]) -> list[Diagnostic]:
    count = sum(g.frees_without_alloc for g in groups)
    if not count:
        return []
    size = sum(g.frees_without_alloc_bytes for g in groups)
    return [Diagnostic("warning", "allocated_before_capture",
                       f"{count} frees ({fmt_bytes(size)}) release memory allocated before the capture started; "
                       "that memory is not in the live bytes, so real usage was higher than shown")]


def _allocations_without_events(schema: Schema, api_calls: Sequence[ApiCallStat], with_events: int) \
        -> list[Diagnostic]:
    missing = sum(stat.calls - stat.failed for stat in api_calls if stat.family == "alloc") - with_events
    if not schema.memory_usage_collected or not missing:
        return []
    return [Diagnostic("info", "allocations_without_events",
                       f"{missing} successful allocation calls have no memory event (zero-size requests, or "
                       "events nsys did not record); their sizes are unknown")]


def _static_memory(groups: list[GroupSummary]) -> list[Diagnostic]:
    statics = [g for g in groups if g.kind in NOT_LEAKS]
    if not statics:
        return []
    count = sum(g.allocations for g in statics)
    size = sum(g.allocated_bytes for g in statics)
    return [Diagnostic("info", "static_memory",
                       f"{count} module globals ({fmt_bytes(size)}) are static memory loaded with the GPU code; they "
                       "are never freed by design and are reported apart, not as leaks")]


def xla_pids(ranges: pd.DataFrame) -> set[int]:
    """Processes that ran XLA (JAX, TensorFlow): XLA names its NVTX ranges Xla* (XlaModule:…,
    XlaCompile:…), PyTorch never does. Such a process is never described as PyTorch."""
    names = ranges["name"].astype(str)
    return set(pd.unique(ranges["pid"].to_numpy()[names.str.startswith("Xla").to_numpy()]).tolist())


def _caching_allocator(schema: Schema, groups: list[GroupSummary], ranges: Optional[pd.DataFrame] = None,
                       pools: Sequence[PoolUse] = ()) -> list[Diagnostic]:
    pids = sorted({g.pid for g in groups})  # the processes with memory events
    names = " ".join(schema.process_names.get(int(p), "") for p in pids)
    python = re.search(r"python|torchrun|pt_main_thread", names, re.I) is not None
    open_device = sum(g.never_freed_count for g in groups if g.kind == "device")
    if not (python and open_device):
        return []
    xla = xla_pids(ranges) if ranges is not None else set()
    if xla & set(pids):
        return [Diagnostic("info", "caching_allocator",
                           "this looks like a JAX (XLA) process (its NVTX ranges are XLA's): XLA's allocator keeps "
                           "the device memory it got for reuse until the process ends, so 'never freed' means "
                           "'still held at the end', not necessarily a leak; look at how live bytes grow from "
                           "step to step")]
    used = [p for p in pools if p.peak_used_bytes]
    if used:
        held = sum(p.end_reserved_bytes for p in used)
        return [Diagnostic("info", "caching_allocator",
                           "this Python process allocates from a stream-ordered memory pool (cudaMallocAsync, as "
                           "PyTorch's backend:cudaMallocAsync does), not from cudaMalloc segments: the pool keeps "
                           f"what it reserved until it is trimmed, and {fmt_bytes(held)} was still reserved at the "
                           "end of the run; 'never freed' means 'still held at the end', not necessarily a leak; "
                           "look at how live bytes grow from step to step")]
    return [Diagnostic("info", "caching_allocator",
                       "this looks like a Python (PyTorch) process: its caching allocator keeps the segments it "
                       "got from cudaMalloc until empty_cache(), so 'never freed' means 'still reserved at the "
                       "end', not necessarily a leak; look at how live bytes grow from step to step")]


VMM_EVENT_APIS = ("cuMemSetAccess", "cuMemUnmap", "cuMemMap")


class VmmEvents(Reducer):
    """How many memory events the driver's virtual-memory API made (the diagnostic
    virtual_memory_api). Facts.more: "api_names" (what the batches' "api" codes name)."""

    field = "vmm_events"
    needs = ("api_names",)

    def start(self, facts) -> None:
        super().start(facts)
        self.codes = [i for i, name in enumerate(facts.more["api_names"]) if name in VMM_EVENT_APIS]
        self.count = 0

    def add(self, b) -> None:
        if self.codes and len(b):
            self.count += int(np.isin(b.calls["api"], self.codes).sum())

    def finish(self, live: dict) -> int:
        return self.count


def _vmm(count: int) -> list[Diagnostic]:
    if not count:
        return []
    return [Diagnostic("info", "virtual_memory_api",
                       f"{count} events come from the driver's virtual-memory API (cuMemCreate/cuMemMap, "
                       "as used by PyTorch expandable segments, NCCL and XLA): nsys records them when access is set "
                       "(cuMemSetAccess) and unmapped (cuMemUnmap); memory created but never mapped is not seen")]


def _capacity(peaks: list[Peak]) -> list[Diagnostic]:
    found = []
    for peak in peaks:
        if peak.pid is None or not peak.total_memory_bytes:
            continue
        share = peak.peak_bytes / peak.total_memory_bytes
        if share >= 0.9:
            found.append(Diagnostic("warning", "near_capacity",
                                    f"process {peak.pid} reached {fmt_percent(share)} of GPU {peak.gpu}'s "
                                    f"{fmt_bytes(peak.total_memory_bytes)} at its peak"))
    return found


def _failures(failed: list[FailedCall]) -> list[Diagnostic]:
    oom = [f for f in failed if f.return_value == 2]
    if not oom:
        return []
    first = oom[0]
    where = f" in NVTX range '{first.nvtx_range}'" if first.nvtx_range else ""
    held = f", holding {fmt_bytes(first.live_bytes)}" if first.live_bytes is not None else ""
    return [Diagnostic("warning", "allocation_failed",
                       f"{len(oom)} memory call{'s' if len(oom) != 1 else ''} failed with out-of-memory; "
                       f"the first, {first.api} "
                       f"({first.error}) by process {first.pid} at {first.time_ns / 1e6:.1f} ms{where}{held}")]
