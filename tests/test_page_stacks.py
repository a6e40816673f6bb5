"""What was live at a moment, by call stack (issue 29): the model's live set of each peak and its
never-freed blocks summed by stack (`Peak.live_stacks`, `Analysis.never_freed_stacks`), the page's
flame graph (icicle) drawn from them, the click list counted over what was live, and the hover
that shows an allocation's call stack, user frames first."""

from __future__ import annotations

from conftest import analysis_of, truth

MiB = 1 << 20


def test_the_live_set_at_the_peak_by_stack_sums_to_the_peak():
    # known_bt_v25's peak is in `burst`: alloc_workspace's 512 MiB block with both of
    # alloc_weights' (256 + 128 MiB), by the truth file
    analysis = analysis_of("known_bt_v25")
    peak = analysis.peak
    made = {}
    for row in truth("known_bt_v25"):
        if row.get("truth") == "cudaMalloc" and (row["site"] == "alloc_weights" or row["bytes"] == 512 * MiB):
            made[row["site"]] = made.get(row["site"], 0) + row["bytes"]
    by_site = {s.site: (s.bytes, s.count) for s in peak.live_stacks}
    assert by_site["alloc_workspace (known)"] == (made["alloc_workspace"], 1) == (512 * MiB, 1)
    assert by_site["alloc_weights (known)"] == (made["alloc_weights"], 2) == (384 * MiB, 2)
    assert all(s.stack_id is not None for s in peak.live_stacks)  # every block was captured with its stack
    assert {s.id for s in analysis.stacks} >= {s.stack_id for s in peak.live_stacks}
    assert sum(s.bytes for s in peak.live_stacks) + peak.pool_reserve_bytes == peak.peak_bytes == 952_107_008
    assert sum(s.count for s in peak.live_stacks) == peak.live_count


def test_every_block_live_at_the_peak_counts_not_only_the_listed_ones():
    # torch_pybt_v25: 1,365 allocations live at the peak; the page carries the 300 largest
    analysis = analysis_of("torch_pybt_v25")
    peak = analysis.peak
    assert peak.live_count == 1365 and len(analysis.timeline.allocations) == 300
    assert sum(s.bytes for s in peak.live_stacks) == peak.peak_bytes == 4_916_874_581
    assert sum(s.count for s in peak.live_stacks) == 1365
    assert sum(s.bytes for s in analysis.never_freed_stacks) == analysis.never_freed_bytes == 4_915_988_480
    sizes = [s.bytes for s in peak.live_stacks]
    assert sizes == sorted(sizes, reverse=True)
