"""What the bytes are (issue 30, section 3; analyses/byte_classes.py) against the truth of real captures.

fixtures/torch_bytes_*_v25: one MLP trained with Adam (workloads/torch_bytes.py), whose truth
file counts each class tensor by tensor: `step` lines (weights, activations, gradients, optimizer
state) and `boundary` lines (memory_stats at every phase boundary, for the caching run).
- exact_v25: PYTORCH_NO_CUDA_MEMORY_CACHING=1: every tensor is a cudaMalloc, so the classes are
  exact, to the byte;
- cached_v25: PyTorch's caching allocator: segment-level, the segments each phase made are the
  truth's reserved deltas, to the byte;
- nonvtx_v25: the exact run without NVTX: steps and phases found from the kernels.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import FIXTURES, analysis_of

import nsysan
from nsysan.analyses import allocator as allocators
from nsysan.analyses.byte_classes import EXACT_LABEL, SEGMENT_LABEL
from nsysan.analyses.allocator import LOOK_BACK_ROWS, OUTSIDE, SEGMENT_ALIGN, AllocatorRows, OutsideRows
from nsysan.engine import frame_batch, pieces
from nsysan.model.bytes import BYTE_CLASSES


def truth(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / f"{name}.truth.jsonl").read_text().splitlines()]


def steps_of(name: str) -> list[dict]:
    return [t for t in truth(name) if t.get("event") == "step"]


def boundary(name: str, step, at: str) -> dict:
    return next(t for t in truth(name) if t.get("at") == at and t.get("step") == step)


def only(name: str):
    (b,) = analysis_of(name).byte_classes
    return b


def live_sum(at) -> int:
    return sum(getattr(at, f"{c}_bytes") for c in BYTE_CLASSES)


# PyTorch's own cuBLAS workspaces (two threads, and cuBLASLt's): what clearCublasWorkspaces() freed
# in the caching run; the same workloads make the same ones without the cache.
PYTORCH_CUBLAS = 369_901_568 - 301_744_128


def test_exact_classes_are_the_truths_tensors_to_the_byte():
    b = only("torch_bytes_exact_v25")
    assert (b.level, b.label) == ("exact", EXACT_LABEL)
    true = steps_of("torch_bytes_exact_v25")
    assert [s.label for s in b.steps] == [f"step {i}" for i in range(5)] and b.step_count == 5
    for step, t in zip(b.steps, true):
        assert step.made_activations_bytes == t["activations_bytes"] == 200_572_936  # saved tensors, input, logits, loss
        assert step.made_gradients_bytes == t["gradients_bytes"] == 75_337_632
        assert step.weights_bytes == t["weights_bytes"] == 75_337_632  # live at every step's highest point
    assert b.steps[0].made_optimizer_state_bytes == true[0]["optimizer_state_bytes"] == 150_675_264  # Adam's state, once
    assert [s.made_optimizer_state_bytes for s in b.steps[1:]] == [0] * 4
    assert [s.optimizer_state_bytes for s in b.steps[1:]] == [true[0]["optimizer_state_bytes"]] * 4
    for at in [b.peak] + b.steps:
        assert at.cache_bytes == 0 and live_sum(at) == at.live_bytes
    # the peak: the steps' series at its highest, Adam's state and the weights whole in it
    (series,) = analysis_of("torch_bytes_exact_v25").steps
    assert b.peak.live_bytes == max(s.peak_live_bytes for s in series.steps) == 738_485_960
    assert (b.peak.weights_bytes, b.peak.optimizer_state_bytes) == (75_337_632, 150_675_264)
    assert b.message.startswith("at the peak (704.3 MiB): weights 71.8 MiB, activations 143.7 MiB, gradients 23.8 MiB, "
                                "optimizer state 143.7 MiB, workspaces 193.3 MiB, other 128.0 MiB")
    assert b.message.endswith(f"({EXACT_LABEL})")


def test_exact_workspaces_are_cublas_made_in_the_first_step():
    exact, cached = only("torch_bytes_exact_v25"), only("torch_bytes_cached_v25")
    assert PYTORCH_CUBLAS == 68_157_440  # 2 x 32 MiB + 1 MiB, from the truth file
    # cuBLAS's own blocks (64 MiB + 128 KiB + 1 KiB per thread) are outside the allocator in the
    # caching run, its workspaces there; without the cache, PyTorch's own are workspaces too
    assert cached.steps[0].made_workspaces_bytes == 134_481_920
    assert exact.steps[0].made_workspaces_bytes == PYTORCH_CUBLAS + 134_481_920
    assert exact.peak.workspaces_bytes == exact.steps[0].made_workspaces_bytes


def test_segment_level_classes_are_the_segments_each_phase_made():
    name = "torch_bytes_cached_v25"
    b = only(name)
    assert (b.level, b.label) == ("segment-level", SEGMENT_LABEL)
    assert SEGMENT_LABEL in b.message
    r = {(step, at): boundary(name, step, at)["reserved"] for step in range(5)
         for at in ("step start", "after forward", "after backward", "after optimizer")}
    # before the steps: the weights' segments, all that was reserved after setup (the weights'
    # tensors are 75,337,632 B of its 90,177,536: a segment's rounding)
    setup = boundary(name, None, "after setup")
    assert b.steps[0].weights_bytes == setup["reserved"] == 90_177_536 >= setup["weights_bytes"]
    for k, step in enumerate(b.steps):  # each phase's segments: the truth's reserved deltas, to the byte
        assert step.made_activations_bytes == r[(k, "after forward")] - r[(k, "step start")]
        assert step.made_gradients_bytes == r[(k, "after backward")] - r[(k, "after forward")]
        assert step.made_optimizer_state_bytes == r[(k, "after optimizer")] - r[(k, "after backward")]
    assert [s.made_activations_bytes for s in b.steps] == [234_881_024, 67_108_864, 0, 0, 0]
    # every class adds up to what the allocator reserved, with cuBLAS's own blocks beside it
    assert b.peak.live_bytes == r[(4, "after optimizer")] + 134_481_920 == 828_639_232
    # the cache: the forward's segments between steps (their activations freed), at most what
    # the allocator held unused then
    for k in (2, 3, 4):
        start = boundary(name, k, "step start")
        assert b.steps[k].cache_bytes == 234_881_024 + 67_108_864 <= start["reserved"] - start["allocated"]
        assert b.steps[k].activations_bytes == 0


def test_steps_without_nvtx_keep_weights_state_and_workspaces_exact():
    nvtx, kernels = only("torch_bytes_exact_v25"), only("torch_bytes_nonvtx_v25")
    assert [s.label for s in kernels.steps] == [f"iteration {i}" for i in range(5)]
    true = steps_of("torch_bytes_nonvtx_v25")
    for step, t in zip(kernels.steps, true):
        assert step.weights_bytes == t["weights_bytes"]
    assert kernels.steps[0].made_optimizer_state_bytes == true[0]["optimizer_state_bytes"]
    assert kernels.steps[0].made_workspaces_bytes == nvtx.steps[0].made_workspaces_bytes

    def made(s):
        return sum(getattr(s, f"made_{c}_bytes") for c in ("activations", "gradients", "optimizer_state", "workspaces",
                                                         "other"))
    # the kernels' phases split a step where its launches change threads: what the step made is the
    # same, but its input, labels, logits and loss (made before the forward's first kernel or after
    # its last) fall outside the forward: 33,554,432 + 32,768 + 16,384,000 + 4 bytes
    assert [made(s) for s in kernels.steps] == [made(s) for s in nvtx.steps]
    assert [t["activations_bytes"] - s.made_activations_bytes for s, t in zip(kernels.steps, true)] == [49_971_204] * 5


def test_an_existing_capture_segment_level_matches_its_reserved_steps():
    """torch_leak_v25 (keeps each step's graph): every step's segments, by phase, are its
    truth's growth of reserved, to the byte; the steps keep memory, so nothing counts as cache."""
    b = only("torch_leak_v25")
    true = steps_of("torch_leak_v25") or [t for t in truth("torch_leak_v25") if "reserved" in t]
    made = [s.made_activations_bytes + s.made_gradients_bytes + s.made_optimizer_state_bytes + s.made_other_bytes
            for s in b.steps]
    reserved = [t["reserved"] for t in true]
    assert made[0] + b.steps[0].weights_bytes == reserved[0]
    assert made[1:] == [after - before for before, after in zip(reserved, reserved[1:])]
    assert all(s.cache_bytes == 0 for s in b.steps + [b.peak])  # growing: the forward's segments hold the kept graphs
    assert b.steps[0].made_workspaces_bytes == 134_481_920  # cuBLAS's own, as reserved.allocators counts outside
    (use,) = analysis_of("torch_leak_v25").reserved.allocators
    assert b.peak.workspaces_bytes == use.outside_at_peak_bytes


def test_a_late_capture_names_nothing():
    """torch_capture_range_v25 began after warm-up: every block was live at its start, made no one
    knows where, so all is `other` and no answer line says what the bytes are."""
    analysis = analysis_of("torch_capture_range_v25")
    (b,) = analysis.byte_classes
    assert b.peak.other_bytes == b.peak.live_bytes > 0
    assert not [a for a in analysis.answers if a.topic == "bytes"]


@pytest.mark.parametrize("name", ["torch_bytes_exact_v25", "torch_clean_v25"])
def test_the_answer_line_is_the_sections_sentence(name):
    analysis = analysis_of(name)
    (line,) = [a for a in analysis.answers if a.topic == "bytes"]
    assert line.code == "byte_classes" and line.message == analysis.byte_classes[0].message


def test_streamed_from_kernel_phases_is_the_whole_frames(monkeypatch):
    """The streamed full analysis (test_bounded_memory's way) gives the same section on the capture
    without NVTX, whose phases come from the kernels (the NVTX ones are in FULL_FIXTURES there)."""
    from test_bounded_memory import chunk_rowids, full_documents

    path = FIXTURES / "torch_bytes_nonvtx_v25.sqlite"
    whole, streamed = full_documents(path, chunk_rowids(path), monkeypatch)
    assert whole["byte_classes"] and streamed["byte_classes"] == whole["byte_classes"]
    assert streamed == whole


def test_no_phases_no_section():
    assert analysis_of("known_mem_v25").byte_classes == []  # steps, but no forward/backward in them
    assert analysis_of("real_oom_v25").byte_classes == []


_framed: dict = {}


@pytest.mark.parametrize("name", ["torch_bytes_exact_v25", "ddp_leak_v25"])
@pytest.mark.parametrize("look_back", [LOOK_BACK_ROWS, 0])
def test_outside_rows_judge_as_the_allocators_do(name, look_back, monkeypatch):
    """OutsideRows (ByteClassSums judges only the allocations it reads) answers what AllocatorRows
    judges of every allocation, across cuts: cuBLAS's workspaces of the exact run are 153 odd
    sizes and 56 blocks made right after one (two ranks of the DDP run: 8 and 4), found looking
    back a few rows at a time or (look_back 0) all at once."""
    monkeypatch.setattr(allocators, "LOOK_BACK_ROWS", look_back)
    if name not in _framed:
        _framed[name] = nsysan.analyze(FIXTURES / f"{name}.sqlite", keep_events=True).events
    events = _framed[name]
    whole = frame_batch(events)
    rows, _, _, bits = AllocatorRows([]).of(whole)
    expected = {"torch_bytes_exact_v25": (153, 56), "ddp_leak_v25": (8, 4)}[name]
    odd = whole.bytes[rows] % SEGMENT_ALIGN != 0
    outside = (bits & OUTSIDE) != 0
    assert (int(odd.sum()), int((outside & ~odd).sum())) == expected
    n = len(whole)
    for bounds in ((), range(0, n, max(1, n // 7)), range(0, n, 3), range(0, n, 50)):
        judge, found = OutsideRows(), []
        for piece in pieces(frame_batch(events), list(bounds)):
            chosen = np.flatnonzero(piece.is_alloc)  # every allocation, the judged and the others
            found.append(piece.seq[chosen[judge.of(piece, chosen)]])
        assert np.concatenate(found).tolist() == whole.seq[rows[outside]].tolist()
