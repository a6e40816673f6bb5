"""A run checked against `Limits`: one `Outcome` per limit and place, and the `Verdict`.

`evaluate_limits(analysis, baseline, limits)` returns a `Verdict` (model/check.py) whose
outcomes are one per limit and place (process/GPU, GPU, or the whole run: `per`); each held,
broke, or could not be measured (no sizes in the capture, no match in the baseline, growth no
step shows): never "ok" for what was not seen. The verdict is the documented JSON `nsysan/check@1` (docs/json.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .compare_runs import MEASURED_GROWTH, compare_analyses
from ..errors import NsysanError
from .limits import Amount, Limits
from ..model import Analysis, ProcessDelta
from ..model.check import BROKEN, CHECK_SCHEMA_ID, HELD, NOT_MEASURED, Outcome, Verdict
from ..base.units import fmt_bytes, fmt_bytes_apart, fmt_percent_apart, fmt_time

@dataclass(frozen=True)
class _Unit:
    """One place the limits are checked at, with its numbers in this run and the baseline's."""

    where: str
    peak: Optional[int]
    never_freed: Optional[int]
    growth: Optional[int]
    base_peak: Optional[int] = None
    growth_gap: str = ""  # why growth is not measured here, when it is not
    kept_gap: str = ""  # why the never-freed bytes are not measured here, when they are not


def evaluate_limits(analysis: Analysis, baseline: Optional[Analysis], limits: Limits,
                    names: tuple[Optional[str], Optional[str]] = (None, None)) -> Verdict:
    """Every limit at every place of `limits.per`; a limit that cannot be measured at a place is an
    outcome `not_measured` (the verdict's status then, unless `limits.allow_unmeasured`);
    NsysanError when no limit is given or one needs what is not there (a baseline). `names`: the
    files the run and the baseline were read from (a committed baseline is named by its file, not
    by the report it was made of), else their analyses' report names."""
    if limits.max_peak_increase is not None and baseline is None:
        raise NsysanError("--max-peak-increase needs a baseline: add --baseline BASE (a report or its analysis.json)")
    if limits.empty:
        raise NsysanError("no limits to check: give at least one (--max-peak 8GiB, ...) or a "
                          "[tool.nsysan.check] table in pyproject.toml")
    comparison = compare_analyses(baseline if baseline is not None else analysis, analysis)
    units = _units(analysis, baseline, comparison.processes, limits.per)
    outcomes: list[Outcome] = []
    sized = {"max-peak": limits.max_peak, "max-peak-increase": limits.max_peak_increase,
             "max-never-freed": limits.max_never_freed, "max-growth-per-step": limits.max_growth_per_step}
    if not units:  # no process with GPU memory: nothing to measure the size limits on
        why = _no_sizes(analysis) or f"no process of {analysis.source.name} holds GPU memory in the capture"
        outcomes.extend(_not_measured(limit, "all", str(threshold) if isinstance(threshold, Amount) else
                                      fmt_bytes(threshold), why) for limit, threshold in sized.items()
                        if threshold is not None)
    for unit in units:
        if limits.max_peak is not None:
            outcomes.append(_at_most("max-peak", unit.where, unit.peak, limits.max_peak, "peak"))
        if limits.max_peak_increase is not None:
            outcomes.append(_increase(unit, limits.max_peak_increase, baseline))
        if limits.max_never_freed is not None:
            outcomes.append(_at_most("max-never-freed", unit.where, None if unit.kept_gap else unit.never_freed,
                                     limits.max_never_freed, "never freed", unit.kept_gap))
        if limits.max_growth_per_step is not None:
            outcomes.append(_at_most("max-growth-per-step", unit.where, unit.growth, limits.max_growth_per_step,
                                     "growth per step", unit.growth_gap))
    if limits.max_peak_increase is not None and limits.per == "gpu" and baseline is not None:
        outcomes.extend(_lost_gpus(analysis, baseline, str(limits.max_peak_increase)))
    if limits.no_failed_allocations:
        outcomes.extend(_failed_allocations(analysis, limits.per))
    if limits.no_warnings:
        outcomes.extend(_warnings(analysis, limits.no_warnings))
    if any(o.status == BROKEN for o in outcomes):
        status = "fail"
    elif any(o.status == NOT_MEASURED for o in outcomes) and not limits.allow_unmeasured:
        status = "not_measured"
    else:
        status = "pass"
    return Verdict(schema=CHECK_SCHEMA_ID, report=names[0] or analysis.source.name,
                   baseline=(names[1] or baseline.source.name) if baseline is not None else None, per=limits.per,
                   ok=status == "pass", outcomes=outcomes,
                   comparison=comparison.headline if baseline is not None else None, status=status,
                   allow_unmeasured=limits.allow_unmeasured)


