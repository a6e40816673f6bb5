"""How a run that ran out of memory without a failed call ended, and the program's own error
message joined with the trace (`--log`).

Worked on the finished `Analysis` (both the whole-frame and the streamed paths make the same one),
so it needs no twin:

- `ended_inside`: a process whose trace ends inside NVTX ranges it never closed, with no failed
  call and no release of its cache. PyTorch under set_per_process_memory_fraction refuses a
  request by itself, and when nothing is cached it frees nothing first: the trace then simply
  stops inside the range that asked. What can be said is said: where it ended, what it held and
  in blocks of which sizes, how it grew before, and that the error message has the rest.
- `join_logged`: each error read from a log (oom_log.py) matched to its process (by the pid it
  names, else the only process that died, else the only process), with the verdict its numbers
  give: over the cap, fragmentation, another process, or a full GPU.
- `fatal`: the processes that died of out-of-memory with no failed call (for `check`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import TYPE_CHECKING, Any, Optional, Sequence

from ..model import GPU_RESIDENT_KINDS, Analysis, Diagnostic, MemoryCap, OutOfMemory
from ..base.units import fmt_bytes, fmt_time
from .answers import gather_answers
from .oom import NEAR_END_NS

if TYPE_CHECKING:  # the log reader's patterns are compiled only for --log (issue 31: every start pays its imports)
    from ..model.oom_found import EndedInside, FatalOom, LoggedOom, SizeCount
    from ..sources.oom_log import OomMessage

BLOCK_SIZES = 8  # distinct block sizes named
OWN_CODES = ("ended_inside", "oom_logged", "oom_log_empty")  # the diagnostics made here
ASK_THE_LOG = ("no memory call failed, so if this was an out-of-memory error, its message gives the request and "
               "the cap: give the program's stderr with --log FILE")


def explain_oom(analysis: Analysis, messages: Sequence[OomMessage] = (), logs: Sequence[str] = ()) -> Analysis:
    """The analysis with `oom.ended_inside`, `oom.logged` (the errors of the logs named `logs`,
    read into `messages`) and `oom.fatal` filled, their caps, diagnostics and answers."""
    oom = analysis.oom
    logged = join_logged(analysis, messages)
    ended = ended_inside(analysis, {m.matched_pid for m in logged})
    oom = dataclasses.replace(oom, ended_inside=ended, logged=logged)
    oom = dataclasses.replace(oom, fatal=fatal(oom))
    diagnostics = _diagnostics(analysis, ended, logged, messages, logs)
    # Worked again on a finished analysis (an analysis.json given to check with --log), it
    # replaces what it made before.
    caps = [c for c in analysis.caps if c.source != "oom_message"] + [
        MemoryCap(pid=m.matched_pid, device=m.device, gpu=_gpu(analysis, m.matched_pid, m.device),
                  cap_bytes=m.cap_bytes, source="oom_message",
                  note=f"the cap the program's error message gives ({m.log} line {m.line})")
        for m in logged if m.matched_pid is not None and m.cap_bytes and m.device is not None]
    if not ended and not logged and not messages and not logs:
        return dataclasses.replace(analysis, oom=oom, diagnostics=diagnostics,
                                   answers=[_after_crash(analysis, a) for a in analysis.answers])
    analysis = dataclasses.replace(analysis, oom=oom, caps=caps, diagnostics=diagnostics)
    labels = {p.pid: p.label for p in analysis.capture.processes if p.label}
    fresh = [a for a in gather_answers(analysis.peak, analysis.process_peaks(), analysis.growth, diagnostics,
                                       analysis.scope == "quick", labels) if a.topic == "oom"]
    fresh = [_after_crash(analysis, a) for a in fresh]
    # Only the out-of-memory answers change: those other post-passes added (the verdict line, the
    # code loads, nvidia-smi, what-if) stay where they are when a finished analysis is joined.
    answers = list(analysis.answers)
    at = next((i for i, a in enumerate(answers) if a.topic == "oom"),
              next((i for i, a in enumerate(answers) if a.topic in ("reserved", "trust")), len(answers)))
    answers = [a for a in answers[:at] if a.topic != "oom"] + fresh + [a for a in answers[at:] if a.topic != "oom"]
    analysis = dataclasses.replace(analysis, answers=answers)
    if any(a.topic == "verdict" for a in answers):  # made before the join: it reads the logged error too
        from .verdict_line import with_verdict

        analysis = with_verdict(analysis)
    return analysis


# --- the trace alone ---------------------------------------------------------------------------

def ended_inside(analysis: Analysis, logged_pids: set = frozenset()) -> list[EndedInside]:
    """Processes cut short inside NVTX ranges they never closed, with no failed out-of-memory
    call and no allocator that gave up (those say more); `logged_pids`: those a logged error
    was joined with (their message says the rest)."""
    oom = analysis.oom
    said = {o.release.pid for o in oom.allocator_ooms} | {f.pid for f in oom.failures}
    found = []
    for cut in oom.cut_short:
        if not cut.open_ranges or cut.pid in said:
            continue
        device, gpu = _main_device(analysis, cut.pid)
        use = next((u for u in analysis.reserved.allocators if u.pid == cut.pid and u.device == device), None)
        blocks = sum(g.never_freed_count for g in analysis.groups
                     if g.pid == cut.pid and g.device == device and g.kind == "device")
        growth = next((g for g in analysis.growth if g.pid == cut.pid and g.device == device), None)
        sized = analysis.capture.memory_usage_collected  # without sizes, no memory event tells when it ended
        ended = sized and analysis.timeline.end_ns - cut.last_event_ns > NEAR_END_NS
        from ..model.oom_found import EndedInside  # made when found (model/oom_found.py)
        item = EndedInside(
            pid=cut.pid, device=device, gpu=gpu, open_ranges=list(cut.open_ranges), last_event_ns=cut.last_event_ns,
            process_ended=ended, live_bytes=cut.end_live_bytes,
            reserved_bytes=use.inside_end_bytes if use is not None and not use.allocator.endswith("preallocation")
            else None, blocks=blocks, block_sizes=_block_sizes(analysis, cut.pid, device),
            growth_bytes_per_step=growth.bytes_per_step if growth is not None and growth.verdict == "growing" else None)
        found.append(dataclasses.replace(item, message=_crash_advice(
            analysis, _ended_message(analysis, item, growth, cut.pid in logged_pids))))
    return found


def _main_device(analysis: Analysis, pid: int) -> tuple[Optional[int], Optional[int]]:
    """The process's device holding the most GPU-resident bytes at the end, and its GPU."""
    mine = [g for g in analysis.groups if g.pid == pid and g.kind in GPU_RESIDENT_KINDS]
    if not mine:
        return None, None
    ends: Counter = Counter()
    for g in mine:
        ends[g.device] += g.end_bytes
    device = max(sorted(ends), key=lambda d: ends[d])
    return device, next(g.gpu for g in mine if g.device == device)


