"""nvidia-smi logs against the exact timeline: what it showed that no event explains, what its
sampling missed, and what belongs to someone else.

Pure functions: the logs (already read, see nsysan.sources.smi_log), the events frame and a few facts
about the capture in; the model's `SmiOverlay` and its diagnostics out. The rules and their
limits are in docs/analyses.md ("nvidia-smi against the trace").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import pandas as pd

from ..base.units import fmt_utc as _utc
from ..events.arrays import distinct_pairs, pair_of
from ..model import GPU_RESIDENT_KINDS, Analysis, Diagnostic, Gpu
from ..sources.smi_log import SmiLog
from ..model.smi import (MissedBySampling, NotInTrace, OtherProcess, SmiLogInfo, SmiOverlay, SmiSeries,
                         SomeoneElse)
from .live_steps import LiveSteps, live_steps
from .smi_clock import SECOND, TOLERANCE_NS, Rise, best_offset, first_rise, fit_at, rise_fits

NEAR_CAPTURE_NS = 5 * SECOND  # samples kept in the model: the capture and this much around it
MAX_SERIES_POINTS = 5000  # beyond, a series keeps the samples where a value changes


@dataclass(frozen=True)
class TraceFacts:
    """What the comparison needs to know about the capture besides its events."""

    gpus: list[Gpu]
    gpu_of: Callable[[int, int], Optional[int]]  # (pid, CUDA ordinal) -> capture GPU id
    activity: dict[int, tuple[int, int]]  # pid -> (first CUDA call, end of its last CUDA call), ns
    session_start_utc_ns: Optional[int]  # TARGET_INFO_SESSION_START_TIME.utcEpochNs
    start_ns: int  # the capture's span on the trace clock
    end_ns: int
    traced: dict[int, set[int]] = field(default_factory=dict)  # GPU id -> pids with memory events on it


def trace_facts(events: pd.DataFrame, gpus: list[Gpu], gpu_of: Callable[[int, int], Optional[int]],
                activity: dict[int, tuple[int, int]], session_start_utc_ns: Optional[int],
                start_ns: int, end_ns: int) -> TraceFacts:
    """The facts, with which processes the trace saw on which GPU (GPU-resident memory only)."""
    resident = events["kind"].isin(GPU_RESIDENT_KINDS).to_numpy()
    pairs = distinct_pairs(events["pid"].to_numpy()[resident], events["device"].to_numpy()[resident],
                           16, 0xFFFF).tolist()  # pair_key's
    traced: dict[int, set[int]] = {}
    for pair in pairs:
        pid, device = pair_of(pair)
        gpu = gpu_of(pid, device)
        if gpu is not None:
            traced.setdefault(gpu, set()).add(pid)
    ts = events["ts_ns"].to_numpy()
    pid_col = events["pid"].to_numpy()
    runs = dict(activity)
    for pid in {p for pids in traced.values() for p in pids} - set(runs):  # no API table: the events' span
        mine = ts[pid_col == pid]
        runs[pid] = (int(mine.min()), int(mine.max()))
    return TraceFacts(gpus, gpu_of, runs, session_start_utc_ns, start_ns, end_ns, traced)


def add_smi(analysis: Analysis, logs: list[SmiLog], activity: dict[int, tuple[int, int]],
            session_start_utc_ns: Optional[int], tz: str) -> Analysis:
    """The analysis with its `smi` section, and the logs' diagnostics among its own."""
    gpu_by_pair = {(g.pid, g.device): g.gpu for g in analysis.groups}
    facts = trace_facts(analysis.events, analysis.capture.gpus, lambda pid, device: gpu_by_pair.get((pid, device)),
                        activity, session_start_utc_ns, analysis.timeline.start_ns, analysis.timeline.end_ns)
    overlay, diagnostics = overlay_smi(logs, analysis.events, facts, tz)
    return dataclasses.replace(analysis, smi=overlay, diagnostics=list(analysis.diagnostics) + diagnostics)


