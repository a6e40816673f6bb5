"""Hot allocation sites: who allocates the most, what they never free, the most they held at once."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..model import CallSite, Site

MAX_SITES = 100


def call_site(label: str, site_table: dict[str, dict]) -> CallSite:
    info = site_table.get(label)
    if info is None:
        return CallSite(label=label)
    return CallSite(label=label, function=info["function"], symbol=info["symbol"], module=info["module"],
                    from_stack=bool(info["from_stack"]))


def rank_sites(events: pd.DataFrame, site_table: dict[str, dict], limit: int = MAX_SITES) -> list[Site]:
    """Sites by bytes allocated (largest first), per site and memory kind."""
    if events.empty:
        return []
    key = ["site", "kind"]
    frame = pd.DataFrame({"site": events["site"].astype(str).to_numpy(), "kind": events["kind"].astype(str).to_numpy(),
                          "api": events["api"].astype(str).to_numpy(), "delta": events["delta_bytes"].to_numpy(),
                          "is_alloc": (events["op"] == "alloc").to_numpy(), "bytes": events["bytes"].to_numpy(),
                          "open": ((events["op"] == "alloc") & (events["partner"] < 0)).to_numpy()})
    frame = frame[frame["site"] != ""]
    frame["live"] = frame.groupby(key, sort=False)["delta"].cumsum()
    frame["alloc_bytes"] = np.where(frame["is_alloc"], frame["bytes"], 0)
    frame["open_bytes"] = np.where(frame["open"], frame["bytes"], 0)
    totals = frame.groupby(key, sort=False).agg(
        allocations=("is_alloc", "sum"), allocated_bytes=("alloc_bytes", "sum"), never_freed_count=("open", "sum"),
        never_freed_bytes=("open_bytes", "sum"), max_live_bytes=("live", "max"))
    totals = totals[totals["allocations"] > 0]
    apis = frame[frame["is_alloc"]].groupby(key, sort=False)["api"].unique()
    totals = totals.sort_values(["allocated_bytes", "allocations"], ascending=False, kind="stable").head(limit)
    return [
        Site(site=call_site(label, site_table), kind=kind, apis=sorted(str(a) for a in apis.loc[(label, kind)]),
             allocations=int(r.allocations), allocated_bytes=int(r.allocated_bytes),
             never_freed_count=int(r.never_freed_count), never_freed_bytes=int(r.never_freed_bytes),
             max_live_bytes=int(max(r.max_live_bytes, 0)))
        for (label, kind), r in zip(totals.index, totals.itertuples())  # one per site
    ]
