"""What runs on a worker: one report in, its JSON document (or its one-line error) out.

Everything here must be importable where the workers run (a Dask worker on another machine needs
nsysan installed and the report readable at the same path) and return plain data that pickles
small: the document as text, not the `Analysis` with its events frame.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Optional

# How analyze_one treats the allocator of the process it runs in (see tune_this_process).
TUNE_PROCESS = "process"  # a worker nsysan started itself (the local pool, --dask local): tuned for good
TUNE_TASK = "task"  # a worker of a cluster nsysan was given: tuned while an analysis runs, then put back
_tuned = False


def tune_this_process() -> None:
    """The allocator settings of the `nsysan` command (reader.py: large arrays kept on the heap,
    no transparent huge pages), once per worker process. Only for workers nsysan started itself:
    the local pool and `--dask local` (a cluster's own workers get `tuned_while_running`). Without
    them a batch worker ran 1e6-event analyses no faster two at a time than the command one by one,
    and a Dask worker (whose nanny sets MALLOC_TRIM_THRESHOLD_=65536) took twice as long."""
    global _tuned
    if not _tuned:
        from ..runtime.malloc_tuning import tune_allocator

        tune_allocator()
        _tuned = True


_GLIBC_MMAP_THRESHOLD = 128 * 1024  # glibc's default, fixed once any threshold is set
_running_lock = threading.Lock()
_running = 0  # analyses now running in this process under tuned_while_running


@contextlib.contextmanager
def tuned_while_running() -> Iterator[None]:
    """On a worker of a cluster nsysan was given (`--dask tcp://...`), large arrays on the heap
    while analyses run, and the worker's own settings back when the last one ends.

    A Dask nanny starts its workers with MALLOC_TRIM_THRESHOLD_=65536, which also fixes glibc's
    mmap threshold at 128 KiB: every column of an analysis is then a fresh mapping, faulted in page
    by page and unmapped when freed. Measured on a 1e6-event export: 3.05 CPU s under the nanny's
    setting, 2.28 s with the command's. The worker keeps its setting for everything else it runs:
    afterwards the thresholds go back to the environment's (or glibc's defaults) and the freed
    heap is returned to the system, so Dask's memory monitor doesn't see the analysis's memory
    as the worker's own (`unmanaged`) for long."""
    global _running
    from ..runtime.malloc_tuning import M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, glibc
    from ..sources.reader import release_memory

    libc = glibc()
    if libc is None or not hasattr(libc, "mallopt"):
        yield
        return
    with _running_lock:
        if _running == 0:
            libc.mallopt(M_MMAP_THRESHOLD, 1 << 30)
            libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)
        _running += 1
    try:
        yield
    finally:
        with _running_lock:
            _running -= 1
            if _running == 0:
                libc.mallopt(M_TRIM_THRESHOLD, _env_bytes("MALLOC_TRIM_THRESHOLD_", _GLIBC_MMAP_THRESHOLD))
                libc.mallopt(M_MMAP_THRESHOLD, _env_bytes("MALLOC_MMAP_THRESHOLD_", _GLIBC_MMAP_THRESHOLD))
                release_memory()


def _env_bytes(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def analyze_some(paths: list[str], *args: Any) -> list[dict[str, Any]]:
    """analyze_one of each path with the same `args`, one after another: one Dask task for a few
    small reports, whose analyses take about as long as the task's own round trip through the scheduler."""
    return [analyze_one(path, *args) for path in paths]


def analyze_one(path: str, nsys: Optional[str] = None, cache_dir: Optional[str] = None,
                threads: Optional[int] = None, tune: Optional[str] = None,
                max_memory: Optional[int] = None, step_range: Optional[str] = None,
                logs: Optional[dict] = None) -> dict[str, Any]:
    """{"path", "ok", "hash", "document" (JSON text) or "error" (one line), "seconds", and for an
    analyzed report "rows" (the summary's), "tables" (nsysan.db's) and "steps" (the fleet view's,
    departure.rank_steps)}. `tune`: TUNE_PROCESS,
    TUNE_TASK or None (the allocator left as it is); `max_memory`: bytes the analysis may take
    (pipeline.analyze_report; None: its share of what the worker may use); `step_range`: the NVTX
    ranges that are steps, as in analyze;
    `logs`: report path -> the paths of its program's logs (`batch --log`), whose out-of-memory
    errors join its trace.

    Never raises for a bad report: an NsysanError becomes the row's error. Anything else is a
    bug in nsysan and is reported as such in the row, so one report can't end the batch.
    """
    from ..sources.reader import limit_threads

    limit_threads(threads)  # a few analyses side by side, each on its share of the cores
    if tune == TUNE_PROCESS:
        tune_this_process()
    with tuned_while_running() if tune == TUNE_TASK else contextlib.nullcontext():
        return _analyze(path, nsys, cache_dir, max_memory, step_range,
                        [Path(p) for p in (logs or {}).get(path, [])])


def _analyze(path: str, nsys: Optional[str], cache_dir: Optional[str], max_memory: Optional[int],
             step_range: Optional[str] = None, logs: Optional[list] = None) -> dict[str, Any]:
    from ..errors import NsysanError, one_line
    from ..pipeline.report_or_document import load_or_analyze
    from ..pipeline.cache import document_of
    from ..sources.export.input_files import file_digest
    from .database import database_rows, report_key
    from .departure import rank_steps
    from .summary import summary_rows

    started = time.perf_counter()
    result: dict[str, Any] = {"path": path, "ok": False, "hash": None, "document": None, "error": None}
    try:
        report = Path(path)
        try:  # the report's key in nsysan.db: the same bytes under another name are the same report
            result["hash"] = file_digest(report)
        except ValueError as err:  # a NUL in a name from an @list
            raise NsysanError(f"{report.name} could not be read: a file name can't hold a NUL character") from err
        except OSError as err:
            raise NsysanError(f"{report.name} could not be read: {err.strerror or err}") from err
        analysis = load_or_analyze(report, nsys=nsys, cache_dir=Path(cache_dir) if cache_dir else None,
                                   keep_events=False, max_memory=max_memory, content=result["hash"],
                                   step_range=step_range, oom_logs=logs or [])
        result["document"] = document_of(analysis)
        # The summary's and the database's rows are made here, in parallel, not by the one
        # process that gathers the results.
        result["rows"] = [dataclasses.asdict(row) for row in summary_rows(result, analysis)]
        result["tables"] = database_rows(report_key(result), analysis, report.name)
        result["steps"] = rank_steps(analysis)  # the fleet view's: which rank departed first
        result["ok"] = True
    except NsysanError as err:
        result["error"] = err.message
    except MemoryError:
        result["error"] = f"{Path(path).name}: out of memory on the worker; use fewer jobs (-j) per machine"
    except Exception as err:  # a bug in nsysan: the row says so, the batch goes on
        result["error"] = f"internal error ({type(err).__name__}: {one_line(str(err))[:200]}); please report it"
    result["seconds"] = round(time.perf_counter() - started, 3)
    return result