def _gpu(analysis: Analysis, pid: Optional[int], device: Optional[int]) -> Optional[int]:
    return next((g.gpu for g in analysis.groups if g.pid == pid and g.device == device), None)


def _block_sizes(analysis: Analysis, pid: int, device: Optional[int]) -> list[SizeCount]:
    """The sizes of the device blocks live at the end, largest first, from the never-freed list
    (the largest allocations): a size is counted only where that list holds all of its blocks."""
    listed = analysis.never_freed
    complete_above = listed[-1].bytes if len(listed) < analysis.never_freed_total and listed else -1
    counts = Counter(a.bytes for a in listed
                     if a.pid == pid and a.device == device and a.kind == "device" and a.bytes > complete_above)
    from ..model.oom_found import SizeCount  # made when found (model/oom_found.py)
    return [SizeCount(bytes=b, count=counts[b]) for b in sorted(counts, reverse=True)[:BLOCK_SIZES]]


def _sizes_text(sizes: list[SizeCount], blocks: int) -> str:
    named = ", ".join(f"{s.count} × {fmt_bytes(s.bytes)}" if s.count > 1 else fmt_bytes(s.bytes) for s in sizes)
    rest = blocks - sum(s.count for s in sizes)
    return named + (f" and {rest:,} smaller" if rest > 0 and named else "")


def _ended_message(analysis: Analysis, item: EndedInside, growth, logged: bool) -> str:
    who = analysis.process_label(item.pid)
    where = item.open_ranges[-1]
    path = f" ({' > '.join(item.open_ranges)})" if len(item.open_ranges) > 1 else ""
    tail = ("Its logged error says what it asked for and the cap" if logged else
            f"{ASK_THE_LOG[0].upper()}{ASK_THE_LOG[1:]}")
    if not analysis.capture.memory_usage_collected:
        return (f"{who}'s trace ends inside '{where}'{path}, never closed; the capture has no sizes, so what it "
                f"held then is unknown. {tail}")
    head = (f"{who} ended inside '{where}'{path} without closing it" if item.process_ended
            else f"the capture ended while {who} was inside '{where}'{path}")
    text = f"{head}: its last memory event at {fmt_time(item.last_event_ns)}, {fmt_bytes(item.live_bytes)} live"
    if item.gpu is not None:
        text += f" on GPU {item.gpu}"
    if item.reserved_bytes is not None:
        text += f", {fmt_bytes(item.reserved_bytes)} of it reserved by its caching allocator"
    if item.blocks:
        text += f", in {item.blocks:,} blocks ({_sizes_text(item.block_sizes, item.blocks)})"
    if item.growth_bytes_per_step is not None and growth is not None:
        text += (f"; before it, it grew {fmt_bytes(item.growth_bytes_per_step)} per step (steps "
                 f"{growth.first_step}-{growth.last_step})")
    else:
        text += _steps_before(analysis, item)
    return text + f". {tail}"


