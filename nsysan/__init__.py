"""nsysan: GPU-memory answers from NVIDIA Nsight Systems reports.

    >>> import nsysan
    >>> analysis = nsysan.analyze("fixtures/known_mem_v25.sqlite")
    >>> analysis.peak.peak_bytes
    952107008
    >>> int(analysis.frame("never_freed")["bytes"].sum())      # every table is a DataFrame
    153067520
    >>> len(analysis.events)                             # and so is every allocation and free
    52

See docs/python.md. `analyze()` runs the whole pipeline: export (for .nsys-rep/.qdrep) -> schema probe -> events
frame -> analyses -> `Analysis`. `load_analysis()` reads a JSON document written by
`nsysan analyze --format json` back into the same model.
"""

from __future__ import annotations

from .runtime import interrupt as _interrupt  # noqa: F401  (first: Ctrl-C while the command starts is one line)

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, Sequence, Union

from .base import notebook_view as _notebook_view
from .errors import NsysanError

if TYPE_CHECKING:
    from .model import Analysis
    from .model import Comparison
    from .model import Verdict

__all__ = ["analyze", "load_analysis", "compare", "check", "Analysis", "NsysanError", "SCHEMA_ID"]
__version__ = "0.1.0"

PathLike = Union[str, Path]
Run = Union[str, Path, "Analysis"]  # a report, an export, an analysis JSON, or an Analysis
Size = Union[str, int]  # "8GiB", "512MiB", or bytes
Progress = Callable[[str, float], None]


def __getattr__(name: str) -> object:
    """`Analysis`, `SCHEMA_ID` and `load_analysis`, imported when first asked for (PEP 562): the
    command line imports this package first, and the model (66 classes, about 70 ms of a start on
    2 cores) then comes on the thread that imports the analyses while nsys exports (issue 31)."""
    if name in ("Analysis", "SCHEMA_ID"):
        from . import model

        return getattr(model, name)
    if name == "load_analysis":
        from .sources.analysis_document import load_analysis

        return load_analysis
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def _repr_html_(analysis: "Analysis") -> str:
    """The report page (as `nsysan analyze -o` writes it) in a sandboxed frame sized for a
    notebook cell: self-contained, nothing is fetched from the network. The model imports no
    renderer, so the package, which knows both, gives `Analysis` its notebook view
    (base/notebook_view.py)."""
    from .render.html import report_frame

    return report_frame(analysis)


_notebook_view.view = _repr_html_


def _path(value: object, what: str) -> Path:
    from .sources.analysis_document import as_path  # with the model: see __getattr__

    return as_path(value, what)


