"""One report in, one `Analysis` out: export -> schema -> events -> analyses."""

from __future__ import annotations

import contextlib
import dataclasses
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Optional, Sequence, TypeVar, Union

from ..sources import export
from ..runtime import memory_budget
from ..analyses import run_analyses
from ..analyses.verdict_line import with_verdict
from ..analyses.capture_start import capture_start_diagnostic
from ..analyses.diagnostics import rerun_command
from ..analyses.hidden import with_unseen_memory
from ..analyses.iterations import iteration_pids
from ..analyses.steps import find_step_ranges, memory_threads
from ..analyses.oom_ends import explain_oom
from ..analyses.spikes import DEFAULT_WINDOW_NS
from ..errors import NsysanError
from ..events import LoadedEvents, load_events
from ..events.read import memory_row_count, memory_rowid_span, read_cuda_activity
from ..events.read_code import CodeTrace, read_code_calls, read_code_trace, with_kernels_after_loads
from ..events.read_launches import read_launches
from ..events.read_start import read_capture_start
from ..model import Analysis, Diagnostic, Source
from ..model.capture import path_text
from ..sources.schema import Schema, open_readonly, probe, refuse_missing_tables
from ..sources.sqlite_file import EXPORTED_TABLES, FIRST_EXPORT_TABLES, LAUNCH_TABLES
from ..base.units import check_duration_ns, check_step_range
from ..sources.snapshot import committed_state

if TYPE_CHECKING:
    import pandas as pd

    from ..sources.oom_log import OomMessage
    from ..sources.smi_log import SmiLog

Progress = Callable[[str, float], None]
T = TypeVar("T")