def overlay_smi(logs: list[SmiLog], events: pd.DataFrame, facts: TraceFacts,
                tz: str) -> tuple[SmiOverlay, list[Diagnostic]]:
    """Each log on the trace clock, per GPU and process, with the three verdicts."""
    out = _Collector()
    if facts.session_start_utc_ns is None:
        out.say("warning", "smi_no_start_time", "the export does not record when the capture started "
                "in UTC, so the nvidia-smi logs cannot be placed on its timeline")
        return SmiOverlay(tz=tz, session_start_utc_ns=None), out.diagnostics
    for log in logs:
        _overlay_one(log, events, facts, out)
    _someone_else(logs, facts, out)
    overlay = SmiOverlay(tz=tz, session_start_utc_ns=facts.session_start_utc_ns, logs=out.logs,
                         series=out.series, not_in_trace=out.not_in_trace, missed=out.missed,
                         someone_else=out.someone_else)
    return overlay, out.diagnostics


@dataclass
class _Collector:
    logs: list[SmiLogInfo] = field(default_factory=list)
    series: list[SmiSeries] = field(default_factory=list)
    not_in_trace: list[NotInTrace] = field(default_factory=list)
    missed: list[MissedBySampling] = field(default_factory=list)
    someone_else: list[SomeoneElse] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    # per log name: samples on the trace clock with their capture GPU id (for "someone else")
    placed: dict[str, pd.DataFrame] = field(default_factory=dict)

    def say(self, severity: str, code: str, message: str) -> None:
        self.diagnostics.append(Diagnostic(severity, code, message))


def _overlay_one(log: SmiLog, events: pd.DataFrame, facts: TraceFacts, out: _Collector) -> None:
    samples = log.samples.assign(ts_ns=log.samples["utc_ns"] - facts.session_start_utc_ns)
    gpu_ids, other_gpus = _match_gpus(samples, facts)
    samples = samples.assign(gpu=gpu_ids)
    out.placed[log.name] = samples
    if log.skipped_rows:
        out.say("warning", "smi_rows_skipped", f"{log.name}: {log.skipped_rows} of {log.skipped_rows + len(samples)} "
                f"rows could not be read and were left out (the first: {log.skipped_example!r})")
    ts = samples["ts_ns"].to_numpy()
    overlaps = bool(((ts >= facts.start_ns) & (ts <= facts.end_ns)).any())
    groups = _groups(log, samples, facts)
    interval = _interval(samples, log.kind)
    info = dict(name=log.name, kind=log.kind, columns=list(log.columns), samples=len(samples),
                skipped_rows=log.skipped_rows, first_ns=int(ts.min()), last_ns=int(ts.max()),
                interval_ns=interval, max_gap_ns=interval, overlaps=overlaps,
                gpus=sorted({g for g, _ in groups}), other_gpus=other_gpus)
    if not groups:
        covered = sorted(set(samples["gpu"]) - {-1})
        where = ", ".join(f"GPU {g}" for g in covered) or ", ".join(other_gpus) or "no GPU it names"
        used = ", ".join(f"GPU {g}" for g in sorted(facts.traced)) or "no GPU"
        what = "processes" if log.kind == "apps" else "GPUs"
        out.say("warning", "smi_other_gpu", f"{log.name} covers {where}, but the traced processes ran on {used}: "
                f"none of its {what} is in the trace, so it is left out")
        out.logs.append(SmiLogInfo(**info))
        return
    compared = [_compare(log, samples, gpu, pid, events, facts) for gpu, pid in groups]
    main = max(compared, key=lambda c: c.traced_peak)  # the clock is checked on the biggest
    info.update(_clock_check(log, main, facts, overlaps, out))
    info["max_gap_ns"] = max((c.max_gap for c in compared), default=interval)
    out.logs.append(SmiLogInfo(**info))
    if not overlaps:
        return  # its samples are not kept, and no verdict is drawn from a log beside the capture
    for c in compared:
        out.series.append(c.series)
        out.not_in_trace.extend(c.not_in_trace)
        out.missed.extend(c.missed)


