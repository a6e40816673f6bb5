"""Hot allocation sites: who allocates the most, what they never free, the most they held at once."""

from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd

from ..model import CallSite, Site
from .grouping import Segments

MAX_SITES = 100


def call_site(label: str, site_table: dict[str, dict]) -> CallSite:
    info = site_table.get(label)
    if info is None:
        return CallSite(label=label)
    return CallSite(label=label, function=info["function"], symbol=info["symbol"], module=info["module"],
                    from_stack=bool(info["from_stack"]), source=str(info.get("source") or "api"),
                    file=str(info.get("file") or ""), line=_int_or_none(info.get("line")),
                    context=str(info.get("context") or ""), stack_id=_int_or_none(info.get("stack_id")))


def _int_or_none(value) -> Optional[int]:
    return None if value is None or pd.isna(value) else int(value)


def rank_sites(events: pd.DataFrame, site_table: dict[str, dict], limit: int = MAX_SITES) -> list[Site]:
    """Sites by bytes allocated (largest first), per site, process and memory kind: the ranks of
    a distributed job are not summed."""
    if events.empty:
        return []
    labels, kinds = events["site"].cat.categories, events["kind"].cat.categories
    # One group per (site, process, kind): codes packed into one integer, built in place (each
    # full-length temporary is 80 MB at 1e7 events), groups summed in one pass each.
    site_codes = events["site"].cat.codes.to_numpy()
    no_site_row = site_codes < 0
    group = site_codes.astype("int64")
    pid_code, pids = pd.factorize(events["pid"].to_numpy())
    group *= len(pids)
    group += pid_code
    del pid_code
    group *= len(kinds)
    group += events["kind"].cat.codes.to_numpy()
    groups = len(labels) * len(pids) * len(kinds)
    group[no_site_row] = 0
    del no_site_row
    seg = Segments(group, groups)
    del group  # not needed once the events are sorted into groups, dropped before the sums make their own
    # Each column brought into segment order once, not once per sum.
    is_alloc = seg.in_group_order(events["op"].cat.codes.to_numpy() == 0)
    sizes = seg.in_group_order(events["bytes"].to_numpy())
    never_freed = is_alloc & seg.in_group_order(events["partner"].to_numpy() < 0)
    allocations = seg.count(is_alloc, ordered=True)
    allocated = seg.sum(np.where(is_alloc, sizes, 0), ordered=True)
    max_live = seg.running_sum_max(events["delta_bytes"].to_numpy())
    no_site = np.asarray(labels == "").repeat(len(pids) * len(kinds))
    ranked = np.flatnonzero((allocations > 0) & ~no_site)
    ranked = ranked[np.lexsort((-allocations[ranked], -allocated[ranked]))][:limit]
    open_count, open_bytes = seg.count(never_freed, ordered=True), seg.sum(np.where(never_freed, sizes, 0), ordered=True)
    del sizes, never_freed
    api_codes = events["api"].cat.codes.to_numpy()
    api_names = events["api"].cat.categories
    sites = []
    for g in ranked:  # one per listed site
        start, stop = int(seg.starts[g]), int(seg.starts[g] + seg.sizes[g])
        rows = seg.order[start:stop]
        apis = sorted({str(api_names[a]) for a in np.unique(api_codes[rows[is_alloc[start:stop]]])})
        site_and_pid, kind = divmod(int(g), len(kinds))
        site, pid = divmod(site_and_pid, len(pids))
        sites.append(Site(site=call_site(str(labels[site]), site_table), kind=str(kinds[kind]), apis=apis,
                          allocations=int(allocations[g]), allocated_bytes=int(allocated[g]),
                          never_freed_count=int(open_count[g]), never_freed_bytes=int(open_bytes[g]),
                          max_live_bytes=int(max(max_live[g], 0)), pid=int(pids[pid])))
    return sites
