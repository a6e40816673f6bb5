"""A notebook session on torch_leak_v25, as plain Python: each `# %%` is a cell.

Run it alone (`python tests/notebook_torch_leak.py` from the repository) or through
tests/test_notebook.py. Every number comes from fixtures/torch_leak_v25.truth.jsonl (PyTorch's
own memory_stats() after each of the six steps) or from arithmetic on it, written out below.
"""

# %% Analyze the capture
import json
from pathlib import Path

import pandas as pd

import nsysan

ROOT = Path(__file__).resolve().parents[1]
analysis = nsysan.analyze(ROOT / "fixtures" / "torch_leak_v25.sqlite")
truth = [json.loads(line) for line in (ROOT / "fixtures" / "torch_leak_v25.truth.jsonl").read_text().splitlines()]
reserved = [record["reserved"] for record in truth if "step" in record]  # after steps 0..5

# %% Frame 1 and 2: the training steps (NVTX bands) and live bytes over time
bands = analysis.frame("bands")
timeline = analysis.frame("timeline")
steps = bands[bands["name"].str.startswith("step ")].sort_values("end_ns")
device = timeline[timeline["kind"] == "device"].sort_values("ts_ns")
at_step_end = pd.merge_asof(steps, device[["ts_ns", "live_bytes"]], left_on="end_ns", right_on="ts_ns")
assert list(at_step_end["name"]) == [f"step {i}" for i in range(6)]

# The driver-level bytes are the caching allocator's segments (`reserved`) plus the library
# workspaces PyTorch took with cudaMalloc outside the allocator: the same 134,481,920 bytes after
# every step (tests/test_analyses.py derives that number from torch_expandable_v25's truth).
WORKSPACES = 134_481_920
assert list(at_step_end["live_bytes"]) == [r + WORKSPACES for r in reserved]
grew = at_step_end["live_bytes"].diff().dropna()
assert (grew > 700 * 2**20).all()  # the leak: every step keeps more than 700 MiB more

# %% Frame 3: the groups, then the blocks never freed
groups = analysis.frame("groups").set_index("kind")
assert groups.loc["device", "end_bytes"] == reserved[-1] + WORKSPACES == 5_681_448_960
never_freed = analysis.frame("never_freed")
by_range = never_freed.groupby("nvtx_range")["bytes"].sum().sort_values(ascending=False)
# Everything on the device at the end was never freed: the kept graphs and the workspaces.
assert by_range.sum() == groups.loc["device", "never_freed_bytes"] == 5_681_448_960
assert len(never_freed) == groups.loc["device", "never_freed_count"]
assert by_range.index[0] == "forward"  # the kept activations dominate

# %% The headline peak: the device bytes at the end plus the static module memory
peaks = analysis.frame("peaks")
top = peaks.sort_values("peak_bytes", ascending=False).iloc[0]
assert top["peak_bytes"] == 5_681_448_960 + groups.loc["static", "end_bytes"] == 5_682_335_061
live = analysis.frame("live_at_peak")
assert (live["peak_bytes"] == top["peak_bytes"]).all() and live["bytes"].is_monotonic_decreasing

# %% How it shows itself
text = repr(analysis)
assert len(text) < 500 and "torch_leak_v25.sqlite" in text and "5.3 GiB" in text
page = analysis._repr_html_()
assert len(page.encode("utf-8")) < 2 * 2**20
print(text)