def _match_gpus(samples: pd.DataFrame, facts: TraceFacts) -> tuple[np.ndarray, list[str]]:
    """Each sample's capture GPU id (-1: none), by UUID, else PCI bus, else index; and the log's
    GPUs that are not in the capture."""
    by_uuid = {(g.uuid or "").lower().removeprefix("gpu-"): g.id for g in facts.gpus if g.uuid}
    by_bus = {_bus(g.bus): g.id for g in facts.gpus if g.bus}
    ids = {g.id for g in facts.gpus}
    uuid, bus, index = samples["gpu_uuid"], samples["gpu_bus"], samples["gpu_index"]
    if (uuid != "").any():
        gpu = uuid.map(by_uuid)
        missing = sorted(f"GPU-{u}" for u in set(uuid[gpu.isna()]) if u)
    elif (bus != "").any():
        gpu = bus.map(lambda b: by_bus.get(_bus(b)))
        missing = sorted(f"bus {b}" for b in set(bus[gpu.isna()]) if b)
    elif (index >= 0).any():
        gpu = index.where(index.isin(ids))
        missing = sorted(f"index {i}" for i in set(index[gpu.isna()]))
    else:
        # No GPU column: a single traced GPU is the only one it can be; an apps log's processes
        # are placed by the trace (see _groups).
        only = list(facts.traced) if len(facts.traced) == 1 else [g.id for g in facts.gpus][:1] \
            if len(facts.gpus) == 1 else []
        gpu = pd.Series(only[0] if only else np.nan, index=samples.index)
        missing = []
    return gpu.fillna(-1).astype("int64").to_numpy(), missing


def _bus(text: str) -> str:
    """'00000000:06:00.0' (nvidia-smi) and '0000:06:00.0' (nsys) -> '0:6:0.0'."""
    parts = str(text).strip().lower().replace(".", ":").split(":")
    try:
        return ":".join(str(int(p, 16)) for p in parts)
    except ValueError:
        return str(text).strip().lower()


def _groups(log: SmiLog, samples: pd.DataFrame, facts: TraceFacts) -> list[tuple[int, Optional[int]]]:
    """(GPU, pid) pairs to compare: a GPU log's GPUs that traced processes used; an apps log's
    traced processes (pid None for GPU series)."""
    if log.kind == "gpu":
        return [(int(g), None) for g in sorted(set(samples["gpu"])) if g in facts.traced]
    pairs = []
    for pid in sorted(set(samples["pid"])):
        on = sorted(set(samples.loc[samples["pid"] == pid, "gpu"]) - {-1})
        traced_on = [g for g, pids in facts.traced.items() if pid in pids]
        for gpu in (on or traced_on):
            if pid in facts.traced.get(gpu, ()):
                pairs.append((int(gpu), int(pid)))
    return pairs


def _interval(samples: pd.DataFrame, kind: str) -> int:
    """Median time between two samples of one GPU (gpu log) or between two sampling instants
    (apps log: all processes of an instant share its timestamp)."""
    groups = samples.groupby("gpu") if kind == "gpu" else [(None, samples)]
    diffs = [np.diff(np.unique(rows["ts_ns"].to_numpy())) for _, rows in groups]
    gaps = np.concatenate(diffs) if diffs else np.zeros(0, "int64")
    return int(np.median(gaps)) if len(gaps) else 0


@dataclass
class _Compared:
    series: SmiSeries
    steps: LiveSteps
    ts: np.ndarray  # all samples of this GPU/process, trace clock
    used: np.ndarray
    first_call: int
    first_alloc: int
    last_call: int
    traced_peak: int
    max_gap: int
    not_in_trace: list[NotInTrace] = field(default_factory=list)
    missed: list[MissedBySampling] = field(default_factory=list)


