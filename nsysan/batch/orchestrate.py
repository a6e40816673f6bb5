"""One batch: analyze every report (engines), keep each result as it arrives (analyses/*.json and
nsysan.db), then gather the summary rows and the fleet view, which the command writes (summary.csv,
summary.html, fleets.json). A Ctrl-C stops the analyses and still returns what was done."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

from ..errors import NsysanError
from .database import ResultsDatabase
from .engines import run_all
from ..model.batch import BatchResult, SummaryRow
from .summary import fleet_view, summary_rows

Progress = Callable[[dict[str, Any]], None]


def run_batch(paths: list[Path], out_dir: Path, *, jobs: int, dask: Optional[str] = None,
              db_path: Optional[Path] = None, tags: Sequence[str] = (), progress: Optional[Progress] = None,
              **options: Any) -> BatchResult:
    """Analyze `paths` (`options`: how, as engines.run_all takes them: nsys, cache_dir, max_memory,
    step_range, logs) and write DIR/analyses/*.json and DIR/nsysan.db (or `db_path`); the command
    writes DIR/summary.csv, DIR/summary.html and DIR/fleets.json from the result.
    Returns what was done, also after a Ctrl-C."""
    out_dir = Path(out_dir)
    documents = out_dir / "analyses"
    db_path = Path(db_path) if db_path else out_dir / "nsysan.db"
    try:
        if db_path.parent == out_dir:
            out_dir.mkdir(parents=True, exist_ok=True)
        database = ResultsDatabase(db_path, tags=tags)  # first: a --db that can't be used stops here
        documents.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise NsysanError(f"could not write {documents}: {err.strerror or err}") from err
    order = {str(p): i for i, p in enumerate(paths)}
    by_report: dict[str, list[SummaryRow]] = {}
    steps: dict[str, list[dict[str, Any]]] = {}
    outcome = BatchResult(reports=len(paths), out_dir=out_dir, db_path=db_path,
                          engine=_engine_name(jobs, dask, len(paths)))
    started = time.perf_counter()

    def on_done(result: dict[str, Any]) -> None:
        # A Ctrl-C waits until this result is kept whole: its document, its database rows and its
        # summary rows, all or none.
        with interrupts.held():
            document_file = None
            if result["ok"]:
                document_file = document_name(Path(result["path"]).name, result["hash"])
                _write(documents / document_file, result["document"])
                outcome.analyzed += 1
                rows = [SummaryRow(**row) for row in result["rows"]]
                steps[result["path"]] = result.get("steps", [])
            else:
                outcome.failed += 1
                rows = summary_rows(result, None)
            database.add(result, f"analyses/{document_file}" if document_file else None)
            by_report[result["path"]] = rows
            if progress:
                progress(result)

    interrupts = _HeldInterrupts()
    try:
        with interrupts:
            run_all(paths, on_done, jobs=jobs, dask=dask, **options)
    except KeyboardInterrupt:
        outcome.interrupted = True
    finally:
        database.close()
    # (Any other error, such as an unreachable Dask scheduler, has left by now: no summary.)
    outcome.seconds = time.perf_counter() - started
    outcome.rows = [row for path in sorted(by_report, key=lambda p: order.get(p, len(order)))
                    for row in by_report[path]]
    outcome.fleets = fleet_view(outcome.rows, steps)
    return outcome


# A file name may take 255 bytes (NAME_MAX on Linux and macOS): the report's name is cut to leave
# room for "-<12 hex>.analysis.json" and the ".<name>.tmp" it is written through.
_NAME_MAX_BYTES = 255
_DOCUMENT_SUFFIX_BYTES = len("-123456789abc.analysis.json") + len("..tmp")


def document_name(report_name: str, content_hash: str) -> str:
    """The name of a report's analysis document in DIR/analyses: `<report name>-<12 hex of its
    hash>.analysis.json`, the report's name cut (at a character, by UTF-8 bytes) when the whole
    would be longer than a file system takes; the hash keeps cut names apart."""
    room = _NAME_MAX_BYTES - _DOCUMENT_SUFFIX_BYTES
    name = report_name.encode("utf-8", "surrogateescape")[:room].decode("utf-8", "ignore")
    return f"{name}-{content_hash[:12]}.analysis.json"


def _write(path: Path, text: str) -> None:
    """A document in place whole (a temporary file renamed), without the fsync of write_atomic:
    one per report would cost more than a small analysis, and a lost document is re-made by
    running the batch again."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        # A leftover (or a link planted there) is removed, never written through: a link would
        # send the document into whatever it points to, an input of this batch included.
        tmp.unlink(missing_ok=True)
        tmp.write_bytes(text.encode("utf-8"))
        os.replace(tmp, path)
    except OSError as err:
        raise NsysanError(f"could not write {path}: {err.strerror or err}") from err


class _HeldInterrupts:
    """Signal handlers that stop the batch at once, except inside `held()`, where the signal is
    remembered and acted on at the end: SIGINT (KeyboardInterrupt), and SIGTERM and SIGHUP when
    the command has made them raise (cli.py), so a cancelled CI job never stops a report half
    kept either. (Blocking the signal would not do: it is then delivered to another thread, and
    Python raises it in the main thread all the same.)"""

    def __init__(self) -> None:
        self.holding = False
        self.pending: Optional[int] = None  # the first signal that came while held
        self.previous: dict[int, Any] = {}
        self.raised: Optional[int] = None  # the signal last acted on
        self.unraisable_hook: Any = None

    def __enter__(self) -> "_HeldInterrupts":
        if threading.current_thread() is threading.main_thread():
            for name in ("SIGINT", "SIGTERM", "SIGHUP"):
                signum = getattr(signal, name, None)
                if signum is None:
                    continue
                current = signal.getsignal(signum)
                if signum == signal.SIGINT or callable(current):
                    self.previous[signum] = signal.signal(signum, self._on_signal)
            self.unraisable_hook, sys.unraisablehook = sys.unraisablehook, self._swallowed
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        if self.unraisable_hook is not None:
            sys.unraisablehook = self.unraisable_hook

    def _swallowed(self, unraisable: Any) -> None:
        """A signal that arrived while Python ran a finalizer or a weakref callback (Dask's and
        the pool's objects are collected while the batch stops) raised where nothing can catch
        it: Python would print 'Exception ignored ... Traceback' and go on. It is sent again a
        moment later instead, to stop the batch where it can."""
        if isinstance(unraisable.exc_value, BaseException) and not isinstance(unraisable.exc_value, Exception) \
                and self.raised is not None:
            threading.Timer(0.01, os.kill, (os.getpid(), self.raised)).start()
            return
        self.unraisable_hook(unraisable)

    def _on_signal(self, signum: int, frame: object) -> None:
        if self.holding:
            self.pending = self.pending or signum
        else:
            self._act(signum, frame)

    def _act(self, signum: int, frame: object) -> None:
        self.raised = signum
        handler = self.previous.get(signum)
        if signum != signal.SIGINT and callable(handler):
            handler(signum, frame)  # the command's: raises to stop the batch
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
            if self.pending:
                signum, self.pending = self.pending, None
                self._act(signum, None)


def _engine_name(jobs: int, dask: Optional[str], reports: int) -> str:
    if dask == "local":
        return f"a Dask LocalCluster of {jobs} worker processes"
    if dask:
        return f"the Dask cluster at {dask}"
    if jobs <= 1 or reports <= 1:
        return "this process"
    return f"a local pool of {min(jobs, reports)} processes"
