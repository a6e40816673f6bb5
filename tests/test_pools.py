"""Stream-ordered memory pools: reserve over time, and the reserve counted in the peak (issue 17, section 3)."""

from __future__ import annotations

import sqlite3

import pytest

from builders import GLOBAL_PID, make_export
from conftest import FIXTURES, truth

import nsysan
from nsysan.pipeline import stages as pipeline

MiB = 1 << 20
POOL = 0x7F0000000000


def test_known_mem_pool_reserve_next_to_what_it_hands_out(known_mem_v25):
    (pool,) = known_mem_v25.reserved.pools
    # the export's own record of the pool's size, read here without nsysan
    with sqlite3.connect(FIXTURES / "known_mem_v25.sqlite") as conn:
        (highest,) = conn.execute("SELECT max(localMemoryPoolSize) FROM CUDA_GPU_MEMORY_USAGE_EVENTS").fetchone()
        (address,) = conn.execute("SELECT DISTINCT localMemoryPoolAddress FROM CUDA_GPU_MEMORY_USAGE_EVENTS "
                                  "WHERE localMemoryPoolAddress IS NOT NULL").fetchone()
    assert pool.peak_reserved_bytes == highest == 64 * MiB and pool.address == address
    # known_allocs.cu frees each cudaMallocAsync block before the next: at most the largest is out
    asyncs = [r["bytes"] for r in truth("known_mem_v25") if r.get("truth") == "cudaMallocAsync"]
    assert pool.peak_used_bytes == max(asyncs)
    # the default pool's release threshold is 0: trimmed to nothing at the next synchronize
    assert pool.trims == 1 and pool.end_reserved_bytes == 0 and pool.pool_type == "local"
    assert pool.created_ns is not None and len(pool.ts_ns) == len(pool.reserved_bytes) == len(pool.used_bytes)
    # the burst peak comes after the trim: no reserve in it
    assert known_mem_v25.peak.peak_bytes == 952107008 and known_mem_v25.peak.pool_reserve_bytes == 0


def test_unused_pool_is_listed_not_counted(ddp_leak_v25):
    # NCCL's cudaMemPoolCreate pools report 32 MiB and hand nothing out
    assert {(p.pid, p.peak_reserved_bytes, p.peak_used_bytes) for p in ddp_leak_v25.reserved.pools} == {
        (2146, 32 * MiB, 0), (2147, 32 * MiB, 0)}
    assert all(p.pool_reserve_bytes == 0 for p in ddp_leak_v25.peaks)


def _pool_export(tmp_path):
    """A 100 MiB cudaMalloc, then an 8 MiB cudaMallocAsync from a pool that reserves 32 MiB,
    trimmed after its free; then a 120 MiB cudaMalloc."""
    memory = [(1000, 0x1000000, 100 * MiB, 0, 1), (9000, 0x9000000, 120 * MiB, 0, 5)]
    calls = [(1000, 1010, "cudaMalloc_v3020", 1), (2000, 2010, "cudaMallocAsync_v11020", 2),
             (3000, 3010, "cudaFreeAsync_v11020", 3), (4000, 4010, "cudaStreamSynchronize_v3020", 4),
             (9000, 9010, "cudaMalloc_v3020", 5)]
    path = make_export(tmp_path / "pool.sqlite", memory=memory, calls=calls)
    with sqlite3.connect(path) as conn:
        for column in ("localMemoryPoolReleaseThreshold", "localMemoryPoolSize", "localMemoryPoolUtilizedSize"):
            conn.execute(f"ALTER TABLE CUDA_GPU_MEMORY_USAGE_EVENTS ADD COLUMN {column} INTEGER")
        for start, op, corr in ((2005, 0, 2), (3005, 1, 3)):
            conn.execute("INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS (start, globalPid, deviceId, contextId, address, "
                         "pc, bytes, memKind, memoryOperationType, correlationId, localMemoryPoolAddress, "
                         "localMemoryPoolSize, localMemoryPoolUtilizedSize) VALUES (?, ?, 0, 1, ?, 0, ?, 2, ?, ?, ?, ?, ?)",
                         (start, GLOBAL_PID, POOL, 8 * MiB, op, corr, POOL, 32 * MiB, 8 * MiB))
        conn.execute("CREATE TABLE CUDA_GPU_MEMORY_POOL_EVENTS (start INTEGER NOT NULL, globalPid INTEGER NOT NULL, "
                     "deviceId INTEGER NOT NULL, address INTEGER NOT NULL, operationType INTEGER NOT NULL, "
                     "poolType INTEGER NOT NULL, correlationId INTEGER, minBytesToKeep INTEGER, "
                     "localMemoryPoolReleaseThreshold INTEGER, localMemoryPoolSize INTEGER, "
                     "localMemoryPoolUtilizedSize INTEGER)")
        conn.executemany("INSERT INTO CUDA_GPU_MEMORY_POOL_EVENTS VALUES (?, ?, 0, ?, ?, 1, ?, NULL, 0, ?, 0)",
                         [(2001, GLOBAL_PID, POOL, 1, 2, 32 * MiB), (4005, GLOBAL_PID, POOL, 3, 4, 0)])
    return path


