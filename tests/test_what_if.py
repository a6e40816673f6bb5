"""`--what-if-gpu SIZE` (issue 30, section 4): the run replayed against a GPU of SIZE.

The first moment over SIZE is checked against an independent running sum of the fixture's own
memory events (device + array + static of every process on the GPU, in time order)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import analysis_of, cli

import nsysan
from nsysan.analyses.what_if import what_if_gpu
from nsysan.model import Analysis

GiB = 1 << 30


def first_over(analysis: Analysis, gpu: int, capacity: int) -> tuple[int, int, int]:
    """(time, live bytes) of the first event that takes the GPU over `capacity`, and the GPU's
    peak, from the events frame."""
    gpu_of = {(g.pid, g.device): g.gpu for g in analysis.groups}
    events = analysis.events
    events = events[events["kind"].astype(str).isin(["device", "array", "static"])]
    mine = events[[gpu_of.get((p, d)) == gpu for p, d in zip(events["pid"], events["device"])]]
    mine = mine.sort_values("ts_ns", kind="stable")
    live = mine["delta_bytes"].cumsum().to_numpy()
    over = np.flatnonzero(live > capacity)
    return int(mine["ts_ns"].to_numpy()[over[0]]), int(live[over[0]]), int(live.max())


def test_the_first_moment_over_the_size_is_the_events_own(torch_leak_v25):
    found = what_if_gpu(torch_leak_v25, 4 * GiB)
    (gpu,) = found.gpus
    assert not found.approximate and not gpu.fits
    assert (gpu.first_over_ns, gpu.over_bytes, gpu.peak_bytes) == first_over(torch_leak_v25, 0, 4 * GiB)
    assert (gpu.pid, gpu.nvtx_path) == (1644, "step 4 > forward")
    assert gpu.peak_bytes == torch_leak_v25.peak.peak_bytes
    # the leak's 735 MiB per step: 4 GiB is used up by the end of step 4, the first that ended above it
    (growth,) = found.growth
    ends = [s.end_live_bytes for s in torch_leak_v25.steps[0].steps]
    assert ends[3] <= 4 * GiB < ends[4]
    assert (growth.bytes_per_step, growth.steps_allowed, growth.at_step) == (735 * (1 << 20), 0, 4)
    assert found.message == ("on a 4.0 GiB GPU: GPU 0 would not fit: over it by 17.1 MiB at 10.093 s by process 1644 "
                             "in 'step 4 > forward' (its peak: 5.3 GiB); with process 1644's growth of 735.0 MiB per "
                             "step, 4.0 GiB is used up by the end of step 4")


def test_each_gpu_of_a_two_rank_job(ddp_leak_v25):
    found = what_if_gpu(ddp_leak_v25, GiB)
    assert [g.gpu for g in found.gpus] == [0, 1]
    for g in found.gpus:
        assert (g.first_over_ns, g.over_bytes, g.peak_bytes) == first_over(ddp_leak_v25, g.gpu, GiB)
    assert [(g.pid, g.nvtx_path) for g in found.gpus] == [(2146, "step 0"), (2147, "step 0")]


def test_the_steps_allowed_are_the_growth_projection_at_the_gpus_size(torch_leak_v25):
    growth = torch_leak_v25.growth[0]
    found = what_if_gpu(torch_leak_v25, growth.capacity_bytes)
    assert found.growth[0].at_step == growth.capacity_step == 193


def test_a_run_that_fits_says_what_is_left():
    found = what_if_gpu(analysis_of("torch_clean_v25"), 80 * GiB)
    (gpu,) = found.gpus
    assert gpu.fits and gpu.first_over_ns is None and found.growth == []
    assert found.message == "on a 80.0 GiB GPU: GPU 0 fits: its peak 1.8 GiB leaves 78.2 GiB free"


def test_the_command_prints_it_among_the_answers_and_the_json_carries_it(capsys):
    code, out, err = cli(capsys, "analyze", "fixtures/known_mem_v25.sqlite", "--what-if-gpu", "512MiB")
    assert code == 0, err
    answers = out[out.index("Answers"):out.index("Peak GPU memory")]
    assert " what if on a 512.0 MiB GPU: GPU 0 would not fit: over it by 396.0 MiB at 517.08 ms by process" in answers
    code, out, err = cli(capsys, "analyze", "fixtures/known_mem_v25.sqlite", "--what-if-gpu", "512MiB", "-f", "json")
    doc = json.loads(out)
    assert doc["what_if"]["capacity_bytes"] == 512 << 20 and doc["what_if"]["gpus"][0]["nvtx_path"] == "burst"
    assert Analysis.from_dict(doc).what_if.gpus[0].over_bytes == 952107008  # the 908 MiB peak, reached at once
    code, out, _ = cli(capsys, "analyze", "fixtures/known_mem_v25.sqlite", "-f", "json")
    assert "what_if" not in json.loads(out)  # absent unless asked


@pytest.mark.parametrize("size", ["0", "-1GiB", "lots", "2PiB", "9" * 400])
def test_a_size_it_cannot_use_is_one_line_and_exit_2(size, capsys):
    code, out, err = cli(capsys, "analyze", "fixtures/known_mem_v25.sqlite", "--what-if-gpu", size)
    assert code == 2 and err.count("\n") == 1 and "--what-if-gpu" in err and not out


def test_the_python_api_takes_it_too():
    analysis = nsysan.analyze("fixtures/known_mem_v25.sqlite", what_if_gpu="1GiB")
    codes = [(a.topic, a.code) for a in analysis.answers]
    # right after the peak and growth answers, before the others
    assert analysis.what_if.gpus[0].fits and codes[:4] == [("verdict", "uneven"), ("peak", "peak"),
                                                          ("growth", "memory_kept_unevenly"), ("what-if", "what_if_gpu")]
    with pytest.raises(nsysan.NsysanError, match="--what-if-gpu"):
        nsysan.analyze("fixtures/known_mem_v25.sqlite", what_if_gpu=0)