def analyze(path: PathLike, *, nsys: Optional[PathLike] = None, cache_dir: Optional[PathLike] = None,
            progress: Optional[Progress] = None, quick: bool = False, step_range: Optional[str] = None,
            spike_window_ns: Optional[int] = None,
            smi: Sequence[PathLike] = (),
            smi_columns: Sequence[str] = (), smi_tz: str = "UTC",
            keep_events: Optional[bool] = None, max_memory: Optional[Size] = None,
            what_if_gpu: Optional[Size] = None,
            log: Union[PathLike, Sequence[PathLike]] = ()) -> Analysis:
    """Analyze one report (.nsys-rep, .qdrep or .sqlite) and return its `Analysis`.

    `progress(stage, fraction)` is called as the export and the loading go on. `quick` reads the
    memory-usage table alone: peaks, live at peak and never freed, without threads, API names,
    sites, NVTX ranges or failed calls (`analysis.scope == "quick"`). `smi` lays nvidia-smi CSV
    logs over the timeline (`analysis.smi`); `smi_columns` name the columns of logs without a
    header, `smi_tz` the zone of their timestamps. `step_range` is a regular
    expression naming the NVTX ranges that are training steps; by default they are found by their
    repetition ("step 3", "iteration 12", ...); `spike_window_ns` is the window within which a
    rise of live bytes is a spike (default 10 ms). `keep_events` keeps the raw frames
    (`analysis.events`, `calls`, `nvtx_ranges`) for a notebook; by default they are kept for exports
    of fewer than ten million memory events (they take about 110 bytes per event) and are None above.
    Without the frames (`keep_events` False, or None from ten million events on), an export whose
    events would not fit `max_memory` (bytes, or "4GiB"; default: half of what this process may
    use), or of twenty million events or more, is streamed: the same `Analysis`, in bounded
    memory, in two to three times the time. `what_if_gpu` (bytes, or "80GiB") replays the run
    against a GPU of that size (`analysis.what_if`). `log` (a path or several) is the program's stderr or
    log: its out-of-memory errors (PyTorch's "CUDA out of memory", XLA's RESOURCE_EXHAUSTED) are
    joined with the trace (`analysis.oom.logged`).

    >>> import nsysan
    >>> analysis = nsysan.analyze("fixtures/known_mem_v25.sqlite")
    >>> analysis.peak.peak_bytes, analysis.scope
    (952107008, 'full')
    >>> nsysan.analyze("fixtures/known_mem_v25.sqlite", quick=True).peak.peak_bytes
    952107008
    """
    from .runtime.memory_budget import budget_bytes
    from .pipeline.stages import analyze_report
    from .sources.smi_log import parse_tz, read_smi_logs

    parse_tz(smi_tz)  # refused as --smi-tz is, with or without logs
    if isinstance(smi, (str, Path)):  # one log: a path, not a sequence of one-letter paths
        smi = [smi]
    if isinstance(smi_columns, str):
        smi_columns = [smi_columns]
    smi = [_path(p, "smi") for p in smi]
    if any(not isinstance(c, str) for c in smi_columns):
        raise NsysanError("smi_columns: give the columns as a string (timestamp,index,memory.used) or a list of them")
    _flag(quick, "quick")
    if keep_events is not None:
        _flag(keep_events, "keep_events")
    if step_range is not None and not isinstance(step_range, str):
        raise NsysanError(f"--step-range {step_range!r} is not a regular expression; give one as a string")
    capacity = None
    if what_if_gpu is not None:
        from .analyses.what_if import what_if_bytes

        capacity = what_if_bytes(what_if_gpu)  # before the long part
    logs = read_smi_logs([Path(p) for p in smi], smi_columns, smi_tz) if smi else []
    analysis = analyze_report(_path(path, "path"), nsys=nsys, cache_dir=Path(cache_dir) if cache_dir else None,
                              progress=progress, quick=quick, step_range=step_range,
                              spike_window_ns=spike_window_ns, smi_logs=logs, smi_tz=smi_tz,
                              keep_events=keep_events,
                              max_memory=budget_bytes(max_memory),
                              oom_logs=[Path(log)] if isinstance(log, (str, Path)) else [Path(p) for p in log])
    if capacity is not None:
        from .analyses.what_if import with_what_if

        analysis = with_what_if(analysis, capacity)
    return analysis


def compare(base: Run, new: Run, *, nsys: Optional[PathLike] = None,
            cache_dir: Optional[PathLike] = None, step_range: Optional[str] = None) -> "Comparison":
    """`nsysan compare BASE NEW` as a function: what grew, appeared or vanished between two runs.

    Each run is a report, an export, an analysis JSON or an `Analysis` already at hand
    (`step_range`: the NVTX ranges that are steps in the reports, as in `analyze`). The
    `Comparison` has the fields of the `nsysan/compare@1` document (docs/json.md) and the tables
    `processes`, `sites` and `ranges` as DataFrames (`frame(name)`), a before/after pair spread
    into `<what>_before`, `<what>_after`, `<what>_delta` (bytes) and `<what>_percent` columns.

    >>> import nsysan
    >>> comparison = nsysan.compare("fixtures/torch_clean_v25.sqlite", "fixtures/torch_leak_v25.sqlite")
    >>> comparison.headline
    'peak +3.5 GiB (+201.9%) on GPU 0; new growth of 735.0 MiB per step on GPU 0; top growing site: cudaMalloc in forward [python3] (+1.9 GiB)'
    >>> sites = comparison.frame("sites")
    >>> sites.loc[sites["status"] == "grew", "label"].tolist()[:2]
    ['cudaMalloc in forward [python3]', 'cudaMalloc in backward [pt_autograd_0]']
    """
    from .runs.compare_runs import compare_analyses

    return compare_analyses(_run(base, nsys, cache_dir, step_range), _run(new, nsys, cache_dir, step_range))


