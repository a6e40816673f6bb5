"""`run_flow`: the analysis of an export from the engine's two looks at the flow of its event
batches (events/stream.py EventFlow), in bounded memory (issue 14): the document `run_analyses`
makes from the whole events frame, for an export too large for it (or `--max-memory 0`).

`--quick` reads the memory table alone: no calls, no NVTX ranges, no labels. The full analysis
joins each batch to its API calls (events/stream_calls.py); one scan of the calls sums the API
call stats, finds the failed calls, the threads and the calls' span; the first look gathers the
allocations' call stacks (and the engine's reducers the live bytes at each failed call,
calls.FailedCalls, and the driver's virtual-memory events, diagnostics.VmmEvents); the second
labels every event's site (events/flow_labels.py) and attributes it to its NVTX ranges, for the
engine's sites table (sites.SiteRanks) and ranges table (ranges.RangeSums); the timeline's bands,
spans and focus from the engine's explore.Explorable as on the whole frame; the steps, growth and
phases from the engine's reducer (step_windows.py) as on the whole frame. The document is built
from the engine's answers as the whole frame's is (analyses.analysis_of).
"""

from __future__ import annotations

import sqlite3
from typing import Optional

import numpy as np
import pandas as pd

from ..engine import Engine, Facts, Labels, Reducer
from ..events import stream
from ..events.batch import EventBatch, no_rows
from ..events.columns import empty_ranges
from ..events.flow_labels import FlowLabels
from ..events.load import QUICK_API
from ..events.nvtx import innermost_range_rows, range_paths
from ..events.read import last_cuda_calls, read_thread_names
from ..events.read_code import code_call_ids
from ..events.read_launches import read_launches
from ..events.read_nvtx import read_nvtx_ranges
from ..events.read_order import order_ahead
from ..events.read_pools import read_pool_events
from ..events.stream import EventFlow
from ..events.stream_calls import CallWindow, MemoryCalls
from ..model import KINDS, Analysis, Diagnostic, Source
from ..sources.schema import Schema
from .allocations import FreeTimes, Listed, described_peaks
from .byte_classes import ByteClassSums, step_phases
from .calls import CallOutcomes, CallStatSums, FailedCalls
from .capture import EventSpan, capture_span, frame_span, gpus
from .diagnostics import VmmEvents
from .explore import Explorable, LargestAllocations
from .groups import GroupSums
from .iterations import iteration_pids
from .never_freed import NeverFreed
from .peak import Peaks
from .pools import PoolUses
from .preallocations import BigBlocks
from .ranges import RangeSums
from .sites import SiteRanks
from .spikes import Spikes
from .step_windows import StepWindows, found_steps
from .steps import find_step_ranges
from .timeline import TimelineSeries
from .verdicts import VerdictLooks
from . import analysis_of


