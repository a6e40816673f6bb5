"""`run_streamed_full`: the full analysis of an export too large for the whole events frame, in
bounded memory (issue 14).

The memory events flow as in `--quick` (streamed_run.py), each batch joined to its API calls
(events/stream_calls.py); one scan of the calls sums the API call stats, finds the failed calls,
the threads and the calls' span; the first pass gathers the allocations' call stacks (and the
engine's reducers the live bytes at each failed call, calls.FailedCalls, and the driver's
virtual-memory events, diagnostics.VmmEvents); the second labels every event's site (events/flow_labels.py) and
attributes it to its NVTX ranges, for the engine's sites table (sites.SiteRanks) and ranges
table (ranges.RangeSums); the timeline's bands, spans and focus from the engine's explore.Explorable
as on the whole frame; the steps, growth and phases from
the engine's reducer (step_windows.py) as on the whole frame. Every section is the whole frame's;
a section not streamed (none now) would be left empty and named by the diagnostic `not_streamed`
(NOT_STREAMED), with how to get it.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from typing import Optional

import numpy as np
import pandas as pd

from ..events.nvtx import attribute_ranges
from ..events.read import last_cuda_calls, read_thread_names
from ..events.read_nvtx import read_nvtx_ranges
from ..events.read_launches import read_launches
from ..events import stream
from ..events.read_order import order_ahead
from ..events.stream import EventFlow
from ..events.flow_labels import FlowLabels
from ..events.stream_calls import MemoryCalls, CallWindow
from ..engine import Labels, Reducer
from ..model import Allocation, Analysis, Diagnostic, Source
from ..sources.schema import Schema
from .answers import gather_answers
from .bounds import cut_long_strings
from .calls import CallOutcomes, CallStatSums, FailedCalls
from .capture import capture_facts, frame_span
from .diagnostics import VmmEvents, capture_diagnostics
from .stacks import referenced_stacks
from .iterations import iteration_pids
from .steps import find_step_ranges
from .explore import early_trace_ends
from .streamed_run import _mini, gpus, run_streamed
from .sites import SiteRanks, call_site
from .verdicts import VerdictLooks
from .byte_classes import byte_classes, step_phases
from .step_windows import found_steps

# The sections (and parts of sections) the streamed full analysis leaves out, as the diagnostic names them:
# none now (the mechanism stays for an analysis added to the whole frame before its stream).
NOT_STREAMED: tuple[str, ...] = ()

# The diagnostics that only the analyses not streamed yet raise: `check --no-warnings` on them
# cannot tell "not raised" from "not looked for" (limits.py); none now
NOT_STREAMED_CODES: tuple[str, ...] = ()


def run_streamed_full(conn: sqlite3.Connection, schema: Schema, source: Source, report_version: Optional[str],
                      step_range: Optional[str], spike_window_ns: int) -> Analysis:
    """The full analysis of the export behind `conn`, the whole frame's (its sections not streamed, none
    now, left empty)."""
    ahead = order_ahead(conn, stream.CHUNK_ROWIDS, stream.MOST_RUNS)  # meanwhile, on a second thread
    calls = MemoryCalls(conn, schema)
    stat_sums, outcomes = CallStatSums(calls.api_names, calls.families), CallOutcomes(calls.api_names, calls.families)

    def summed(chunk: dict, family: np.ndarray) -> None:  # each chunk of calls the scan reads
        stat_sums.add(chunk, family)
        outcomes.add(chunk, family)

    calls.scan(summed)
    ranges, operator_ranges = read_nvtx_ranges(conn, schema)
    thread_names = read_thread_names(conn, schema)
    nvtx_steps = find_step_ranges(ranges, calls.threads, step_range)
    launches = None if step_range is not None else read_launches(
        conn, schema, iteration_pids(calls.threads, nvtx_steps, schema.capture_start_pids))
    stepped = found_steps(ranges, calls.threads, step_range, launches, nvtx_steps)
    flow = EventFlow(conn, schema, call_window=CallWindow(calls), order_ahead=ahead)
    looks: dict = {}
    # the engine's facts beyond the kinds and GPUs: the steps and their phases; the NVTX ranges
    # (and the operator ranges: the ranges table's) and memory threads (the spikes' range
    # instances), and what the second pass's labels name
    more: dict = {"found_steps": stepped, "phases": step_phases(stepped.steps, stepped.ranges), "nvtx_ranges": ranges,
                  "operator_ranges": operator_ranges, "memory_threads": calls.threads,
                  "failed_call_rows": outcomes.failed,
                  "labels": lambda: _labels(looks["second"], ranges), "site_table": lambda: described.site_table}
    notes: list[Diagnostic] = []
    gpu_of, total_memory = gpus(schema)
    verdict_looks = VerdictLooks(outcomes, lambda: ((real for _, real, _ in calls.read()), calls.api_names),
                                 calls.api_names, ranges, gpu_of, total_memory, schema.process_names,
                                 schema.duration_ns, lambda: looks["big_blocks"], more)

    def second(engine) -> FlowLabels:
        """The second look's labelling of each batch (FlowLabels), once the `engine` has looked at
        every batch once: for the engine's second look (the sites', spikes', ranges table's), and
        the verdicts' consumers (its watchers)."""
        span, blocks = engine.so_far("event_span"), engine.so_far("big_blocks")
        peaks = engine.reducer("peaks")
        looks["second"] = FlowLabels(conn, schema, engine.so_far("call_chains"), calls.spans,
                                   calls.api_names, flow.kinds, ranges, operator_ranges, thread_names, notes,
                                   listed=_listed(engine.so_far("largest")[0], blocks), look=peaks,
                                   times=(span.first_ts, span.last_ts) if span.first_ts is not None else None)
        looks["second"].watchers.append(LiveSetInfo(verdict_looks.live_sets, looks["second"]))
        return looks["second"]

    described = Described(looks, flow, ranges)
    quick = run_streamed(conn, schema, source, report_version, step_range, spike_window_ns, flow=flow,
                         labelling=second, described=described, answers=looks, more=more,
                         spans=((calls.first_ts, calls.last_end), frame_span(ranges, "start_ns", "end_ns")),
                         verdict_looks=verdict_looks, reducers=(CallChains(), SiteRanks(), FailedCalls(), VmmEvents()))
    sites, failed = looks["second"], looks["failed_calls"]
    capture = capture_facts(schema, quick.groups, calls.threads, report_version,
                            not ranges.empty or schema.has_nvtx_table)
    labels = {p.pid: p.label for p in capture.processes}
    last_calls = last_cuda_calls(conn, schema, calls.last_end_by_pid, ranges)
    verdicts = looks["verdicts"]  # run_streamed's, of verdict_looks
    calls.close()  # the calls' chunks kept since the scan: read for the last time by the verdicts
    steps, phases, growth, step_notes = looks["steps"].answers(  # the engine's StepWindows
        quick.timeline.end_ns, gpu_of, step_range, last_calls, more["labels"](), capture.processes, verdicts.caps,
        not ranges.empty, False)
    api_calls = stat_sums.stats()
    diagnostics = list(schema.diagnostics) + list(flow.diagnostics) + notes + capture_diagnostics(
        schema, ranges, last_calls, quick.groups, quick.peaks, failed, report_version, api_calls, False,
        looks["vmm_events"], flow.call_window.joined_allocations, quick.reserved.pools)
    diagnostics = [d for d in diagnostics if d.code not in verdicts.replaces] + verdicts.diagnostics \
        + step_notes + ([not_streamed_note()] if NOT_STREAMED else [])
    range_table, range_families = looks["ranges"]
    analysis = dataclasses.replace(
        quick, scope="full", capture=capture, sites=looks["sites"], api_calls=api_calls, failed_calls=failed,
        diagnostics=diagnostics, oom=verdicts.oom, caps=verdicts.caps, reserved=verdicts.reserved,
        ranges=range_table, range_families=range_families,
        timeline=looks["explorable"].timeline(quick.timeline, early_trace_ends(ranges, last_calls)), steps=steps, growth=growth, phases=phases,
        byte_classes=byte_classes(looks["byte_classes"], verdicts.reserved, growth, gpu_of))
    answers = gather_answers(analysis.peak, analysis.process_peaks(), growth, diagnostics, False,
                             {pid: label for pid, label in labels.items() if label}, analysis.byte_classes)
    analysis = dataclasses.replace(analysis, answers=answers)
    return cut_long_strings(dataclasses.replace(analysis, stacks=referenced_stacks(sites.registry.stacks, analysis)))