def _compare(log: SmiLog, samples: pd.DataFrame, gpu: int, pid: Optional[int], events: pd.DataFrame,
             facts: TraceFacts) -> _Compared:
    pids = sorted(facts.traced[gpu]) if pid is None else [pid]
    rows = samples[(samples["gpu"] == gpu) & ((samples["pid"] == pid) if pid is not None else True)]
    rows = rows.sort_values("ts_ns", kind="stable")
    ts, used = rows["ts_ns"].to_numpy().astype("int64"), rows["used_bytes"].to_numpy().astype("int64")
    steps = live_steps(events, pids, gpu, facts.gpu_of)
    first_call = min(facts.activity[p][0] for p in pids)
    last_call = max(facts.activity[p][1] for p in pids)
    first_alloc = int(steps.ts_ns[0]) if len(steps.ts_ns) else first_call
    traced = steps.at(ts)
    running = _running(ts, used, traced, first_call, last_call, facts.end_ns)
    traced_peak, _ = steps.peak_in(first_call, last_call)
    gaps = np.diff(ts[running]) if running.sum() > 1 else np.zeros(0, "int64")
    interval = int(np.median(np.diff(ts))) if len(ts) > 1 else 0
    max_gap = int(gaps.max()) if len(gaps) else interval
    near = (ts >= facts.start_ns - NEAR_CAPTURE_NS) & (ts <= facts.end_ns + NEAR_CAPTURE_NS)
    keep = _thin(np.flatnonzero(near), used, traced)
    series = SmiSeries(log=log.name, kind=log.kind, gpu=gpu, pid=pid, ts_ns=ts[keep].tolist(),
                       used_bytes=used[keep].tolist(), traced_bytes=traced[keep].astype("int64").tolist(),
                       running=running[keep].astype(int).tolist())
    compared = _Compared(series, steps, ts, used, first_call, first_alloc, last_call, traced_peak, max_gap)
    if running.any():
        diff = used[running] - traced[running]
        compared.not_in_trace.append(NotInTrace(
            log=log.name, gpu=gpu, pid=pid, samples=int(running.sum()), median_bytes=int(round(np.median(diff))),
            max_bytes=int(diff.max()), min_bytes=int(diff.min()), smi_peak_bytes=int(used.max()),
            traced_peak_bytes=int(traced_peak)))
        compared.missed.append(_missed(log.name, gpu, pid, ts[running], used[running], traced[running], steps,
                                       interval, max_gap))
    return compared


def _running(ts: np.ndarray, used: np.ndarray, traced: np.ndarray, first_call: int, last_call: int,
             capture_end: int) -> np.ndarray:
    """Samples taken while the process(es) ran: from the first CUDA call to the last, and after
    it until nvidia-smi shows less than the trace has live. A process that exits frees its
    memory without events, and nvidia-smi never shows less than what is allocated while the
    process lives, so that drop is its exit. Nothing after the capture's end counts."""
    running = (ts >= first_call) & (ts <= capture_end)
    exited = (ts > last_call) & (used < traced)
    if exited.any():
        running &= ts < ts[np.argmax(exited)]
    return running


def _missed(name: str, gpu: int, pid: Optional[int], ts: np.ndarray, used: np.ndarray, traced: np.ndarray,
            steps: LiveSteps, interval: int, max_gap: int) -> MissedBySampling:
    start, end = int(ts[0]), int(ts[-1])
    top = int(np.argmax(used))
    sampled_peak = int(traced.max())
    exact, exact_at = steps.peak_in(start, end)
    above, spikes, longest = steps.time_above(sampled_peak, start, end)
    return MissedBySampling(
        log=name, gpu=gpu, pid=pid, window_start_ns=start, window_end_ns=end, interval_ns=interval,
        max_gap_ns=max_gap, highest_sample_bytes=int(used[top]), highest_sample_ns=int(ts[top]),
        sampled_peak_bytes=sampled_peak, exact_peak_bytes=exact, exact_peak_ns=exact_at,
        missed_bytes=exact - sampled_peak, time_above_ns=above, spikes_missed=spikes, longest_missed_ns=longest)


