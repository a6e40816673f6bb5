"""Steps without NVTX: the iterations of a loop, found from the sequence of kernels it launches.

A training or evaluation step launches the same kernels in the same order every time, so a
process's launch sequence (events/read_launches.py: each kernel launch named by its kernel, each
copy and synchronization by its API) repeats with the step's length as its period. The rule
(docs/analyses.md, "Steps without NVTX"):

- Period (on the middle SCORED launches of a longer sequence): the candidates are the distances between consecutive launches of the same kernel that
  occur most often; each is scored by the longest stretch of the sequence that repeats with it
  (no more than 2% of a window of one period differs from the period before), and the one that
  covers the most wins, the shorter at equal cover (twice a period repeats too). It must repeat
  at least MIN_STEPS times.
- Where a step begins: after the optimizer's kernels (PyTorch's `multi_tensor_apply`, Adam, SGD
  ...), else after the synchronization (a loss read back to the host) followed by the longest
  idle time of the host, else before the longest idle time; skipping the copies and
  synchronizations that end the step. The launches from there on that begin the same way
  (MIN_SIGNATURE launches, or until the beginning is unique within a period: the beginning most
  steps of the repeating stretch have) start the steps, in the warm-up as well. A step that
  begins otherwise (its threads' launches swapped) is found by the launches just after its
  beginning, by a gap of a whole number of periods (within a tenth of one) split evenly, or,
  before the first and after the last, by a period of launches NEAR_SAME the repeating sequence.
- A step runs from the end of the call before its first launch to the start of the next step
  (the first no earlier than twice the later steps' lead-in, or a tenth of a step, before its
  first launch: setup may come before it); the last ends with its period's last launch, or is open if the trace stops before that.
- Confidence: high when at least 80% of the steps are the same sequence exactly (and at least
  MIN_STEPS are), medium from half, low below.

Everything is numpy over integer codes: a million launches take well under a second.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pandas as pd

from ..events.columns import empty_ranges
from ..events.read_launches import KERNEL, SYNC
from .iteration_phases import iteration_phases

MIN_STEPS = 3
CANDIDATES = 24  # periods scored, the most frequent distances
MISMATCH = 50  # a window of one period repeats when at most 1/MISMATCH of it differs
MIN_SIGNATURE = 8  # launches a step's beginning must match, at least (or the whole period)
NEAR_SAME = 0.9  # a stretch one period long is a step when this share of it is the repeating sequence
MAX_SIGNATURE = 256  # and at most: each launch of the signature is one pass over the sequence
OPTIMIZER = re.compile(r"multi_tensor_apply|adam|sgd|lamb|adagrad|rmsprop|optimizer", re.I)
OPEN = np.iinfo("int64").max // 2  # the end of a step the trace stops in (read.py's open end)
SCORED = 1 << 18  # launches the periods are scored on, at most: the middle of a longer sequence


@dataclass(frozen=True)
class Iterations:
    """The steps of one process found from its launch sequence."""

    spans: pd.DataFrame  # start_ns, end_ns, name ("iteration 3"), in time order
    kernels: int  # kernel launches in one step (the repeating sequence's)
    same: int  # steps that are the repeating sequence exactly
    confidence: str  # high | medium | low
    how: str  # the sentence that says how they were found
    phases: pd.DataFrame = dataclasses.field(default_factory=empty_ranges)  # iteration_phases' ranges


def iteration_pids(threads: np.ndarray, found: dict, also: tuple[int, ...] = ()) -> list[int]:
    """The processes with memory calls (`threads`: steps.memory_threads keys), or with blocks live
    when a late capture began (`also`: their steps may call nothing), whose NVTX ranges give no
    steps (`found`: find_step_ranges' result): those whose launches are read."""
    return sorted((set((threads >> 24).tolist()) | set(also)) - set(found))


def find_iterations(launches: pd.DataFrame, names: dict[int, str], pids: list[int]) -> dict[int, Iterations]:
    """Per process among `pids`, its steps as found from its launch sequence, when it repeats."""
    found = {}
    pid_column = launches["pid"].to_numpy()
    for pid in pids:  # a few processes
        mine = launches[pid_column == pid]
        if len(mine) < 2 * MIN_STEPS:
            continue
        codes = pd.factorize(mine["token"])[0].astype("int64")
        optimizer = np.array([bool(OPTIMIZER.search(names.get(t, ""))) for t in pd.unique(mine["token"])])[codes]
        got = _iterations(codes, mine["ts_ns"].to_numpy(), mine["end_ns"].to_numpy(), mine["kind"].to_numpy(),
                          optimizer)
        if got is not None:
            found[int(pid)] = dataclasses.replace(got, phases=iteration_phases(
                int(pid), got.spans, mine, optimizer & (mine["kind"].to_numpy() == KERNEL)))
    return found


def _iterations(codes: np.ndarray, starts: np.ndarray, ends: np.ndarray, kind: np.ndarray,
                optimizer: np.ndarray) -> Optional[Iterations]:
    period, region = _period(codes)
    if period is None:
        return None
    first = _first_launch(codes, starts, ends, kind, optimizer, period, region)
    starts_at = _step_starts(codes, first, period, region)
    if len(starts_at) < MIN_STEPS:
        return None
    n = len(codes)
    sequences = _sequences(codes, starts_at, period)
    # the repeating sequence is the most common one
    reference = max(set(sequences) - {b""}, key=sequences.count, default=b"")
    starts_at = _extended(codes, starts_at, period, np.frombuffer(reference, codes.dtype))
    sequences = _sequences(codes, starts_at, period)
    same = np.array([sequence == reference for sequence in sequences])
    last_closed = starts_at[-1] + period <= n
    begin = np.where(starts_at > 0, ends[np.maximum(starts_at - 1, 0)], starts[starts_at])
    begin = np.minimum(begin, starts[starts_at])
    # The first step may follow a long setup: it begins no earlier than its own lead-in would
    # take (twice the later steps' idle time before their first launch, or a tenth of a step).
    lead = starts[starts_at[1:]] - begin[1:]
    lead_in = max(2 * float(np.median(lead)), 0.1 * float(np.median(np.diff(begin))))
    begin[0] = max(begin[0], starts[starts_at[0]] - int(lead_in))
    finish = np.append(begin[1:], ends[starts_at[-1] + period - 1] if last_closed else OPEN)
    spans = pd.DataFrame({"start_ns": begin, "end_ns": np.maximum(finish, begin),
                          "name": [f"iteration {i}" for i in range(len(starts_at))]})
    count, exact = len(starts_at), int(same.sum())
    confidence = ("high" if exact >= MIN_STEPS and exact >= 0.8 * count else
                  "medium" if exact >= MIN_STEPS and exact >= 0.5 * count else "low")
    kernels = int((kind[first:first + period] == KERNEL).sum())  # the same in every step of the period
    how = (f"steps found from the kernel sequence: {count:,} iterations of {kernels:,} kernels"
           f", the same in {exact:,} of {count:,} (confidence {confidence})")
    return Iterations(spans=spans, kernels=kernels, same=exact, confidence=confidence, how=how)


def _sequences(codes: np.ndarray, starts_at: np.ndarray, period: int) -> list[bytes]:
    """Each step's first `period` codes as bytes (b"" for a step shorter than that)."""
    sizes = np.diff(np.append(starts_at, len(codes)))
    return [codes[s:s + period].tobytes() if size >= period else b""
            for s, size in zip(starts_at.tolist(), sizes.tolist())]  # one per step


def _extended(codes: np.ndarray, starts_at: np.ndarray, period: int, reference: np.ndarray) -> np.ndarray:
    """The steps, with those before the first and after the last whose beginning differed (so
    that no signature found them) but whose launches are the repeating sequence's, at least
    NEAR_SAME of them in place."""
    if len(reference) != period:
        return starts_at
    found = starts_at.tolist()
    while found[0] - period >= 0 and np.mean(codes[found[0] - period:found[0]] == reference) >= NEAR_SAME:
        found.insert(0, found[0] - period)
    while found[-1] + 2 * period <= len(codes) and \
            np.mean(codes[found[-1] + period:found[-1] + 2 * period] == reference) >= NEAR_SAME:
        found.append(found[-1] + period)
    return np.array(found, "int64")


def _period(codes: np.ndarray) -> tuple[Optional[int], tuple[int, int]]:
    """The period that covers the longest stretch of the sequence, and that stretch [a, b); on
    the middle SCORED launches of a longer one (a million launches would take a second, and the
    steps' beginnings are then looked for in the whole sequence)."""
    offset = max(0, (len(codes) - SCORED) // 2)
    codes = codes[offset:offset + SCORED]
    n = len(codes)
    best: tuple[int, int, tuple[int, int]] = (0, 0, (0, 0))  # (cover, -period, region)
    for p in _candidates(codes):
        differs = codes[:-p] != codes[p:]  # position i against i + p
        if len(differs) < p:
            continue
        summed = np.concatenate([[0], np.cumsum(differs)])
        good = summed[p:] - summed[:-p] <= p // MISMATCH  # windows [i, i + p) of comparisons
        run_start, run_end = longest_run(good)
        if run_end <= run_start:
            continue
        region = (run_start, min(n, run_end - 1 + 2 * p))  # tokens the good windows cover
        cover = region[1] - region[0]
        if cover >= MIN_STEPS * p and (cover, -p) > best[:2]:
            best = (cover, -p, region)
    return (-best[1], (best[2][0] + offset, best[2][1] + offset)) if best[0] else (None, (0, 0))


def _candidates(codes: np.ndarray) -> list[int]:
    """The most frequent distances between consecutive occurrences of one token."""
    n = len(codes)
    order = np.argsort(codes, kind="stable")
    same = codes[order][1:] == codes[order][:-1]
    gaps = (order[1:] - order[:-1])[same]
    gaps = gaps[gaps * MIN_STEPS <= n]
    if not len(gaps):
        return []
    values, counts = np.unique(gaps, return_counts=True)
    frequent = counts >= MIN_STEPS - 1
    values, counts = values[frequent], counts[frequent]
    return values[np.argsort(-counts, kind="stable")[:CANDIDATES]].tolist()


def longest_run(flags: np.ndarray) -> tuple[int, int]:
    """[start, end) of the first longest run of true flags ((0, 0): none)."""
    edges = np.diff(np.concatenate([[0], flags.astype("int8"), [0]]))
    begins, stops = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    if not len(begins):
        return 0, 0
    longest = int(np.argmax(stops - begins))
    return int(begins[longest]), int(stops[longest])


def _first_launch(codes: np.ndarray, starts: np.ndarray, ends: np.ndarray, kind: np.ndarray, optimizer: np.ndarray,
                  period: int, region: tuple[int, int]) -> int:
    """Index, inside the repeating region, of a step's first launch (see the module's rule)."""
    a = region[0]
    steps = (region[1] - a) // period
    cycle = np.arange(a, a + period)
    idle = np.zeros(len(codes))
    idle[1:] = starts[1:] - np.maximum.accumulate(ends)[:-1]  # host time no launch was under way
    typical = np.median(idle[a:a + steps * period].reshape(steps, period), axis=0)
    launches = np.flatnonzero(kind[cycle] == KERNEL)
    if not len(launches):
        return a
    marks = np.flatnonzero(optimizer[cycle] & (kind[cycle] == KERNEL))
    if len(marks):  # after the last of the optimizer's launches (its cluster's end, going round)
        gaps = np.diff(np.append(marks, marks[0] + period))
        after = [int(marks[int(np.argmax(gaps))])]
    else:
        after = np.flatnonzero(kind[cycle] == SYNC).tolist()
    if after:
        # the next kernel launch after each mark, going round the period
        nexts = [int(launches[np.searchsorted(launches, m, side="right") % len(launches)]) for m in after]
        choice = max(nexts, key=lambda j: typical[j])
    else:
        choice = int(launches[np.argmax(typical[launches])])
    return a + choice


def _step_starts(codes: np.ndarray, first: int, period: int, region: tuple[int, int]) -> np.ndarray:
    """Where the steps start: the launches that begin as most steps of the repeating region do at
    `first` and whole periods from it (one step's beginning may differ: two threads' launches
    swapped)."""
    n = len(codes)
    length = min(period, MIN_SIGNATURE)
    same_place = np.arange(first - (first - region[0]) // period * period, region[1], period)
    while True:
        hashed = _window_hash(codes, length)
        hits = _signature_hits(hashed, same_place, 0)
        if length >= min(period, MAX_SIGNATURE) or _unique(hits, period, region, length):
            break
        length = min(period, MAX_SIGNATURE, length * 2)
    # the launches just after the beginning find a step whose first launches were swapped, when
    # they too begin each step once
    for shift in (length // 2, length) if length < period else ():
        later = _signature_hits(hashed, same_place, shift)
        if _unique(later, period, region, length):
            hits = np.union1d(hits, later)
    kept: list[int] = []
    for hit in hits.tolist():  # one per step, a few thousand
        if not kept or hit - kept[-1] >= max(1, period // 2):
            # a step whose beginning differs (two threads' launches swapped) leaves a gap of a
            # whole number of periods: it is split there evenly
            gap = hit - kept[-1] if kept else 0
            whole = int(round(gap / period))
            if whole >= 2 and abs(gap - whole * period) <= period // 10:
                kept += [kept[-1] + round(gap * j / whole) for j in range(1, whole)]
            kept.append(hit)
    return np.array([h for h in kept if h < n], "int64")


def _signature_hits(hashed: np.ndarray, same_place: np.ndarray, shift: int) -> np.ndarray:
    """Where the window `shift` launches after a step's beginning is the one most steps of the
    repeating region have there (`hashed`: _window_hash; `same_place`: those steps' beginnings),
    as the steps' beginnings."""
    places = same_place[same_place + shift < len(hashed)] + shift
    values, counts = np.unique(hashed[places], return_counts=True)
    found = np.flatnonzero(hashed == values[np.argmax(counts)]) - shift
    return found[found >= 0]


def _unique(hits: np.ndarray, period: int, region: tuple[int, int], length: int) -> bool:
    """Whether the hits inside the repeating region lie whole periods apart (once per step;
    one may be missing)."""
    inside = hits[(hits >= region[0]) & (hits + length <= region[1])]
    return bool(len(inside)) and bool(np.all(np.diff(inside) % period == 0))


def _window_hash(codes: np.ndarray, length: int) -> np.ndarray:
    """A hash of each window of `length` codes (wrapping uint64 arithmetic)."""
    count = len(codes) - length + 1
    if count <= 0:
        return np.zeros(0, "uint64")
    hashed = np.zeros(count, "uint64")
    with np.errstate(over="ignore"):
        for t in range(length):  # at most a period: a few thousand passes for the longest steps
            hashed = hashed * np.uint64(1000003) + codes[t:count + t].astype("uint64") + np.uint64(1)
    return hashed
