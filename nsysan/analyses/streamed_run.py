"""`run_streamed`: the `--quick` Analysis from the engine's two looks at the flow of event batches,
the same document `run_analyses` makes from the whole events frame."""

from __future__ import annotations

import dataclasses
import sqlite3
from typing import Optional

import numpy as np
import pandas as pd

from ..events.columns import empty_ranges
from ..events.load import QUICK_API
from ..events.read_pools import read_pool_events
from ..engine import Engine, Facts, Labels, Reducer
from ..events.stream import EventFlow
from ..model import SCHEMA_ID, KINDS, Allocation, Analysis, Peak, Source, Timeline
from ..sources.schema import Schema
from .answers import gather_answers
from .bounds import cut_long_strings
from .capture import EventSpan, capture_facts, capture_span
from .calls import CallOutcomes
from .diagnostics import capture_diagnostics
from .explore import Explorable, LargestAllocations, allocation_groups
from .allocations import FreeTimes
from .peak import Peaks, PeakSeries, headline, module_load_note, peak_of
from .preallocations import BigBlocks
from .byte_classes import ByteClassSums
from .step_windows import StepWindows
from .groups import GroupSums
from .never_freed import NeverFreed
from .pools import PoolUses
from .ranges import RangeSums
from .timeline import TimelineSeries
from .sites import call_site
from .spikes import Spikes
from .stacks import stack_bytes
from .steps import step_diagnostics
from ..events.batch import EventBatch, no_rows
from .verdicts import VerdictLooks


def run_streamed(conn: sqlite3.Connection, schema: Schema, source: Source, report_version: Optional[str],
                 step_range: Optional[str], spike_window_ns: int, flow: Optional[EventFlow] = None,
                 labelling=None, spans: tuple = (), described=None,
                 answers: Optional[dict] = None, more: Optional[dict] = None, reducers: tuple = (),
                 verdict_looks: Optional[VerdictLooks] = None) -> Analysis:
    """The quick analysis of the export behind `conn`, its events read twice in batches.

    For the streamed full analysis (streamed_full.py): `flow` joins the batches to their calls,
    `answers`, when given, is filled with the engine's answers by field (nsysan/engine);
    `labelling(engine)` makes what labels each batch of the second look (made between the looks;
    the engine orders it after the peaks and before the reducers that need `labels`), `spans`
    widen the timeline to the calls' and ranges' ((start, end) each: capture_span), and `described` tells what the calls say of listed allocations: `allocations(rows,
    free_ts, peak)` (rows: seq, ts, pid, device, kind, address, bytes; `peak`: a PeakSeries whose
    live allocations they are), `frame(rows, peak)` (_mini with their threads, API names, sites
    and NVTX ranges), `peak_event(peak)` (the API name and NVTX range of the event that reached
    it), `own_api(peak)` (the API of the series' last own allocation before it),
    the `site_table` and the NVTX `ranges`; `more`: the reducers' facts beyond the kinds and GPUs
    (Facts.more) (the batches' `labels`: none read,
    unless given; the full analysis's `found_steps` and `phases`); `reducers`: the full analysis's
    reducers beyond these; `verdict_looks`: the full analysis's verdicts (VerdictLooks, those of
    the memory table alone when not given), whose Verdicts `answers` gets as "verdicts"."""
    flow = flow or EventFlow(conn, schema)
    gpu_of, total_memory = gpus(schema)
    more = more if more is not None else {}
    more.update(spike_window_ns=spike_window_ns, end_ns=capture_span(schema.duration_ns, *spans)[1],
                pool_events=read_pool_events(conn, schema))
    more.setdefault("labels", Labels)
    peak_look, largest, more["pool_uses"] = Peaks(), LargestAllocations(), PoolUses()
    # AllocatorSums' peaks (the full analysis's): each process's so far, raised on the second look
    more["allocator_peaks"] = lambda: [(s.pid, s.device, s.best_ts) for s in peak_look.series
                                       if s.pid is not None and s.best_seq >= 0]
    looks = verdict_looks or VerdictLooks(CallOutcomes([], []), lambda: ((), ()), None, empty_ranges(), gpu_of,
                                          total_memory, schema.process_names, schema.duration_ns,
                                          lambda: engine.so_far("big_blocks"), more)
    later = [_Labelling(lambda: labelling(engine))] if labelling is not None else []  # once the engine has looked
    engine = flow.feed(lambda: Engine(
        [GroupSums(), TimelineSeries(), Explorable(), NeverFreed(), largest, StepWindows(), ByteClassSums(), Spikes(),
         more["pool_uses"], RangeSums(), peak_look, BigBlocks(), EventSpan(),
         FreeTimes(largest, peak_look), *later, *looks.reducers, *reducers], Facts(flow.kinds, gpu_of, more)),
        keep=True)
    if answers is not None:  # (the full analysis's AllocatorSums needs them on its second look)
        answers["big_blocks"] = engine.so_far("big_blocks")
    notes = list(flow.diagnostics)
    described = described or _Undescribed(flow.kinds)
    start_ns, end_ns = capture_span(schema.duration_ns, engine.so_far("event_span").capture, *spans)

    def second_look() -> _Again:
        engine.between()  # (again, should the pass start over)
        return _Again(engine)

    flow.replay(second_look)
    answered = engine.finish(flow.live)
    if answers is not None:
        answers.update(answered)
    pools = answered["pools"]
    kinds = flow.kinds
    groups = answered["groups"]
    series = [s for s in answered["peaks"] if s.best_seq >= 0]
    free_ts = answered["free_times"]
    peaks = [_peak(s, free_ts, kinds, total_memory, described) for s in series]
    capture = capture_facts(schema, groups, np.zeros(0, "int64"), report_version, schema.has_nvtx_table)
    labels = {p.pid: p.label for p in capture.processes}

    def label(pid: int) -> str:
        return labels.get(pid) or f"process {pid}"

    verdicts = looks.verdicts(peaks, [lambda s=s: module_load_note(s, described.own_api(s)) for s in series], groups,
                              pools or [], end_ns, described.frame,
                              described.allocations, label)
    peaks = verdicts.peaks
    if answers is not None:
        answers["verdicts"] = verdicts
    leaks = answered["never_freed"]
    never_freed = described.allocations(leaks.head(500), {})
    leaked = described.frame(leaks)
    timeline = answered["explorable"].timeline(
        Timeline(start_ns=int(start_ns), end_ns=int(end_ns), series=answered["timeline"]), [])
    largest, allocations_total = answered["largest"]
    timeline = dataclasses.replace(timeline, allocations=described.allocations(largest, free_ts),
                                   allocations_total=allocations_total)
    diagnostics = list(schema.diagnostics) + notes + capture_diagnostics(
        schema, empty_ranges(), {}, groups, peaks, [], report_version, quick=True, pools=pools or [])
    step_notes = step_diagnostics(answered["steps"].series, [], False, True, step_range)
    diagnostics = [d for d in diagnostics if d.code not in verdicts.replaces] + verdicts.diagnostics + step_notes
    analysis = Analysis(
        schema=SCHEMA_ID, scope="quick", source=source, capture=capture, groups=groups, peak=headline(peaks),
        peaks=peaks, never_freed=never_freed, never_freed_total=int(len(leaks)), sites=[], api_calls=[],
        failed_calls=[], ranges=[], timeline=timeline, diagnostics=diagnostics, caps=verdicts.caps,
        oom=verdicts.oom, reserved=verdicts.reserved, steps=[],
        growth=[], never_freed_groups=allocation_groups(leaked, np.arange(len(leaks)), described.site_table),
        never_freed_stacks=stack_bytes(leaked, np.arange(len(leaks))),
        phases=[], spikes=answered["spikes"], events=None, calls=None, nvtx_ranges=None)
    answers = gather_answers(analysis.peak, analysis.process_peaks(), [], diagnostics, True,
                             {pid: name for pid, name in labels.items() if name})
    return cut_long_strings(dataclasses.replace(analysis, answers=answers, stacks=[]))