def _thin(rows: np.ndarray, used: np.ndarray, traced: np.ndarray) -> np.ndarray:
    """The samples to ship: all of them, or past MAX_SERIES_POINTS those where a value changes
    (and the one before, so that steps keep their edges)."""
    if len(rows) <= MAX_SERIES_POINTS:
        return rows
    u, t = used[rows], traced[rows]
    change = np.concatenate([[True], (u[1:] != u[:-1]) | (t[1:] != t[:-1])])
    edge = change | np.concatenate([change[1:], [True]])
    return rows[edge]


def _clock_check(log: SmiLog, main: _Compared, facts: TraceFacts, overlaps: bool, out: _Collector) -> dict:
    """The first-rise check, and the best shift; a warning when the log looks misplaced."""
    start_utc = facts.session_start_utc_ns
    if log.kind == "gpu":
        rise = first_rise(main.ts, main.used, main.traced_peak,
                          opening_is_before=bool(len(main.ts)) and main.ts[0] < main.first_call)
    else:
        rise = _first_apps_row(log, main, facts)
    offset, fit = best_offset(main.ts, main.used, main.steps, main.first_call, main.last_call,
                              max(_interval_of(main.ts), 1))
    aligned = rise_fits(rise, main.first_call, main.first_alloc) if rise is not None else None
    as_read = fit_at(main.ts, main.used, main.steps, main.first_call, main.last_call, 0)
    # Without a rise to check (the log started after the process), the shift decides alone, and
    # only when it fits well and clearly better than the times as read.
    shifted = offset is not None and abs(offset) > TOLERANCE_NS and (as_read is None or as_read < fit - 0.2)
    if aligned is None and overlaps and shifted:
        aligned = False
    hint = (f"; the offset that fits the trace best is {_signed_seconds(offset)} (fit {fit:.2f}){_zone_hint(log, offset)}"
            if offset is not None and abs(offset) > TOLERANCE_NS else "")
    if not overlaps:
        out.say("warning", "smi_no_overlap", f"{log.name} does not overlap the capture: it covers "
                f"{_utc(start_utc + int(main.ts.min()))} to {_utc(start_utc + int(main.ts.max()))}, the capture "
                f"{_utc(start_utc + facts.start_ns)} to {_utc(start_utc + facts.end_ns)} (its times read as "
                f"{log.tz}, --smi-tz){hint}")
        aligned = False
    elif aligned is False:
        where = (f"its first rise ({_utc(start_utc + rise.at_ns)}) is {_signed_seconds(rise.at_ns - main.first_alloc)} "
                 f"from the traced process's first allocation ({_utc(start_utc + main.first_alloc)})"
                 if rise is not None else "it follows the trace better when shifted")
        out.say("warning", "smi_clock_offset", f"{log.name} looks off the trace's clock: {where}{hint}; "
                f"its times were read as {log.tz} (--smi-tz)")
    return dict(rise_ns=rise.at_ns if rise else None, first_call_ns=main.first_call,
                first_alloc_ns=main.first_alloc, best_offset_ns=offset, fit=fit, aligned=aligned)


def _first_apps_row(log: SmiLog, main: _Compared, facts: TraceFacts):
    """For an apps log, the process's first row is its rise; the previous sampling instant of the
    log (any process) is when it was not there yet."""
    if not len(main.ts):
        return None
    instants = np.unique(log.samples["utc_ns"].to_numpy() - facts.session_start_utc_ns)
    before = instants[instants < main.ts[0]]
    previous = int(before[-1]) if len(before) else int(main.ts[0]) - max(_interval_of(main.ts), 1)
    return Rise(int(main.ts[0]), previous)


def _interval_of(ts: np.ndarray) -> int:
    return int(np.median(np.diff(ts))) if len(ts) > 1 else 0


