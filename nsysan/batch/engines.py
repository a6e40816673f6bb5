"""Where the analyses run: in this process (-j 1), a local process pool, or a Dask cluster.

Each engine runs at most `jobs` analyses at once and hands every result to `on_done` as soon as it
arrives, so a batch of thousands of reports holds `jobs` analyses in memory, not thousands, and a
Ctrl-C loses only the ones running. As many more wait queued (a path each, no memory to speak of),
so a worker that finishes starts its next report at once instead of waiting for this process to
hear of it and submit one: with reports of a tenth of a second, that round trip was a large part
of each. A worker that dies (killed for memory, say) fails its
report's row, not the batch. The largest reports go first, so the batch doesn't end waiting on
one large analysis while the other workers have nothing left to do.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from ..runtime import memory_budget
from ..errors import NsysanError, one_line
from .lifetime import quiet_resource_tracker, stop_processes, worker_initializer
from .worker import TUNE_PROCESS, TUNE_TASK, analyze_one, analyze_some

OnDone = Callable[[dict[str, Any]], None]
# Reports handed to the engine per analysis it runs at once: one running, one queued behind it.
QUEUED_PER_WORKER = 2
# A Dask task costs about as much as the analysis of a small report (its round trip through the
# scheduler, the worker's and the client's bookkeeping: measured here, 200 reports of 300 kB,
# 5 CPU s more than the local pool in all). Reports under SMALL_REPORT_BYTES go up to
# SMALL_PER_TASK to a task, as long as every worker thread still gets TASKS_PER_THREAD tasks
# or more, so the last ones still spread over the workers.
SMALL_REPORT_BYTES = 4 << 20
SMALL_PER_TASK = 4
TASKS_PER_THREAD = 8
# What the fork servers of nsysan's own workers import before forking any: the allocator settings
# first, before anything that could start a thread (forkserver_tuning.py says why), then the
# analysis, so no worker imports it for its first report.
WORKER_PRELOAD = ["nsysan.batch.forkserver_tuning", "nsysan.batch.worker", "nsysan.pipeline.stages"]
# How long `--dask tcp://...` tries to reach its scheduler before the batch stops with one line.
DASK_CONNECT_TIMEOUT = "20s"
DASK_MISSING = "--dask needs Dask distributed, an optional extra: pip install 'nsysan[dask]'"


def default_jobs() -> int:
    """The cores this process may use (its CPU affinity, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def run_all(paths: list[Path], on_done: OnDone, *, jobs: int, dask: Optional[str] = None,
            nsys: Optional[str] = None, cache_dir: Optional[str] = None,
            max_memory: Optional[int] = None, step_range: Optional[str] = None,
            logs: Optional[dict] = None) -> None:
    """Analyze every path, calling `on_done(result)` per report in completion order;
    `max_memory`: bytes each analysis may take (None: on this machine, its share of half the
    memory nsysan may use; on a Dask cluster's worker, half of what that worker may use);
    `logs`: str(path) -> its program's logs (worker.analyze_one)."""
    if not dask and (jobs <= 1 or len(paths) <= 1):
        for path in paths:
            on_done(analyze_one(str(path), nsys, cache_dir, max_memory=max_memory, step_range=step_range,
                                logs=logs))
        return
    # Each of `jobs` analyses at once gets its share of this machine's cores (a remote Dask
    # worker has one thread per task: one analysis per thread, its share of its machine).
    ours = not dask or dask == "local"  # worker processes nsysan starts (their allocator is tuned)
    threads = max(1, default_jobs() // jobs) if ours else 1
    # `jobs` analyses at once on this machine share its memory; a cluster's worker knows its own.
    budget = max_memory if max_memory is not None or not ours else memory_budget.default_budget(jobs)
    if ours and cache_dir is None:
        # Named here: the pool's workers fork from a server started with the environment of the
        # first batch of this process, so they would not see a later $NSYSAN_CACHE_DIR.
        from ..sources.export import resolve_cache_dir

        cache_dir = str(resolve_cache_dir())
    args = (nsys, cache_dir, threads, TUNE_PROCESS if ours else TUNE_TASK, budget, step_range, logs or {})
    paths = largest_first(paths)
    if ours and os.name == "posix":
        quiet_resource_tracker()
    if dask:
        _on_dask(paths, on_done, jobs, dask, args)
    else:
        _on_local_pool(paths, on_done, jobs, args)


def _size(path: Path) -> int:
    """The file's size, -1 when it can't be read (it fails at once on the worker)."""
    try:
        return path.stat().st_size
    except (OSError, ValueError):  # ValueError: a NUL in a listed name
        return -1


def largest_first(paths: list[Path]) -> list[Path]:
    """The paths by size, largest first (the input order among equals; an unreadable one last)."""
    return sorted(paths, key=lambda path: -_size(path))


def dask_tasks(paths: list[Path], threads: int) -> list[list[Path]]:
    """The reports of each Dask task, in order: a large report alone, small ones a few together."""
    def is_small(path: Path) -> bool:
        return _size(path) < SMALL_REPORT_BYTES
    small = sum(1 for path in paths if is_small(path))
    per_task = max(1, min(SMALL_PER_TASK, small // max(1, threads * TASKS_PER_THREAD)))
    tasks: list[list[Path]] = []
    for path in paths:
        if is_small(path) and tasks and len(tasks[-1]) < per_task and is_small(tasks[-1][0]):
            tasks[-1].append(path)
        else:
            tasks.append([path])
    return tasks


def _failed(path: Path, why: str) -> dict[str, Any]:
    return {"path": str(path), "ok": False, "hash": None, "document": None, "error": why, "seconds": None}


def _on_local_pool(paths: list[Path], on_done: OnDone, jobs: int, args: tuple) -> None:
    methods = multiprocessing.get_all_start_methods()
    # forkserver: workers fork from a clean server that imported nsysan once (no threads of this
    # process, no half-held locks), and start in milliseconds instead of a second per import.
    context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    if context.get_start_method() == "forkserver":
        context.set_forkserver_preload(WORKER_PRELOAD)
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(paths)), mp_context=context,
                               initializer=worker_initializer)
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
    except BaseException:  # Ctrl-C, SIGTERM, a database that can't be written: no worker outlives the batch
        # The pool's only handle on its workers, and every process this one started (a worker whose
        # start the interrupt cut short is not in the pool's list yet).
        workers = {*(getattr(pool, "_processes", None) or {}).values(), *multiprocessing.active_children()}
        pool.shutdown(wait=False, cancel_futures=True)
        stop_processes(workers)
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
        # imported distributed and nsysan's analysis once, as the local pool's are: spawned workers
        # imported them anew and took 1.5 s to stop at the end, forked ones stop in 0.1 s, and
        # their first task no longer imports nsysan. No statistical profiler in the workers
        # (it samples every thread's stack every 10 ms, for a dashboard nobody opens here).
        # Its logs silenced up to CRITICAL: a Ctrl-C makes the scheduler log the tasks it drops
        # ("Couldn't gather keys") after `nsysan: interrupted`; a task that fails is its rows' error.
        forkserver = "forkserver" in multiprocessing.get_all_start_methods()
        with dask.config.set({"distributed.worker.multiprocessing-method": "forkserver" if forkserver else "spawn",
                              "distributed.worker.profile.enabled": False}):
            if forkserver:
                _preload_nsysan_in_dask_forkserver()
            # The scheduler serves HTTP (its health routes) even without a dashboard, on 8787 by
            # default: when another cluster holds that port Dask warns on stderr. Any free port of
            # the loopback interface, and no dashboard on it.
            cluster = LocalCluster(n_workers=jobs, threads_per_worker=1, processes=True, host="127.0.0.1",
                                   dashboard_address="127.0.0.1:0", scheduler_kwargs={"dashboard": False},
                                   silence_logs=logging.CRITICAL)
        return Client(cluster), cluster, jobs
    try:
        client = Client(address, timeout=DASK_CONNECT_TIMEOUT)
    except (OSError, TimeoutError, ValueError) as err:
        raise NsysanError(f"could not reach the Dask scheduler at {address} ({type(err).__name__}: "
                          f"{one_line(str(err))[:160]})") from err
    threads = sum(client.nthreads().values()) or jobs
    return client, None, threads


def _preload_nsysan_in_dask_forkserver() -> None:
    """Dask's fork server imports distributed and the packages it knows of; nsysan's worker and
    analysis (with numpy, pandas and pyarrow) too, so no worker imports them for its first task."""
    from distributed.utils import get_mp_context

    # Dask sets its list the first time it asks for the context: ask first, then replace it.
    get_mp_context().set_forkserver_preload([WORKER_PRELOAD[0], "distributed", *WORKER_PRELOAD[1:]])


def _on_dask(paths: list[Path], on_done: OnDone, jobs: int, address: str, args: tuple) -> None:
    client, cluster, window = _dask_client(address, jobs)
    from distributed import as_completed

    todo: Iterator[tuple[int, list[Path]]] = iter(enumerate(dask_tasks(paths, window)))
    owner: dict[str, tuple[Any, list[Path]]] = {}  # the futures in flight, by key

    def submit(index: int, reports: list[Path]):
        future = client.submit(analyze_some, [str(p) for p in reports], *args, pure=False,
                               key=f"nsysan-analyze-{index}")
        owner[future.key] = (future, reports)
        return future

    try:
        first = [submit(i, p) for _, (i, p) in zip(range(QUEUED_PER_WORKER * window), todo)]
        queue = as_completed(first)
        for future in queue:
            _, reports = owner.pop(future.key)
            try:
                results = future.result()
            except Exception as err:  # the worker died, or the task could not run there
                results = [_failed(path, f"{path.name}: the Dask task failed ({type(err).__name__}: "
                                         f"{one_line(str(err))[:160]})") for path in reports]
            future.release()
            for index, more in todo:  # the next task first: the worker may be waiting for it
                queue.add(submit(index, more))
                break
            for result in results:
                on_done(result)
    finally:
        if owner:  # interrupted: the analyses still in flight are dropped
            client.cancel([future for future, _ in owner.values()])
        client.close()
        if cluster is not None:
            cluster.close()
