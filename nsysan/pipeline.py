"""One report in, one `Analysis` out: export -> schema -> events -> analyses."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Callable, Optional, Union

from . import export
from .analyses import run_analyses
from .errors import NsysanError
from .events import load_events
from .model import Analysis, Source
from .schema import open_readonly, probe

Progress = Callable[[str, float], None]
# Share of the progress bar taken by the export, when there is one.
EXPORT_SHARE = 0.6


def analyze_report(report: Path, *, nsys: Optional[Union[str, Path]] = None, cache_dir: Optional[Path] = None,
                   progress: Optional[Progress] = None, quick: bool = False) -> Analysis:
    """Analyze one .nsys-rep / .qdrep / .sqlite file (`quick`: its memory-usage table alone)."""
    say = progress or (lambda stage, fraction: None)
    is_report = report.suffix.lower() in (".nsys-rep", ".qdrep")
    share = EXPORT_SHARE if is_report else 0.0
    result = export.ensure_sqlite(report, nsys=nsys, cache_dir=cache_dir,
                                  progress=lambda f: say("exporting with nsys", f * share))
    version = export.report_version(report) if is_report else None
    conn = open_readonly(result.sqlite_path)
    try:
        schema = probe(conn, report.name)
        try:
            loaded = load_events(conn, schema, lambda stage, f: say(stage, share + f * (1 - share)), quick=quick)
        except NsysanError as err:  # events.py does not know the report's name; with several, it matters
            raise NsysanError(f"{report.name}: {err.message}", err.exit_code) from err
    except sqlite3.DatabaseError as err:  # a damaged file found half-way through reading it
        raise NsysanError(f"{report.name} could not be read ({err}); the file may be truncated") from err
    finally:
        conn.close()
    source = Source(path=str(report), name=report.name, format=_format(report),
                    size_bytes=report.stat().st_size, exported_with=result.exported_with,
                    from_cache=result.from_cache)
    return run_analyses(loaded, schema, source, report_version=version)


def _format(path: Path) -> str:
    return {".nsys-rep": "nsys-rep", ".qdrep": "qdrep"}.get(path.suffix.lower(), "sqlite")
