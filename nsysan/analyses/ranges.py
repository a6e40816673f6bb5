"""Memory per NVTX range name: what each phase allocates, frees, leaves behind, and the high mark.

One reducer (`RangeSums`, nsysan/engine) on both paths: the whole events frame is one batch, an
export too large for it a flow of many. Of each event it reads, besides the batch's own columns,
its innermost user range, that range's path and its innermost operator: the labelled columns
"nvtx_range", "nvtx_path", "operator" of `batch.calls`, named by engine.Labels (the events frame's
categories; on the streamed flow the site sums label each batch before the second look).
"""

from __future__ import annotations

from collections import Counter
from typing import Optional

import numpy as np
import pandas as pd

from ..engine import Reducer
from ..events.nvtx import MAX_NVTX_DEPTH, attribute_ranges, range_paths
from ..model import GPU_RESIDENT_KINDS, RangeFamily, RangeStat
from ..model.memory import range_family
from .capture import FINITE
from .grouping import code_sums
from .groups import batch_series
from .windows import Windows

MAX_RANGES = 200
MOVED = ("allocations", "allocated", "freed", "open")  # per user range name and per operator name
# the labelled columns of an event's ranges (batch.calls), and what names their codes (engine.Labels)
NVTX_COLUMNS = {"nvtx_range": "ranges", "nvtx_path": "paths", "operator": "operators"}