def analyze_report(report: Path, *, nsys: Optional[Union[str, Path]] = None, cache_dir: Optional[Path] = None,
                   progress: Optional[Progress] = None, quick: bool = False,
                   smi_logs: Sequence[SmiLog] = (), smi_tz: str = "UTC",
                   step_range: Optional[str] = None, spike_window_ns: Optional[int] = None,
                   keep_events: Optional[bool] = None, max_memory: Optional[int] = None,
                   oom_logs: Sequence[Path] = (), exported: Optional[export.ExportResult] = None) -> Analysis:
    """Analyze one .nsys-rep / .qdrep / .sqlite file (`quick`: its memory-usage table alone),
    with nvidia-smi logs (read by nsysan.sources.smi_log) laid over its timeline when given;
    `step_range`: a regular expression naming the NVTX ranges that are training steps;
    `spike_window_ns`: the window within which a rise of live bytes is a spike (default 10 ms);
    `keep_events`: whether the `Analysis` keeps the raw frames (`events`, `calls`, `nvtx_ranges`);
    None keeps them for exports of fewer than KEEP_EVENTS_BELOW memory events;
    `max_memory`: bytes the analysis may take when it keeps no frames (memory_budget.py; None:
    half of what this process may use): over it, the events are streamed; `oom_logs`: the
    program's stderr or log files, whose out-of-memory errors are joined with the trace
    (oom_log.py; read before the long part, so a bad one fails at once); `exported`: the first
    export, `export.analysis_export(report, ...)` with the same nsys and cache_dir, when the caller
    made it already (the command line does, while it imports this module)."""
    messages: list[OomMessage] = []
    if oom_logs:
        # The log reader (its patterns) only for --log: `nsysan analyze` imports this module while
        # nsys exports, and the export waits less for what it imports (issue 31).
        from ..sources.oom_log import read_oom_logs

        messages = read_oom_logs(oom_logs)
    say = progress or (lambda stage, fraction: None)
    check_step_range(step_range)
    if spike_window_ns is not None:  # the API's value, checked as the command line's --spike-window
        try:
            check_duration_ns(spike_window_ns, "spike_window_ns")
        except ValueError as err:
            raise NsysanError(str(err)) from None
    if max_memory is not None:
        max_memory = memory_budget.budget_bytes(max_memory)
    is_report = report.suffix.lower() in (".nsys-rep", ".qdrep")
    share = export.EXPORT_SHARE if is_report else 0.0

    def export_it(use_sibling: bool = True, tables: Sequence[str] = FIRST_EXPORT_TABLES,
                  stage: str = "exporting with nsys") -> export.ExportResult:
        return export.analysis_export(report, nsys=nsys, cache_dir=cache_dir, progress=say, use_sibling=use_sibling,
                                      tables=tables, stage=stage)

    # An analysis that keeps no frames (the command line's; a notebook's by default from
    # KEEP_EVENTS_BELOW events on) of a large export streams the events in bounded memory
    # (analyses/flow.py; see STREAM_QUICK_FROM_ROWS
    # and memory_budget.py); one that keeps them, or lays nvidia-smi logs over them, can't.
    may_stream_from = (None if keep_events is True or smi_logs
                       else 0 if keep_events is False else KEEP_EVENTS_BELOW)
    budget = max_memory if max_memory is not None or may_stream_from is None else memory_budget.default_budget()

    def read(found: export.ExportResult) -> tuple[Schema, Optional[LoadedEvents], dict[int, tuple[int, int]],
                                                  Optional[CodeTrace], list[int]]:
        return _read(report, found.sqlite_path, export.resolve_cache_dir(cache_dir),
                     lambda stage, f: say(stage, share + f * (1 - share)), quick, bool(smi_logs), may_stream_from,
                     budget, step_range, own_export=found.exported_with is not None,
                     launches_held=not export.lacks_tables(found, LAUNCH_TABLES))

    result = exported or export_it()
    version = export.report_version(report) if is_report else None
    notes: list[Diagnostic] = []
    try:
        schema, loaded, activity, code_calls, launch_pids = read(result)
    except NsysanError as err:
        if not result.from_sibling:
            raise
        # It passed every identity check yet can't be read: the report itself still can be.
        damaged = result.sqlite_path
        result = export_it(use_sibling=False)
        schema, loaded, activity, code_calls, launch_pids = read(result)
        notes.append(Diagnostic("warning", "sibling_export_damaged",
                                f"{damaged.name}, the export beside the report, could not be read ({err.message}); "
                                "the report was exported again and that export analyzed"))
    if result.from_sibling:
        notes.append(Diagnostic("info", "sibling_export",
                                f"read {result.sqlite_path.name}, the export of {report.name} found beside it "
                                "(it records this report as its input and the same capture start); delete it "
                                "to have nsysan export the report itself"))
    if launch_pids or (loaded is None and not quick and step_range is None
                       and export.lacks_tables(result, LAUNCH_TABLES)):
        # A process whose NVTX ranges give no steps: they come from its kernel launches, named only
        # in the kernel table, which the cached export was made without; nsys adds it to the entry.
        # (Streamed, whose processes those are is known only while streaming: added before, and the
        # grown export probed again, which streams on its own schema.)
        result = export_it(use_sibling=False, tables=EXPORTED_TABLES, stage="exporting the kernels with nsys")
        if loaded is not None:
            loaded.launches, loaded.launch_names = _read_launches(report, result.sqlite_path,
                                                                  export.resolve_cache_dir(cache_dir), launch_pids)
        else:
            schema, loaded, activity, code_calls, launch_pids = read(result)
    schema.diagnostics.extend(notes)
    source = Source(path=path_text(report), name=path_text(report.name), format=_format(report),
                    size_bytes=report.stat().st_size, exported_with=result.exported_with,
                    from_cache=result.from_cache,
                    sibling_export=path_text(result.sqlite_path) if result.from_sibling else None)

    def unseen(analysis: Analysis, trace: Optional[CodeTrace]) -> Analysis:
        """with_unseen_memory, the loads of the processes that keep loading code named by the kernels
        that ran after them (analyses/hidden.py): where nsysan's cached export was made without the
        kernel table, nsys adds it first, so that the document is the one of an export of every table."""
        nonlocal result
        found = with_unseen_memory(analysis, trace)
        pids = [p.pid for p in found.hidden.processes if p.keeps_loading]
        if trace is None or not pids:
            return found
        if export.lacks_tables(result, LAUNCH_TABLES):
            result = export_it(use_sibling=False, tables=EXPORTED_TABLES, stage="exporting the kernels with nsys")
        return with_unseen_memory(analysis, _on_export(
            report, result.sqlite_path, export.resolve_cache_dir(cache_dir),
            lambda conn, schema: with_kernels_after_loads(conn, schema, trace, pids)))

    if loaded is None:  # left to be streamed (see _read)
        streamed, code_calls = _streamed(report, result.sqlite_path, export.resolve_cache_dir(cache_dir), schema,
                                         source, version, step_range, spike_window_ns or DEFAULT_WINDOW_NS, quick)
        return with_verdict(unseen(explain_oom(streamed, messages, [Path(p).name for p in oom_logs]), code_calls))
    if keep_events is None:
        keep_events = len(loaded.events) < KEEP_EVENTS_BELOW
    if not keep_events:
        without_notebook_columns(loaded)
    analysis = run_analyses(loaded, schema, source, report_version=version, step_range=step_range,
                            spike_window_ns=spike_window_ns or DEFAULT_WINDOW_NS, keep_calls=keep_events)
    analysis = explain_oom(analysis, messages, [Path(p).name for p in oom_logs])
    if smi_logs:
        from ..analyses.smi import add_smi

        analysis = add_smi(analysis, list(smi_logs), activity, schema.session_start_utc_ns, smi_tz)
    analysis = unseen(analysis, code_calls)
    if not keep_events:
        analysis = dataclasses.replace(analysis, events=None, calls=None, nvtx_ranges=None)
    return with_verdict(analysis)  # last: it reads the OOM join and every verdict