def _steps_before(analysis: Analysis, item: EndedInside) -> str:
    """What its closed steps did before it ended, when no growth verdict says it (too few steps
    to judge, or not growing): '; before it, steps 0-2 took it from A to B (+C)'."""
    series = next((s for s in analysis.steps if s.pid == item.pid and s.device == item.device), None)
    closed = [step for step in series.steps if step.closed] if series is not None else []
    if not closed:
        return ""
    first, last = closed[0], closed[-1]
    change = last.end_live_bytes - first.start_live_bytes
    which = f"step {first.number}" if first is last else f"steps {first.number}-{last.number}"
    sign = "+" if change >= 0 else ""
    return (f"; before it, {which} took it from {fmt_bytes(first.start_live_bytes)} to "
            f"{fmt_bytes(last.end_live_bytes)} ({sign}{fmt_bytes(change)})")


# --- the log joined with the trace -------------------------------------------------------------

def join_logged(analysis: Analysis, messages: Sequence[OomMessage]) -> list[LoggedOom]:
    """Each logged error with its process, the trace's side of it and its verdict."""
    oom = analysis.oom
    # the trace's processes: those with memory calls, and any the OOM verdicts name (a capture
    # without a memory table lists none, yet its ranges show who was cut short)
    pids = ({p.pid for p in analysis.capture.processes} | {c.pid for c in oom.cut_short}
            | {o.release.pid for o in oom.allocator_ooms} | {f.pid for f in oom.failures})
    memory_pids = sorted({g.pid for g in analysis.groups if g.kind in GPU_RESIDENT_KINDS}
                         or {p.pid for p in analysis.capture.processes})  # without sizes: the processes
    died = sorted({o.release.pid for o in oom.allocator_ooms} | {c.pid for c in oom.cut_short if c.open_ranges})
    found = []
    ranks = {p.rank: p.pid for p in analysis.capture.processes if p.rank is not None}
    for m in messages:
        if m.pid is not None and m.pid in pids:
            pid, how = m.pid, "pid"
        elif m.thread is not None and m.thread in pids:  # glog's thread id: the main thread's is the pid
            pid, how = m.thread, "pid"
        elif m.rank is not None and m.rank in ranks:
            pid, how = ranks[m.rank], "rank"
        elif len(died) == 1:
            pid, how = died[0], "only_death"
        elif len(memory_pids) == 1:
            pid, how = memory_pids[0], "only_process"
        else:
            pid, how = None, ""
        found.append(_logged(analysis, m, pid, how))
    return found


def _logged(analysis: Analysis, m: OomMessage, pid: Optional[int], how: str) -> LoggedOom:
    device = m.device if m.device is not None else (_main_device(analysis, pid)[0] if pid is not None else None)
    cap = m.cap_bytes
    prealloc = next((p for p in analysis.reserved.preallocations if p.pid == pid and p.device == device), None)
    if cap is None and m.framework == "xla" and prealloc is not None:
        cap = prealloc.bytes  # XLA's allocator never goes beyond its preallocated pool
    others = None
    if m.total_bytes is not None and m.free_bytes is not None and m.process_bytes is not None:
        others = max(m.total_bytes - m.free_bytes - m.process_bytes, 0)
    elif m.other_processes:
        others = sum(m.other_processes.values())
    verdict = _verdict(m, cap, others)
    trace_reserved = _trace_reserved(analysis, pid, device)
    from ..model.oom_found import LoggedOom  # made when found (model/oom_found.py)
    item = LoggedOom(log=m.log, line=m.line, framework=m.framework, wording=m.wording, pid=m.pid, matched_pid=pid,
                     matched_by=how, device=device, request_bytes=m.request_bytes, cap_bytes=cap,
                     total_bytes=m.total_bytes, free_bytes=m.free_bytes, process_bytes=m.process_bytes,
                     allocated_bytes=m.allocated_bytes, reserved_unallocated_bytes=m.reserved_unallocated_bytes,
                     others_bytes=others, verdict=verdict, trace_reserved_bytes=trace_reserved, message="")
    return dataclasses.replace(item, message=_logged_message(analysis, item, prealloc is not None and
                                                             m.cap_bytes is None))


