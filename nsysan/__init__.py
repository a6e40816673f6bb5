"""nsysan: GPU-memory answers from NVIDIA Nsight Systems reports.

    >>> import nsysan
    >>> analysis = nsysan.analyze("fixtures/known_mem_v25.sqlite")
    >>> analysis.peak.peak_bytes
    952107008
    >>> analysis.events          # the normalized events frame (pandas)

`analyze()` runs the whole pipeline: export (for .nsys-rep/.qdrep) -> schema probe -> events
frame -> analyses -> `Analysis`. `load_analysis()` reads a JSON document written by
`nsysan analyze --format json` back into the same model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional, Union

from .errors import NsysanError
from .model import SCHEMA_ID, Analysis

__all__ = ["analyze", "load_analysis", "Analysis", "NsysanError", "SCHEMA_ID"]
__version__ = "0.1.0"

PathLike = Union[str, Path]
Progress = Callable[[str, float], None]


def analyze(path: PathLike, *, nsys: Optional[PathLike] = None, cache_dir: Optional[PathLike] = None,
            progress: Optional[Progress] = None, quick: bool = False) -> Analysis:
    """Analyze one report (.nsys-rep, .qdrep or .sqlite) and return its `Analysis`.

    `progress(stage, fraction)` is called as the export and the loading go on. `quick` reads the
    memory-usage table alone: peaks, live at peak and never freed, without threads, API names,
    sites, NVTX ranges or failed calls (`analysis.scope == "quick"`).
    """
    from .pipeline import analyze_report

    return analyze_report(Path(path), nsys=nsys, cache_dir=Path(cache_dir) if cache_dir else None,
                          progress=progress, quick=quick)


def load_analysis(path: PathLike) -> Analysis:
    """Read an analysis JSON document (schema nsysan/analysis@1) back into an `Analysis`."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise NsysanError(f"{Path(path).name} could not be read as an analysis JSON ({err})") from err
    if not isinstance(data, dict):
        raise NsysanError(f"{Path(path).name} is not an nsysan analysis document")
    return Analysis.from_dict(data)