def _someone_else(logs: list[SmiLog], facts: TraceFacts, out: _Collector) -> None:
    """Per GPU that a gpu log covers: memory.used before the traced processes started, and with
    an apps log of the same GPU, memory.used beyond every process it lists, and the untraced ones."""
    apps = [(log, out.placed[log.name]) for log in logs if log.kind == "apps" and log.name in out.placed]
    for info in out.logs:
        if info.kind != "gpu" or not info.overlaps:
            continue
        samples = out.placed[info.name]
        for gpu in info.gpus:
            rows = samples[samples["gpu"] == gpu].sort_values("ts_ns", kind="stable")
            pids = facts.traced[gpu]
            first = min(facts.activity[p][0] for p in pids)
            last = max(facts.activity[p][1] for p in pids)
            before = rows[rows["ts_ns"] < first]
            entry = dict(gpu=gpu, log=info.name,
                         before_bytes=int(before["used_bytes"].iloc[-1]) if len(before) else None)
            for apps_log, apps_rows in apps:
                mine = apps_rows[apps_rows["gpu"].isin([gpu, -1])] if (apps_rows["gpu"] == gpu).any() else None
                if mine is None or mine.empty:
                    continue
                entry.update(_unattributed(rows, mine, first, last, info.interval_ns))
                entry["apps_log"] = apps_log.name
                entry["processes"] = _other_processes(mine, facts, gpu)
                break
            out.someone_else.append(SomeoneElse(**entry))


def _unattributed(gpu_rows: pd.DataFrame, apps_rows: pd.DataFrame, first: int, last: int,
                  interval: int) -> dict:
    """memory.used minus the sum of the apps log's processes at the nearest sampling instant
    (within half the longer interval), over the GPU samples taken while the process ran."""
    per_instant = apps_rows.groupby("ts_ns", as_index=False)["used_bytes"].sum().rename(
        columns={"used_bytes": "apps_bytes"})
    running = gpu_rows[(gpu_rows["ts_ns"] >= first) & (gpu_rows["ts_ns"] <= last)]
    if running.empty or per_instant.empty:
        return {}
    apps_interval = _interval_of(per_instant["ts_ns"].to_numpy())
    tolerance = max(interval, apps_interval, 1) // 2
    matched = pd.merge_asof(running[["ts_ns", "used_bytes"]], per_instant, on="ts_ns", direction="nearest",
                            tolerance=tolerance).dropna()
    if matched.empty:
        return {}
    rest = matched["used_bytes"].to_numpy() - matched["apps_bytes"].to_numpy().astype("int64")
    return dict(unattributed_median_bytes=int(round(np.median(rest))), unattributed_max_bytes=int(rest.max()))


def _other_processes(apps_rows: pd.DataFrame, facts: TraceFacts, gpu: int) -> list[OtherProcess]:
    traced = facts.traced.get(gpu, set())
    others = apps_rows[~apps_rows["pid"].isin(traced)]
    result = []
    for pid, rows in others.groupby("pid"):
        names = [n for n in rows["process_name"] if n and not n.startswith("[")]
        result.append(OtherProcess(pid=int(pid), name=names[0] if names else "", gpu=gpu,
                                   max_used_bytes=int(rows["used_bytes"].max()), samples=len(rows)))
    return sorted(result, key=lambda p: (-p.max_used_bytes, p.pid))


def _signed_seconds(ns: int) -> str:
    return f"{ns / SECOND:+.3f} s"


def _zone_hint(log: SmiLog, offset_ns: int) -> str:
    """A shift of whole quarter hours is a time zone, not a clock drifting: the zone it implies."""
    quarter = 15 * 60 * SECOND
    zone_part = round(offset_ns / quarter) * quarter
    if not zone_part or abs(offset_ns - zone_part) > TOLERANCE_NS:
        return ""
    # A log read in zone Z that needs +d to fit was written at Z's offset minus d.
    minutes = (log.utc_offset_ns - zone_part) // (60 * SECOND)
    if minutes == 0:
        return ": was it written in UTC? then give --smi-tz UTC"
    sign = "+" if minutes >= 0 else "-"
    h, m = divmod(abs(minutes), 60)
    return f": was it written at UTC{sign}{h:02d}:{m:02d}? then give --smi-tz {sign}{h:02d}:{m:02d}"