class RangeSums(Reducer):
    """The ranges table (`Analysis.ranges`, with `range_families`: finish answers both). Per range
    name: instances, time, bytes allocated/freed inside (innermost range), still live at the end,
    and the highest live GPU-resident bytes of the process while one was open; per user range
    name, the allocations inside it or a range nested in it.

    PyTorch's operator ranges are rows of their own, one per operator name however many
    instances: an allocation counts in its innermost user range and in its innermost operator.
    Facts.more: "nvtx_ranges" and "operator_ranges" (read_nvtx; none: no table), "end_ns" (the
    capture's end as known before the events; the latest event of a finite time may end it
    later), "labels" (a callable giving the engine.Labels of the batches' labelled columns, once
    the flow is done) and, when sizes were not collected, "range_alloc_calls" (alloc_calls of the calls).
    A second look: on the streamed flow the ranges of a batch's events are known then."""

    field = "ranges"
    needs = ("nvtx_ranges", "operator_ranges", "end_ns", "labels")
    second_look = True

    def start(self, facts) -> None:
        super().start(facts)
        more = facts.more
        self.ranges, self.operators = more.get("nvtx_ranges"), more.get("operator_ranges")
        self.active = self.ranges is not None and not (self.ranges.empty and self.operators.empty)
        if not self.active:
            return
        self.end_ns = int(more.get("end_ns", 0))
        # per code of each labelled column (engine.Labels), the sums (MOVED; per path the first two)
        self.sums = {column: np.zeros((len(MOVED), 0), "int64") for column in NVTX_COLUMNS}
        # allocations not freed yet, with their ranges' codes; those never to be freed leave
        # their bytes in `open` of their ranges at once
        self.unfreed = {c: np.zeros(0, "int64") for c in ("seq", "bytes", "nvtx_range", "operator")}
        # The whole frame ends each range by the capture's end, past every event of a finite time
        # (below FINITE): ranges ending by FINITE hold the same events, and the end need not be
        # known before the events.
        spans = range_spans(self.ranges, self.operators, FINITE - 1)
        self.windows, self.window_ids = Windows(), np.zeros(len(spans), "int64")
        pid = spans["pid"].to_numpy().astype("int64")
        for p in pd.unique(pid).tolist():  # one per process
            mine = np.flatnonzero(pid == p)
            self.window_ids[mine] = self.windows.open(int(p), spans["start_ns"].to_numpy()[mine],
                                                      spans["end_ns"].to_numpy()[mine])
        self.resident = [i for i, kind in enumerate(facts.kinds) if kind in GPU_RESIDENT_KINDS]
        self.live: dict[int, int] = {}  # pid -> its GPU-resident live bytes so far

    def add(self, batch) -> None:
        """Nothing on the first look (the second reads every batch)."""

    def again(self, b) -> None:
        if not self.active or not len(b):
            return
        finite = b.ts[b.ts < FINITE]
        if len(finite):
            self.end_ns = max(self.end_ns, int(finite.max()))
        self._resident(b)
        if "nvtx_path" in b.calls:  # labelled (the full analysis)
            self._moved(b)

    def finish(self, live: dict) -> tuple[list[RangeStat], list[RangeFamily]]:
        """The table and the families; the allocations still unfreed now (the flow's `live`) never were."""
        if not self.active:
            return [], []
        self.windows.finish()
        ids = self.window_ids
        max_live = np.maximum(self.windows.at_start[ids], self.windows.high_after[ids])
        for column in ("nvtx_range", "operator"):
            self._never_freed(column, self.unfreed[column], self.unfreed["bytes"])
        labels = self.facts.more["labels"]()
        moved = [self._frame(c, labels, MOVED) for c in ("nvtx_range", "operator")]
        moved = pd.concat([moved[0], moved[1].drop(index="", errors="ignore")]).groupby(level=0, sort=False).sum() \
            if not self.operators.empty else moved[0]
        nested = nested_sums(self._frame("nvtx_path", labels, MOVED[:2]), self.ranges)
        return ranked_ranges(range_spans(self.ranges, self.operators, self.end_ns), max_live, moved, nested,
                             self.facts.more.get("range_alloc_calls"))

    def _resident(self, b) -> None:
        """Each process's GPU-resident live bytes after each of its events, into the windows of its
        ranges (the value carried in at a range's start, or after an event inside): from the
        batch's per-process series (groups.batch_series, made once for every reducer)."""
        for (p, _), rows, live in batch_series(b, self.resident, per_device=False):  # the few processes
            live = live + self.live.get(p, 0)
            self.live[p] = int(live[-1])
            self.windows.add_series(p, b.ts[rows], live)

    def _moved(self, b) -> None:
        """Per name: allocations and bytes allocated inside (each allocation's ranges), bytes freed
        inside (each free's own); per path, the allocations and their bytes."""
        allocs = b.is_alloc
        frees = b.partner_seq >= 0  # a free of an allocation seen (an allocation's is -1)
        sized = b.bytes.astype("int64", copy=False)
        # once for every column: each row's role (0: an allocation, 1: a free of one, 2: neither)
        # and the bytes it moved
        role = 2 - 2 * allocs.view(np.int8).astype(np.intp) - frees
        moved = np.where(allocs | frees, sized, 0)
        columns = [c for c in NVTX_COLUMNS if c != "operator" or not self.operators.empty]  # else all none
        for column in columns:
            code = b.calls[column]
            groups = int(code.max()) + 1
            table = self._grow(column, groups)[:, :groups]
            sums = _code_sums(code, groups, role, moved, column != "nvtx_path")
            for i, summed in enumerate(sums):
                table[i] += summed
        # the allocations freed in this batch leave it unfreed no more, nor those of earlier ones
        partners = b.partner_seq[frees]
        inside = partners[partners >= b.seq[0]]
        freed_here = np.zeros(len(b), bool)
        # a batch numbers its rows one after another (the whole frame: 0..n-1), so a row is a difference
        freed_here[inside - b.seq[0] if b.seq[-1] - b.seq[0] == len(b) - 1 else np.searchsorted(b.seq, inside)] = True
        kept = ~np.isin(self.unfreed["seq"], partners[partners < b.seq[0]])
        fresh = np.flatnonzero(allocs & ~freed_here)  # not freed in this batch: a few at 1e7 events
        now = {"seq": b.seq[fresh], "bytes": sized[fresh],
               **{c: b.calls[c][fresh].astype("int64") if c in columns else np.zeros(len(fresh), "int64")
                  for c in ("nvtx_range", "operator")}}
        self.unfreed = {c: np.concatenate([self.unfreed[c][kept], now[c]]) for c in self.unfreed}
        closed = b.closed.get("seq", np.zeros(0, "int64"))
        if len(closed):  # never to be freed: still live at the end, for the whole frame
            gone = np.isin(self.unfreed["seq"], closed)
            for column in ("nvtx_range", "operator"):
                self._never_freed(column, self.unfreed[column][gone], self.unfreed["bytes"][gone])
            self.unfreed = {c: values[~gone] for c, values in self.unfreed.items()}

    def _never_freed(self, column: str, codes: np.ndarray, sizes: np.ndarray) -> None:
        """Allocations that will never be freed: their bytes stay live in their ranges."""
        if len(codes):
            np.add.at(self._grow(column, int(codes.max()) + 1)[3], codes, sizes)

    def _grow(self, column: str, size: int) -> np.ndarray:
        """The sums of `column`, for codes up to `size` at least."""
        table = self.sums[column]
        if table.shape[1] < size:
            grown = np.zeros((len(MOVED), size - table.shape[1]), "int64")
            table = self.sums[column] = np.concatenate([table, grown], 1)
        return table

    def _frame(self, column: str, labels, columns: tuple) -> pd.DataFrame:
        """The sums of `column` per name (`labels` name the codes; one row per code seen)."""
        table = self.sums[column]
        names = list(getattr(labels, NVTX_COLUMNS[column]))[:table.shape[1]]
        return pd.DataFrame(table[:len(columns)].T.copy(), columns=list(columns), index=pd.Index(names, dtype=object))