def not_streamed_note() -> Diagnostic:
    return Diagnostic(
        "warning", "not_streamed",
        "this export is too large to hold its events whole, so it was analyzed in bounded memory, and these "
        f"sections are not computed that way yet and are left empty: {', '.join(NOT_STREAMED)}; analyze it "
        "with nsysan.analyze(path, keep_events=True) on a machine with about 250 bytes of memory per event "
        "for all of them, or with --quick for the memory-table answers alone")


class Described:
    """What the calls say of the allocations run_streamed lists (never freed, largest): their
    thread, API name, NVTX range, site and stack, from the site sums once the second pass is done."""

    def __init__(self, looks: dict, flow: EventFlow, ranges: pd.DataFrame) -> None:
        self.looks, self.flow, self.ranges = looks, flow, ranges

    @property
    def site_table(self) -> dict:
        if "site_table" not in self.looks:  # once the second pass is done
            self.looks["site_table"] = self.looks["second"].site_table()
        return self.looks["site_table"]

    def allocations(self, rows: pd.DataFrame, free_ts: dict, peak=None) -> list[Allocation]:
        """analyses.to_allocations of the rows of listed allocations (live at `peak`)."""
        info = self.looks["second"].allocation_info(rows["seq"].to_numpy(), peak) if len(rows) \
            else pd.DataFrame()
        kinds = self.flow.kinds
        return [Allocation(pid=int(pid), tid=int(tid), device=int(device), kind=kinds[int(kind)], api=str(api),
                           address=int(address), bytes=int(size), alloc_time_ns=int(ts),
                           free_time_ns=free_ts.get(int(seq)), nvtx_range=str(nvtx),
                           site=call_site(site, self.site_table), stack_id=int(stack) if stack >= 0 else None, operator=str(operator))
                for (seq, ts, pid, device, kind, address, size), (tid, api, nvtx, site, stack, operator)
                in zip(rows[["seq", "ts", "pid", "device", "kind", "address", "bytes"]].itertuples(index=False),
                       info.itertuples(index=False))]  # capped lists

    def frame(self, rows: pd.DataFrame, peak=None) -> pd.DataFrame:
        """The rows as a small events frame (streamed_run._mini) with their threads, API names,
        sites and NVTX ranges; the sites' categories in call_sites' order."""
        mini = _mini(rows, self.flow.kinds)
        if mini.empty:
            return mini
        info = self.looks["second"].allocation_info(rows["seq"].to_numpy(), peak)
        labels = info["site"].tolist()
        order = self.looks["second"].whole_frame_labels()
        mini["tid"] = info["tid"].to_numpy().astype("int32")
        mini["api"] = pd.Categorical(info["api"].to_numpy())
        present = set(labels)
        mini["site"] = pd.Categorical(labels, categories=[label for label in order if label in present])
        mini["nvtx_range"] = pd.Categorical(info["nvtx_range"].to_numpy())
        mini["stack"] = info["stack"].to_numpy().astype("int32")
        return mini

    def peak_event(self, peak) -> tuple[str, str]:
        """The API name and NVTX range of the event at which `peak` was reached."""
        return self.looks["second"].at_peak[id(peak)][1:3]

    def own_api(self, peak) -> str:
        """The API of the last allocation of `peak`'s own (not a module static) before it."""
        return self.looks["second"].at_peak[id(peak)][3]


