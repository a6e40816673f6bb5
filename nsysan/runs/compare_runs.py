"""Two runs side by side: what grew, appeared or vanished between a base and a new `Analysis`.

`compare_analyses(base, new)` returns a `Comparison` (model/comparison.py), the documented JSON
`nsysan/compare@1` (docs/json.md). It reads the two models only, so a committed `analysis.json` is as good a base
as a report.

Processes are matched by role, never by pid (pids differ from run to run): by rank when every
process of both runs has one, else by GPU order (each process's GPU, the one of its highest
peak, in ascending order: GPU 0 and 1 of one run match GPU 2 and 3 of another), else by
process name and the order in which processes started. Within a matched process its devices
are matched in GPU order. Sites are matched by label and kind, NVTX ranges by name.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any, Optional

from ..model import GPU_RESIDENT_KINDS, Analysis
from ..model.comparison import COMPARE_SCHEMA_ID, CaptureNote, Change, Comparison, ProcessDelta, ProcessRow, \
    RangeDelta, RunRef, SiteDelta
from ..base.units import fmt_bytes, fmt_percent

# Kinds counted in a row's end-of-run and never-freed bytes: GPU-resident memory, without
# module globals (static memory is loaded with the code and never freed by design).
_KEPT_KINDS = tuple(k for k in GPU_RESIDENT_KINDS if k != "static")
# Growth verdicts that measured a rate per step (the others: too_few_steps, preallocated).
MEASURED_GROWTH = ("growing", "uneven", "stable")


@dataclass
class _Process:
    pid: int
    name: str
    rank: Optional[int]
    first_ns: int
    rows: list[ProcessRow] = field(default_factory=list)

    @property
    def main_gpu(self) -> Optional[int]:
        best = max(self.rows, key=lambda r: (r.peak_bytes, -r.device))
        return best.gpu if best.gpu is not None else best.device


def compare_analyses(base: Analysis, new: Analysis) -> Comparison:
    """What changed from `base` to `new`: per matched process and GPU, per site, per NVTX range."""
    base_procs, new_procs = _processes(base), _processes(new)
    matched_by, pairs = match_processes(base_procs, new_procs)
    deltas: list[ProcessDelta] = []
    for role, b, n in pairs:
        deltas.extend(_process_deltas(role, b, n))
    notes = capture_notes(base, new)
    no_sizes = any(n.code in ("sizes_missing", "quick_analysis") for n in notes)  # nor ranges, then
    # Without sizes on one side, a site or range would read as grown from 0 B; with call stacks or
    # an allocator on one side only, the same allocations carry other site names on each side.
    sites, unchanged = ([], 0) if notes else _site_deltas(base, new)
    ranges = [] if no_sizes else _range_deltas(base, new)
    identical = (not notes and not sites and not ranges and all(
        d.base_pid is not None and d.new_pid is not None and not d.peak.changed and not d.end.changed
        and not d.never_freed.changed and not (d.growth_per_step and d.growth_per_step.changed) for d in deltas))
    base_ref, new_ref = (RunRef(name=a.source.name, path=a.source.path, processes=len(procs),
                                peak_bytes=a.peak.peak_bytes if a.peak else None)
                         for a, procs in ((base, base_procs), (new, new_procs)))
    comparison = Comparison(schema=COMPARE_SCHEMA_ID, base=base_ref, new=new_ref,
                            matched_by=matched_by, identical=identical, headline="", processes=deltas,
                            sites=sites, ranges=ranges, unchanged_sites=unchanged, notes=notes)
    return dataclasses.replace(comparison, headline=headline(comparison))


def headline(c: Comparison) -> str:
    """The verdict in one line: "peak +3.5 GiB (+194%) on GPU 0; new growth of 735.0 MiB per step; ..."."""
    if c.identical:
        return ("no difference: peak, end-of-run and never-freed bytes are the same on every process and GPU, "
                "and so are the sites and NVTX ranges")
    parts: list[str] = []
    matched = [d for d in c.processes if d.base_pid is not None and d.new_pid is not None]
    peak = max(matched, key=lambda d: abs(d.peak.delta or 0), default=None)
    if peak is not None and peak.peak.delta:
        parts.append(f"peak {_signed(peak.peak)} on {peak.role}")
    elif matched:
        parts.append("same peak")
    kept = max(matched, key=lambda d: abs(d.never_freed.delta or 0), default=None)
    if kept is not None and kept.never_freed.delta and (peak is None or kept.role != peak.role
                                                          or not peak.peak.delta):
        parts.append(f"never freed {_signed(kept.never_freed)} on {kept.role}")
    growth = max((d for d in matched if d.growth_per_step and d.growth_per_step.delta),
                 key=lambda d: abs(d.growth_per_step.delta or 0), default=None)  # type: ignore[union-attr]
    if growth is not None:
        g = growth.growth_per_step
        assert g is not None and g.after is not None and g.before is not None
        if growth.growth_after == "growing" and growth.growth_before != "growing":
            parts.append(f"new growth of {fmt_bytes(g.after)} per step on {growth.role}")
        else:
            parts.append(f"growth per step {fmt_bytes(g.before)} → {fmt_bytes(g.after)} on {growth.role}")
    if any(n.code == "sizes_missing" for n in c.notes):
        return "; ".join(n.message for n in c.notes)  # nothing else is measured on both sides
    parts += [n.message for n in c.notes]
    only_new = [d.role for d in c.processes if d.base_pid is None]
    only_base = [d.role for d in c.processes if d.new_pid is None]
    if only_new:
        parts.append("new: " + ", ".join(only_new))
    if only_base:
        parts.append("gone: " + ", ".join(only_base))
    top = next((s for s in c.sites if s.status in ("appeared", "grew")), None)
    if top is not None:
        what = "top new site" if top.status == "appeared" else "top growing site"
        parts.append(f"{what}: {top.label} ({_signed(top.max_live, percent=False)})")
    return "; ".join(parts)


def capture_notes(base: Analysis, new: Analysis) -> list[CaptureNote]:
    """What the two captures differ in that changes what can be compared."""
    notes = []
    runs = (("base", base), ("new", new))
    without = [f"{a.source.name} ({side})" for side, a in runs if not a.capture.memory_usage_collected]
    if without and len(without) < 2:
        notes.append(CaptureNote("sizes_missing", f"{without[0]} was captured without --cuda-memory-usage, so it "
                                 "has no sizes and no byte of the two runs is compared; capture both with "
                                 "--cuda-memory-usage=true"))
    quick = [f"{a.source.name} ({side})" for side, a in runs if a.scope == "quick"]
    if len(quick) == 1:
        notes.append(CaptureNote("quick_analysis", f"{quick[0]} is a --quick analysis, which reads no sites or NVTX "
                                 "ranges, so they are not compared; analyze both runs without --quick"))
    stacks = [f"{a.source.name} ({side})" for side, a in runs if a.capture.backtraces]
    if len(stacks) == 1:
        notes.append(CaptureNote("stacks_differ", f"only {stacks[0]} has call stacks, so the runs name their sites "
                                 "differently and sites are not compared; capture both with the same "
                                 "--cudabacktrace"))
    # A framework's allocator (pytorch_caching, pytorch_expandable, xla_preallocation), and a
    # stream-ordered pool: PyTorch's cudaMallocAsync backend shows only as the pool it uses.
    kinds = [sorted({u.allocator for u in a.reserved.allocators} | ({"cudaMallocAsync pool"} if a.reserved.pools
                                                                      else set())) for _, a in runs]
    if kinds[0] and kinds[1] and kinds[0] != kinds[1]:
        notes.append(CaptureNote("allocators_differ", f"the runs use different allocators ({', '.join(kinds[0])} → "
                                 f"{', '.join(kinds[1])}), so their allocations come from other APIs and sites "
                                 "are not compared"))
    return notes


def _signed(change: Change, percent: bool = True) -> str:
    delta = change.delta or 0
    text = ("+" if delta >= 0 else "-") + fmt_bytes(abs(delta))
    if percent and change.percent is not None:
        text += f" ({fmt_percent(change.percent / 100, signed=True)})"
    return text


def _processes(analysis: Analysis) -> list[_Process]:
    """The processes with GPU-resident memory, each with one row per CUDA device."""
    peaks = {(p.pid, p.device): p for p in analysis.peaks if p.pid is not None}
    names = {p.pid: p.name for p in analysis.capture.processes}
    # Only a rank read from the process's environment is a role of its own; a rank numbered by
    # GPU order is the GPU order, which the matching falls back to anyway.
    ranks = {p.pid: p.rank if p.rank_source == "environment" else None for p in analysis.capture.processes}
    first: dict[int, int] = {}
    for s in analysis.timeline.series:
        if s.ts_ns:
            first[s.pid] = min(first.get(s.pid, s.ts_ns[0]), s.ts_ns[0])
    # Bytes of growth per step where the growth verdict judged a rate: not from one or two steps
    # (too_few_steps), not inside a preallocation, where it cannot be seen.
    growth = {(g.pid, g.device): g.bytes_per_step for g in analysis.growth if g.verdict in MEASURED_GROWTH}
    verdicts = {(g.pid, g.device): g.verdict for g in analysis.growth}
    rows: dict[tuple[int, int], dict[str, Any]] = {}
    for g in analysis.groups:
        if g.kind not in GPU_RESIDENT_KINDS:
            continue
        row = rows.setdefault((g.pid, g.device), {"gpu": g.gpu, "end": 0, "kept": 0})
        row["end"] += g.end_bytes
        if g.kind in _KEPT_KINDS:
            row["kept"] += g.never_freed_bytes
    processes: dict[int, _Process] = {}
    for (pid, device), row in sorted(rows.items()):
        peak = peaks.get((pid, device))
        if peak is None:  # module statics alone on a GPU the process does not compute on
            continue
        proc = processes.setdefault(pid, _Process(pid, names.get(pid, ""), ranks.get(pid), first.get(pid, 0)))
        proc.rows.append(ProcessRow(pid=pid, name=proc.name, device=device, gpu=row["gpu"],
                              peak_bytes=peak.peak_bytes, end_bytes=row["end"],
                              never_freed_bytes=row["kept"], rank=proc.rank,
                              growth_per_step=growth.get((pid, device)), growth_verdict=verdicts.get((pid, device))))
    return list(processes.values())


def process_rows(analysis: Analysis) -> list[ProcessRow]:
    """One row per process and CUDA device with a GPU peak, in pid then device order."""
    return [row for proc in _processes(analysis) for row in proc.rows]


def match_processes(base: list[_Process], new: list[_Process]
                    ) -> tuple[str, list[tuple[str, Optional[_Process], Optional[_Process]]]]:
    """Pairs (role, base process, new process), either side None when unmatched; and the rule used."""
    everyone = base + new
    if everyone and all(p.rank is not None for p in everyone):
        return "rank", _pair_by_key(base, new, lambda p: p.rank, lambda p: f"rank {p.rank}")
    if all(len({p.main_gpu for p in run}) == len(run) for run in (base, new)):
        order = {id(p): i for run in (base, new)
                 for i, p in enumerate(sorted(run, key=lambda p: (p.main_gpu is None, p.main_gpu)))}
        return "gpu", _pair_by_key(base, new, lambda p: order[id(p)], lambda p: f"GPU {p.main_gpu}")
    # By name and the order in which the processes of that name started.
    numbered: dict[int, tuple[str, int]] = {}
    for run in (base, new):
        seen: dict[str, int] = {}
        for p in sorted(run, key=lambda p: (p.first_ns, p.name)):
            seen[p.name] = seen.get(p.name, 0) + 1
            numbered[id(p)] = (p.name, seen[p.name])
    return "name", _pair_by_key(base, new, lambda p: numbered[id(p)],
                                lambda p: f"{numbered[id(p)][0] or 'process'} #{numbered[id(p)][1]}")


def _pair_by_key(base, new, key, label):
    by_base = {key(p): p for p in base}
    by_new = {key(p): p for p in new}
    pairs = []
    for k in sorted(set(by_base) | set(by_new), key=lambda k: (k is None, k)):
        b, n = by_base.get(k), by_new.get(k)
        pairs.append((label(n if n is not None else b), b, n))
    return pairs


def _process_deltas(role: str, base: Optional[_Process], new: Optional[_Process]) -> list[ProcessDelta]:
    def gpu_ordered(p: Optional[_Process]) -> list[ProcessRow]:
        return sorted(p.rows, key=lambda r: (r.gpu is None, r.gpu, r.device)) if p else []

    out = []
    for b, n in itertools.zip_longest(gpu_ordered(base), gpu_ordered(new)):
        row = n if n is not None else b
        assert row is not None
        gpu = row.gpu if row.gpu is not None else row.device
        if role.startswith("GPU "):  # matched by GPU: the role is the process's main GPU
            name = role if role == f"GPU {gpu}" else f"GPU {gpu} (process of {role})"
        else:
            name = f"{role} · GPU {gpu}"

        def value(row: Optional[ProcessRow], attr: str) -> Any:
            return getattr(row, attr) if row is not None else None

        def change(attr: str) -> Change:
            return Change.of(value(b, attr), value(n, attr))

        growth = None
        if (b and b.growth_per_step is not None) or (n and n.growth_per_step is not None):
            growth = change("growth_per_step")
        out.append(ProcessDelta(
            role=name, base_pid=value(b, "pid"), new_pid=value(n, "pid"), base_gpu=value(b, "gpu"),
            new_gpu=value(n, "gpu"), peak=change("peak_bytes"), end=change("end_bytes"),
            never_freed=change("never_freed_bytes"), growth_per_step=growth, growth_before=value(b, "growth_verdict"),
            growth_after=value(n, "growth_verdict")))
    return out


def _site_deltas(base: Analysis, new: Analysis) -> tuple[list[SiteDelta], int]:
    def by_label(a: Analysis) -> dict[tuple[str, str], Any]:
        # Sites are per process; two runs have other pids, so a site is matched by label and kind
        # with its processes summed (max_live: the sum of each process's most).
        summed: dict[tuple[str, str], Any] = {}
        for s in a.sites:
            key = (s.site.label, s.kind)
            if key in summed:
                s = dataclasses.replace(summed[key], allocated_bytes=summed[key].allocated_bytes + s.allocated_bytes,
                                        never_freed_bytes=summed[key].never_freed_bytes + s.never_freed_bytes,
                                        max_live_bytes=summed[key].max_live_bytes + s.max_live_bytes)
            summed[key] = s
        return summed

    b_sites, n_sites = by_label(base), by_label(new)
    deltas, unchanged = [], 0
    for key in set(b_sites) | set(n_sites):
        b, n = b_sites.get(key), n_sites.get(key)
        max_live = Change.of(b.max_live_bytes if b else 0, n.max_live_bytes if n else 0)
        allocated = Change.of(b.allocated_bytes if b else 0, n.allocated_bytes if n else 0)
        kept = Change.of(b.never_freed_bytes if b else 0, n.never_freed_bytes if n else 0)
        if b is None:
            status = "appeared"
        elif n is None:
            status = "vanished"
        elif max_live.changed or allocated.changed or kept.changed:
            status = "grew" if (max_live.delta, kept.delta, allocated.delta) > (0, 0, 0) else "shrank"
        else:
            unchanged += 1
            continue
        deltas.append(SiteDelta(label=key[0], kind=key[1], status=status, max_live=max_live,
                                allocated=allocated, never_freed=kept))
    deltas.sort(key=lambda s: (-abs(s.max_live.delta or 0), -abs(s.never_freed.delta or 0), s.label, s.kind))
    return deltas, unchanged


def _range_deltas(base: Analysis, new: Analysis) -> list[RangeDelta]:
    b_ranges = {r.name: r for r in base.ranges}
    n_ranges = {r.name: r for r in new.ranges}
    out = []
    for name in set(b_ranges) | set(n_ranges):
        b, n = b_ranges.get(name), n_ranges.get(name)
        max_live = Change.of(b.max_live_bytes if b else 0, n.max_live_bytes if n else 0)
        kept = Change.of(b.still_live_bytes if b else 0, n.still_live_bytes if n else 0)
        if (max_live.delta or 0) > 0 or (kept.delta or 0) > 0:
            out.append(RangeDelta(name=name, max_live=max_live, still_live=kept))
    out.sort(key=lambda r: (-max(r.max_live.delta or 0, r.still_live.delta or 0), r.name))
    return out
