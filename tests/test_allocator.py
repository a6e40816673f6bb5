"""Reserved versus used: caching allocators, XLA preallocation, VMM without access (issue 17, section 3)."""

from __future__ import annotations

import pytest
from builders import make_export
from conftest import analysis_of, truth

import nsysan

MiB, KiB = 1 << 20, 1 << 10
# Allocated outside PyTorch's allocator on the torch captures: cuBLAS's 1 KiB + 128 KiB + 64 MiB
# workspace, once on the main thread (forward) and once on the autograd thread (backward).
OUTSIDE_TORCH = 2 * (64 * MiB + 128 * KiB + 1 * KiB)


@pytest.mark.parametrize("name, allocator", [("torch_leak_v25", "pytorch_caching"),
                                             ("torch_clean_v25", "pytorch_caching"),
                                             ("torch_expandable_v25", "pytorch_expandable")])
def test_caching_allocator_reserved_bytes_split_from_the_rest(name, allocator):
    analysis = analysis_of(name)
    (use,) = analysis.reserved.allocators
    assert use.allocator == allocator
    # what PyTorch itself reported as reserved after its last step (.truth.jsonl, memory_stats)
    last_step = [r for r in truth(name) if "step" in r][-1]
    assert use.inside_end_bytes == last_step["reserved"]
    assert use.outside_end_bytes == OUTSIDE_TORCH and use.outside_allocations == 6
    device = next(g for g in analysis.groups if g.kind == "device")
    assert use.inside_end_bytes + use.outside_end_bytes == device.end_bytes
    assert "reserved" in use.message and "not in an nsys trace" in use.message
    assert any(d.code == "caching_allocator" and d.message == use.message for d in analysis.diagnostics)


def test_no_allocator_is_claimed_for_plain_cuda(known_mem_v25, real_oom_v25):
    assert known_mem_v25.reserved.allocators == [] and real_oom_v25.reserved.allocators == []


def test_xla_preallocation_is_recognized():
    analysis = analysis_of("jax_prealloc_v25")
    (block,) = analysis.reserved.preallocations
    limit = truth("jax_prealloc_v25")[0]["bytes_limit"]  # JAX's own allocator limit: the block
    assert block.bytes == limit and block.framework == "XLA" and block.api == "cuMemSetAccess"
    assert 0.74 < block.share_of_gpu < 0.76  # XLA's default: 75 % of the GPU
    for setting in ("XLA_PYTHON_CLIENT_PREALLOCATE=false", "XLA_PYTHON_CLIENT_ALLOCATOR=platform"):
        assert setting in block.message
    assert "reservation, not the use" in block.message
    # the headline explains itself instead of a bare "(module load)"
    assert "XLA preallocated" in analysis.peak.note and "module load" in analysis.peak.note
    cap = analysis.memory_cap(block.pid, block.device)
    assert (cap.source, cap.cap_bytes) == ("xla_preallocation", limit)
    # not PyTorch: the generic "this looks like PyTorch" guess is gone
    assert all(d.code != "caching_allocator" for d in analysis.diagnostics)


def test_module_load_peaks_say_what_reached_the_level(ddp_leak_v25):
    rank0 = next(p for p in ddp_leak_v25.peaks if p.pid == 2146)
    assert rank0.api == "(module load)" and "kernel-image statics" in rank0.note


def test_vmm_memory_never_given_access_is_reported(tmp_path):
    # two cuMemCreate handles, only one mapped with access (one memory event)
    calls = [(100, 110, "cuMemCreate", 1), (120, 130, "cuMemCreate", 2), (140, 150, "cuMemMap", 3),
             (160, 170, "cuMemSetAccess", 4), (180, 190, "cuMemMap", 5)]
    memory = [(165, 0x20000000, 2 * MiB, 0, 4)]
    analysis = nsysan.analyze(make_export(tmp_path / "vmm.sqlite", memory=memory, calls=calls))
    (diagnostic,) = [d for d in analysis.diagnostics if d.code == "vmm_without_access"]
    assert "1 of its 2 cuMemCreate" in diagnostic.message and "2.0 MiB" in diagnostic.message
