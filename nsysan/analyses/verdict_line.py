"""The verdict in one line: what the page's headline and the terminal's first answer say, in place
of the largest number. Built from the finished analysis (both paths, and the --log join), in this
order, the first that applies:

1. out of memory: a failed call, the allocator giving up, or an error only the --log shows;
   else a process that ended inside NVTX ranges it never closed (what the trace alone can say);
2. growth every step (the fastest-growing process), with where it fills the GPU;
3. a preallocation (XLA) that hides the real use;
4. memory kept in some steps only;
5. healthy: every process with judged steps is stable (or flat after its warm-up);
6. otherwise the peak, or that sizes were not collected.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..model import Analysis, Answer
from ..base.units import fmt_bytes, fmt_share, fmt_time
from .graphs import share_text


def with_verdict(analysis: Analysis) -> Analysis:
    """The analysis with its verdict as the first answer (topic "verdict")."""
    severity, kind, sentence = verdict_of(analysis)
    answers = [a for a in analysis.answers if a.topic != "verdict"]
    return dataclasses.replace(analysis, answers=[Answer("verdict", severity, kind, sentence)] + answers)


def verdict_of(a: Analysis) -> tuple[str, str, str]:
    """(severity, kind, sentence): kind is out_of_memory, ended_inside, growing, preallocated,
    uneven, healthy, peak or no_sizes."""
    several = len({p.pid for p in a.capture.processes if p.devices}) > 1
    who = (lambda pid: f"{a.process_label(pid)} " if several and pid is not None else "")
    oom = _out_of_memory(a, who)
    if oom:
        return "error", "out_of_memory", oom
    for e in a.oom.ended_inside:  # no failed call, no release: what the trace alone can say
        if e.open_ranges:
            return ("warning", "ended_inside", f"{who(e.pid)}ended inside '{' > '.join(e.open_ranges)}' without closing "
                    f"it, with {fmt_bytes(e.live_bytes)} live: if it ran out of memory, --log with its error says so")
    growing = sorted((g for g in a.growth if g.verdict == "growing"), key=lambda g: -g.bytes_per_step)
    if growing:
        g = growing[0]
        where = f" from {g.holders[0].site}" if g.holders else ""
        full = f"; full at step ~{g.capacity_step}" if g.capacity_step is not None else ""
        return ("warning", "growing",
                f"{who(g.pid)}grows {fmt_bytes(g.bytes_per_step)} per step{where}{full}{_in_graphs(a, g.pid)}")
    for p in a.reserved.preallocations:
        if p.framework == "XLA" or any(g.verdict == "preallocated" for g in a.growth):
            share = f" ({p.share_of_gpu:.0%} of the GPU)" if p.share_of_gpu else ""
            return ("warning", "preallocated",
                    f"{who(p.pid)}XLA preallocated {fmt_bytes(p.bytes)}{share}: the real use is not visible")
    uneven = [g for g in a.growth if g.verdict == "uneven"]
    if uneven:
        g = max(uneven, key=lambda g: g.total_bytes)
        return ("warning", "uneven", f"{who(g.pid)}keeps memory in some steps, not every step: "
                f"{fmt_bytes(g.total_bytes)} over steps {g.first_step}-{g.last_step}")
    judged = [g for g in a.growth if g.first_step is not None]
    if judged and all(g.verdict == "stable" for g in judged):
        warmed = [g.message[g.message.index("grew during "):].split(";")[0] for g in judged
                  if "grew during " in g.message]  # growth.py's "grew during steps 0-3 (+5.8 GiB), flat since step 3"
        since = max(g.first_step for g in judged)
        said = warmed[0] if len(judged) == 1 and warmed else f"stable since step {since}"
        return "info", "healthy", f"healthy: {said}" + _peak_tail(a) + _cache_caveat(a)
    if a.peak is not None:
        where = f"GPU {a.peak.gpu}" if a.peak.gpu is not None else f"CUDA device {a.peak.device}"
        inside = f" in '{a.peak.nvtx_range}'" if a.peak.nvtx_range else ""
        return "info", "peak", (f"peak {fmt_bytes(a.peak.peak_bytes)} on {where}, {a.process_label(a.peak.pid)}, "
                                f"at {fmt_time(a.peak.peak_time_ns)}{inside}")
    if not a.capture.memory_usage_collected:
        return "warning", "no_sizes", "sizes were not collected: capture with --cuda-memory-usage=true"
    return "info", "peak", "no GPU memory was allocated"


def _in_graphs(a: Analysis, pid: int) -> str:
    """How much of what the process's steps kept was captured into CUDA graphs (analyses/graphs.py)."""
    for p in a.graphs.processes:
        if p.pid == pid and p.captured_bytes and p.steps_kept_bytes and p.steps_kept_bytes > 0:
            part = share_text(min(p.captured_bytes, p.steps_kept_bytes), p.steps_kept_bytes)
            fate = ", none destroyed" if p.exec_destroyed == p.exec_destroyed_at_exit else ""
            return f"; {part} of it captured into {p.instantiated} CUDA graphs{fate}"
    return ""