def _verdict(m: OomMessage, cap: Optional[int], others: Optional[int]) -> str:
    request = m.request_bytes
    if request is None:
        return "unknown"
    unallocated = m.reserved_unallocated_bytes
    if m.framework == "xla" and cap is not None and m.allocated_bytes is not None:
        unallocated = cap - m.allocated_bytes  # free inside the pool
    if unallocated is not None and unallocated >= request:
        return "fragmentation"
    held = (m.allocated_bytes or 0) + ((m.reserved_unallocated_bytes or 0) if m.framework == "pytorch" else 0)
    if cap is not None and held + request > cap:
        return "over_cap"
    if m.free_bytes is not None and m.free_bytes < request:
        return "other_process" if others is not None and others >= request - m.free_bytes else "gpu_full"
    return "unknown"


def _trace_reserved(analysis: Analysis, pid: Optional[int], device: Optional[int]) -> Optional[int]:
    """What the trace shows the process's allocator holding when it failed: after its last
    release when it gave up (PyTorch frees its cache, retries, then raises), else at the end."""
    if pid is None:
        return None
    use = next((u for u in analysis.reserved.allocators if u.pid == pid and u.device == device), None)
    if use is None:
        block = next((p for p in analysis.reserved.preallocations if p.pid == pid and p.device == device), None)
        return block.bytes if block is not None else None
    gave_up = [o for o in analysis.oom.allocator_ooms if o.release.pid == pid and o.release.device == device]
    if gave_up:
        return max(gave_up[-1].release.live_after_bytes - use.outside_end_bytes, 0)
    return use.inside_end_bytes


def exact_bytes(n: Optional[int]) -> str:
    """Sizes as PyTorch prints them in its message (two decimals), so they read alike."""
    if n is None:
        return "n/a"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} bytes"


def _logged_message(analysis: Analysis, m: LoggedOom, cap_from_trace: bool) -> str:
    who = analysis.process_label(m.matched_pid) if m.matched_pid is not None else "a process of the log"
    how = {"pid": "", "rank": " (its rank, from the line's [rankN])", "only_death": " (the only process that died)",
           "only_process": " (the only process in the trace)", "": " (no process of the trace could be matched)"}
    name = "PyTorch's caching allocator" if m.framework == "pytorch" else "XLA's allocator"
    gpu = f" on GPU {m.device}" if m.device is not None else ""
    text = f"{m.log} line {m.line}: {name} of {who}{how[m.matched_by]} could not get {exact_bytes(m.request_bytes)}{gpu}"
    held = None
    if m.framework == "pytorch" and m.allocated_bytes is not None:
        held = m.allocated_bytes + (m.reserved_unallocated_bytes or 0)
        text += (f"; it held {exact_bytes(held)} ({exact_bytes(m.allocated_bytes)} in tensors, "
                 f"{exact_bytes(m.reserved_unallocated_bytes)} reserved but unallocated)")
    elif m.allocated_bytes is not None:
        held = m.allocated_bytes
        text += f"; {exact_bytes(held)} of its pool was in use"
    text += ". " + _verdict_sentence(m, held, cap_from_trace)
    if m.trace_reserved_bytes is not None and m.matched_pid is not None:
        text += f". The trace shows its allocator holding {exact_bytes(m.trace_reserved_bytes)}"
        ended = next((c for c in analysis.oom.cut_short if c.pid == m.matched_pid and c.open_ranges), None)
        gave_up = next((o for o in analysis.oom.allocator_ooms if o.release.pid == m.matched_pid), None)
        if gave_up is not None:
            text += (f" after it freed its cache at {fmt_time(gave_up.release.start_ns)}"
                     + (f" in {gave_up.release.nvtx_path}" if gave_up.release.nvtx_path else ""))
        elif ended is not None:
            text += f" when it ended inside '{ended.open_ranges[-1]}'"
        else:
            text += " at the end"
    return text


