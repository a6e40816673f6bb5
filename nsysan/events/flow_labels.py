"""The labels of a flow of event batches joined to their calls (the streamed full analysis, on
the engine's second look): each allocation's site by site_labels.SiteLabeller (as the whole
frame's), and each free its allocation's, from the live allocations carried across batches.

Every event of a batch (frees too) is attributed to its innermost NVTX range and operator once,
here, in the batch's `calls` as labelled columns for the engine's second look (engine.Labels: the
spikes, the ranges table).
What the lists of allocations say of them (allocation_info: never freed, largest, live at a
peak) is kept as each batch is labelled.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd

from ..model import GPU_RESIDENT_KINDS, KINDS
from .arrays import among, pair_key
from .batch import places
from .normalize import event_api_codes, event_api_names
from .nvtx import RangeLookup, operator_codes, range_paths
from .site_labels import SiteLabeller

RESIDENT = [KINDS.index(k) for k in GPU_RESIDENT_KINDS]  # the flow's codes of these kinds (KINDS first)
STATIC = KINDS.index("static")

ALLOCATION_INFO = ("seq", "site", "tid", "api", "nvtx_range", "stack", "operator")


class FlowLabels:
    """The second pass's consumer: each event's site, API, NVTX range and operator (the batch's
    labelled calls), and what the lists of allocations say of them (allocation_info)."""

    def __init__(self, conn, schema, wanted_chains: np.ndarray, calls_and_chains, api_names: list[str],
                 kinds: list[str], ranges: pd.DataFrame, operator_ranges: pd.DataFrame,
                 thread_names: dict, diagnostics: list, listed=(), look=None,
                 times: Optional[tuple[int, int]] = None) -> None:
        """`times`: the earliest and latest event time (the lookups' axis then spans what the
        whole frame's spans: see RangeLookup)."""
        self.api_names = event_api_names(api_names)  # as normalize names the events' APIs
        self.kinds, self.static = kinds, kinds.index("static")
        self.ranges, self.operator_ranges = ranges, operator_ranges
        self.range_names = ranges["name"].to_numpy(dtype=object) if not ranges.empty else np.zeros(0, object)
        self.range_names_or_none = np.append(self.range_names, "")  # range row -1 (none): ""
        # each range's name as a code (ranges repeat a few names over many instances): a fallback
        # label depends on the name, not on which instance
        codes, range_name_list = pd.factorize(self.range_names, use_na_sentinel=False)
        self.range_name_codes = codes.astype("int64")
        # The ranges sorted once for every batch's lookups, not once per batch
        self.range_lookup, self.operator_lookup = RangeLookup(ranges, times), RangeLookup(operator_ranges, times)
        self.operator_code, self.operator_names = operator_codes(operator_ranges)  # as attribute_operators'
        self.labeller = SiteLabeller(conn, schema, wanted_chains, calls_and_chains, self.api_names, range_name_list,
                                  self.operator_names, thread_names, diagnostics)
        self.registry = self.labeller.registry
        # of each range row (and of row -1: "", last), the code of its path in path_names
        self.path_code, self.path_names = pd.factorize(np.append(range_paths(ranges) if not ranges.empty
                                                                 else np.zeros(0, object), ""))
        # the live allocations (what their frees need) and those never to be freed, with what
        # to_allocations lists of them: ALLOCATION_INFO, strings as codes into `strings`
        self.live = {c: np.zeros(0, "int64") for c in ALLOCATION_INFO}
        self.closed: list[dict] = []
        self.listed = np.unique(np.asarray(listed, "int64"))  # allocations listed whether freed or not
        self.kept: list[dict] = []
        # at each peak of `look` (the flow's peak.Peaks): its live allocations' ALLOCATION_INFO,
        # and the API name and NVTX range of the event that reached it
        self.look_at, self.at_peak, self._seen, self._last_own = look, {}, {}, {}
        self.strings: dict[str, int] = {"": 0}
        # fed each batch with `known` (ALLOCATION_INFO of the live allocations before it and its
        # own) and the allocations closed before it once this has labelled it (analyses/flow.py LiveSetInfo)
        self.watchers: list = []

    def label(self, b) -> None:
        """Label the batch's events (its `calls`' labelled columns) and carry the live allocations'
        labels past it. Reads nothing of the other reducers, so the flow does it on the thread that
        reads the second look's batches, ahead of the engine (stream.EventFlow.replay); what `look`
        needs of this batch waits in `b.shared["labelled"]`."""
        n = len(b)
        if n == 0:
            return
        nvtx, operator = self._attribute(b)
        allocs = np.flatnonzero(b.is_alloc)
        api = self._api_codes(b)
        info = self._label(b, allocs, api, nvtx, operator)
        site = np.full(n, -1, "int64")
        site[allocs] = info["site"]
        # the batch labelled for the engine's second look after this (engine.Labels): its events' API
        # names, NVTX ranges, paths and operators, and its events' sites (the frees' set below, in `site`)
        named, others = np.zeros(n, "int64"), np.flatnonzero(~b.is_alloc)
        named[allocs] = info["nvtx_range"]
        named[others] = self._named(nvtx[others], self.range_names_or_none)
        b.calls.update(api=api, site=site, nvtx_range=named, nvtx_path=self.path_code[nvtx], operator=operator)
        # a free belongs to the site of the allocation it frees: this batch's or a live one's
        known = {c: np.concatenate([self.live[c], info[c]]) for c in ALLOCATION_INFO}
        if len(self.listed):
            kept = np.isin(info["seq"], self.listed)
            self.kept.append({c: info[c][kept] for c in ALLOCATION_INFO})
        seqs, sites = known["seq"], known["site"]
        frees = np.flatnonzero(~b.is_alloc & (b.partner_seq >= 0))
        freed = places(seqs, len(self.live["seq"]), b, allocs, b.partner_seq[frees])
        site[frees] = sites[freed]
        closed = b.closed.get("seq", np.zeros(0, "int64"))
        gone = np.isin(seqs, closed)  # and the allocations freed, found above
        gone[freed[seqs[freed] == b.partner_seq[frees]]] = True
        # the allocations never to be freed before this batch's look (closed ones are listed as never freed)
        closed_before = list(self.closed)
        if len(closed):
            self.closed.append({c: known[c][np.searchsorted(seqs, closed)] for c in ALLOCATION_INFO})
        self.live = {c: values[~gone] for c, values in known.items()}
        b.shared["labelled"] = (known, nvtx, closed_before)

    def look(self, b) -> None:
        """What the peaks and the watchers need of a labelled batch (`label`), once the peaks and
        the out-of-memory moments have looked at it: the engine's second look, in its order."""
        if len(b) == 0:
            return
        if "labelled" not in b.shared:  # a batch not read ahead (the table read again: see replay)
            self.label(b)
        known, nvtx, closed = b.shared.pop("labelled")
        if self.look_at is not None:
            self._peaks(b, known, nvtx)
        for watcher in self.watchers:  # what the calls say of this batch's and the live allocations
            watcher.add(b, known, closed)

    def allocation_info(self, seqs: np.ndarray, peak=None) -> pd.DataFrame:
        """What to_allocations lists of each allocation never freed or `listed`, or live at `peak`
        (a PeakSeries, or oom.Moment, once the batch it was found in is labelled) (`seqs`: of
        those), by seq: tid, api, nvtx_range, site (its label), stack, operator."""
        if peak is not None and id(peak) in self.at_peak:
            rows = self.at_peak[id(peak)][0]
        else:
            rows = {c: np.concatenate([self.live[c]] + [part[c] for part in self.closed + self.kept])
                    for c in ALLOCATION_INFO}
        _, first = np.unique(rows["seq"], return_index=True)  # a listed allocation may still be live
        rows = {c: values[first] for c, values in rows.items()}
        at = pd.Index(rows["seq"]).get_indexer(seqs)
        strings = np.array(list(self.strings), dtype=object)
        labels = np.array(list(self.labeller.labels), dtype=object)
        return pd.DataFrame({
            "tid": rows["tid"][at], "api": np.array(self.api_names, dtype=object)[rows["api"][at]],
            "nvtx_range": strings[rows["nvtx_range"][at]],
            "site": labels[rows["site"][at]],
            "stack": rows["stack"][at], "operator": strings[rows["operator"][at]]}, index=seqs)

    def _peaks(self, b, known: dict, nvtx_rows: np.ndarray) -> None:
        """What the peaks that this batch raised hold: their live allocations' information (from
        the live ones and this batch's), the API and NVTX range of the event at the peak, and the
        API of the series' last own allocation then (peak.module_load_note)."""
        api = b.calls["api"]  # the events' API codes (label)
        # the series' own allocations (not module statics) among the batch's: found once, and
        # each series' among them (not each series' events first: 0.7 s at 1e7 events)
        owned = np.flatnonzero(among(b.kind, RESIDENT) & (b.kind != STATIC) & (b.delta > 0))
        pairs = pair_key(b.pid[owned], b.device[owned])
        for peak in self.look_at.series:  # a few series, as peak.Peaks finds them
            own = owned[among(pairs, peak.members)]
            if peak.best_seq >= 0 and peak.live_set is not self._seen.get(id(peak)):
                self._seen[id(peak)] = peak.live_set  # a new live set: the peak was raised in this batch
                at = np.searchsorted(known["seq"], peak.live_set["seq"].to_numpy())
                i = int(np.searchsorted(b.seq, peak.best_seq))
                nvtx = int(nvtx_rows[i])
                before = own[own <= i]
                self.at_peak[id(peak)] = ({c: known[c][at] for c in ALLOCATION_INFO}, self.api_names[int(api[i])],
                                          str(self.range_names[nvtx]) if nvtx >= 0 else "",
                                          self.api_names[int(api[before[-1]])] if len(before)
                                          else self._last_own.get(id(peak), ""))
            if len(own):
                self._last_own[id(peak)] = self.api_names[int(api[own[-1]])]

    def _attribute(self, b) -> tuple[np.ndarray, np.ndarray]:
        """Each event's innermost NVTX range (nvtx.innermost_range_rows: on its thread, else its
        process's main thread) and operator (attribute_operators: on its own thread only)."""
        tid = b.calls["tid"].astype("int64")
        nvtx = self.range_lookup.rows(b.pid, tid, b.ts) if self.range_lookup.usable else np.full(len(b), -1, "int64")
        operator = np.zeros(len(b), "int64")
        if self.operator_lookup.usable:
            index = self.operator_lookup.innermost(b.pid, tid, b.ts)
            operator = np.where(index >= 0, self.operator_code[np.maximum(index, 0)], 0)
        return nvtx, operator

    def _named(self, rows: np.ndarray, names: np.ndarray) -> np.ndarray:
        """Codes into `strings` of names[rows]: each distinct row's name once (the few ranges of a
        batch, not a string hashed per event: 0.3 s at 1e7 events), in the same order."""
        slot, distinct = pd.factorize(rows)
        return self._string(names[distinct])[slot] if len(rows) else np.zeros(0, "int64")

    def _string(self, values: np.ndarray) -> np.ndarray:
        """Codes into `strings` of some strings (a dictionary look-up per distinct one)."""
        slot, distinct = pd.factorize(values)
        return np.array([self.strings.setdefault(str(v), len(self.strings)) for v in distinct] or [0],
                        "int64")[slot] if len(values) else np.zeros(0, "int64")

    def site_table(self) -> dict[str, dict]:
        """label -> its SITE_COLUMNS (the whole frame's sites table, as a dictionary)."""
        return self.labeller.table().set_index("label").to_dict("index")

    def whole_frame_labels(self) -> list[str]:
        """The site labels in the whole frame's order (its categories' order)."""
        return list(self.labeller.order()[0])

    def _api_codes(self, b) -> np.ndarray:
        return event_api_codes(b.calls["api"], b.kind == self.static, b.ts <= 0, len(self.api_names))

    def _label(self, b, allocs: np.ndarray, api: np.ndarray, nvtx: np.ndarray, operator: np.ndarray) -> dict:
        """Of each allocation (`allocs`, given the batch's events' API codes, innermost NVTX range and
        operator): its site code (into `labeller.labels`) and ALLOCATION_INFO."""
        pid, tid = b.pid[allocs], b.calls["tid"][allocs].astype("int64")
        api, nvtx, operator = api[allocs], nvtx[allocs], operator[allocs]
        name = np.append(self.range_name_codes, -1)[nvtx]  # -1 (no range) picks the -1 after the last
        site, stack = self.labeller.label(pid, tid, b.correlation[allocs], b.calls["chain"][allocs], api, name,
                                          operator)
        return {"seq": b.seq[allocs], "site": site, "tid": tid, "api": api, "stack": stack,
                "nvtx_range": self._named(nvtx, self.range_names_or_none),
                "operator": self._named(operator, self.operator_names) if not self.operator_ranges.empty
                else np.zeros(len(allocs), "int64")}
