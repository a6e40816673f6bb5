"""Live bytes over time: the running sum of each (process, device, kind), drawn as a step series."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..model import Band, Series, Timeline

GROUP = ["pid", "device", "kind"]
MAX_POINTS = 2000  # per series: enough to draw, small enough to ship in JSON
MAX_BANDS = 300


def live_bytes(events: pd.DataFrame, by: list[str] = GROUP) -> np.ndarray:
    """Live bytes of each event's group right after the event (events are in time order)."""
    if events.empty:
        return np.zeros(0, "int64")
    return events.groupby(by, observed=True, sort=False)["delta_bytes"].cumsum().to_numpy("int64")


def build_timeline(events: pd.DataFrame, ranges: pd.DataFrame, start_ns: int, end_ns: int,
                   max_points: int = MAX_POINTS) -> Timeline:
    """Step series per (process, device, kind), downsampled so that every peak survives."""
    series = []
    if not events.empty:
        frame = pd.DataFrame({"pid": events["pid"].to_numpy(), "device": events["device"].to_numpy(),
                              "kind": events["kind"].astype(str).to_numpy(),
                              "ts_ns": events["ts_ns"].to_numpy(), "live": live_bytes(events)})
        for (pid, device, kind), group in frame.groupby(GROUP, sort=True):  # one per series
            ts, live = _downsample(group["ts_ns"].to_numpy(), group["live"].to_numpy(), max_points)
            series.append(Series(int(pid), int(device), str(kind), ts.tolist(), live.tolist()))
    return Timeline(start_ns=int(start_ns), end_ns=int(end_ns), series=series, bands=top_level_bands(ranges, events))


def _downsample(ts: np.ndarray, live: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """Keep, per time bucket, the highest point and the last one, so peaks and levels survive."""
    if len(ts) <= max_points:
        return ts, live
    buckets = max(1, max_points // 2)
    span = max(int(ts[-1] - ts[0]), 1)
    bucket = ((ts - ts[0]) * (buckets - 1) // span).astype("int64")
    frame = pd.DataFrame({"bucket": bucket, "live": live, "pos": np.arange(len(ts))})
    highest = frame.loc[frame.groupby("bucket")["live"].idxmax(), "pos"].to_numpy()
    last = frame.groupby("bucket")["pos"].max().to_numpy()
    keep = np.unique(np.concatenate([highest, last, [0]]))
    return ts[keep], live[keep]


def top_level_bands(ranges: pd.DataFrame, events: pd.DataFrame, limit: int = MAX_BANDS) -> list[Band]:
    """Outermost NVTX ranges of each process's main thread (e.g. "setup", "step 0", "step 1").

    The main thread (tid == pid) carries the phases of a program; worker threads (PyTorch's
    autograd threads, for one) carry library ranges such as cub sorts. A process whose main
    thread has no ranges falls back to the threads that allocated.
    """
    if ranges.empty:
        return []
    top = ranges[ranges["depth"] == 1]
    pids = np.unique(events["pid"].to_numpy()) if not events.empty else np.unique(top["pid"].to_numpy())
    top = top[top["pid"].isin(pids).to_numpy()]
    on_main = (top["tid"] == top["pid"]).to_numpy()
    has_main = top.loc[on_main, "pid"].unique()
    def thread_keys(frame: pd.DataFrame) -> np.ndarray:
        return frame["pid"].to_numpy().astype("int64") << 24 | frame["tid"].to_numpy().astype("int64") & 0xFFFFFF

    by_allocator = np.isin(thread_keys(top), thread_keys(events)) if not events.empty else np.zeros(len(top), bool)
    top = top[on_main | (~top["pid"].isin(has_main).to_numpy() & by_allocator)]
    end_cap = top["end_ns"].where(top["end_ns"] < np.iinfo("int64").max // 4, top["start_ns"])
    top = top.assign(end_ns=end_cap)
    if len(top) > limit:  # keep the longest, then show them in time order
        top = top.assign(length=top["end_ns"] - top["start_ns"]).nlargest(limit, "length")
    top = top.sort_values("start_ns", kind="stable")
    return [Band(int(p), str(n), int(s), int(e))
            for p, n, s, e in top[["pid", "name", "start_ns", "end_ns"]].itertuples(index=False)]
