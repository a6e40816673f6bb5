"""What runs on a worker: one report in, its JSON document (or its one-line error) out.

Everything here must be importable where the workers run (a Dask worker on another machine needs
nsysan installed and the report readable at the same path) and return plain data that pickles
small: the document as text, not the `Analysis` with its events frame.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from pathlib import Path
from typing import Any, Optional

HASH_CHUNK = 1 << 20


def content_hash(path: Path) -> str:
    """SHA-256 of the file's bytes, hex: the report's key in nsysan.db (the same report under
    another name or in another folder is the same report)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(HASH_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


_tuned = False


def tune_this_process() -> None:
    """The allocator settings of the `nsysan` command (reader.py: large arrays kept on the heap,
    no transparent huge pages), once per worker process. Only for workers nsysan started itself:
    the local pool and `--dask local`; a cluster's own workers keep their settings. Without them
    a batch worker ran 1e6-event analyses no faster two at a time than the command one by one,
    and a Dask worker (whose nanny sets MALLOC_TRIM_THRESHOLD_=65536) took twice as long."""
    global _tuned
    if not _tuned:
        from ..reader import avoid_transparent_huge_pages, keep_large_arrays_on_the_heap

        keep_large_arrays_on_the_heap()
        avoid_transparent_huge_pages()
        _tuned = True


def analyze_one(path: str, nsys: Optional[str] = None, cache_dir: Optional[str] = None,
                threads: Optional[int] = None, tune: bool = False) -> dict[str, Any]:
    """{"path", "ok", "hash", "document" (JSON text) or "error" (one line), "seconds", and for an
    analyzed report "rows" (the summary's) and "tables" (nsysan.db's)}.

    Never raises for a bad report: an NsysanError becomes the row's error. Anything else is a
    bug in nsysan and is reported as such in the row, so one report can't end the batch.
    """
    from ..errors import NsysanError, one_line
    from ..inputs import load_or_analyze
    from ..render.json import render_json
    from .database import database_rows, report_key
    from .summary import summary_rows

    from ..reader import limit_threads

    limit_threads(threads)  # a few analyses side by side, each on its share of the cores
    if tune:
        tune_this_process()
    started = time.perf_counter()
    result: dict[str, Any] = {"path": path, "ok": False, "hash": None, "document": None, "error": None}
    try:
        report = Path(path)
        try:
            result["hash"] = content_hash(report)
        except OSError as err:
            raise NsysanError(f"{report.name} could not be read: {err.strerror or err}") from err
        analysis = load_or_analyze(report, nsys=nsys, cache_dir=Path(cache_dir) if cache_dir else None,
                                   keep_events=False)
        result["document"] = render_json(analysis)
        # The summary's and the database's rows are made here, in parallel, not by the one
        # process that gathers the results.
        result["rows"] = [dataclasses.asdict(row) for row in summary_rows(result, analysis)]
        result["tables"] = database_rows(report_key(result), analysis, report.name)
        result["ok"] = True
    except NsysanError as err:
        result["error"] = err.message
    except MemoryError:
        result["error"] = f"{Path(path).name}: out of memory on the worker; use fewer jobs (-j) per machine"
    except Exception as err:  # a bug in nsysan: the row says so, the batch goes on
        result["error"] = f"internal error ({type(err).__name__}: {one_line(str(err))[:200]}); please report it"
    result["seconds"] = round(time.perf_counter() - started, 3)
    return result
