"""The C allocator's settings for processes nsysan runs itself: the `nsysan` command, and the
batch workers it starts. A library must not retune its host's allocator, so nothing here runs on
import except in `nsysan.batch.forkserver_tuning`, imported only by nsysan's own fork servers.

Imports nothing heavy (no numpy): a fork server applies these settings before it imports anything
that could start a thread.
"""

from __future__ import annotations

import functools

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # glibc's mallopt parameter numbers


def tune_allocator() -> None:
    """Both settings of the `nsysan` command: large arrays kept on the heap, no transparent huge pages."""
    keep_large_arrays_on_the_heap()
    avoid_transparent_huge_pages()

def keep_large_arrays_on_the_heap() -> None:
    """For processes nsysan runs itself only (a library must not retune its host's allocator).

    Each column of a 1e7-event analysis is an 80 MB array, above glibc's largest mmap threshold
    (32 MiB): every one is a fresh mapping whose pages fault in one by one and go back to the
    system when it is freed, and an analysis makes dozens of them. Served from the heap, freed
    arrays are reused without faulting again. Measured on the 1e7-event export: `--quick` median
    of 5 runs 6.85 s instead of 7.29 s, 100 MB more peak memory; release_memory() still returns
    the heap's free memory after the big reads.

    One heap for every thread, too: glibc gives each new thread an arena of its own, so the arrays
    of the second core (the second reader, the peaks and the timeline found while the groups are
    summed) never reused what the main heap had freed, and stacked on top of it: 1e7 events, peak
    2427 MiB with per-thread arenas, 2152 MiB with one.
    """
    libc = glibc()
    if libc is None or not hasattr(libc, "mallopt"):
        return
    libc.mallopt(M_MMAP_THRESHOLD, 1 << 30)
    libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)
    libc.mallopt(M_ARENA_MAX, 1)


def avoid_transparent_huge_pages() -> None:
    """For processes nsysan runs itself only, like keep_large_arrays_on_the_heap().

    Where the kernel backs anonymous memory with 2 MiB pages whenever it can
    (transparent_hugepage=always, as on this machine and in several distributions), memory that
    the analysis frees and touches again is faulted and zeroed 2 MiB at a time: perf put 27% of
    the CPU samples of a 1e7-event `--quick` analysis in the kernel's clear_page. Without huge
    pages for this process (PR_SET_THP_DISABLE; other processes keep the system's setting),
    `nsysan analyze --quick` of that export took 5.79 s instead of 6.55 s (medians of 5,
    interleaved) at the same peak memory; the full analysis was unchanged (13.88 s against
    14.03 s, medians of 4), its lower kernel time spent again in TLB misses.
    """
    libc = glibc()
    if libc is None or not hasattr(libc, "prctl"):
        return
    pr_set_thp_disable = 41  # <linux/prctl.h>; Linux 3.15 and later, ignored (-1) before
    libc.prctl(pr_set_thp_disable, 1, 0, 0, 0)


@functools.cache  # three callers ask at start-up
def glibc():
    """The C library through ctypes when it is glibc (the one with malloc_trim), else None."""
    import ctypes

    try:
        # glibc's soname first: find_library runs `ldconfig -p` in a child process (5-7 ms of
        # the command's start, before its export: issue 31), and names this file on glibc anyway
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc's name here: ask where the C library is
        try:
            import ctypes.util

            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        except OSError:  # no C library to load (not Linux)
            return None
    return libc if hasattr(libc, "malloc_trim") else None  # glibc only
