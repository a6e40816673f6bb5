"""Training steps: which NVTX ranges are the steps, and what each step did to live memory.

A step is an instance of the NVTX range a program repeats around its loop body ("step 3",
"iteration 12", "ProfilerStep#7", "train_step"). Per process, the steps are the ranges on a
thread that calls memory APIs whose name, with its numbers blanked out, repeats at least
MIN_STEPS times at one nesting depth; a name that says step/iteration/epoch/batch wins, then
the main thread, then the outermost depth, then the most instances; libraries' own ranges
(LIBRARY_RANGES) and unnamed ones are never steps by repetition. `--step-range REGEX` names them
instead. Steps are time windows on the whole process: PyTorch's backward pass allocates
from its autograd thread, inside the main thread's step.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from typing import Optional

import numpy as np
import pandas as pd

from ..events.arrays import distinct_pairs
from ..events.nvtx import thread_key
from ..model import Diagnostic, Holder, Step, StepSeries

MIN_STEPS = 3
STEP_KINDS = ("device", "array")  # allocated by the program; module statics are loaded by the driver
STEP_WORDS = re.compile(r"step|iter|epoch|batch", re.I)
# Ranges that libraries mark themselves, in every step of a script that marks none (nsys -t nvtx
# records them): CCCL's "cub::DeviceRadixSort", NCCL's "ncclAllReduce", XLA's "XlaModule:#...#",
# "Thunk:#...#"; C++-qualified or '#'-tagged names are a library's, not a loop's.
LIBRARY_RANGES = r"::|#|^(?:nccl|Xla|Thunk|GpuMetrics|cudnn|cublas|cutlass|thrust|cub)"
MAX_HOLDERS = 3  # per step
MAX_LISTED = 200  # steps listed per series in the model
OPEN_END = np.iinfo("int64").max // 4  # an end beyond this is "never closed" (see events.py)

# The two lines that make steps visible, given whenever no steps are found.
HOW_TO_MARK_STEPS = ("mark each step with two lines, `torch.cuda.nvtx.range_push(f\"step {i}\")` at the top "
                     "of the loop body and `torch.cuda.nvtx.range_pop()` at its end (with torch.profiler, "
                     "`prof.step()` under `torch.autograd.profiler.emit_nvtx()` marks ProfilerStep#N ranges), "
                     "or name the ranges that are steps with --step-range REGEX")


def find_step_ranges(ranges: pd.DataFrame, memory_threads: np.ndarray,
                     pattern: Optional[str] = None) -> dict[int, tuple[str, pd.DataFrame]]:
    """Per process: the steps' name (numbers as N, or the pattern) and their ranges in time order.

    `memory_threads`: pid << 24 | tid of every thread that made a memory call. A process that
    made none (a capture that began after warm-up, with the caching allocator full: its memory
    events are the blocks already live) has its steps looked for on all its threads.
    """
    keys = thread_key(ranges["pid"].to_numpy(), ranges["tid"].to_numpy())
    candidates = ranges[np.isin(keys, memory_threads) | ~np.isin(ranges["pid"].to_numpy(), memory_threads >> 24)]
    if pattern is not None:
        candidates = candidates[candidates["name"].str.contains(pattern, regex=True).to_numpy()]
        family = pd.Series(pattern, index=candidates.index)
        least = 1
    else:
        family = candidates["name"].str.replace(r"\d+", "N", regex=True)
        least = MIN_STEPS
        # libraries' own ranges repeat every step too, but are not the loop: left to --step-range
        library = family.str.contains(LIBRARY_RANGES, regex=True).to_numpy() | (family == "").to_numpy()
        candidates, family = candidates[~library], family[~library]
    # Counted and ranked in plain Python: a few hundred ranges, where pandas' groupby, sorts and
    # masks took 16 ms of the GPT-2 capture's analysis (issue 31).
    with_family = candidates.assign(family=family)
    pid, tid = with_family["pid"].to_numpy(), with_family["tid"].to_numpy()
    depth, families = with_family["depth"].to_numpy(), with_family["family"].to_numpy(dtype=object)
    # (pid, tid, depth, family) -> instances, in order of first appearance
    counted = Counter(zip(pid.tolist(), tid.tolist(), depth.tolist(), families.tolist()))
    # Preference: a step-like name, the main thread, the outermost depth, the most instances.
    ranked = sorted(((key, n) for key, n in counted.items() if n >= least),
                    key=lambda item: (item[0][0], not STEP_WORDS.search(item[0][3]), item[0][1] != item[0][0],
                                      item[0][2], -item[1]))  # stable
    chosen: dict[int, tuple[str, pd.DataFrame]] = {}
    for (best_pid, best_tid, best_depth, best_family), _ in ranked:
        if best_pid in chosen:  # one per process: its first
            continue
        mine = with_family[(pid == best_pid) & (tid == best_tid) & (depth == best_depth) & (families == best_family)]
        chosen[int(best_pid)] = (str(best_family), mine.sort_values("start_ns", kind="stable"))
    return chosen


def step_numbers(names: list[str]) -> list[int]:
    """The number in each step's name when every step has a distinct one ("step 3" -> 3), else 0, 1, ..."""
    numbers = [int(found[-1]) if (found := re.findall(r"\d+", name)) else None for name in names]
    if None in numbers or len(set(numbers)) != len(numbers) or numbers != sorted(numbers):
        return list(range(len(names)))
    return numbers  # type: ignore[return-value]