def _verdict_sentence(m: LoggedOom, held: Optional[int], cap_from_trace: bool) -> str:
    request = m.request_bytes
    if m.verdict == "fragmentation":
        if m.framework == "pytorch":
            return (f"Fragmentation: {exact_bytes(m.reserved_unallocated_bytes)} was cached but unallocated, more "
                    f"than the {exact_bytes(request)} asked, yet in no piece large enough; "
                    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True avoids this")
        return (f"Fragmentation: {exact_bytes(m.cap_bytes - (m.allocated_bytes or 0))} of its "
                f"{exact_bytes(m.cap_bytes)} pool was free, more than asked, yet in no piece large enough")
    if m.verdict == "over_cap":
        what = "allowed (set_per_process_memory_fraction)"
        if m.framework == "xla":
            what = ("its allocator may use (the block the trace shows it preallocated)" if cap_from_trace else
                    "its allocator may use (XLA's memory limit, the XLA_PYTHON_CLIENT_MEM_FRACTION share)")
        asked = (f"{exact_bytes(held)} held + {exact_bytes(request)} asked = {exact_bytes(held + (request or 0))}"
                 if held is not None else f"{exact_bytes(request)} asked")
        return (f"Over the cap: {asked}, more than the {exact_bytes(m.cap_bytes)} {what}; "
                "the request was refused without asking the driver")
    if m.verdict == "other_process":
        return (f"Another process: the GPU had {exact_bytes(m.free_bytes)} free of {exact_bytes(m.total_bytes)}, "
                f"and other processes held {exact_bytes(m.others_bytes)} of it (this one: "
                f"{exact_bytes(m.process_bytes)})")
    if m.verdict == "gpu_full":
        return (f"The GPU was full: {exact_bytes(m.free_bytes)} free of {exact_bytes(m.total_bytes)}, this process "
                f"holding {exact_bytes(m.process_bytes)}")
    return "Its numbers say no more (the message lacks the cap or the GPU's free memory)"


# --- for check, and the diagnostics -----------------------------------------------------------

def fatal(oom: OutOfMemory) -> list[FatalOom]:
    """Processes that died of out-of-memory with no failed call: their allocator gave up (the
    trace), or a logged error is theirs (the log); a logged error of no known process too."""
    by_trace = {o.release.pid for o in oom.allocator_ooms}
    by_log = {m.matched_pid for m in oom.logged if m.matched_pid is not None}
    if not by_trace and not oom.logged:
        return []  # most runs: nothing found, so oom_found's classes are not made (5 ms after the export)
    from ..model.oom_found import FatalOom  # made when found (model/oom_found.py)
    found = [FatalOom(pid=pid, found_by="trace and log" if pid in by_trace and pid in by_log
                      else "trace" if pid in by_trace else "log") for pid in sorted(by_trace | by_log)]
    if any(m.matched_pid is None for m in oom.logged):
        found.append(FatalOom(pid=None, found_by="log"))
    return found


def _after_crash(analysis: Analysis, said: Any) -> Any:
    """A run cut short (a Diagnostic or an Answer) may have crashed: the line that keeps the last
    CUDA events then, said last."""
    if said.code not in ("run_cut_short", "ended_inside") or getattr(said, "topic", "") == "verdict":
        return said  # the verdict is one short line
    return dataclasses.replace(said, message=_crash_advice(analysis, said.message))


def _crash_advice(analysis: Analysis, message: str) -> str:
    """`message` ending with the line to capture again after a crash (once: a finished analysis
    may be joined again)."""
    line = analysis.capture.crash_rerun_command
    if not line or message.endswith(line):
        return message
    return (f"{message.rstrip('.')}; if it crashed, nsys may have lost the CUDA events it had not yet written: "
            f"capture again with: {line}")


def _diagnostics(analysis: Analysis, ended: list[EndedInside], logged: list[LoggedOom],
                 messages: Sequence[OomMessage], logs: Sequence[str]) -> list[Diagnostic]:
    # A process that ended inside its ranges is said in full: its "cut short" line goes.
    cut = tuple(f"{analysis.process_label(e.pid)} was cut short" for e in ended)
    found = [_after_crash(analysis, d) for d in analysis.diagnostics if d.code not in OWN_CODES
             and not (d.code == "run_cut_short" and d.message.startswith(cut))]
    found += [_after_crash(analysis, Diagnostic("warning", "ended_inside", e.message)) for e in ended]
    found += [Diagnostic("warning", "oom_logged", m.message) for m in logged]
    read = {m.log for m in messages}
    for name in logs:
        if name not in read:
            found.append(Diagnostic("info", "oom_log_empty",
                                    f"--log {name} holds no out-of-memory error nsysan reads (PyTorch's 'CUDA out "
                                    "of memory. Tried to allocate', XLA's RESOURCE_EXHAUSTED)"))
    return found
