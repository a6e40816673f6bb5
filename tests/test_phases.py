"""What each phase costs and where memory jumps (issue 17, part 1b), on the torch captures.

The truth files give PyTorch's reserved bytes after each step; nsysan's live device bytes follow
them plus a constant (see test_growth.py), so a step's change is the truth's difference of
reserved bytes, and the phases inside a step (forward, backward, optimizer, run back to back)
add up to it. Issue 17 states the per-phase figures measured at the driver level.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import ROOT, analysis_of, truth

MiB = 1 << 20


def phase(analysis, path):
    [found] = [p for p in analysis.phases if p.path == path]
    return found


def nets_by_step(found, first_step):
    return {step: net for step, net in zip(found.step, found.net_bytes) if step >= first_step}


def test_leak_phases_per_step():
    analysis = analysis_of("torch_leak_v25")
    forward = nets_by_step(phase(analysis, "step N > forward"), 2)
    backward = nets_by_step(phase(analysis, "step N > backward"), 2)
    optimizer = nets_by_step(phase(analysis, "step N > optimizer"), 2)
    assert set(forward.values()) <= {342 * MiB, 354 * MiB} and len(forward) == 4  # steps 2-5
    assert set(backward.values()) == {386 * MiB}
    assert all(abs(v) <= 2 * MiB for v in optimizer.values())  # "about 0"
    # the three phases make up each step's change, the truth's difference of reserved bytes
    reserved = [r["reserved"] for r in truth("torch_leak_v25") if "step" in r]
    for k in range(2, 6):
        assert forward[k] + backward[k] + optimizer[k] == reserved[k] - reserved[k - 1]


def test_clean_phases_net_zero_from_step_3():
    analysis = analysis_of("torch_clean_v25")
    for name in ("forward", "backward", "optimizer"):
        found = phase(analysis, f"step N > {name}")
        assert set(nets_by_step(found, 3).values()) == {0}
        assert found.instances == 6


def test_phase_statistics_cover_every_instance():
    found = phase(analysis_of("torch_leak_v25"), "step N > backward")
    assert found.instances == len(found.net_bytes) == 6
    assert found.rise_max_bytes == max(found.rise_bytes) and found.net_max_bytes == max(found.net_bytes)
    assert all(r >= max(n, 0) for r, n in zip(found.rise_bytes, found.net_bytes))  # the peak is at least the end


@pytest.mark.parametrize("name", ["torch_leak_v25", "torch_clean_v25"])
def test_the_top_spike_is_inside_a_step_and_named_with_its_range(name):
    analysis = analysis_of(name)
    top = max(analysis.spikes, key=lambda s: s.rise_bytes)
    [series] = analysis.steps
    assert any(st.start_ns <= top.start_ns and top.peak_ns <= st.end_ns for st in series.steps)
    assert top.nvtx_path.startswith("step ") and " > " in top.nvtx_path
    assert top.rise_bytes == top.peak_live_bytes - top.start_live_bytes > 0
    assert top.apis and top.sites


def test_spikes_do_not_overlap_and_say_whether_memory_came_back():
    analysis = analysis_of("known_mem_v25")
    spikes = sorted(analysis.spikes, key=lambda s: s.start_ns)
    assert all(a.peak_ns < b.start_ns for a, b in zip(spikes, spikes[1:]))
    # known_allocs.cu: the 512 MiB workspace of `burst` is freed in its range (truth: freed 1)
    burst_bytes = [r["bytes"] for r in truth("known_mem_v25") if r.get("bytes", 0) >= 512 * MiB]
    assert burst_bytes == [512 * MiB]
    burst = max(spikes, key=lambda s: s.rise_bytes)
    assert burst.rise_bytes >= burst_bytes[0] and burst.nvtx_path == "burst"
    assert burst.freed_after_bytes >= burst_bytes[0]  # and later frees too
    # the 32 MiB cudaMallocAsync block of `async pool` comes back to where the rise began
    pool = [s for s in spikes if s.nvtx_path == "async pool"]
    assert pool and pool[0].given_back_ns is not None and pool[0].freed_after_bytes == pool[0].rise_bytes


def test_a_bad_spike_window_is_one_line_and_exit_2():
    done = subprocess.run([sys.executable, "-m", "nsysan", "analyze", "fixtures/known_mem_v25.sqlite",
                           "--spike-window", "ten"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2 and "--spike-window" in done.stderr and done.stderr.count("\n") == 1