_CACHES = {"pytorch_caching": "PyTorch's caching allocator", "pytorch_expandable": "PyTorch's caching allocator"}


def _cache_caveat(a: Analysis) -> str:
    """A caching allocator hands its reserve out again without a CUDA call: tensors that pile up
    inside it (a leak smaller than its free blocks) are not in the trace. Flat is flat as far as
    the driver sees."""
    held = [u for u in a.reserved.allocators if u.allocator in _CACHES]
    if not held:
        return ""
    reserved = max(held, key=lambda u: u.inside_end_bytes)
    return (f"; {_CACHES[reserved.allocator]} holds {fmt_bytes(reserved.inside_end_bytes)} reserved, and what "
            "tensors use inside it is not in the trace")


def _peak_tail(a: Analysis) -> str:
    if a.peak is None:
        return ""
    share = fmt_share(a.peak.peak_bytes, a.peak.total_memory_bytes) if a.peak.total_memory_bytes else ""
    return f"; peak {fmt_bytes(a.peak.peak_bytes)}" + (f" ({share} of the GPU)" if share else "")


def _out_of_memory(a: Analysis, who) -> Optional[str]:
    o = a.oom
    if o.failures:
        f = o.failures[0]
        inside = f" in '{f.nvtx_path}'" if f.nvtx_path else ""
        live = (f" with {fmt_bytes(f.gpu_live_bytes)} live on GPU {f.gpu}" if f.gpu_live_bytes is not None
                and f.gpu is not None else "")
        of = f" of {fmt_bytes(f.total_memory_bytes)}" if live and f.total_memory_bytes else ""
        return f"{who(f.pid)}ran out of memory: {f.api} failed{inside}{live}{of}"
    logged = {x.matched_pid: x for x in o.logged if x.matched_pid is not None}
    for x in o.allocator_ooms:
        r = x.release
        inside = f" in '{r.nvtx_path}'" if r.nvtx_path else ""
        return f"{who(r.pid)}ran out of memory{inside}{_cap(logged.get(r.pid))}: the allocator gave up " \
               f"with {fmt_bytes(r.live_before_bytes)} live"
    for fatal in o.fatal:
        log = logged.get(fatal.pid) if fatal.pid is not None else next(iter(o.logged), None)
        ended = next((e for e in o.ended_inside if e.pid == fatal.pid), None)
        inside = f" in '{' > '.join(ended.open_ranges)}'" if ended and ended.open_ranges else ""
        asked = f" asking for {fmt_bytes(log.request_bytes)}" if log and log.request_bytes else ""
        return f"{who(fatal.pid)}ran out of memory{inside}{asked}{_cap(log)}"
    return None


def _cap(log) -> str:
    return f" under a {fmt_bytes(log.cap_bytes)} cap" if log is not None and log.cap_bytes else ""