def _no_sizes(analysis: Analysis) -> Optional[str]:
    """Why a run has no bytes to measure (captured without --cuda-memory-usage, or with it and no
    memory event recorded), or None."""
    note = next((d for d in analysis.diagnostics if d.code in ("sizes_not_collected", "no_memory_events")), None)
    if note is None and not analysis.capture.memory_usage_collected:
        return f"{analysis.source.name} has no memory table (allocation sizes were not collected)"
    return f"{analysis.source.name}: {note.message}" if note is not None else None


def _preallocated(analysis: Analysis) -> dict[tuple[int, Optional[int]], str]:
    """(pid, GPU) -> why its never-freed bytes are not seen: XLA allocates inside the block it
    reserved at start, so what its program keeps is inside a block the trace sees as one."""
    return {(c.pid, c.gpu): f"process {c.pid}: XLA preallocated {fmt_bytes(c.cap_bytes)} and allocates inside it, "
                            "out of the trace's sight, so what it keeps cannot be seen; run with "
                            "XLA_PYTHON_CLIENT_ALLOCATOR=platform to see it"
            for c in analysis.caps if c.source == "xla_preallocation"}


def _growth_gap(analysis: Analysis, pid: Optional[int], gpu: Optional[int]) -> str:
    """Why a process has no growth per step: its verdict's own words (too few steps, the trace
    stops before its steps end, a preallocation hides it), or why no steps were found."""
    verdict = next((g for g in analysis.growth if g.pid == pid and g.verdict not in MEASURED_GROWTH
                    and (gpu is None or g.gpu == gpu)), None)
    if verdict is not None:
        return verdict.message
    note = next((d for d in analysis.diagnostics if d.code == "no_steps"), None)
    why = note.message if note is not None else "no training steps were found"
    return f"process {pid}: {why}"