# An analysis streams its events (when it may) from this many rows of the memory table on, and
# below it when its whole frame would not fit the memory budget (memory_budget.py). Below, the
# whole frame is faster (1e7 events, 1 December: 19 s full and 9 s --quick, against 52 s and 22 s
# streamed, which reads the tables twice and does most of its work on one core) and takes about
# 240 bytes per event (180 for --quick); above, streaming keeps the peak near 0.5 GiB at 1e7
# and 1 GiB at 1e8 for the full analysis, the same document value for value
# (docs/performance.md); the whole frame grows without bound and ran out of memory at 1e8 events.
STREAM_QUICK_FROM_ROWS = 20_000_000


# `nsysan.analyze` keeps the raw frames for exports below this many memory events (they take
# about 110 bytes per event, calls included: 1.1 GB at 1e7); the command line never keeps them.
KEEP_EVENTS_BELOW = 10_000_000


def without_notebook_columns(loaded: LoadedEvents) -> None:
    """Drop, before the analyses, the columns that only a notebook reads: the correlation ids
    (every join on them is made while loading), 8 bytes per event and per call."""
    for frame in (loaded.events, loaded.calls):
        if "correlation_id" in frame:
            del frame["correlation_id"]


def _read(report: Path, sqlite_path: Path, scratch: Path, say: Progress, quick: bool,
          activity: bool = False, may_stream_from: Optional[int] = None,
          budget: Optional[int] = None,
          step_range: Optional[str] = None,
          own_export: bool = False,
          launches_held: bool = True) -> tuple[Schema, Optional[LoadedEvents], dict[int, tuple[int, int]],
                                               Optional[CodeTrace], list[int]]:
    """The schema and events of the committed state of the export at `sqlite_path`, and with
    `activity` when each process made its first and last CUDA call (for nvidia-smi logs);
    `may_stream_from`: no events (None; they are streamed later, see _streamed) when the memory
    table has at least that many rows (None: never) and STREAM_QUICK_FROM_ROWS or more, or its
    whole frame would not fit `budget` bytes. Without `step_range`, the launch sequences of the
    processes whose NVTX ranges give no steps are read too (analyses/iterations.py).
    `own_export`: made by nsysan's export cache, which knows what it holds; any other export
    made with `--tables` must hold every table nsysan reads. Without `launches_held` (a cached
    export made without sqlite_file.LAUNCH_TABLES) the launches are not read: the processes whose
    launches are wanted come back last (empty: none), for the caller to read them from an export
    that holds those tables."""
    with _export_connection(report, sqlite_path, scratch) as conn:
        schema = probe(conn, report.name)
        if not own_export:
            refuse_missing_tables(schema, sqlite_path.name)
        started = read_capture_start(conn, schema)  # on schema's diagnostics: every path says it
        if started is not None:
            schema.diagnostics.append(capture_start_diagnostic(started, rerun_command(schema)))
            schema.capture_start_pids = started.pids
        rows = memory_rowid_span(conn, schema) if may_stream_from is not None else -1

        def too_many(rows: int) -> bool:
            return rows >= (may_stream_from or 0) and (
                rows >= STREAM_QUICK_FROM_ROWS or not memory_budget.fits(rows, quick, budget))
        # The span is the rows of an export (two b-tree descents); a table whose rowids jump
        # (a row moved to rowid 2^32) has far fewer: counted (one scan, 0.1 s at 1e7 rows)
        # before it is streamed for rows it doesn't have.
        schema_only = too_many(rows) and too_many(memory_row_count(conn, schema))
        try:
            loaded = load_events(conn, schema, say, quick=quick) if not schema_only else None
            launch_pids: list[int] = []
            if loaded is not None and not quick and step_range is None:
                loaded.memory_threads = threads = memory_threads(loaded.calls)
                loaded.nvtx_steps = find_step_ranges(loaded.ranges, threads)
                launch_pids = iteration_pids(threads, loaded.nvtx_steps, schema.capture_start_pids)
                if launches_held:
                    loaded.launches, loaded.launch_names = read_launches(conn, schema, launch_pids)
                    launch_pids = []
            runs = read_cuda_activity(conn, schema, loaded.calls) if activity else {}
            code_calls = None if quick or loaded is None else read_code_trace(conn, schema, loaded.code_calls)
        except NsysanError as err:  # events.py does not know the report's name; with several, it matters
            raise NsysanError(f"{report.name}: {err.message}", err.exit_code) from err
    return schema, loaded, runs, code_calls, launch_pids


