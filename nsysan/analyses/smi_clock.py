"""Is an nvidia-smi log on the trace's clock? Its first rise, and the shift that fits it best.

nvidia-smi writes wall-clock local time without a zone; the trace counts from its session start,
whose UTC time the export records. A wrong zone moves a log by hours, a second machine's clock
by seconds. Two checks, both on the log's samples against the exact timeline:

- the first rise: memory appears when the process starts using the GPU, so the log's first
  rise must fall between the traced process's first CUDA call and its first allocation, give or
  take a second (the rise happened somewhere between the sample that shows it and the one before);
- the best shift: the shift of the log's times that makes its values follow the trace's live
  bytes most closely (see best_offset). It says which offset fits when the first fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from .live_steps import LiveSteps

SECOND = 1_000_000_000
TOLERANCE_NS = SECOND  # how far the log may be from the trace before it is called misaligned
RISE_BYTES = 64 * 2**20  # a rise: this much above the log's opening value (less for small traces)
FINEST_STEP_NS = 10_000_000  # the best shift is searched down to 10 ms
COARSE_STEPS = 2000  # candidate shifts in the first, coarse pass
GOOD_FIT = 0.8  # a shift is only named when the log then follows the trace this well
MIN_FIT_SAMPLES = 10  # fewer samples over the run (a 1 s log of a 5 s run) fit anything


@dataclass(frozen=True)
class Rise:
    at_ns: int  # the first sample that shows it
    previous_ns: int  # the sample before (the rise happened in between)


def first_rise(ts_ns: np.ndarray, used_bytes: np.ndarray, traced_peak_bytes: int,
               opening_is_before: bool) -> Optional[Rise]:
    """The first sample at least RISE_BYTES (or half the traced peak, if smaller) above the log's
    opening value. None when the log starts after the process did (`opening_is_before` False):
    its opening value already holds the process, so it shows no rise."""
    if len(ts_ns) < 2 or not opening_is_before:
        return None
    threshold = max(min(RISE_BYTES, traced_peak_bytes // 2), 2**20)
    above = np.flatnonzero(used_bytes - used_bytes[0] >= threshold)
    if len(above) == 0 or above[0] == 0:
        return None
    i = int(above[0])
    return Rise(int(ts_ns[i]), int(ts_ns[i - 1]))


def rise_fits(rise: Rise, first_call_ns: int, first_alloc_ns: int) -> bool:
    """The rise (somewhere in (previous, at]) falls within [first call - 1 s, first alloc + 1 s]."""
    return rise.at_ns >= first_call_ns - TOLERANCE_NS and rise.previous_ns <= first_alloc_ns + TOLERANCE_NS


def best_offset(ts_ns: np.ndarray, used_bytes: np.ndarray, steps: LiveSteps, first_ns: int, last_ns: int,
                interval_ns: int) -> tuple[Optional[int], Optional[float]]:
    """(shift in ns to add to the log's times, how well it then fits), or (None, None) when no
    shift makes it follow the trace well (GOOD_FIT) over enough samples.

    The fit is 1 - var(log - trace) / var(trace) over the samples that fall within the process's
    run (first to last CUDA call): 1 when the log is the trace plus a constant (the memory no
    event shows), 0 or less when it does not follow it. Only shifts that put nearly as many
    samples over the run as the best-placed one compete (a shift that keeps three lucky samples
    must not win). Every such shift is tried: a coarse pass over the whole range (a wrong zone
    is hours away), then finer passes around the best, down to 10 ms.
    """
    if len(ts_ns) < MIN_FIT_SAMPLES or len(steps.ts_ns) == 0 or last_ns <= first_ns:
        return None, None
    low, high = first_ns - int(ts_ns[-1]), last_ns - int(ts_ns[0])
    values = used_bytes.astype("float64")
    span = last_ns - first_ns
    expected = min(len(ts_ns), span // max(interval_ns, 1) + 1)
    needed = max(MIN_FIT_SAMPLES, int(0.8 * expected))

    def score(shift: int) -> float:
        lo, hi = np.searchsorted(ts_ns, [first_ns - shift, last_ns - shift], side="left")
        if hi - lo < needed:
            return -np.inf
        traced = steps.at(ts_ns[lo:hi] + shift).astype("float64")
        spread = traced.var()
        if spread == 0:
            return -np.inf
        # How much of the trace's variation the log reproduces, in bytes (not a correlation:
        # a log's flat 4 MiB rising to 5 MiB must not "fit" a trace growing by gigabytes).
        return 1.0 - float((values[lo:hi] - traced).var()) / float(spread)

    step = max(interval_ns // 2, (high - low) // COARSE_STEPS, FINEST_STEP_NS)
    candidates = np.arange(low, high + step, step, dtype="int64")
    best, best_score = _best(candidates, score)
    while step > FINEST_STEP_NS and best_score > -np.inf:
        finer = max(step // 10, FINEST_STEP_NS)
        near, near_score = _best(np.arange(best - step, best + step + 1, finer, dtype="int64"), score)
        if near_score > best_score:
            best, best_score = near, near_score
        step = finer
    if best_score < GOOD_FIT or np.isnan(best_score):
        return None, None  # no shift makes the log follow the trace: there is nothing to suggest
    return best, round(best_score, 4)


def fit_at(ts_ns: np.ndarray, used_bytes: np.ndarray, steps: LiveSteps, first_ns: int, last_ns: int,
           shift: int) -> Optional[float]:
    """The fit (as in best_offset) of the log at one shift; None when it cannot be measured."""
    inside = (ts_ns + shift >= first_ns) & (ts_ns + shift <= last_ns)
    if inside.sum() < MIN_FIT_SAMPLES:
        return None
    traced = steps.at(ts_ns[inside] + shift).astype("float64")
    if traced.var() == 0:
        return None
    return round(1.0 - float((used_bytes[inside].astype("float64") - traced).var()) / float(traced.var()), 4)


def _best(candidates: np.ndarray, score) -> tuple[int, float]:
    scores = np.array([score(int(c)) for c in candidates])
    scores[np.isnan(scores)] = -np.inf
    i = int(np.argmax(scores))
    # Among equal scores (a flat stretch, the sampling interval wide), the one nearest no shift.
    ties = np.flatnonzero(scores == scores[i])
    i = int(ties[np.argmin(np.abs(candidates[ties]))])
    return int(candidates[i]), float(scores[i])