def _units(analysis: Analysis, baseline: Optional[Analysis], rows: list[ProcessDelta], per: str) -> list[_Unit]:
    names = {p.pid: p.name for p in analysis.capture.processes}
    mine = [d for d in rows if d.new_pid is not None]

    def growth_of(d: ProcessDelta) -> Optional[int]:
        return d.growth_per_step.after if d.growth_per_step else None

    def gap_of(d: ProcessDelta) -> str:
        return "" if growth_of(d) is not None else _growth_gap(analysis, d.new_pid, d.new_gpu)

    hidden = _preallocated(analysis)
    if per == "process":
        return [_Unit(where=_process_place(d, names), peak=d.peak.after, never_freed=d.never_freed.after,
                      growth=growth_of(d), base_peak=d.peak.before, growth_gap=gap_of(d),
                      kept_gap=hidden.get((d.new_pid, d.new_gpu), "")) for d in mine]
    # Per GPU: all processes on it together; the GPUs of the two runs matched by identity.
    # Growth is the sum of its processes', and not measured when one of them is not.
    on_gpu: dict[int, list[ProcessDelta]] = {}
    for d in mine:
        if d.new_gpu is not None:
            on_gpu.setdefault(d.new_gpu, []).append(d)
    peaks = _gpu_peaks(analysis)
    base_peaks = _gpu_peaks(baseline) if baseline is not None else {}
    gpus = sorted(set(peaks) | set(on_gpu))
    same = match_gpus(analysis, baseline, gpus, sorted(base_peaks)) if baseline is not None else {}
    units = []
    for gpu in gpus:
        base_gpu, found = same.get(gpu), on_gpu.get(gpu, [])
        gaps = [gap for gap in map(gap_of, found) if gap]
        units.append(_Unit(where=f"GPU {gpu}", peak=peaks.get(gpu),
                           never_freed=sum(d.never_freed.after or 0 for d in found),
                           growth=None if gaps or not found else sum(growth_of(d) or 0 for d in found),
                           growth_gap="; ".join(gaps),
                           kept_gap="; ".join(hidden[(d.new_pid, gpu)] for d in found if (d.new_pid, gpu) in hidden),
                           base_peak=base_peaks.get(base_gpu) if base_gpu is not None else None))
    if per == "gpu" or not units:
        return units
    # The whole run: its highest GPU peak, all never-freed bytes, the growth of all GPUs together.
    every_gap = [u.growth_gap for u in units if u.growth_gap]
    return [_Unit(where="all", peak=max(peaks.values(), default=None),
                  never_freed=sum(u.never_freed or 0 for u in units),
                  growth=None if every_gap else sum(u.growth or 0 for u in units), growth_gap="; ".join(every_gap),
                  kept_gap="; ".join(u.kept_gap for u in units if u.kept_gap),
                  base_peak=max(base_peaks.values(), default=None))]


def _process_place(d: ProcessDelta, names: dict[int, str]) -> str:
    """ "process 1644 python3 on GPU 0", with "rank 1, " ahead when processes are matched by rank."""
    rank = d.role.split(" · ")[0] + ", " if d.role.startswith("rank ") else ""
    name = f"process {d.new_pid} {names.get(d.new_pid or 0, '')}".rstrip()
    return f"{rank}{name} on GPU {d.new_gpu}" if d.new_gpu is not None else f"{rank}{name}"


def _gpu_peaks(analysis: Analysis) -> dict[int, int]:
    """Live GPU-resident bytes at each GPU's peak, all its processes together."""
    return {gpu: peak.peak_bytes for gpu, peak in analysis.gpu_peaks().items()}


# What each size limit measures, as its lines name it.
_MEASURES = {"max-peak": "peak", "max-peak-increase": "peak increase", "max-never-freed": "never freed",
             "max-growth-per-step": "growth per step"}


def match_gpus(analysis: Analysis, baseline: Analysis, gpus: list[int], base_gpus: list[int]) -> dict[int, int]:
    """Each GPU of this run -> the same GPU of the baseline, by identity, never by position: the
    same UUID (the same board), else the same id and model (another machine of the same kind).
    A GPU without its match is not paired with whatever GPU is left."""
    mine = {g.id: g for g in analysis.capture.gpus}
    theirs = {g.id: g for g in baseline.capture.gpus}
    by_uuid = {g.uuid: g.id for g in theirs.values() if g.uuid and g.id in base_gpus}
    matched = {gpu: by_uuid[mine[gpu].uuid] for gpu in gpus if gpu in mine and mine[gpu].uuid in by_uuid}
    for gpu in gpus:
        if gpu in matched or gpu not in base_gpus or gpu in matched.values():
            continue
        a, b = mine.get(gpu), theirs.get(gpu)
        if (a.name if a else None) == (b.name if b else None):  # both unnamed (a document without GPUs) too
            matched[gpu] = gpu
    return matched


