"""One analysis alone, then two at once in two processes (one reader thread each, as `nsysan batch
-j 2` runs them), twice: the CPU seconds and wall seconds of each.

    flock /tmp/nsysan-bench.lock python benchmarks/side_by_side.py [benchmarks/data/big_1000000.sqlite]

If the CPU time per analysis grows when two run together, the cores share something (cache,
memory bandwidth) that caps any pool. If the wall time of two at once is twice that of one, the
two processes together got no more of the machine than one did: on a kernel with
`sched_autogroup_enabled = 1` the cores are shared between sessions, not processes, and other
sessions were busy.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def analyze_timed(path: str, results: "multiprocessing.Queue") -> None:
    from nsysan.pipeline.report_or_document import load_or_analyze
    from nsysan.runtime.malloc_tuning import avoid_transparent_huge_pages, keep_large_arrays_on_the_heap
    from nsysan.sources.reader import limit_threads

    keep_large_arrays_on_the_heap()
    avoid_transparent_huge_pages()
    limit_threads(1)
    load_or_analyze(Path(path))  # warm: imports and the page cache
    cpu, wall = time.process_time(), time.perf_counter()
    load_or_analyze(Path(path))
    results.put((time.process_time() - cpu, time.perf_counter() - wall))


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "benchmarks" / "data" / "big_1000000.sqlite")
    autogroup = Path("/proc/sys/kernel/sched_autogroup_enabled")
    print(f"sched_autogroup_enabled: {autogroup.read_text().strip() if autogroup.exists() else 'n/a'}")
    context = multiprocessing.get_context("forkserver")
    for at_once in (1, 2, 1, 2):
        results = context.Queue()
        workers = [context.Process(target=analyze_timed, args=(path, results)) for _ in range(at_once)]
        for worker in workers:
            worker.start()
        measured = [results.get() for _ in workers]
        for worker in workers:
            worker.join()
        print(f"{at_once} at once: CPU s {[round(c, 2) for c, _ in measured]}, wall s "
              f"{[round(w, 2) for _, w in measured]}, load {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
