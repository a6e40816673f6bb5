"""What compare, check and batch accept: a report, an export, or an analysis JSON document.

A JSON document is read back, never re-analyzed: a baseline committed as `analysis.json` costs
a file read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

from ..sources.analysis_document import load_analysis
from ..errors import NsysanError
from ..model import Analysis

Progress = Callable[[str, float], None]


def is_analysis_document(path: Path) -> bool:
    """A `.json` file, or any file whose first non-blank byte is `{` (SQLite and nsys reports
    start with their own magic, never with a brace)."""
    if path.suffix.lower() == ".json":
        return True
    from ..sources.export import open_regular

    try:
        with open_regular(path) as handle:  # a FIFO never waits for a writer here
            head = handle.read(64).lstrip()
    except OSError:
        return False  # the analysis path says what is wrong with it
    return head.startswith(b"{")


def load_or_analyze(path: Union[str, Path], *, nsys: Optional[Union[str, Path]] = None,
                    cache_dir: Optional[Path] = None, progress: Optional[Progress] = None,
                    keep_events: Optional[bool] = None, max_memory: Optional[int] = None,
                    content: Optional[str] = None, step_range: Optional[str] = None,
                    oom_logs: Sequence[Path] = (), **options: Any) -> Analysis:
    """The `Analysis` of a report or export, or the one stored in an analysis JSON document
    (`keep_events`, `max_memory`, `step_range` and `options`, any other option of the analysis: see
    pipeline.analyze_report). Without the raw frames (`keep_events` False) an analysis already
    made of the same bytes with the same options is read back from the cache (pipeline/cache.py);
    `content`: the input's sha256 when the caller has it already. A document keeps the steps it
    was analyzed with: NsysanError when they were found by another rule than `step_range`.
    `oom_logs`: the program's stderr or logs, whose out-of-memory errors are joined with the
    analysis however it was got (a document, the cache, or analyzed now: analyses/oom_ends.py
    works on a finished one)."""
    if oom_logs:
        from ..analyses.oom_ends import explain_oom
        from ..sources.oom_log import read_oom_logs

        messages = read_oom_logs(oom_logs)  # a bad log fails before any work
        analysis = load_or_analyze(path, nsys=nsys, cache_dir=cache_dir, progress=progress, keep_events=keep_events,
                                   max_memory=max_memory, content=content, step_range=step_range,
                                   **options)
        return explain_oom(analysis, messages, [Path(p).name for p in oom_logs])
    path = Path(path)
    if path.is_dir():
        raise NsysanError(f"{path} is a folder; give a report (.nsys-rep, .qdrep, .sqlite) or an analysis.json")
    if is_analysis_document(path):
        try:
            return _same_steps(load_analysis(path), step_range, path)
        except NsysanError as err:
            raise NsysanError(f"{path.name}: {err.message}" if not err.message.startswith(path.name)
                              else err.message, err.exit_code) from err
        except (KeyError, TypeError, ValueError, AttributeError) as err:  # valid JSON, not our shape
            raise NsysanError(f"{path.name} is not a complete nsysan analysis document ({type(err).__name__}: "
                              f"{err})") from err
    from .stages import analyze_report

    if step_range is not None:
        options["step_range"] = step_range

    def analyze() -> Analysis:
        return analyze_report(path, nsys=nsys, cache_dir=cache_dir, progress=progress, keep_events=keep_events,
                              max_memory=max_memory, **options)

    if keep_events is not False:  # the raw frames are not in a document: analyze
        return analyze()
    from .cache import cached_analysis

    return cached_analysis(path, analyze, nsys=nsys, cache_dir=cache_dir, content=content,
                           options=options)


def _same_steps(analysis: Analysis, step_range: Optional[str], path: Path) -> Analysis:
    """A document analyzed without `--step-range REGEX` (or with another) holds other steps than
    the report would give with it: its numbers cannot be re-cut, so say so rather than compare
    steps of two rules. A document without steps has nothing to disagree with."""
    if step_range is None:
        return analysis
    rules = {(s.found_by, s.range_name) for s in analysis.steps}
    if rules and rules != {("step-range", step_range)}:
        found = ", ".join(sorted(f"{name!r} ({by})" for by, name in rules))
        raise NsysanError(f"{path.name}: the steps of this analysis of {analysis.source.name} are {found}, not "
                          f"--step-range {step_range!r}; analyze the report again with --step-range, or give "
                          "the report itself")
    return analysis
