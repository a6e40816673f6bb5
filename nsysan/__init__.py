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

    >>> import nsysan
    >>> analysis = nsysan.analyze("fixtures/known_mem_v25.sqlite")
    >>> analysis.peak.peak_bytes, analysis.scope
    (952107008, 'full')
    >>> nsysan.analyze("fixtures/known_mem_v25.sqlite", quick=True).peak.peak_bytes
    952107008
    """
    from .pipeline import analyze_report

    return analyze_report(Path(path), nsys=nsys, cache_dir=Path(cache_dir) if cache_dir else None,
                          progress=progress, quick=quick)


def load_analysis(path: PathLike) -> Analysis:
    """Read an analysis JSON document (schema nsysan/analysis@1) back into an `Analysis`.

    Documents written by older nsysan versions load (fields added since read as empty); a
    malformed one raises NsysanError naming the file and the field. The raw frames (`events`,
    `calls`, `nvtx_ranges`) are not in the JSON and are None.

    >>> import nsysan
    >>> analysis = nsysan.load_analysis("tests/golden/known_mem_v25.analysis.json")
    >>> analysis.peak.peak_bytes, len(analysis.frame("never_freed")), analysis.events is None
    (952107008, 6, True)
    >>> nsysan.load_analysis("pyproject.toml")
    Traceback (most recent call last):
    nsysan.errors.NsysanError: pyproject.toml could not be read as an analysis JSON (Expecting value: ...)
    """
    name = Path(path).name
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise NsysanError(f"{name} could not be read as an analysis JSON ({err})") from err
    if not isinstance(data, dict):
        raise NsysanError(f"{name} is not an nsysan analysis document")
    try:
        return Analysis.from_dict(data)
    except NsysanError as err:
        raise NsysanError(f"{name}: {err.message}", err.exit_code) from None