def run_flow(conn: sqlite3.Connection, schema: Schema, source: Source, report_version: Optional[str],
             step_range: Optional[str], spike_window_ns: int, quick: bool) -> tuple[Analysis, Optional[pd.DataFrame]]:
    """The analysis (`quick` or full) of the export behind `conn`, its events read twice in batches;
    and (full) the code-load and graph calls' rows read in the scan of the memory calls
    (read_code.read_code_calls' `raw`; None when not read there)."""
    gpu_of, total_memory = gpus(schema)
    looks: dict = {}  # the first look's big blocks; the full analysis's labelling ("second") and site table
    more: dict = {"spike_window_ns": spike_window_ns}  # the reducers' facts beyond the kinds and GPUs
    if quick:
        flow = EventFlow(conn, schema)
        calls, ranges, spans, reducers = None, empty_ranges(), (), ()
        outcomes = CallOutcomes([], [])
        verdict_looks = VerdictLooks(outcomes, lambda: ((), ()), None, ranges, gpu_of, total_memory,
                                     schema.process_names, schema.duration_ns, lambda: looks["big_blocks"], more)
        described = _Undescribed(flow.kinds)
        labelling = []
    else:
        ahead = order_ahead(conn, stream.CHUNK_ROWIDS, stream.MOST_RUNS)  # meanwhile, on a second thread
        calls = MemoryCalls(conn, schema)
        stat_sums, outcomes = CallStatSums(calls.api_names, calls.families), CallOutcomes(calls.api_names,
                                                                                          calls.families)

        def summed(chunk: dict, family: np.ndarray) -> None:  # each chunk of calls the scan reads
            stat_sums.add(chunk, family)
            outcomes.add(chunk, family)

        calls.scan(summed, code_call_ids(conn, schema))  # and the code-load calls' rows (read_code)
        ranges, operator_ranges = read_nvtx_ranges(conn, schema)
        thread_names = read_thread_names(conn, schema)
        nvtx_steps = find_step_ranges(ranges, calls.threads, step_range)
        launches = None if step_range is not None else read_launches(
            conn, schema, iteration_pids(calls.threads, nvtx_steps, schema.capture_start_pids))
        stepped = found_steps(ranges, calls.threads, step_range, launches, nvtx_steps)
        flow = EventFlow(conn, schema, call_window=CallWindow(calls), order_ahead=ahead)
        # the steps and their phases; the NVTX ranges (and the operator ranges: the ranges table's)
        # and memory threads (the spikes' range instances), and what the second look's labels name
        more.update(found_steps=stepped, phases=step_phases(stepped.steps, stepped.ranges), nvtx_ranges=ranges,
                    operator_ranges=operator_ranges, memory_threads=calls.threads, failed_call_rows=outcomes.failed,
                    labels=lambda: _labels(looks["second"], ranges), site_table=lambda: described.site_table)
        spans = ((calls.first_ts, calls.last_end), frame_span(ranges, "start_ns", "end_ns"))
        reducers = (CallChains(), SiteRanks(), FailedCalls(), VmmEvents())
        verdict_looks = VerdictLooks(outcomes, lambda: ((real for _, real, _ in calls.read()), calls.api_names),
                                     calls.api_names, ranges, gpu_of, total_memory, schema.process_names,
                                     schema.duration_ns, lambda: looks["big_blocks"], more)
        described = Described(looks, flow)
        label_notes: list[Diagnostic] = []

        def second(engine: Engine) -> FlowLabels:
            """The second look's labelling of each batch (FlowLabels), once the `engine` has looked at
            every batch once: for the engine's second look (the sites', spikes', ranges table's), and
            the verdicts' consumers (its watchers)."""
            span, blocks = engine.so_far("event_span"), engine.so_far("big_blocks")
            looks["second"] = FlowLabels(conn, schema, engine.so_far("call_chains"), calls.spans,
                                         calls.api_names, flow.kinds, ranges, operator_ranges, thread_names,
                                         label_notes, listed=_listed(engine.so_far("largest")[0], blocks),
                                         look=engine.reducer("peaks"),
                                         times=(span.first_ts, span.last_ts) if span.first_ts is not None else None)
            looks["second"].watchers.append(LiveSetInfo(verdict_looks.live_sets, looks["second"]))
            return looks["second"]

        labelling = [_Labelling(lambda: second(engine))]  # once the engine has looked
    more.update(end_ns=capture_span(schema.duration_ns, *spans)[1], pool_events=read_pool_events(conn, schema))
    more.setdefault("labels", Labels)
    peak_look, largest, more["pool_uses"] = Peaks(), LargestAllocations(), PoolUses()
    # AllocatorSums' peaks (the full analysis's): each process's so far, raised on the second look
    more["allocator_peaks"] = lambda: [(s.pid, s.device, s.best_ts) for s in peak_look.series
                                       if s.pid is not None and s.best_seq >= 0]
    engine = flow.feed(lambda: Engine(
        [GroupSums(), TimelineSeries(), Explorable(), NeverFreed(), largest, StepWindows(), ByteClassSums(), Spikes(),
         more["pool_uses"], RangeSums(), peak_look, BigBlocks(), EventSpan(),
         FreeTimes(largest, peak_look, verdict_looks.live_sets), *labelling, *verdict_looks.reducers, *reducers],
        Facts(flow.kinds, gpu_of, more)), keep=True)
    looks["big_blocks"] = engine.so_far("big_blocks")  # (AllocatorSums needs them on its second look)
    notes = list(flow.diagnostics)  # (a quick analysis's: those of its first look)
    start_ns, end_ns = capture_span(schema.duration_ns, engine.so_far("event_span").capture, *spans)

    def second_look() -> _Again:
        engine.between()  # (again, should the pass start over)
        return _Again(engine)

    def labelled(batch: EventBatch) -> None:
        """On the thread that reads the second look's batches back: the batch labelled (FlowLabels.label)."""
        looks["second"].label(batch)

    def ahead(batch: EventBatch) -> None:
        """On a thread of its own, while the engine looks at the batch before and the next one is
        labelled: the batch looked at by the reducers that may go ahead (Reducer.ahead)."""
        engine.again(batch, ahead=True)

    flow.replay(second_look, ahead=(ahead,) if quick else (labelled, ahead))
    answered = engine.finish(flow.live)
    peaks = described_peaks(answered["peaks"], flow.kinds, total_memory, described, answered["free_times"])
    if quick:
        return analysis_of(schema, source, report_version, True, answered, described, verdict_looks, peaks,
                           lambda: ([], []), threads=np.zeros(0, "int64"), ranges=ranges, last_calls={},
                           notes=notes, joined=0, span=(start_ns, end_ns), step_range=step_range,
                           labels=Labels(), stacks=[]), None
    last_calls = last_cuda_calls(conn, schema, calls.last_end_by_pid, ranges)
    analysis = analysis_of(
        schema, source, report_version, False, answered, described, verdict_looks, peaks,
        lambda: (stat_sums.stats(), answered["sites"]), threads=calls.threads, ranges=ranges, last_calls=last_calls,
        notes=list(flow.diagnostics) + label_notes, joined=flow.call_window.joined_allocations,
        span=(start_ns, end_ns), step_range=step_range, labels=more["labels"](),
        stacks=looks["second"].registry.stacks)
    calls.close()  # the calls' chunks kept since the scan: read for the last time by the verdicts
    return analysis, calls.other_rows