def gpus(schema: Schema) -> tuple:
    """(gpu_of(pid, device), total_memory(gpu)) as run_analyses makes them."""
    gpu_totals = {g.id: g.total_memory_bytes for g in schema.gpus}

    def gpu_of(pid: int, device: int) -> Optional[int]:
        if schema.cuda_device_to_gpu:
            return schema.cuda_device_to_gpu.get((pid, device))
        return device if device in gpu_totals or not gpu_totals else None

    def total_memory(gpu: Optional[int]) -> Optional[int]:
        return gpu_totals.get(gpu) if gpu is not None else None

    return gpu_of, total_memory


class _Undescribed:
    """What a quick analysis says of listed allocations: no thread, API name, site or NVTX range."""

    site_table: dict = {}

    def __init__(self, kinds: list[str]) -> None:
        self.kinds, self.ranges = kinds, empty_ranges()

    def allocations(self, rows: pd.DataFrame, free_ts: dict, peak=None) -> list[Allocation]:
        return _allocations(rows, self.kinds, free_ts)

    def frame(self, rows: pd.DataFrame, peak=None) -> pd.DataFrame:
        return _mini(rows, self.kinds)

    def peak_event(self, peak) -> None:
        return None

    def own_api(self, peak) -> None:
        return None


class _Again:
    """The second look at a batch: the `engine`'s."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def add(self, batch) -> None:
        self.engine.again(batch)


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
        self.consumer.add(b)

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


def _allocations(rows: pd.DataFrame, kinds: list[str], free_ts: dict) -> list[Allocation]:
    site = call_site("", {})
    return [Allocation(pid=int(pid), tid=-1, device=int(device), kind=kinds[int(kind)],
                       api="(module load)" if kinds[int(kind)] == "static" else QUICK_API, address=int(address),
                       bytes=int(size), alloc_time_ns=int(ts), free_time_ns=free_ts.get(int(seq)), nvtx_range="",
                       site=site, stack_id=None, operator="")
            for seq, ts, pid, device, kind, address, size
            in rows[["seq", "ts", "pid", "device", "kind", "address", "bytes"]].itertuples(index=False)]




def _peak(series: PeakSeries, free_ts: dict, kinds: list[str], total_memory, described) -> Peak:
    live = series.live_set
    event = described.peak_event(series) or ("(module load)" if kinds[series.best_kind] == "static" else QUICK_API, "")
    return peak_of(series, described.frame(live, series), np.arange(len(live)), event, total_memory(series.gpu),
                   lambda at: described.allocations(live.iloc[at], free_ts, series), described.site_table)