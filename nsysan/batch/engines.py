"""Where the analyses run: in this process (-j 1), a local process pool, or a Dask cluster.

Each engine runs at most `jobs` analyses at once and hands every result to `on_done` as soon as it
arrives, so a batch of thousands of reports holds `jobs` analyses in memory, not thousands, and a
Ctrl-C loses only the ones running. As many more wait queued (a path each, no memory to speak of),
so a worker that finishes starts its next report at once instead of waiting for this process to
hear of it and submit one: with reports of a tenth of a second, that round trip was a large part
of each. A worker that dies (killed for memory, say) fails its
report's row, not the batch.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from ..errors import NsysanError, one_line
from .worker import analyze_one

OnDone = Callable[[dict[str, Any]], None]
# Reports handed to the engine per analysis it runs at once: one running, one queued behind it.
QUEUED_PER_WORKER = 2
DASK_MISSING = "--dask needs Dask distributed, an optional extra: pip install 'nsysan[dask]'"


def default_jobs() -> int:
    """The cores this process may use (its CPU affinity, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def run_all(paths: list[Path], on_done: OnDone, *, jobs: int, dask: Optional[str] = None,
            nsys: Optional[str] = None, cache_dir: Optional[str] = None) -> None:
    """Analyze every path, calling `on_done(result)` per report in completion order."""
    if not dask and (jobs <= 1 or len(paths) <= 1):
        for path in paths:
            on_done(analyze_one(str(path), nsys, cache_dir))
        return
    # Each of `jobs` analyses at once gets its share of this machine's cores (a remote Dask
    # worker has one thread per task: one analysis per thread, its share of its machine).
    ours = not dask or dask == "local"  # worker processes nsysan starts (their allocator is tuned)
    threads = max(1, default_jobs() // jobs) if ours else 1
    args = (nsys, cache_dir, threads, ours)
    if dask:
        _on_dask(paths, on_done, jobs, dask, args)
    else:
        _on_local_pool(paths, on_done, jobs, args)


def _failed(path: Path, why: str) -> dict[str, Any]:
    return {"path": str(path), "ok": False, "hash": None, "document": None, "error": why, "seconds": None}


def _on_local_pool(paths: list[Path], on_done: OnDone, jobs: int, args: tuple) -> None:
    methods = multiprocessing.get_all_start_methods()
    # forkserver: workers fork from a clean server that imported nsysan once (no threads of this
    # process, no half-held locks), and start in milliseconds instead of a second per import.
    context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    if context.get_start_method() == "forkserver":
        context.set_forkserver_preload(["nsysan.batch.worker", "nsysan.pipeline"])
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(paths)), mp_context=context)
    todo = iter(paths)
    running: dict[Future, Path] = {}

    def fill() -> None:
        for path in todo:
            running[pool.submit(analyze_one, str(path), *args)] = path
            if len(running) >= QUEUED_PER_WORKER * jobs:
                return

    try:
        fill()
        while running:
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                path = running.pop(future)
                try:
                    result = future.result()
                except Exception as err:  # BrokenProcessPool: the worker died under this report
                    result = _failed(path, f"{path.name}: the worker analyzing it died ({type(err).__name__}: "
                                           f"{one_line(str(err))[:120]}); it may have run out of memory")
                on_done(result)
            fill()
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def _dask_client(address: str, jobs: int) -> tuple[Any, Any, int]:
    """(client, cluster or None, how many analyses run at once there)."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise NsysanError(DASK_MISSING) from None
    if address == "local":
        import dask

        # processes, one thread each (an analysis holds the GIL between its numpy calls), on the
        # loopback interface only: nothing listens on the network. Forked from a forkserver that
        # imported distributed, numpy and pandas once, as the local pool's are: spawned workers
        # imported them anew and took 1.5 s to stop at the end, forked ones stop in 0.1 s.
        method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
        with dask.config.set({"distributed.worker.multiprocessing-method": method}):
            cluster = LocalCluster(n_workers=jobs, threads_per_worker=1, processes=True, host="127.0.0.1",
                                   dashboard_address=None, silence_logs=logging.ERROR)
        return Client(cluster), cluster, jobs
    try:
        client = Client(address, timeout="20s")
    except (OSError, TimeoutError, ValueError) as err:
        raise NsysanError(f"could not reach the Dask scheduler at {address} ({type(err).__name__}: "
                          f"{one_line(str(err))[:160]})") from err
    threads = sum(client.nthreads().values()) or jobs
    return client, None, threads


def _on_dask(paths: list[Path], on_done: OnDone, jobs: int, address: str, args: tuple) -> None:
    client, cluster, window = _dask_client(address, jobs)
    from distributed import as_completed

    todo: Iterator[tuple[int, Path]] = iter(enumerate(paths))
    owner: dict[str, tuple[Any, Path]] = {}  # the futures in flight, by key

    def submit(index: int, path: Path):
        future = client.submit(analyze_one, str(path), *args, pure=False, key=f"nsysan-analyze-{index}")
        owner[future.key] = (future, path)
        return future

    try:
        first = [submit(i, p) for _, (i, p) in zip(range(QUEUED_PER_WORKER * window), todo)]
        queue = as_completed(first)
        for future in queue:
            _, path = owner.pop(future.key)
            try:
                result = future.result()
            except Exception as err:  # the worker died, or the task could not run there
                result = _failed(path, f"{path.name}: the Dask task failed ({type(err).__name__}: "
                                       f"{one_line(str(err))[:160]})")
            future.release()
            on_done(result)
            for index, path in todo:
                queue.add(submit(index, path))
                break
    finally:
        if owner:  # interrupted: the analyses still in flight are dropped
            client.cancel([future for future, _ in owner.values()])
        client.close()
        if cluster is not None:
            cluster.close()