class _Undescribed(Listed):
    """What a quick analysis says of listed allocations: no thread, API name, site or NVTX range
    (_mini), freed as the flow's reducers saw (`free_ts`)."""

    site_table: dict = {}

    def __init__(self, kinds: list[str]) -> None:
        self.kinds = kinds

    def rows(self, listed: pd.DataFrame, peak=None) -> tuple[pd.DataFrame, np.ndarray]:
        mini = _mini(listed, self.kinds)
        return mini, np.arange(len(mini))

    def free_times(self, listed: pd.DataFrame, free_ts: dict[int, int]) -> np.ndarray:
        return np.array([free_ts.get(seq, -1) for seq in listed["seq"].tolist()] if len(listed) else [], "int64")

    def peak_event(self, peak) -> None:
        return None

    def own_api(self, peak) -> None:
        return None


class _Again:
    """The second look at a batch: the `engine`'s, but for what run_flow's `ahead` did."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def add(self, batch) -> None:
        self.engine.again(batch, ahead=False)


class _Labelling(Reducer):
    """The second look's consumer that `make()` makes between the looks (the streamed full
    analysis's events.flow_labels.FlowLabels): it labels each batch for the reducers that need
    `labels` (engine.Labels), once the peaks and the out-of-memory moments (oom.OomLiveSets) have
    looked at it (it reads the live sets raised in it). Its answer: the consumer."""

    field = "labels"
    needs = ("peaks", "oom_live")
    second_look = True

    def __init__(self, make) -> None:
        self.make = make

    def add(self, b: EventBatch) -> None:
        pass

    def between(self) -> None:
        self.consumer = self.make()

    def again(self, b: EventBatch) -> None:
        self.consumer.look(b)

    def finish(self, live: dict):
        return self.consumer


def _mini(rows: pd.DataFrame, kinds: list[str]) -> pd.DataFrame:
    """Allocation rows as a small events frame (EVENT_COLUMNS of a quick load), for the analyses
    that look at a few rows only (allocation groups, what made a peak, big blocks)."""
    if rows.empty:
        rows = no_rows()
    n = len(rows)
    blank = pd.Categorical.from_codes(np.zeros(n, "int8"), categories=[""])
    kind = rows["kind"].to_numpy().astype("int64")
    return pd.DataFrame({
        "ts_ns": rows["ts"].to_numpy().astype("int64"), "pid": rows["pid"].to_numpy().astype("int32"), "tid": -1,
        "device": rows["device"].to_numpy().astype("int16"),
        "kind": pd.Categorical.from_codes(kind, categories=kinds),
        "op": pd.Categorical.from_codes(np.zeros(n, "int8"), categories=["alloc", "free"]),
        "api": pd.Categorical.from_codes((kind == KINDS.index("static")).astype("int8"),
                                         categories=[QUICK_API, "(module load)"]),
        "address": rows["address"].to_numpy().astype("uint64"), "bytes": rows["bytes"].to_numpy().astype("int64"),
        "delta_bytes": rows["bytes"].to_numpy().astype("int64"), "nvtx_range": blank, "nvtx_path": blank,
        "site": blank, "operator": blank, "stack": -1, "seq": rows["seq"].to_numpy().astype("int64")})


class Described(_Undescribed):
    """What the calls say of the allocations run_flow lists (never freed, largest, live at a peak or
    at an out-of-memory moment): their thread, API name, NVTX range, site, stack and operator, from
    what the second look kept (FlowLabels.allocation_info) and the site sums once it is done."""

    def __init__(self, looks: dict, flow: EventFlow) -> None:
        super().__init__(flow.kinds)
        self.looks = looks

    @property
    def site_table(self) -> dict:
        if "site_table" not in self.looks:  # once the second pass is done
            self.looks["site_table"] = self.looks["second"].site_table()
        return self.looks["site_table"]

    def rows(self, listed: pd.DataFrame, peak=None) -> tuple[pd.DataFrame, np.ndarray]:
        """The rows as a small events frame (_mini) with their threads, API names, sites, NVTX
        ranges, stacks and operators; the sites' categories in call_sites' order."""
        mini, at = super().rows(listed)
        if mini.empty:
            return mini, at
        info = self.looks["second"].allocation_info(listed["seq"].to_numpy(), peak)
        labels = info["site"].tolist()
        order = self.looks["second"].whole_frame_labels()
        mini["tid"] = info["tid"].to_numpy().astype("int32")
        mini["api"] = pd.Categorical(info["api"].to_numpy())
        present = set(labels)
        mini["site"] = pd.Categorical(labels, categories=[label for label in order if label in present])
        mini["nvtx_range"] = pd.Categorical(info["nvtx_range"].to_numpy())
        mini["stack"] = info["stack"].to_numpy().astype("int32")
        mini["operator"] = pd.Categorical(info["operator"].to_numpy())
        return mini, at

    def peak_event(self, peak) -> tuple[str, str]:
        """The API name and NVTX range of the event at which `peak` was reached."""
        return self.looks["second"].at_peak[id(peak)][1:3]

    def own_api(self, peak) -> str:
        """The API of the last allocation of `peak`'s own (not a module static) before it."""
        return self.looks["second"].at_peak[id(peak)][3]