def _code_sums(code: np.ndarray, groups: int, role: np.ndarray, moved: np.ndarray, freed: bool) -> list[np.ndarray]:
    """Per code 0..groups-1 (rows of other codes count nowhere): the allocations, the bytes they
    allocated and (`freed`) the bytes the frees freed, in int64 (grouping.code_sums), from each
    row's `role` (0: an allocation, 1: a free, 2: neither) and the bytes it `moved`: one count
    and one sum over the rows' cells (code, role), not a masked copy of the codes and a sum per
    column of bytes (this reducer's largest cost at 1e7 events)."""
    cell = code.astype(np.intp)
    cell += 1  # a code below 0 (none) into slot 0, dropped
    if len(code) and int(code.min()) < -1:
        np.maximum(cell, 0, out=cell)
    cell *= 3
    cell += role
    counted = np.bincount(cell, minlength=3 * (groups + 1))[3:3 * (groups + 1):3]
    summed = code_sums(cell, moved, 3 * (groups + 1))
    return [counted, summed[3:3 * (groups + 1):3]] + ([summed[4:3 * (groups + 1):3]] if freed else [])


def range_spans(ranges: pd.DataFrame, operators: pd.DataFrame, end_ns: int) -> pd.DataFrame:
    """The user ranges then the operator ranges (column `operator`), each ending by the capture's
    end `end_ns` (a range left open ends there) and no earlier than it starts."""
    spans = pd.concat([ranges.assign(operator=False), operators.assign(operator=True)], ignore_index=True) \
        if not operators.empty else ranges.assign(operator=False)
    spans = spans.assign(end_ns=np.minimum(spans["end_ns"].to_numpy(), max(end_ns, 0)))
    return spans.assign(end_ns=np.maximum(spans["end_ns"], spans["start_ns"]))


