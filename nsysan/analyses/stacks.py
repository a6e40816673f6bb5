"""The call stacks an analysis keeps: exactly those its `stack_id`s refer to."""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

import numpy as np
import pandas as pd

from ..events.arrays import category_codes, distinct_rows
from ..model import Analysis, Stack, StackBytes

# Leaves of a flame graph: a Python capture's peak holds a few dozen stacks; a cap keeps a capture
# with thousands (every line of a model's build) to a page of this many, the rest shown as "other".
MAX_STACK_BYTES = 500


def referenced_stacks(stacks: list[Stack], analysis: Analysis) -> list[Stack]:
    """The stacks that any `stack_id` in `analysis` points to (a site's, an allocation's, wherever
    it is listed: sites, never-freed rows and groups, live at a peak or at an out-of-memory
    failure, the timeline's largest allocations), in id order, each once. Walking the whole model
    rather than naming its lists keeps the document consistent when a section is added."""
    if not stacks:  # a capture without call stacks (most): nothing to walk for
        return []
    wanted = set(_stack_ids(analysis))
    return [stack for stack in stacks if stack.id in wanted]


def _stack_ids(value: Any) -> Iterator[int]:
    if dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            if f.metadata.get("raw"):  # the events frames: not part of the document
                continue
            item = getattr(value, f.name)
            if f.name == "stack_id":
                if item is not None:
                    yield item
            else:
                yield from _stack_ids(item)
    elif isinstance(value, (list, tuple)):
        # Lists of numbers (a series' times and bytes) hold no stack: skip them whole.
        if value and (dataclasses.is_dataclass(value[0]) or isinstance(value[0], (list, tuple))):
            for item in value:
                yield from _stack_ids(item)


def stack_bytes(events: pd.DataFrame, rows: np.ndarray, limit: int = MAX_STACK_BYTES) -> list[StackBytes]:
    """Alloc events `rows` summed by process, device, kind, call stack and site: bytes, count and
    the oldest one's allocation time, largest first (ties in the order of their labels, so that the
    whole-frame and the streamed analyses, whose category codes differ, list them alike); at most
    `limit`."""
    kinds, sites = events["kind"].cat.categories, events["site"].cat.categories
    columns = [events["pid"].to_numpy()[rows], events["device"].to_numpy()[rows],
               category_codes(events["kind"])[rows], category_codes(events["site"])[rows],
               events["stack"].to_numpy()[rows]]
    group, firsts = distinct_rows(*columns)
    total = np.zeros(len(firsts), "int64")
    np.add.at(total, group, events["bytes"].to_numpy()[rows].astype("int64"))
    count = np.bincount(group, minlength=len(firsts))
    oldest = np.full(len(firsts), np.iinfo("int64").max)
    np.minimum.at(oldest, group, events["ts_ns"].to_numpy()[rows].astype("int64"))
    found = [StackBytes(pid=int(pid), device=int(device), kind=str(kinds[kind]),
                        site=str(sites[site]) if site >= 0 else "", stack_id=int(stack) if stack >= 0 else None,
                        bytes=int(total[g]), count=int(count[g]), first_alloc_ns=int(oldest[g]))
             for g, (pid, device, kind, site, stack) in enumerate(zip(*(c[firsts].tolist() for c in columns)))]
    found.sort(key=lambda s: (-s.bytes, s.pid, s.device, s.kind, s.site, -1 if s.stack_id is None else s.stack_id))
    return found[:limit]