def _read_launches(report: Path, sqlite_path: Path, scratch: Path, pids: list[int]) -> tuple[pd.DataFrame, dict[int, str]]:
    """read_launches of `pids` from the export at `sqlite_path`, on that export's own schema (its
    times and the tables it holds)."""
    return _on_export(report, sqlite_path, scratch, lambda conn, schema: read_launches(conn, schema, pids))


def _on_export(report: Path, sqlite_path: Path, scratch: Path, read: Callable[[sqlite3.Connection, Schema], T]) -> T:
    """`read` of the committed state of the export at `sqlite_path`, on its own schema."""
    with _export_connection(report, sqlite_path, scratch) as conn:
        return read(conn, probe(conn, report.name))


@contextlib.contextmanager
def _export_connection(report: Path, sqlite_path: Path, scratch: Path) -> Iterator[sqlite3.Connection]:
    """The committed state of the export at `sqlite_path`, open read-only, closed after; a damaged
    file found half-way through reading it is one NsysanError naming the report (worded as
    events/load.py words it: where the damage is found first depends on the reads)."""
    with committed_state(sqlite_path, scratch) as readable:
        conn = open_readonly(readable, name=sqlite_path.name)
        try:
            yield conn
        except sqlite3.DatabaseError as err:
            raise NsysanError(f"{report.name}: the export could not be read ({err}); it may be truncated or "
                              "damaged") from err
        finally:
            conn.close()


def _streamed(report: Path, sqlite_path: Path, scratch: Path, schema: Schema, source: Source,
              version: Optional[str], step_range: Optional[str], spike_window_ns: int,
              quick: bool = True) -> tuple[Analysis, Optional[CodeTrace]]:
    """The analysis (`quick` or full) of the export at `sqlite_path`, its events streamed in bounded
    memory, and (full) the code-load and graph calls (events/read_code.py)."""
    from ..analyses.flow import run_flow

    with _export_connection(report, sqlite_path, scratch) as conn:
        try:
            analysis, code_rows = run_flow(conn, schema, source, version, step_range, spike_window_ns, quick)
            # (the code-load calls: from their rows read in the flow's scan of the memory calls)
            return analysis, None if quick else read_code_trace(conn, schema,
                                                                read_code_calls(conn, schema, code_rows))
        except NsysanError as err:
            raise NsysanError(f"{report.name}: {err.message}", err.exit_code) from err


def _format(path: Path) -> str:
    return {".nsys-rep": "nsys-rep", ".qdrep": "qdrep"}.get(path.suffix.lower(), "sqlite")
