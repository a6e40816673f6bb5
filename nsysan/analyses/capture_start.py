"""A capture that began while the program ran: what was already live (events/read_start.py), said
first, so that the blocks nsys lists at time 0 are read as the state the capture found, not as
allocations made at 0 ms (model.LIVE_AT_START names them so in every table)."""

from __future__ import annotations

from ..events.read_start import CaptureStart
from ..model import Diagnostic
from ..base.units import fmt_bytes, fmt_time

_KIND_NAMES = {"static": "module statics", "device": "device blocks"}


def capture_start_diagnostic(state: CaptureStart, rerun: str = "") -> Diagnostic:
    """"3.5 GiB in 1,292 blocks were already live when the capture began (capture range from
    cuProfilerStart at 16.27 ms): ..." (warning `live_at_capture_start`); `rerun`: the nsys line
    that captures from the start (diagnostics.rerun_command), said last."""
    if state.profiler_start is not None:
        why = f"capture range from {state.profiler_start[0]} at {fmt_time(state.profiler_start[1])}"
    elif state.delay_ms:
        why = f"the capture was delayed by {state.delay_ms:,} ms"
    else:
        why = "the capture began while the program ran: a capture range or a delay"
    kinds = sorted(state.by_kind.items(), key=lambda item: -item[1][1])
    parts = ", ".join(f"{count:,} {_KIND_NAMES.get(kind, kind)} ({fmt_bytes(size)})" for kind, (count, size) in kinds)
    return Diagnostic("warning", "live_at_capture_start",
                      f"{fmt_bytes(state.bytes)} in {state.blocks:,} blocks were already live when the capture began "
                      f"({why}): {parts}; who allocated them, where, when and in which NVTX range is not in the "
                      "capture, so they are listed as '(live at capture start)', not as allocations made at 0 ms"
                      + (f"; to see them, capture from the start, without the capture range or delay: {rerun}"
                         if rerun else ""))
