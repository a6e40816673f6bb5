"""Analyses: the engine's reducers (one per question, nsysan/engine) and what makes their answers
one `Analysis` on both paths (`analysis_of`): the whole frame's `run_analyses`, here, and the flow's
`run_flow` (flow.py). None of them does I/O but the flow's reading.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Callable, Optional, TypeVar

import numpy as np
import pandas as pd

from ..events import LoadedEvents
from ..events.columns import empty_calls
from ..engine import Engine, Facts, FramePieces, Labels, frame_batch, frame_labels, frame_live
from ..model import SCHEMA_ID, Analysis, Diagnostic, Peak, Source, Timeline
from ..sources.schema import Schema
from .allocations import Listed, described_peaks
from .bounds import cut_long_strings
from .capture import EventSpan, capture_facts, capture_span, frame_span, gpus
from .calls import FailedCalls, api_call_stats, call_outcomes, allocations_with_events
from .explore import Explorable, allocation_groups, early_trace_ends, LargestAllocations
from .diagnostics import VmmEvents, capture_diagnostics
from .never_freed import MAX_LISTED, NeverFreed
from .groups import GroupSums
from .peak import Peaks, headline
from .pools import PoolUses
from .preallocations import BigBlocks
from .ranges import RangeSums, alloc_calls
from .sites import SiteRanks
from .stacks import referenced_stacks, stack_bytes
from .byte_classes import ByteClassSums, byte_classes, step_phases
from .step_windows import StepWindows, found_steps
from .steps import memory_threads, step_diagnostics
from .spikes import DEFAULT_WINDOW_NS, Spikes
from .answers import gather_answers
from .timeline import TimelineSeries
from .verdicts import VerdictLooks, frame_calls


__all__ = ["run_analyses"]

T = TypeVar("T")

# The whole frame is fed to the reducers in batches of this many events (engine.FramePieces), as
# a flow's batches are: what a reducer makes of a batch (n-long gathers, groups, running sums) is
# bounded by it. At 1e7 events, in one batch the analyses held up to 823 MiB above the frames
# (two cores at once: SiteRanks.again 410 MiB, ReleaseBursts.add 370 ...), in pieces of 2^20
# 206 MiB, at the same CPU time (tracemalloc; docs/performance.md).
PIECE_ROWS = 1 << 20


def run_analyses(loaded: "LoadedEvents", schema: Schema, source: Source,
                 report_version: Optional[str] = None, step_range: Optional[str] = None,
                 spike_window_ns: int = DEFAULT_WINDOW_NS, keep_calls: bool = True) -> Analysis:
    """Every analysis over one export's frames, as one `Analysis`.

    `step_range`: a regular expression naming the NVTX ranges that are training steps (found by
    their repetition when None); `spike_window_ns`: the window within which a rise is a spike;
    `keep_calls` false (the command line's): the `Analysis` keeps no calls frame, and the frame
    (`loaded.calls`, emptied) is let go of once what reads it is done, before most reducers run
    (296 MiB at 1e7 calls).
    """
    events, calls, ranges = loaded.events, loaded.calls, loaded.ranges
    frames = (events, calls if keep_calls else None, ranges)  # (--smi reads the events after)
    if not keep_calls:
        loaded.calls = empty_calls()  # `calls`, below, is then the last reference
    site_table = loaded.sites.set_index("label").to_dict("index") if not loaded.sites.empty else {}

    listed = Listed(events, site_table)
    gpu_of, total_memory = gpus(schema)

    kinds = list(events["kind"].cat.categories)
    # The analyses only read the frames, and numpy works without the GIL on large arrays: the
    # API calls' statistics are found on a second core while this one finds the pools and the
    # capture's span, then the peaks (the verdicts wait for them between their looks), then in
    # one engine run the reducers that need no other's answer (the timeline, the byte classes,
    # the ranges' and sites' tables), while this core runs every other reducer in one engine run
    # (at 1e7 events 3.8 s of CPU on each core; docs/performance.md).
    with ThreadPoolExecutor(max_workers=1) as pool:
        # the API calls' statistics first: the calls frame can go once they and this core's
        # readers of it are done (0.3 s at 1e7 calls)
        api_call_work = _letting_go(api_call_stats, calls)
        api_calls_later = pool.submit(api_call_work)
        # The pools first (the peaks take their reserve changes); they read the pool rows alone, so
        # their batch holds no event (as a flow's batch of pool rows alone does): none of the frame's
        # columns is made for it.
        pool_uses = PoolUses()
        pools = Engine([pool_uses], Facts(kinds, gpu_of, {"pool_events": loaded.pool_events})).run(
            [frame_batch(events.iloc[:0], pools=loaded.pool_usage)], {})["pools"]
        # The whole frame as the engine's batches of PIECE_ROWS (numpy views, and the few columns made
        # of them as each is read), for every engine run below: each run's batches have per-batch work
        # of their own (`shared`), and the same live set.
        whole, live = FramePieces(events, PIECE_ROWS), frame_live(events)
        start_ns, end_ns = capture_span(schema.duration_ns, _one_run(EventSpan(), Facts(kinds), whole, live).capture,
                                        frame_span(calls, "ts_ns", "end_ns"), frame_span(ranges, "start_ns", "end_ns"))
        peaks_later = pool.submit(lambda whole=whole: described_peaks(_one_run(Peaks(), Facts(kinds, gpu_of, {
            "pool_uses": pool_uses}), whole, live), kinds, total_memory, listed))
        facts = Facts(kinds, gpu_of)
        outcomes = call_outcomes(calls)
        # pid << 24 | tid of each thread with memory calls: 1e7 calls, read once (or by the pipeline already)
        threads = loaded.memory_threads if loaded.memory_threads is not None else memory_threads(calls)
        joined = allocations_with_events(calls)
        range_alloc_calls = None if schema.memory_usage_collected else alloc_calls(calls, ranges)  # no sizes: the calls
        # the verdicts read the calls again only when one failed (VerdictLooks)
        read_calls = frame_calls(calls if keep_calls or not outcomes.failed.empty else empty_calls())
        del calls  # what else reads them has its own reference: the API calls' statistics, kept until they are done
        found = found_steps(ranges, threads, step_range,
                            (loaded.launches, loaded.launch_names) if step_range is None else None,
                            loaded.nvtx_steps if step_range is None else None)
        # what the reducers know before the events: the steps and their phases, the NVTX ranges,
        # the failed calls, what the labelled columns name, the capture's end, and (the verdicts'
        # looks', filled by them) the out-of-memory calls and each process's peak, from the second core
        more = {"found_steps": found, "phases": step_phases(found.steps, found.ranges),
                "spike_window_ns": spike_window_ns, "nvtx_ranges": ranges, "operator_ranges": loaded.operator_ranges,
                "memory_threads": threads, "end_ns": end_ns, "labels": partial(frame_labels, events),
                "failed_call_rows": outcomes.failed, "range_alloc_calls": range_alloc_calls}
        # the reducers that need no other's answer in one run: each piece's batch and groups made
        # once for the five (runs of their own made them again, and left this core twice the
        # second's share)
        apart = [TimelineSeries(), Explorable(), ByteClassSums(), RangeSums(), *([] if loaded.quick else [SiteRanks()])]
        apart_facts = dataclasses.replace(facts, more={**more, "site_table": lambda: site_table})
        apart_later = pool.submit(lambda: Engine(apart, apart_facts).run(whole, dict(live)))
        looks = VerdictLooks(outcomes, read_calls, None if loaded.quick else list(events["api"].cat.categories),
                             ranges, gpu_of, total_memory, schema.process_names, schema.duration_ns,
                             lambda: engine.so_far("big_blocks"), more)
        more["allocator_peaks"] = lambda: [(p.pid, p.device, p.peak_time_ns) for p in peaks_later.result()[0]
                                           if p.pid is not None]
        engine = Engine([GroupSums(), NeverFreed(), LargestAllocations(), BigBlocks(), StepWindows(),
                         Spikes(), *looks.reducers,
                         *([] if loaded.quick else [FailedCalls(), VmmEvents()])],
                        dataclasses.replace(facts, more=more))
        answered = engine.run(whole, dict(live))
        answered.update(apart_later.result(), pools=pools)

        def later() -> tuple[list, list]:
            return _here_unless_started(api_calls_later, api_call_work), answered.get("sites", [])

        return analysis_of(
            schema, source, report_version, loaded.quick, answered, listed, looks, peaks_later.result(), later,
            threads=threads, ranges=ranges, last_calls=loaded.last_cuda_call_ns, notes=list(loaded.diagnostics),
            joined=joined, span=(start_ns, end_ns), step_range=step_range,
            labels=frame_labels(events), stacks=loaded.stacks, frames=frames)


def analysis_of(schema: Schema, source: Source, report_version: Optional[str], quick: bool, answered: dict,
                listed: Listed, looks: VerdictLooks, peaks: tuple[list[Peak], list[Callable[[], str]]],
                later: Callable[[], tuple[list, list]], *, threads: np.ndarray, ranges: pd.DataFrame,
                last_calls: dict[int, int], notes: list[Diagnostic], joined: int, span: tuple[int, int],
                step_range: Optional[str], labels: Labels, stacks: list,
                frames: tuple = (None, None, None)) -> Analysis:
    """The `Analysis` of what the engine's reducers `answered` (by field), on both paths (the whole
    frame's run_analyses, the flow's run_flow): the listed allocations described by `listed`, the
    verdicts' `looks` done, the `peaks` (allocations.described_peaks); `later()`: the API call
    statistics and the sites table (asked for last: the whole frame's are found on the second core
    meanwhile); `threads`: the memory threads; `ranges`: the NVTX ranges; `last_calls`: pid -> its
    last CUDA call; `notes`: the reading's diagnostics; `joined`: the allocation calls that caused a
    memory event (calls.allocations_with_events); `span`: the capture's; `labels`: what the batches'
    labelled columns name; `stacks`: the call stacks; `frames`: the events, calls and NVTX ranges
    frames a notebook keeps (None: not kept)."""
    gpu_of, (start_ns, end_ns) = looks.gpu_of, span
    groups, pools = answered["groups"], answered["pools"] or []
    capture = capture_facts(schema, groups, threads, report_version, not ranges.empty or schema.has_nvtx_table)
    names = {p.pid: p.label for p in capture.processes}
    verdicts = looks.verdicts(*peaks, groups, pools, end_ns, listed, lambda pid: names.get(pid) or f"process {pid}",
                              answered.get("free_times"))
    peaks = verdicts.peaks
    largest, allocations_total = answered["largest"]
    trace_ends = early_trace_ends(ranges, last_calls)
    timeline = dataclasses.replace(
        answered["explorable"].timeline(Timeline(start_ns=int(start_ns), end_ns=int(end_ns),
                                                 series=answered["timeline"]), trace_ends),
        allocations=listed.allocations(largest, answered.get("free_times")), allocations_total=allocations_total)
    api_calls, sites = later()
    failed = answered.get("failed_calls", [])
    diagnostics = list(schema.diagnostics) + notes + capture_diagnostics(
        schema, ranges, last_calls, groups, peaks, failed, report_version, api_calls, quick,
        answered.get("vmm_events", 0), joined, pools)
    if quick:
        steps, phases, growth = [], [], []
        step_notes = step_diagnostics(answered["steps"].series, [], False, True, step_range)
    else:
        steps, phases, growth, step_notes = answered["steps"].answers(
            int(end_ns), gpu_of, step_range, last_calls, labels, capture.processes, verdicts.caps, not ranges.empty,
            False)
    diagnostics = [d for d in diagnostics if d.code not in verdicts.replaces] + verdicts.diagnostics + step_notes
    leaks = answered["never_freed"]  # largest first
    range_table, range_families = ([], []) if quick else answered["ranges"]
    analysis = Analysis(
        schema=SCHEMA_ID, scope="quick" if quick else "full", source=source, capture=capture, groups=groups,
        peak=headline(peaks), peaks=peaks, never_freed=listed.allocations(leaks.head(MAX_LISTED)),
        never_freed_total=len(leaks), sites=[] if quick else sites, api_calls=api_calls, failed_calls=failed,
        ranges=range_table, range_families=range_families, timeline=timeline, diagnostics=diagnostics,
        caps=verdicts.caps, oom=verdicts.oom, reserved=verdicts.reserved, steps=steps, growth=growth,
        never_freed_groups=allocation_groups(*listed.rows(leaks), listed.site_table) if len(leaks) else [],
        never_freed_stacks=stack_bytes(*listed.rows(leaks)) if len(leaks) else [], phases=phases,
        spikes=answered["spikes"],
        byte_classes=[] if quick else byte_classes(answered["byte_classes"], verdicts.reserved, growth, gpu_of),
        events=frames[0], calls=frames[1], nvtx_ranges=frames[2])
    answers = gather_answers(analysis.peak, analysis.process_peaks(), growth, diagnostics, quick,
                             {pid: label for pid, label in names.items() if label}, analysis.byte_classes)
    # The stacks last: every stack_id of the finished model (groups, timeline, OOM lists) is kept.
    analysis = dataclasses.replace(analysis, answers=answers)
    return cut_long_strings(dataclasses.replace(analysis, stacks=referenced_stacks(stacks, analysis)))


def _here_unless_started(later: Future, work: Callable[[], T]) -> T:
    """The result of `work`, queued for the second core as `later`, found on this one instead when
    the second has not started it yet (a queued future can still be cancelled; a running one cannot)."""
    return work() if later.cancel() else later.result()


def _letting_go(work: Callable[[pd.DataFrame], T], frame: pd.DataFrame) -> Callable[[], T]:
    """work(frame), called once (on the second core, or on this one: _here_unless_started), which
    holds `frame` only until then."""
    held = [frame]
    return lambda: work(held.pop())


def _one_run(reducer, facts: Facts, whole: FramePieces, live: dict):
    """What `reducer` answers of the whole frame's batches `whole` (frame_live's `live`)."""
    return Engine([reducer], facts).run(whole, dict(live))[reducer.field]