def ranked_ranges(spans: pd.DataFrame, max_live: np.ndarray, moved: pd.DataFrame, nested: pd.DataFrame,
                  alloc_calls: Optional[dict[str, int]]) -> tuple[list[RangeStat], list[RangeFamily]]:
    """The rows of the ranges table from the range instances `spans` (range_spans), the highest
    live bytes while each was open, and per name what moved inside (`moved`: MOVED) and inside
    it or a range nested in it (`nested`: nested_sums); a name without events has zeros. With
    them the families (range_families), summed over every name before the rows are capped.

    In plain Python, a few hundred names: pandas' groupby, joins and sorts took 40 ms of the GPT-2
    capture's analysis on the GPU machine (issue 31). Where a name is missing from `moved` or
    `nested`, their columns are floats (as pandas' join made them): the same values come out."""
    # per name, in the order the names first come: its instances, time open, highest live bytes,
    # whether any is an operator's, first start; summed by name code (a dict per instance took 57
    # of ranked_ranges' 110 ms at 1e7 events: 80,000 instances of 5,003 names)
    codes, uniques = pd.factorize(spans["name"])  # no name (NA): no row, as pandas' groupby leaves it out
    code, size = codes[codes >= 0], len(uniques)
    start, end = spans["start_ns"].to_numpy()[codes >= 0], spans["end_ns"].to_numpy()[codes >= 0]
    live = np.asarray(max_live)[codes >= 0]
    first = np.full(size, len(code), "int64")  # each name's first instance
    np.minimum.at(first, code, np.arange(len(code)))
    total_time = np.zeros(size, (end - start).dtype)
    np.add.at(total_time, code, end - start)
    highest, first_start = live[first], start[first]  # (copies: gathered)
    np.maximum.at(highest, code, live)
    np.minimum.at(first_start, code, start)
    operator = np.zeros(size, bool)
    np.logical_or.at(operator, code, spans["operator"].to_numpy()[codes >= 0].astype(bool))
    per_name: dict[str, dict] = {
        name: {"instances": count, "total_time": time, "max_live": high, "operator": is_operator, "first_start": at}
        for name, count, time, high, is_operator, at in zip(
            uniques.tolist(), np.bincount(code, minlength=size).tolist(), total_time.tolist(), highest.tolist(),
            operator.tolist(), first_start.tolist())}  # one per name
    for table in (moved, nested):
        found = dict(zip(table.index.tolist(), table.to_numpy().tolist()))
        as_float = any(name not in found for name in per_name)
        for name, row in per_name.items():
            values = found.get(name)
            for i, column in enumerate(table.columns):
                value = 0 if values is None else values[i]
                row[column] = float(value) if as_float else value
    for row in per_name.values():
        # an operator's bytes are its innermost operator's alone (operators nest in user ranges, not
        # in paths), so its nested counts are its own
        if row["operator"]:
            for own, within in (("allocations", "nested_allocations"), ("allocated", "nested_allocated")):
                row[within] = float(row[own]) if isinstance(row[within], float) else row[own]
    families = range_families(per_name)
    ranked = sorted(per_name.items(), key=lambda item: (item[1]["allocated"], item[1]["max_live"],
                                                        item[1]["instances"]), reverse=True)  # stable
    return [RangeStat(name=str(name), operator=r["operator"], **_summed(r),
                      alloc_calls=None if alloc_calls is None else int(alloc_calls.get(str(name), 0)))
            for name, r in ranked[:MAX_RANGES]], families  # one per range name


def _summed(r: dict) -> dict:
    """What a row of the ranges table and a family say alike, of their sums (ranked_ranges')."""
    return dict(instances=int(r["instances"]), total_time_ns=int(r["total_time"]), allocations=int(r["allocations"]),
                allocated_bytes=int(r["allocated"]), freed_bytes=int(r["freed"]), still_live_bytes=int(r["open"]),
                max_live_bytes=int(max(r["max_live"], 0)), first_start_ns=int(r["first_start"]),
                nested_allocations=int(r["nested_allocations"]), nested_allocated_bytes=int(r["nested_allocated"]))


