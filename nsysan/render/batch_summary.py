"""summary.csv, summary.html and fleets.json of a batch: one row per report x process/GPU (sortable in the
page), failed reports with their error, and the fleet view below the page's table. The page is
self-contained and escaped like the report page; the CSV quotes what a spreadsheet would run."""

from __future__ import annotations

import csv
import io
from dataclasses import asdict
from typing import Any

from ..model.batch import COLUMNS, FLEETS_SCHEMA, BatchResult, Fleet, SummaryRow
from .html import _environment, content_security_policy


def render_csv(rows: list[SummaryRow]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if v is None else _csv_safe(v)) for k, v in asdict(row).items()})
    return out.getvalue()


def _csv_safe(value: Any) -> Any:
    """A profile's string that a spreadsheet would run as a formula (=, +, -, @) gets a quote."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def render_fleets_json(fleets: list[Fleet]) -> str:
    """fleets.json of a batch (docs/json.md, "nsysan/fleets@1"): the fleet view as data."""
    import json

    return json.dumps({"schema": FLEETS_SCHEMA, "fleets": [dict(asdict(f), line=f.line) for f in fleets]},
                      indent=2, sort_keys=True, ensure_ascii=True) + "\n"


def render_summary_html(batch: BatchResult) -> str:
    env = _environment()
    # what the page's <style> holds (both includes), for its hash in the CSP
    style = env.get_template("compare.css.j2").render() + env.get_template("batch.css.j2").render()
    script = env.get_template("batch.js.j2").render()
    return env.get_template("batch.html.j2").render(b=batch, csp=content_security_policy(style, script, images=False))