def test_pool_reserve_counts_in_the_peak(tmp_path):
    analysis = nsysan.analyze(_pool_export(tmp_path))
    (pool,) = analysis.reserved.pools
    assert (pool.peak_reserved_bytes, pool.peak_used_bytes, pool.trims, pool.end_reserved_bytes) == (
        32 * MiB, 8 * MiB, 1, 0)
    assert pool.ts_ns == [2001, 2005, 3005, 4005] and pool.reserved_bytes == [32 * MiB, 32 * MiB, 32 * MiB, 0]
    # while the pool holds 32 MiB: 100 + 32 MiB (not 100 + 8); after the trim 100 + 120 MiB wins
    assert analysis.peak.peak_bytes == 220 * MiB and analysis.peak.pool_reserve_bytes == 0
    # without the 120 MiB block the pool's moment is the peak
    with sqlite3.connect(tmp_path / "pool.sqlite") as conn:
        conn.execute("DELETE FROM CUDA_GPU_MEMORY_USAGE_EVENTS WHERE bytes = ?", (120 * MiB,))
    analysis = nsysan.analyze(tmp_path / "pool.sqlite")
    assert analysis.peak.peak_bytes == 132 * MiB and analysis.peak.pool_reserve_bytes == 24 * MiB


def test_pool_without_recorded_size_changes_no_peak(tmp_path):
    # the same export with localMemoryPoolSize NULL (as in exports that leave it out): the pool
    # is listed with no reserve, and the peak is what the events say
    path = _pool_export(tmp_path)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE CUDA_GPU_MEMORY_USAGE_EVENTS SET localMemoryPoolSize = NULL")
        conn.execute("UPDATE CUDA_GPU_MEMORY_POOL_EVENTS SET localMemoryPoolSize = NULL")
        conn.execute("DELETE FROM CUDA_GPU_MEMORY_USAGE_EVENTS WHERE bytes = ?", (120 * MiB,))
    analysis = nsysan.analyze(path)
    assert analysis.reserved.pools[0].peak_reserved_bytes == 0
    assert analysis.peak.peak_bytes == 108 * MiB and analysis.peak.pool_reserve_bytes == 0


@pytest.mark.parametrize("streamed", [False, True])
def test_peak_made_by_a_pool_created_inside_cudamallocasync_is_timed_at_the_creation(tmp_path, monkeypatch, streamed):
    """The pool is created (reserve 32 MiB) at 2001 ns, inside the cudaMallocAsync of 2000-2010; the
    allocation's own event comes at 2005. Without the 120 MiB block the peak (100 + 32 MiB) was
    reached at the creation: the level did not move at 2005 (8 MiB handed out of the reserve)."""
    path = _pool_export(tmp_path)
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM CUDA_GPU_MEMORY_USAGE_EVENTS WHERE bytes = ?", (120 * MiB,))
    if streamed:
        from test_bounded_memory import streaming_from

        streaming_from(1, monkeypatch)
    analysis = pipeline.analyze_report(path, keep_events=not streamed)
    assert analysis.peak.peak_bytes == 132 * MiB and analysis.peak.peak_time_ns == 2001


def test_pytorch_cudamallocasync_backend_is_a_pool_with_its_end_reserve():
    """torch_async_v25: PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync. The pool's reserve after
    the last step is PyTorch's reserved (truth: 3,489,660,928 B from step 1 on)."""
    from conftest import analysis_of

    analysis = analysis_of("torch_async_v25")
    reserved = [r["reserved"] for r in truth("torch_async_v25") if r.get("step", -1) >= 0]
    (pool,) = [p for p in analysis.reserved.pools if p.peak_used_bytes]
    assert pool.end_reserved_bytes == pool.peak_reserved_bytes == reserved[-1] == 3_489_660_928
    assert analysis.reserved.allocators == []  # not PyTorch's caching allocator's segments
    note = next(d.message for d in analysis.diagnostics if d.code == "caching_allocator")
    assert "stream-ordered memory pool" in note and "3.2 GiB was still reserved at the end of the run" in note
    assert "segments it got from cudaMalloc" not in note
    import io

    from rich.console import Console

    from nsysan.render.terminal import render_terminal

    console = Console(width=200, record=True, file=io.StringIO())
    render_terminal(analysis, console)
    first = " ".join(console.export_text().split("Peak GPU memory")[0].split())
    assert "a memory pool on GPU 0 reserved up to 3.2 GiB" in first and "3.2 GiB still reserved at the end" in first


def test_the_page_says_the_async_backends_pool_kept_its_reserve():
    from conftest import analysis_of

    from nsysan.render.html import render_html

    page = render_html(analysis_of("torch_async_v25"))
    verdict = page[page.index('id="verdict-never-freed"'):].split("</li>")[0]
    assert "Its memory pool on GPU 0 (cudaMallocAsync) still held 3.2 GiB reserved at the end" in verdict
    assert "empty_cache" not in verdict
