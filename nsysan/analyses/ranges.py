"""Memory per NVTX range name: what each phase allocates, frees, leaves behind, and the high mark."""

from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd

from ..events.nvtx import MAX_NVTX_DEPTH, attribute_ranges, range_paths
from ..model import GPU_RESIDENT_KINDS, RangeFamily, RangeStat
from ..model.memory import range_family
from .grouping import Segments
from .timeline import Groups, group_events

MAX_RANGES = 200


def range_stats(events: pd.DataFrame, ranges: pd.DataFrame, end_ns: int,
                operator_ranges: Optional[pd.DataFrame] = None, limit: int = MAX_RANGES,
                calls: Optional[pd.DataFrame] = None, sizes_known: bool = True,
                grouped: Optional[Groups] = None) -> tuple[list[RangeStat], list[RangeFamily]]:
    """Per range name: instances, time, bytes allocated/freed inside (innermost range), still live
    at the end, and the highest live GPU-resident bytes of the process while one was open.
    Without sizes (`sizes_known` False), the allocation calls made inside each are counted from `calls`.

    PyTorch's operator ranges are rows of their own, one per operator name however many
    instances: an allocation counts in its innermost user range and in its innermost operator.
    `grouped`: the events' (process, device, kind) groups (timeline.group_events), found when None.
    With the rows, the families of user ranges that differ only in their numbers (ranked_ranges).
    """
    operators = operator_ranges if operator_ranges is not None else ranges.iloc[:0]
    if ranges.empty and operators.empty:
        return [], []
    spans = range_spans(ranges, operators, end_ns)
    max_live = _max_live_while_open(events, spans, grouped if grouped is not None else group_events(events))
    moved = nested = None
    if not events.empty:
        moved = _moved_inside(events, "nvtx_range")
        nested = nested_sums(_moved_inside(events, "nvtx_path"), ranges)
        if not operators.empty and "operator" in events:
            moved = pd.concat([moved, _moved_inside(events, "operator").drop(index="", errors="ignore")])
            moved = moved.groupby(level=0, sort=False).sum()
    alloc_calls = _alloc_calls(calls, ranges) if not sizes_known and calls is not None else None
    return ranked_ranges(spans, max_live, moved, alloc_calls, limit, nested)


def range_spans(ranges: pd.DataFrame, operators: pd.DataFrame, end_ns: int) -> pd.DataFrame:
    """The user ranges then the operator ranges (column `operator`), each ending by the capture's
    end `end_ns` (a range left open ends there) and no earlier than it starts."""
    spans = pd.concat([ranges.assign(operator=False), operators.assign(operator=True)], ignore_index=True) \
        if not operators.empty else ranges.assign(operator=False)
    spans = spans.assign(end_ns=np.minimum(spans["end_ns"].to_numpy(), max(end_ns, 0)))
    return spans.assign(end_ns=np.maximum(spans["end_ns"], spans["start_ns"]))


def ranked_ranges(spans: pd.DataFrame, max_live: np.ndarray, moved: Optional[pd.DataFrame],
                  alloc_calls: Optional[dict[str, int]], limit: int = MAX_RANGES,
                  nested: Optional[pd.DataFrame] = None) -> tuple[list[RangeStat], list[RangeFamily]]:
    """The rows of range_stats from the range instances `spans` (range_spans), the highest live
    bytes while each was open, and per name (`moved`, _moved_inside's columns; None without
    events) what moved inside, and (`nested`, nested_sums) inside it or a range nested in it.
    With them the families (range_families), summed over every name before the rows are capped."""
    spans = spans.assign(max_live=max_live)
    per_name = spans.groupby("name", sort=False).agg(
        instances=("name", "size"), total_time=("end_ns", "sum"), started=("start_ns", "sum"),
        max_live=("max_live", "max"), operator=("operator", "max"), first_start=("start_ns", "min"))
    per_name["total_time"] -= per_name["started"]
    if moved is not None:
        per_name = per_name.join(moved, how="left")
    if nested is not None:
        per_name = per_name.join(nested, how="left")
    for column in ("allocations", "allocated", "freed", "open", "nested_allocations", "nested_allocated"):
        if column not in per_name:
            per_name[column] = 0
    per_name = per_name.fillna(0)
    # an operator's bytes are its innermost operator's alone (operators nest in user ranges, not
    # in paths), so its nested counts are its own
    operator = per_name["operator"].to_numpy(bool)
    for own, within in (("allocations", "nested_allocations"), ("allocated", "nested_allocated")):
        per_name.loc[operator, within] = per_name.loc[operator, own]
    families = range_families(per_name, limit)
    per_name = per_name.sort_values(["allocated", "max_live", "instances"], ascending=False, kind="stable").head(limit)
    return [RangeStat(name=str(name), instances=int(r.instances), total_time_ns=int(r.total_time),
                      allocations=int(r.allocations), allocated_bytes=int(r.allocated), freed_bytes=int(r.freed),
                      still_live_bytes=int(r.open), max_live_bytes=int(max(r.max_live, 0)), operator=bool(r.operator),
                      first_start_ns=int(r.first_start),
                      alloc_calls=None if alloc_calls is None else int(alloc_calls.get(str(name), 0)),
                      nested_allocations=int(r.nested_allocations), nested_allocated_bytes=int(r.nested_allocated))
            for name, r in zip(per_name.index, per_name.itertuples())], families  # one per range name


