"""Hot allocation sites: who allocates the most, what they never free, the most they held at once."""

from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd

from ..engine import Reducer
from ..events.arrays import LOW, group_order
from .grouping import Keyed, code_sums
from ..model import CallSite, Site

MAX_SITES = 100
# per (site, process, kind): its allocations, their bytes, the frees paired with them and their
# bytes, the live bytes after the last event so far and the most at once
SITE_SUMS = ("allocations", "allocated", "freed", "freed_bytes", "live", "max_live")


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


class SiteRanks(Reducer):
    """The sites table (`Analysis.sites`): sites by bytes allocated (largest first), per site,
    process and memory kind (the ranks of a distributed job are not summed), with how many of
    their allocations were never freed and the most they held at once.

    One reducer on both paths: of each event it reads its site, the labelled column "site" of
    `batch.calls` (a free's is its allocation's), and its API ("api"), named by engine.Labels
    (the events frame's categories; on the streamed flow the site sums label each batch before
    the second look). An allocation never freed is one no free of the flow pairs with
    (`partner_seq`), so the never-freed sums are the allocations' less the paired frees' and
    need no live set. Facts.more: "labels" and "site_table" (callables giving the
    engine.Labels and the site table, label -> its SITE_COLUMNS, once the flow is done)."""

    field = "sites"
    needs = ("labels", "site_table")
    second_look = True

    def start(self, facts) -> None:
        super().start(facts)
        # per (site, process, kind) group, in order of first appearance: keys site << 32 | pid << 8 | kind
        self.groups = Keyed(SITE_SUMS, {"max_live": LOW})
        self.pids = np.zeros(0, "int64")  # in order of first appearance (ties rank by it)
        self.apis = np.zeros(0, "int64")  # group << 20 | API code, of each group's allocations

    def add(self, batch) -> None:
        """Nothing on the first look (the streamed flow's sites are known on the second)."""

    def again(self, b) -> None:
        if not len(b):
            return
        pid_code, pids = pd.factorize(b.pid)
        self.pids = pd.unique(np.concatenate([self.pids, pids]))
        site = b.calls["site"]
        has = site >= 0  # streamed: a free whose allocation the flow never saw has none
        rows = slice(None) if has.all() else np.flatnonzero(has)  # the whole frame: every row
        if not has.any():
            return
        # each row's (site, process, kind) as a dense code of this batch; the sums of every code
        # are made in row order into tables small enough to stay in cache, and only the running
        # live bytes read the rows in group order (at 1e7 events, gathering each column in group
        # order took most of this reducer's second); only the groups present are looked up among
        # all so far
        kinds = len(self.facts.kinds)
        local = site[rows].astype("int64") * len(pids) + pid_code[rows]
        local *= kinds
        local += b.kind[rows]
        codes = (int(site[rows].max()) + 1) * len(pids) * kinds
        if codes <= len(local):  # a table per sum as long as the codes
            slot, counts = local, np.bincount(local, minlength=codes)
            present = chosen = np.flatnonzero(counts)
        else:  # codes of many sites and processes, or a small batch: numbered densely first
            slot, present = pd.factorize(local, sort=True)
            codes, chosen = len(present), slice(None)
            counts = np.bincount(slot, minlength=codes)
        lengths = counts[chosen]
        site_code, rest = np.divmod(present, len(pids) * kinds)
        g = self.groups
        at = g.codes((site_code << 32) | (pids[rest // kinds].astype("int64") << 8) | (rest % kinds))
        alloc = b.is_alloc[rows]
        paired = ~alloc & (b.partner_seq[rows] >= 0)
        api = b.calls["api"][rows]
        names = int(api.max()) + 1 if len(api) else 0
        if len(api) and int(api.min()) >= 0 and codes * (names + 2) <= 4 * len(local) + 4096:
            # each row's cell (its code, and its allocation's API, or a paired free, or neither):
            # one count gives the allocations, the frees and the APIs of each code (masked copies
            # of the codes and a hash of the (code, API) pairs took 40% of this reducer)
            cell = np.where(alloc, api, np.where(paired, names, names + 1)).astype(np.intp)
            cell += slot * (names + 2)
            cells = np.bincount(cell, minlength=codes * (names + 2)).reshape(codes, names + 2)[chosen]
            del cell
            g["allocations"][at] += cells[:, :names].sum(axis=1)
            g["freed"][at] += cells[:, names]
            hit, api_code = np.nonzero(cells[:, :names])
            used = (at[hit] << 20) | api_code
        else:  # many codes and API names: the (code, API) pairs hashed
            pairs = pd.unique((local[alloc] << 20) | api[alloc].astype("int64"))
            used = (at[np.searchsorted(present, pairs >> 20)] << 20) | (pairs & 0xFFFFF)
            g["allocations"][at] += np.bincount(slot[alloc], minlength=codes)[chosen]
            g["freed"][at] += np.bincount(slot[paired], minlength=codes)[chosen]
        self.apis = pd.unique(np.concatenate([self.apis, used]))
        moves = b.delta[rows].astype("int64", copy=False)
        # the bytes allocated (even cells) and freed (odd) per code, in one pass
        sums = code_sums(slot * 2 + paired, np.where(alloc, b.bytes[rows], np.where(paired, moves, 0)), 2 * codes)
        g["allocated"][at] += sums[0::2][chosen]
        g["freed_bytes"][at] -= sums[1::2][chosen]
        del alloc, paired
        moves = moves[group_order(slot, codes)]
        del local, slot
        starts = np.cumsum(lengths) - lengths
        running = np.cumsum(moves)  # the live bytes after each row, carried in from the batches before
        running -= np.repeat(running[starts] - moves[starts] - g["live"][at], lengths)
        g["live"][at] = running[starts + lengths - 1]
        g["max_live"][at] = np.maximum(g["max_live"][at], np.maximum.reduceat(running, starts))

    def finish(self, live: dict) -> list[Site]:
        keys = np.array(self.groups.keys(), "int64")
        if not len(keys):
            return []
        labels, site_table = self.facts.more["labels"](), self.facts.more["site_table"]()
        g = self.groups
        code, pid, kind = keys >> 32, (keys >> 8) & 0xFFFFFF, keys & 0xFF
        site_rank = np.array([labels.site_rank(c) for c in code.tolist()], "int64")  # a few per site
        named = np.array([labels.sites[c] != "" for c in code.tolist()], bool)
        ranked = np.flatnonzero((g["allocations"] > 0) & named)
        ranked = ranked[np.lexsort((kind[ranked], pd.Index(self.pids).get_indexer(pid[ranked]), site_rank[ranked],
                                    -g["allocations"][ranked], -g["allocated"][ranked]))][:MAX_SITES]
        apis: dict[int, set] = {}
        for pair in self.apis.tolist():  # a few per group
            apis.setdefault(pair >> 20, set()).add(str(labels.apis[pair & 0xFFFFF]))
        return [Site(site=call_site(str(labels.sites[code[i]]), site_table), kind=str(self.facts.kinds[kind[i]]),
                     apis=sorted(apis.get(i, ())), allocations=int(g["allocations"][i]),
                     allocated_bytes=int(g["allocated"][i]),
                     never_freed_count=int(g["allocations"][i] - g["freed"][i]),
                     never_freed_bytes=int(g["allocated"][i] - g["freed_bytes"][i]),
                     max_live_bytes=int(max(g["max_live"][i], 0)), pid=int(pid[i]))
                for i in ranked.tolist()]
