"""Windows over live series fed in tiny batches read what the whole-frame analyses read of them
(analyses/windows.py: the most live bytes while a window is open, as ranges.RangeSums reads them,
against a slice of the series per window; the steps' and phases' windows: test_engine.py's
StepWindows on one batch and many)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from conftest import FIXTURES

import nsysan
from nsysan.analyses.windows import LOW, Windows
from nsysan.model import GPU_RESIDENT_KINDS

FAR = np.iinfo("int64").max
NAMES = ["torch_leak_v25", "ddp_leak_v25", "known_bt_v25", "torch_ops_v25", "real_oom_v25"]


def frames(name: str):
    analysis = nsysan.analyze(FIXTURES / f"{name}.sqlite")
    return analysis.events, analysis.nvtx_ranges


def edge_windows(ts: np.ndarray, ranges: pd.DataFrame, pid: int) -> tuple[np.ndarray, np.ndarray]:
    """The process's NVTX ranges, and windows that start and end exactly at events (several
    events share a time in these captures), before the first, after the last, of no length."""
    mine = ranges[ranges["pid"] == pid] if not ranges.empty else ranges
    starts = [mine["start_ns"].to_numpy()] if len(mine) else []
    ends = [mine["end_ns"].to_numpy()] if len(mine) else []
    picks = ts[np.linspace(0, len(ts) - 1, min(len(ts), 40)).astype("int64")]
    starts += [picks, picks, picks - 1, picks + 1, [ts[0] - 10, ts[-1] + 1, ts[0]]]
    ends += [picks, picks[::-1].clip(min=picks), picks + 1, np.full(len(picks), ts[-1]),
             [ts[0] - 5, ts[-1] + 9, ts[-1]]]
    return np.concatenate(starts).astype("int64"), np.concatenate(ends).astype("int64")


def fed(keys: np.ndarray, ts: np.ndarray, live: np.ndarray, values: np.ndarray, windows: Windows, size: int) -> None:
    """Every event in time order, `size` at a time, each series' rows of a batch with their live bytes
    (the rows of series without windows are skipped)."""
    for low in range(0, len(ts), size):
        part = np.arange(low, min(low + size, len(ts)))
        for key in pd.unique(keys[part]).tolist():
            rows = part[keys[part] == key]
            windows.add_series(key, ts[rows], live[rows], values[rows])
    windows.finish()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("size", [1, 7])
def test_range_windows_read_the_most_live_while_open(name, size):
    events, ranges = frames(name)
    resident = events["kind"].isin(GPU_RESIDENT_KINDS).to_numpy()
    pid = events["pid"].to_numpy()
    keys = np.where(resident, pid, -1).astype("int64")
    live = np.zeros(len(events), "int64")
    windows, expected = Windows(), []
    for p in np.unique(pid[resident]).tolist():  # one per process
        rows = np.flatnonzero(resident & (pid == p))
        live[rows] = np.cumsum(events["delta_bytes"].to_numpy()[rows])
        ts = events["ts_ns"].to_numpy()[rows]
        starts, ends = edge_windows(ts, ranges, p)
        ids = windows.open(p, starts, ends)
        # the process's live bytes carried in at the start (0 before its first event), or after
        # an event inside: padded[first:stop]
        padded = np.concatenate([[0], live[rows]])
        first = np.searchsorted(ts, starts, side="right")
        stop = np.searchsorted(ts, np.maximum(ends, starts), side="right") + 1
        expected += [(i, int(padded[a:z].max())) for i, a, z in zip(ids.tolist(), first, stop)]
    fed(keys, events["ts_ns"].to_numpy(), live, np.zeros(len(events), "int64"), windows, size)
    ids = np.array([i for i, _ in expected], "int64")
    assert np.maximum(windows.at_start[ids], windows.high_after[ids]).tolist() == [most for _, most in expected]


def test_windows_open_until_the_end_and_windows_never_reached():
    windows = Windows()
    ids = windows.open(5, np.array([10, 10, 25, 100, 0]), np.array([FAR, 20, 30, 200, 5]))
    # series 5: live 1, 3, 2 at times 10, 20, 20 (the two at 20 in separate batches), then 7 at 40
    windows.add_series(5, np.array([10]), np.array([1]), np.array([1]))
    windows.add_series(9, np.array([15]), np.array([99]), np.array([0]))  # no windows: skipped
    windows.add_series(5, np.array([20]), np.array([3]), np.array([2]))
    windows.add_series(5, np.array([20, 40]), np.array([2, 7]), np.array([0, 5]))
    windows.finish()
    assert windows.before[ids].tolist() == [0, 0, 2, 7, 0]
    assert windows.at_start[ids].tolist() == [1, 1, 2, 7, 0]
    assert windows.high[ids].tolist() == [7, 3, LOW, LOW, LOW]
    assert windows.high_after[ids].tolist() == [7, 3, LOW, LOW, LOW]
    assert windows.end[ids].tolist() == [7, 2, 2, 7, 0]
    assert windows.summed[ids].tolist() == [8, 3, 0, 0, 0]