def range_families(per_name: pd.DataFrame, limit: int = MAX_RANGES) -> list[RangeFamily]:
    """User ranges whose names differ only in their numbers ("step 0" ... "step 9": "step N"), one
    family per pattern of two names or more, summed over all its names (ranked_ranges' columns),
    in the order they first opened; the `limit` that allocated most when there are more (as the rows)."""
    user = per_name[~per_name["operator"].to_numpy(bool)]
    if user.empty:
        return []
    family = pd.Series([range_family(str(name)) for name in user.index], index=user.index)
    user = user.assign(family=family.to_numpy(), name=user.index.astype(str))
    sizes = user.groupby("family", sort=False)["name"].transform("size").to_numpy()
    user = user[(sizes > 1) & (user["family"] != user["name"]).to_numpy()].sort_values("first_start", kind="stable")
    if user.empty:
        return []
    summed = user.groupby("family", sort=False).agg(
        first=("name", "first"), last=("name", "last"), names=("name", "size"), instances=("instances", "sum"),
        total_time=("total_time", "sum"), allocations=("allocations", "sum"), allocated=("allocated", "sum"),
        freed=("freed", "sum"), open=("open", "sum"), max_live=("max_live", "max"),
        nested_allocations=("nested_allocations", "sum"), nested_allocated=("nested_allocated", "sum"),
        first_start=("first_start", "min"))
    summed = summed.sort_values(["nested_allocated", "max_live", "instances"], ascending=False, kind="stable") \
        .head(limit).sort_values("first_start", kind="stable")
    return [RangeFamily(name=str(name), first=str(r.first), last=str(r.last), names=int(r.names),
                        instances=int(r.instances), total_time_ns=int(r.total_time), allocations=int(r.allocations),
                        allocated_bytes=int(r.allocated), freed_bytes=int(r.freed), still_live_bytes=int(r.open),
                        max_live_bytes=int(max(r.max_live, 0)), nested_allocations=int(r.nested_allocations),
                        nested_allocated_bytes=int(r.nested_allocated), first_start_ns=int(r.first_start))
            for name, r in zip(summed.index, summed.itertuples())]  # one per family


def nested_sums(by_path: pd.DataFrame, ranges: pd.DataFrame) -> pd.DataFrame:
    """Per user range name, the allocations and bytes allocated inside it or a range nested in it:
    `by_path` (_moved_inside's columns per NVTX path, the ranges open at each event, outermost
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
    if ranges.empty:
        return {}
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


def _alloc_calls(calls: pd.DataFrame, ranges: pd.DataFrame) -> dict[str, int]:
    """Allocation calls per innermost range name (only read when sizes were not collected: the
    calls are then all there is to count)."""
    allocs = calls[(calls["family"] == "alloc").to_numpy()]
    if allocs.empty:
        return {}
    names, _ = attribute_ranges(allocs, ranges)
    counts = pd.Series(np.asarray(names)).value_counts()
    return {str(name): int(count) for name, count in counts.items()}  # one per range name


def _moved_inside(events: pd.DataFrame, column: str) -> pd.DataFrame:
    """Per name of an event column: allocations, bytes allocated, freed, and left allocated."""
    names = events[column].cat.categories
    seg = Segments(events[column].cat.codes.to_numpy().astype("int64"), len(names))
    # Each column brought into segment order once, not once per sum.
    is_alloc = seg.in_group_order(events["op"].cat.codes.to_numpy() == 0)
    matched = seg.in_group_order(events["partner"].to_numpy() >= 0)
    sizes = seg.in_group_order(events["bytes"].to_numpy())
    return pd.DataFrame({"allocations": seg.count(is_alloc, ordered=True),
                         "allocated": seg.sum(np.where(is_alloc, sizes, 0), ordered=True),
                         "freed": seg.sum(np.where(~is_alloc & matched, sizes, 0), ordered=True),
                         "open": seg.sum(np.where(is_alloc & ~matched, sizes, 0), ordered=True)},
                        index=pd.Index(names, dtype=object))


def _max_live_while_open(events: pd.DataFrame, spans: pd.DataFrame, grouped: Groups) -> np.ndarray:
    """For each range instance, the most GPU-resident bytes its process held while it was open."""
    result = np.zeros(len(spans), "int64")
    span_pid = spans["pid"].to_numpy()
    for pid in np.unique(span_pid):  # one per process
        mine = np.flatnonzero(span_pid == pid)
        theirs = grouped.rows(GPU_RESIDENT_KINDS, int(pid))
        if len(theirs) == 0:
            continue
        ts = events["ts_ns"].to_numpy()[theirs]
        # A sentinel 0 at the front is "live before the first event"; the sentinel at the end
        # keeps every reduceat index in range.
        values = np.concatenate([[0], np.cumsum(events["delta_bytes"].to_numpy()[theirs]), [0]])
        start = np.searchsorted(ts, spans["start_ns"].to_numpy()[mine], side="right")  # value at start
        stop = np.searchsorted(ts, spans["end_ns"].to_numpy()[mine], side="right") + 1
        bounds = np.empty(2 * len(mine), "int64")
        bounds[0::2], bounds[1::2] = start, np.maximum(stop, start + 1)
        result[mine] = np.maximum.reduceat(values, bounds)[0::2]
    return result