class LiveSetInfo:
    """FlowLabels' watcher of the live sets at the moments of out of memory (oom.OomLiveSets, which
    the engine has look at each batch before FlowLabels): keeps what the calls say of each live
    set's largest allocations, found in that batch, before a later free in it lets go of them (FlowLabels.allocation_info reads it as a
    peak's; those of a moment after the last event are still live, or closed, at the end)."""

    def __init__(self, live_sets, sites: FlowLabels) -> None:
        self.live_sets, self.sites = live_sets, sites

    def add(self, b, known: dict) -> None:
        for moment in self.live_sets.moments:
            if moment.resolved and id(moment) not in self.sites.at_peak:
                info = {c: np.concatenate([known[c]] + [s[c] for s in self.sites.closed]) for c in known}
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
                  lambda seq, pid, tid, ts: _nvtx_path(pid, tid, ts, ranges), list(sites.path_names),
                  list(sites.operator_names))


def _nvtx_path(pid: int, tid: int, ts: int, ranges: pd.DataFrame) -> str:
    """The NVTX path of an event (the events frame's nvtx_path)."""
    return str(np.asarray(attribute_ranges(pd.DataFrame({"pid": [pid], "tid": [tid], "ts_ns": [ts]}), ranges)[1])[0])


def _listed(largest: pd.DataFrame, big_blocks: pd.DataFrame) -> np.ndarray:
    """The allocations run_streamed lists whether freed or not: the largest, the big blocks."""
    return np.concatenate([largest["seq"].to_numpy(), big_blocks["seq"].to_numpy()])