class LiveSetInfo:
    """FlowLabels' watcher of the live sets at the moments of out of memory (oom.OomLiveSets, which
    the engine has look at each batch before FlowLabels): keeps what the calls say of each live
    set's largest allocations, found in that batch, before a later free in it lets go of them
    (FlowLabels.allocation_info reads it as a peak's; those of a moment after the last event are
    still live, or closed, at the end)."""

    def __init__(self, live_sets, sites: FlowLabels) -> None:
        self.live_sets, self.sites = live_sets, sites

    def add(self, b, known: dict, closed: list[dict]) -> None:
        for moment in self.live_sets.moments:
            if moment.resolved and id(moment) not in self.sites.at_peak:
                info = {c: np.concatenate([known[c]] + [s[c] for s in closed]) for c in known}
                rows = np.flatnonzero(np.isin(info["seq"], moment.largest["seq"].to_numpy()))
                self.sites.at_peak[id(moment)] = ({c: v[rows] for c, v in info.items()}, "", "", "")


class CallChains(Reducer):
    """The call stacks of the allocations (what the second look's labels read, FlowLabels): their ids, distinct."""

    field = "call_chains"

    def start(self, facts) -> None:
        super().start(facts)
        self.chains: list[np.ndarray] = []

    def add(self, b) -> None:
        chain = b.calls["chain"][b.is_alloc] if len(b) else np.zeros(0, "int64")
        if (chain >= 0).any():
            self.chains.append(np.unique(chain[chain >= 0]))

    def finish(self, live: dict) -> np.ndarray:
        return np.unique(np.concatenate(self.chains)) if self.chains else np.zeros(0, "int64")


def _labels(sites: FlowLabels, ranges: pd.DataFrame) -> Labels:
    """What the batches' labelled columns name, once the second pass is done (FlowLabels labels each
    batch before the engine's second look at it)."""
    order = {label: i for i, label in enumerate(sites.whole_frame_labels())}
    labels = list(sites.labeller.labels)
    return Labels(sites.api_names, labels, list(sites.strings), [order[label] for label in labels],
                  _NvtxPath(ranges), list(sites.path_names), list(sites.operator_names))


class _NvtxPath:
    """The NVTX path of an event (the events frame's nvtx_path, as attribute_ranges names it),
    called as engine.Labels.path: the ranges' paths made once, not for every event asked (the
    paths and names of 80,000 ranges, made for each spike's top, took 0.3 s at 1e7 events)."""

    def __init__(self, ranges: pd.DataFrame) -> None:
        self.ranges, self.paths = ranges, None

    def __call__(self, seq: int, pid: int, tid: int, ts: int) -> str:
        if self.ranges.empty:
            return ""
        row = int(innermost_range_rows(np.array([pid], "int64"), np.array([tid], "int64"), np.array([ts], "int64"),
                                       self.ranges)[0])
        if row < 0:
            return ""
        if self.paths is None:
            self.paths = range_paths(self.ranges)
        path = self.paths[row]
        return "nan" if pd.isna(path) else str(path)  # a range without a name: as attribute_ranges' categorical says


def _listed(largest: pd.DataFrame, big_blocks: pd.DataFrame) -> np.ndarray:
    """The allocations run_flow lists whether freed or not: the largest, the big blocks."""
    return np.concatenate([largest["seq"].to_numpy(), big_blocks["seq"].to_numpy()])