def step_spans(spans: pd.DataFrame, end_ns: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The steps' starts, ends and whether each closed."""
    starts = spans["start_ns"].to_numpy()
    raw_ends = spans["end_ns"].to_numpy()
    # nsys ends a range left open at the end of the session (or leaves its end NULL, read as
    # OPEN_END): a step that ends at the capture's end never closed.
    closed = raw_ends < min(OPEN_END, max(end_ns, 0))
    ends = np.where(closed, raw_ends, max(end_ns, 0))
    return starts, np.maximum(ends, starts), closed


def step_series(pid: int, device: int, gpu: Optional[int], family: str, found_by: str, spans: pd.DataFrame,
                times: tuple, sums: tuple, holders: dict[int, list[Holder]],
                trace_end_ns: Optional[dict[int, int]], found=None) -> StepSeries:
    """The StepSeries of one (process, device): `times` step_spans(), `sums` per step its live
    bytes at start and end, peak, bytes allocated and kept (allocated inside and never freed);
    `found`: the iterations.Iterations its steps are, when the kernels gave them."""
    starts, ends, closed = times
    start_live, end_live, peak, allocated, kept = sums
    freed = allocated - (end_live - start_live)
    deltas = np.diff(np.concatenate([[start_live[0]], end_live])) if len(end_live) else end_live
    traced = ends <= (trace_end_ns or {}).get(pid, OPEN_END)
    names = spans["name"].astype(str).tolist()
    numbers = step_numbers(names)
    # Columns as Python values first: a long run has 5,000 steps per process, and indexing
    # a numpy array makes an object per value.
    columns = zip(numbers, names, starts.tolist(), ends.tolist(), closed.tolist(), start_live.tolist(),
                  end_live.tolist(), deltas.tolist(), peak.tolist(), allocated.tolist(), freed.tolist(),
                  kept.tolist(), traced.tolist())
    steps = [Step(number=number, name=name, start_ns=int(start), end_ns=int(end), closed=bool(is_closed),
                  start_live_bytes=int(live_at_start), end_live_bytes=int(live_at_end), delta_bytes=int(delta_i),
                  peak_live_bytes=int(peak_i), allocated_bytes=int(allocated_i), freed_bytes=int(freed_i),
                  kept_bytes=int(kept_i), kept=holders.get(i, []), traced=bool(is_traced))
             for i, (number, name, start, end, is_closed, live_at_start, live_at_end, delta_i, peak_i, allocated_i,
                     freed_i, kept_i, is_traced) in enumerate(columns)]  # one per step
    if found is not None:
        return StepSeries(pid=pid, device=device, gpu=gpu, range_name=family, found_by="kernels", steps=steps,
                          found_how=found.how, confidence=found.confidence)
    return StepSeries(pid=pid, device=device, gpu=gpu, range_name=family, found_by=found_by, steps=steps)


def listed(series: StepSeries, limit: int = MAX_LISTED) -> StepSeries:
    """The series with its first and last limit/2 steps when it has more (a 5000-step capture
    would otherwise put 3 MB of steps into the JSON); `step_count` keeps the number found."""
    if len(series.steps) <= limit:
        return dataclasses.replace(series, step_count=len(series.steps))
    half = limit // 2
    return dataclasses.replace(series, steps=series.steps[:half] + series.steps[-half:],
                               step_count=len(series.steps))


def holders_by_step(step: np.ndarray, site: np.ndarray, name: np.ndarray, size: np.ndarray, sites, names) -> \
        dict[int, list[Holder]]:
    """Per step, its MAX_HOLDERS largest (site, range) pairs of kept allocations, given each one's
    step, site and range (codes into `sites` and `names`, -1 for none) and size, in event order
    (which breaks ties)."""
    kept = pd.DataFrame({"step": step, "site": site, "range": name, "bytes": size})
    summed = kept.groupby(["step", "site", "range"], sort=False)["bytes"].agg(["sum", "size"]).reset_index()
    summed = summed.sort_values(["step", "sum"], ascending=[True, False], kind="stable")
    summed = summed.groupby("step", sort=False).head(MAX_HOLDERS)
    holders: dict[int, list[Holder]] = {}
    for step_i, site_code, name_code, total, count in summed.itertuples(index=False):  # capped per step
        holders.setdefault(int(step_i), []).append(Holder(
            site=str(sites[site_code]) if site_code >= 0 else "", nvtx_range=str(names[name_code]) if name_code >= 0 else "",
            bytes=int(total), allocations=int(count)))
    return holders


def memory_threads(calls: pd.DataFrame) -> np.ndarray:
    """pid << 24 | tid of every thread that made a memory call (an event's thread is its call's)."""
    return distinct_pairs(calls["pid"].to_numpy(), calls["tid"].to_numpy(), 24, 0xFFFFFF)


def step_diagnostics(series, found: list[StepSeries], has_ranges: bool, quick: bool,
                     pattern: Optional[str]) -> list[Diagnostic]:
    """Why steps (and so the growth verdict) are missing, with how to make them visible; `series`:
    the (process, device) series of device + array bytes."""
    if not series or found:
        return []
    if quick:
        return [Diagnostic("info", "no_steps", "--quick does not read NVTX ranges, so steps and memory growth "
                                               "per step are not judged; run without --quick for them")]
    if pattern is not None:
        return [Diagnostic("warning", "no_steps", f"no NVTX range on a thread that allocates GPU memory matches "
                                                  f"--step-range {pattern!r}, so memory growth per step is not "
                                                  "judged")]
    why = ("the capture has no NVTX ranges" if not has_ranges else
           f"no NVTX range repeats at least {MIN_STEPS} times on a thread that allocates GPU memory")
    why += f", and no kernel sequence repeats {MIN_STEPS} times or more"  # analyses/iterations.py
    return [Diagnostic("info", "no_steps", f"no training steps found ({why}), so memory growth per step is not "
                                           f"judged; {HOW_TO_MARK_STEPS}")]
