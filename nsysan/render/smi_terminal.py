"""The terminal lines of the nvidia-smi section (`nsysan analyze --smi`), from `Analysis.smi`."""

from __future__ import annotations

from typing import Optional

from rich.console import Group
from rich.text import Text

from ..errors import printable
from ..model.smi import MissedBySampling, SmiLogInfo, SmiOverlay, SomeoneElse
from ..base.units import SECOND, fmt_duration, fmt_mib, fmt_time
from .layout import Lines


def smi_section(smi: SmiOverlay) -> Group:
    """Which logs and how they sit on the trace's clock, then the three verdicts, in MiB (nvidia-smi's unit)."""
    parts: list = [Text(f"nvidia-smi against the trace (log times read as {printable(smi.tz)}; --smi-tz to change)",
                        style="bold")]
    parts.append(_block([(log.name, _log_line(log)) for log in smi.logs]))
    if smi.not_in_trace:
        parts.append(Text("  Not in the trace: nvidia-smi minus the traced live bytes while the process ran", style="bold"))
        rows = [(n.log, f"{_who(n.gpu, n.pid)}: median {fmt_mib(n.median_bytes)}, max {fmt_mib(n.max_bytes)} over "
                        f"{n.samples} samples; peaks: nvidia-smi {fmt_mib(n.smi_peak_bytes)}, trace "
                        f"{fmt_mib(n.traced_peak_bytes)}") for n in smi.not_in_trace]
        parts.append(_block(rows))
    if smi.missed:
        parts.append(Text("  Missed by sampling: the trace at the log's instants against its exact peak", style="bold"))
        parts.append(_block([(m.log, _missed_line(m)) for m in smi.missed]))
    if smi.someone_else:
        parts.append(Text("  Someone else: memory on the GPU that belongs to no traced process", style="bold"))
        parts.append(_block([(o.log, _someone_else_line(o)) for o in smi.someone_else]))
    return Group(*parts)


def smi_answer(smi: SmiOverlay) -> list[tuple[str, str, str]]:
    """The answer line of the first screen (label, severity, text): what nvidia-smi shows that no
    allocation explains, for the log and GPU where that is most."""
    if not smi.not_in_trace:
        return []
    biggest = max(smi.not_in_trace, key=lambda n: n.median_bytes)
    if biggest.median_bytes <= 0:
        return []
    return [("nvidia-smi", "info", f"{_who(biggest.gpu, biggest.pid)}: about {fmt_mib(biggest.median_bytes)} more "
                                   "than the allocations (median): CUDA context, kernel images, library workspaces "
                                   "below the allocator; the section below says more")]


def _block(rows: list[tuple[str, str]]) -> Lines:
    """Two columns, the log's name and what is said of it; the text wraps in its own column."""
    return Lines([(printable(name), printable(text)) for name, text in rows], indent=4, gap=2)


def _log_line(log: SmiLogInfo) -> str:
    what = "memory.used per GPU" if log.kind == "gpu" else "used_memory per process"
    line = f"{what}, {log.samples} samples every {fmt_duration(log.interval_ns)}"
    if log.skipped_rows:
        line += f" ({log.skipped_rows} unreadable rows left out)"
    if not log.overlaps:
        return line + "; does not overlap the capture (see diagnostics)"
    if not log.gpus:
        return line + "; covers no GPU of the trace (see diagnostics)"
    if log.aligned is False:
        return line + "; OFF the trace's clock (see diagnostics)"
    if log.rise_ns is not None and log.first_alloc_ns is not None:
        line += f"; first rise {_signed_ms(log.rise_ns - log.first_alloc_ns)} from the first allocation"
    if log.best_offset_ns is not None:
        line += f", best fit at {_signed_ms(log.best_offset_ns)}"
    return line


def _missed_line(m: MissedBySampling) -> str:
    head = (f"{_who(m.gpu, m.pid)}, {fmt_time(m.window_start_ns)} to {fmt_time(m.window_end_ns)}: "
            f"highest sample {fmt_mib(m.highest_sample_bytes)}; ")
    if m.missed_bytes > 0:
        body = (f"the trace peaked at {fmt_mib(m.exact_peak_bytes)} ({fmt_time(m.exact_peak_ns)}) but only "
                f"{fmt_mib(m.sampled_peak_bytes)} at its samples: {m.spikes_missed} spike(s) above it for "
                f"{fmt_duration(m.time_above_ns)} in all, the longest {fmt_duration(m.longest_missed_ns)}")
    else:
        body = f"its samples caught the trace's exact peak ({fmt_mib(m.exact_peak_bytes)}): nothing missed"
    return head + body + f"; spikes longer than {fmt_duration(m.max_gap_ns)} are always caught"


def _someone_else_line(other: SomeoneElse) -> str:
    facts = []
    if other.before_bytes is not None:
        facts.append(f"{fmt_mib(other.before_bytes)} in use before the traced process started")
    if other.unattributed_median_bytes is not None:
        facts.append(f"{fmt_mib(other.unattributed_median_bytes)} (median, max "
                     f"{fmt_mib(other.unattributed_max_bytes)}) in no process of {other.apps_log}")
    for p in other.processes[:5]:
        facts.append(f"process {p.pid} {p.name or '(no name)'}, not traced, held up to {fmt_mib(p.max_used_bytes)}")
    if not facts:
        return f"GPU {other.gpu}: nothing to tell (the log starts after the process did)"
    return f"GPU {other.gpu}: " + "; ".join(facts)


def _who(gpu: Optional[int], pid: Optional[int]) -> str:
    return f"GPU {gpu} " + ("(all processes)" if pid is None else f"(process {pid})")


def _signed_ms(ns: int) -> str:
    return f"{ns / 1e6:+.0f} ms" if abs(ns) < SECOND else f"{ns / 1e9:+.3f} s"

