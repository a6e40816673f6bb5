"""Edge cases on tiny hand-made exports: address reuse, pre-capture frees, ties, row order."""

from __future__ import annotations

import nsysan
import pytest
from builders import make_export

MiB = 1 << 20


def analyze(tmp_path, **tables):
    return nsysan.analyze(make_export(tmp_path / "tiny.sqlite", **tables))


def mallocs(*rows):
    """API rows for (start, corr, name) triples."""
    return [(start, start + 10, name, corr) for start, corr, name in rows]


def test_free_before_any_alloc_is_allocated_before_capture(tmp_path):
    a = analyze(tmp_path,
                memory=[(100, 0xA000, 8 * MiB, 1, 1), (200, 0xB000, 1 * MiB, 0, 2)],
                calls=mallocs((100, 1, "cudaFree_v3020"), (200, 2, "cudaMalloc_v3020")))
    (group,) = a.groups
    assert (group.frees_without_alloc, group.frees_without_alloc_bytes) == (1, 8 * MiB)
    assert group.peak_bytes == 1 * MiB  # the orphan free does not drive live bytes below zero
    assert group.end_bytes == 1 * MiB
    assert any(d.code == "allocated_before_capture" for d in a.diagnostics)


def test_address_reuse_and_double_free(tmp_path):
    memory = [(100, 0xA000, 4 * MiB, 0, 1), (200, 0xA000, 4 * MiB, 1, 2),  # alloc, free
              (300, 0xA000, 2 * MiB, 0, 3), (400, 0xA000, 2 * MiB, 1, 4),  # same address again
              (500, 0xA000, 2 * MiB, 1, 5)]                                  # a second free: orphan
    a = analyze(tmp_path, memory=memory)
    (group,) = a.groups
    assert (group.allocations, group.frees, group.frees_without_alloc) == (2, 3, 1)
    assert (group.peak_bytes, group.end_bytes, group.never_freed_count) == (4 * MiB, 0, 0)


def test_free_and_alloc_at_the_same_ns_never_overstate_the_peak(tmp_path):
    # Block A is freed and block B allocated at the same nanosecond: the peak is one block.
    memory = [(100, 0xA000, 8 * MiB, 0, 1), (200, 0xB000, 8 * MiB, 0, 3), (200, 0xA000, 8 * MiB, 1, 2)]
    a = analyze(tmp_path, memory=memory)
    assert a.groups[0].peak_bytes == 8 * MiB
    assert a.peak.peak_time_ns == 100


def test_rows_out_of_time_order_are_sorted(tmp_path):
    memory = [(300, 0xA000, 1 * MiB, 1, 3), (100, 0xA000, 1 * MiB, 0, 1), (200, 0xB000, 2 * MiB, 0, 2)]
    a = analyze(tmp_path, memory=memory)
    (group,) = a.groups
    assert (group.peak_bytes, group.peak_time_ns, group.end_bytes) == (3 * MiB, 200, 2 * MiB)
    assert [x.address for x in a.never_freed] == [0xB000]


def test_static_memory_is_not_a_leak(tmp_path):
    a = analyze(tmp_path, memory=[(100, 0xA000, 4096, 0, 0, 5)])  # memKind 5 = Device Static
    assert a.never_freed == [] and a.never_freed_total == 0
    assert a.groups[0].kind == "static" and a.peak.peak_bytes == 4096
    assert a.events["api"].astype(str).tolist() == ["(module load)"]


def test_kinds_are_grouped_apart(tmp_path):
    memory = [(100, 0xA000, 1 * MiB, 0, 1, 2), (110, 0xB000, 2 * MiB, 0, 2, 1), (120, 0xC000, 3 * MiB, 0, 3, 4)]
    a = analyze(tmp_path, memory=memory,
                calls=mallocs((100, 1, "cudaMalloc_v3020"), (110, 2, "cudaHostAlloc_v3020"),
                              (120, 3, "cudaMallocManaged_v6000")))
    kinds = {g.kind: g.peak_bytes for g in a.groups}
    assert kinds == {"device": 1 * MiB, "pinned": 2 * MiB, "managed": 3 * MiB}
    assert a.peak.peak_bytes == 1 * MiB  # pinned (host) and managed memory are not GPU-resident peaks


def test_api_suffixes_and_lookalikes(tmp_path):
    # cudaFreeHost must not count as cudaFree, cudaMallocAsync not as cudaMalloc.
    calls = mallocs((100, 1, "cudaMalloc_v3020"), (110, 2, "cudaFreeHost_v3020"),
                    (120, 3, "cudaMallocAsync_ptsz_v11020"), (130, 4, "cudaFree_v3020"),
                    (140, 5, "cuMemAlloc_v2"), (150, 6, "cudaLaunchKernel_v7000"))
    a = analyze(tmp_path, calls=calls, memory_table=False)
    assert {c.api: c.family for c in a.api_calls} == {
        "cudaMalloc": "alloc", "cudaFreeHost": "free", "cudaMallocAsync": "alloc", "cudaFree": "free",
        "cuMemAlloc": "alloc"}


def test_nested_nvtx_ranges_give_innermost_and_path(tmp_path):
    nvtx = [(0, 1000, "train"), (100, 400, "step 0"), (150, 300, "forward"), (500, 900, "step 1")]
    memory = [(200, 0xA000, 1 * MiB, 0, 1), (350, 0xB000, 1 * MiB, 0, 2), (450, 0xC000, 1 * MiB, 0, 3),
              (600, 0xD000, 1 * MiB, 0, 4), (1200, 0xE000, 1 * MiB, 0, 5)]
    calls = mallocs(*[(ts, c, "cudaMalloc_v3020") for ts, _, _, _, c in memory])
    a = analyze(tmp_path, memory=memory, calls=calls, nvtx=nvtx)
    events = a.events
    assert events["nvtx_range"].astype(str).tolist() == ["forward", "step 0", "train", "step 1", ""]
    assert events["nvtx_path"].astype(str).tolist()[:2] == ["train > step 0 > forward", "train > step 0"]


def test_failed_allocation_is_reported_with_live_bytes(tmp_path):
    memory = [(100, 0xA000, 6 * MiB, 0, 1)]
    calls = [(100, 110, "cudaMalloc_v3020", 1), (200, 210, "cudaMalloc_v3020", 2, 2)]
    a = analyze(tmp_path, memory=memory, calls=calls, nvtx=[(150, 300, "fill")])
    (failed,) = a.failed_calls
    assert (failed.error, failed.live_bytes, failed.nvtx_range) == ("cudaErrorMemoryAllocation", 6 * MiB, "fill")


@pytest.mark.parametrize("rows", [[], [(100, 0xA000, 1 * MiB, 1, 1)]])
def test_no_allocations_in_the_capture(tmp_path, rows):
    a = analyze(tmp_path, memory=rows)
    assert a.peak is None or a.peak.peak_bytes == 0
    assert a.never_freed == []