def _lost_gpus(analysis: Analysis, baseline: Analysis, threshold: str) -> list[Outcome]:
    """A not-measured line per GPU of the baseline that this run has no match for."""
    peaks, base_peaks = _gpu_peaks(analysis), _gpu_peaks(baseline)
    matched = set(match_gpus(analysis, baseline, sorted(peaks), sorted(base_peaks)).values())
    names = {g.id: g.name for g in baseline.capture.gpus}
    return [_not_measured("max-peak-increase", f"GPU {gpu} of the baseline", threshold,
                          f"this run has no GPU {gpu}{f' ({names[gpu]})' if names.get(gpu) else ''} of the "
                          "baseline: it lost a GPU, or runs on other ones")
            for gpu in sorted(set(base_peaks) - matched)]


def _not_measured(limit: str, where: str, threshold: str, why: str) -> Outcome:
    return Outcome(limit=limit, where=where, ok=False, measured=None, threshold=threshold,
                   message=f"{_MEASURES[limit]} not measured: {why} ({where})", status=NOT_MEASURED)


def _at_most(limit: str, where: str, measured: Optional[int], threshold: int, what: str, gap: str = "") -> Outcome:
    if measured is None:
        return _not_measured(limit, where, fmt_bytes(threshold), gap or f"nothing to measure it on at {where}")
    ok = measured <= threshold
    shown, limit_shown = fmt_bytes_apart(measured, threshold)
    return Outcome(limit=limit, where=where, ok=ok, measured=measured, threshold=fmt_bytes(threshold),
                   message=f"{what} {shown} is {'within' if ok else 'over'} the limit of {limit_shown} ({where})",
                   status=HELD if ok else BROKEN)


def _increase(unit: _Unit, amount: Amount, baseline: Optional[Analysis]) -> Outcome:
    if unit.peak is None or unit.base_peak is None:
        assert baseline is not None
        why = _no_sizes(baseline) or f"{unit.where} has no match in the baseline {baseline.source.name}"
        if unit.peak is None:
            why = f"no peak at {unit.where}"
        return _not_measured("max-peak-increase", unit.where, str(amount), why)
    delta = unit.peak - unit.base_peak
    percent = 100.0 * delta / unit.base_peak if unit.base_peak else (0.0 if delta == 0 else float("inf"))
    limit_shown = f"+{amount}"
    if amount.percent is not None:
        ok, measured = percent <= amount.percent, round(percent, 2)
        percent_shown, closer = fmt_percent_apart(percent, amount.percent)
        if percent_shown != f"{percent:+.1f}%":  # too close to tell apart at one decimal
            limit_shown = closer
    else:
        assert amount.bytes is not None
        ok, measured = delta <= amount.bytes, delta
        percent_shown = f"{percent:+.1f}%"
        if fmt_bytes(abs(delta)) == fmt_bytes(amount.bytes) and abs(delta) != amount.bytes:
            limit_shown = "+" + fmt_bytes_apart(abs(delta), amount.bytes)[1]
    sign = "+" if delta >= 0 else "-"
    delta_shown = sign + (fmt_bytes_apart(abs(delta), amount.bytes)[0] if amount.bytes is not None else
                          fmt_bytes(abs(delta)))
    shown = f"{delta_shown} ({percent_shown})" if unit.base_peak else delta_shown
    before, after = fmt_bytes_apart(unit.base_peak, unit.peak)
    return Outcome(limit="max-peak-increase", where=unit.where, ok=ok, measured=measured, threshold=str(amount),
                   message=f"peak increase {shown}, {before} → {after}, is {'within' if ok else 'over'} the limit "
                           f"of {limit_shown} ({unit.where})", status=HELD if ok else BROKEN)