def range_families(per_name: dict[str, dict]) -> list[RangeFamily]:
    """User ranges whose names differ only in their numbers ("step 0" ... "step 9": "step N"), one
    family per pattern of two names or more, summed over all its names (ranked_ranges' rows, by
    name), in the order they first opened; the MAX_RANGES that allocated most when there are more
    (as the rows)."""
    user = [(str(name), range_family(str(name)), row) for name, row in per_name.items() if not row["operator"]]
    sizes = Counter(family for _, family, _ in user)
    members = sorted(((name, family, row) for name, family, row in user if sizes[family] > 1 and family != name),
                     key=lambda member: member[2]["first_start"])  # stable
    summed: dict[str, dict] = {}
    for name, family, row in members:
        total = summed.get(family)
        if total is None:
            summed[family] = {**row, "first": name, "last": name, "names": 1}
            continue
        total["last"] = name
        total["names"] += 1
        for column in ("instances", "total_time", "allocations", "allocated", "freed", "open",
                       "nested_allocations", "nested_allocated"):
            total[column] += row[column]
        total["max_live"] = max(total["max_live"], row["max_live"])
        total["first_start"] = min(total["first_start"], row["first_start"])
    ranked = sorted(summed.items(), key=lambda item: (item[1]["nested_allocated"], item[1]["max_live"],
                                                      item[1]["instances"]), reverse=True)[:MAX_RANGES]
    return [RangeFamily(name=str(name), first=r["first"], last=r["last"], names=r["names"], **_summed(r))
            for name, r in sorted(ranked, key=lambda item: item[1]["first_start"])]  # one per family


def nested_sums(by_path: pd.DataFrame, ranges: pd.DataFrame) -> pd.DataFrame:
    """Per user range name, the allocations and bytes allocated inside it or a range nested in it:
    `by_path` (allocations, allocated per NVTX path, the ranges open at each event, outermost
    first) added to every name on the path, once per path even where a name repeats on it."""
    names = path_names(ranges)
    totals: dict[str, list[int]] = {}
    for path, allocations, allocated in zip(by_path.index, by_path["allocations"].to_numpy(),
                                            by_path["allocated"].to_numpy()):
        for name in names.get(str(path), ()):
            total = totals.setdefault(name, [0, 0])
            total[0] += int(allocations)
            total[1] += int(allocated)
    return pd.DataFrame([[a, b] for a, b in totals.values()], index=pd.Index(list(totals), dtype=object),
                        columns=["nested_allocations", "nested_allocated"], dtype="int64")


def path_names(ranges: pd.DataFrame) -> dict[str, frozenset]:
    """The names on each NVTX path (events.nvtx.range_paths' strings) from the ranges' parents, not
    by splitting the path (a name may hold " > ")."""
    paths = range_paths(ranges)
    parent, names = ranges["parent"].to_numpy(), ranges["name"].to_numpy(dtype=object)
    depth = ranges["depth"].to_numpy()
    found: dict[str, frozenset] = {}
    for row in pd.Series(np.arange(len(paths))).groupby(paths, sort=False).first().tolist():  # one per path
        chain, at = set(), int(row)
        # as deep as range_paths went: past MAX_NVTX_DEPTH a path is the range's name alone
        for _ in range(MAX_NVTX_DEPTH if depth[row] <= MAX_NVTX_DEPTH else 1):
            if at < 0:
                break
            chain.add(str(names[at]))
            at = int(parent[at])
        found[str(paths[row])] = frozenset(chain)
    return found


def alloc_calls(calls: pd.DataFrame, ranges: pd.DataFrame) -> dict[str, int]:
    """Allocation calls per innermost range name (only read when sizes were not collected: the
    calls are then all there is to count)."""
    allocs = calls[(calls["family"] == "alloc").to_numpy()]
    names, _ = attribute_ranges(allocs, ranges)
    counts = pd.Series(np.asarray(names)).value_counts()
    return {str(name): int(count) for name, count in counts.items()}  # one per range name