def check(report: Run, baseline: Optional[Run] = None, *, max_peak: Optional[Size] = None,
          max_peak_increase: Optional[Size] = None, max_never_freed: Optional[Size] = None,
          max_growth_per_step: Optional[Size] = None, no_failed_allocations: Optional[bool] = None,
          no_warnings: Union[str, Sequence[str], bool, None] = None, per: str = "process",
          config: Optional[PathLike] = None, nsys: Optional[PathLike] = None,
          cache_dir: Optional[PathLike] = None, allow_unmeasured: Optional[bool] = None,
          step_range: Optional[str] = None) -> "Verdict":
    """`nsysan check` as a function: the run against memory limits. Returns the `Verdict`
    (`ok`, and one `outcomes` row per limit and place, also as `frame("outcomes")`) instead of an
    exit code (`status`: pass, fail, or not_measured when a limit could not be measured and
    `allow_unmeasured` is not set). Sizes are bytes or strings like "8GiB"; `max_peak_increase`
    may be "10%", and "none" switches off a limit the config sets.
    `config` names an nsysan.toml or pyproject.toml whose [tool.nsysan.check] table fills in the
    limits not given (unlike the command, nothing is read unless it is named).

    >>> import nsysan
    >>> verdict = nsysan.check("fixtures/torch_leak_v25.sqlite", "fixtures/torch_clean_v25.sqlite",
    ...                        max_peak_increase="10%", max_never_freed="6GiB")
    >>> verdict.ok, [(o.limit, o.ok) for o in verdict.outcomes]
    (False, [('max-peak-increase', False), ('max-never-freed', True)])
    >>> verdict.frame("outcomes")[["limit", "where", "ok"]].shape
    (2, 3)
    """
    from .runs.gate import evaluate_limits
    from .runs.limits import Limits, read_named_config

    defaults = read_named_config(_path(config, "config"), "config") if config is not None else None
    if not isinstance(no_warnings, (str, bool, type(None), list, tuple)):
        raise NsysanError(f"--no-warnings {no_warnings!r}: give diagnostic codes as a string or a list of strings, "
                          "or all")

    def text(size: Optional[Size]) -> Optional[str]:
        return None if size is None else str(size)

    limits = Limits.parse(per=per, max_peak=text(max_peak), max_peak_increase=text(max_peak_increase),
                          max_never_freed=text(max_never_freed), max_growth_per_step=text(max_growth_per_step),
                          no_failed_allocations=no_failed_allocations,
                          no_warnings=no_warnings if isinstance(no_warnings, (str, type(None))) else
                          ("all" if no_warnings is True else None) if isinstance(no_warnings, bool) else
                          ",".join(map(str, no_warnings)), defaults=defaults, allow_unmeasured=allow_unmeasured)
    base = _run(baseline, nsys, cache_dir, step_range) if baseline is not None else None
    return evaluate_limits(_run(report, nsys, cache_dir, step_range), base, limits)


def _run(run: Run, nsys: Optional[PathLike], cache_dir: Optional[PathLike],
         step_range: Optional[str] = None) -> Analysis:
    from .model import Analysis

    if isinstance(run, Analysis):
        return run
    from .pipeline.report_or_document import load_or_analyze

    return load_or_analyze(_path(run, "run"), nsys=nsys, cache_dir=Path(cache_dir) if cache_dir else None,
                           step_range=step_range)


def _flag(value: object, what: str) -> None:
    """A yes/no argument of the API: True or False, never a string that is always true ("no")."""
    if not isinstance(value, bool):
        raise NsysanError(f"{what}={value!r:.40}: use True or False")