def _failed_allocations(analysis: Analysis, per: str) -> list[Outcome]:
    """Failed allocation calls, less the probes (a call that fails and is retried at once, as a
    feature test: analyze says it is not a failure), plus the processes that died of an
    out-of-memory error no call shows (`oom.fatal`: PyTorch's allocator giving up under a cap,
    found in the trace, or the error read from the program's log with --log)."""
    from ..base.apis import family

    probes = {(p.pid, p.tid, p.api, p.time_ns) for p in analysis.oom.probes}
    failed = [f for f in analysis.failed_calls if family(f.api) in ("alloc", "vmm", "pool")
              and (f.pid, f.tid, f.api, f.time_ns) not in probes]
    deaths = [(f.pid, _death(analysis, f)) for f in analysis.oom.fatal]
    names = {p.pid: p.name for p in analysis.capture.processes}
    if per == "process":
        pids = sorted({p.pid for p in analysis.capture.processes} | {f.pid for f in failed}
                      | {pid for pid, _ in deaths if pid is not None})
        places = [(f"process {pid} {names.get(pid, '')}".rstrip(), [f for f in failed if f.pid == pid],
                   [text for who, text in deaths if who == pid], [p for p in analysis.oom.probes if p.pid == pid])
                  for pid in pids]
        unmatched = [text for who, text in deaths if who is None]
        if unmatched or not places:  # a logged error of no process of the trace; a trace of none
            places.append(("all", [], unmatched, []))
    else:
        places = [("all", failed, [text for _, text in deaths], analysis.oom.probes)]
    outcomes = []
    for where, calls, died, skipped in places:
        said = []
        if calls:
            first = min(calls, key=lambda f: f.time_ns)
            said.append(f"{len(calls)} failed allocation{'s' if len(calls) > 1 else ''}, the first "
                        f"{first.api} → {first.error}")
        said.extend(died)
        if not said:
            said.append("no failed allocation")
            if skipped:
                said.append(f"{len(skipped)} probe{'s' if len(skipped) > 1 else ''} retried at once "
                            f"({skipped[0].api} → {skipped[0].error}) {'is' if len(skipped) == 1 else 'are'} "
                            "not a failure")
        broke = bool(calls or died)
        outcomes.append(Outcome(limit="no-failed-allocations", where=where, ok=not broke,
                                measured=len(calls) + len(died), threshold="0",
                                message=f"{'; '.join(said)} ({where})", status=BROKEN if broke else HELD))
    return outcomes


def _death(analysis: Analysis, fatal: Any) -> str:
    """How a process died of out-of-memory with no failed call, in a few words: what the trace
    shows (the allocator's last release) and what its log says (the request)."""
    parts = []
    release = next((o for o in analysis.oom.allocator_ooms if o.release.pid == fatal.pid), None)
    if "trace" in fatal.found_by and release is not None:
        inside = f" inside {' > '.join(release.open_ranges)}" if release.open_ranges else ""
        parts.append(f"the allocator freed its cache ({fmt_bytes(release.release.released_bytes)}) at "
                     f"{fmt_time(release.release.start_ns)} and the process ended{inside}")
    elif "trace" in fatal.found_by:
        parts.append("the trace ends inside ranges it never closed")
    logged = next((g for g in analysis.oom.logged if g.matched_pid == fatal.pid), None)
    if "log" in fatal.found_by and logged is not None:
        asked = f" could not get {fmt_bytes(logged.request_bytes)}" if logged.request_bytes is not None else ""
        parts.append(f"{logged.log} line {logged.line}:{asked}")
    return "out of memory without a failing call: " + "; ".join(parts or [fatal.found_by])


def _warnings(analysis: Analysis, codes: tuple[str, ...]) -> list[Outcome]:
    if codes == ("all",):
        found = [d for d in analysis.diagnostics if d.severity in ("warning", "error")]
        codes = tuple(sorted({d.code for d in found})) or ("all",)
    outcomes = []
    for code in codes:
        hits = [d for d in analysis.diagnostics if d.code == code or (code == "all" and d.severity != "info")]
        message = f"diagnostic {code}: {hits[0].message}" if hits else f"no {code} diagnostic"
        outcomes.append(Outcome(limit="no-warnings", where=code, ok=not hits, measured=len(hits), threshold="0",
                                message=message, status=BROKEN if hits else HELD))
    return outcomes
