"""One self-contained HTML page of an `Analysis`, and the report folder around it.

The page loads nothing: the plots are PNG data URIs, the CSS and the small sorting script are
inline, and a Content-Security-Policy meta tag allows exactly those two by their SHA-256 and
images from `data:`. So even if escaping failed somewhere, a `<script>` smuggled in through an
NVTX name could not run, and the page could not reach the network. Every string from the profile
goes through jinja's autoescape; nothing is marked safe.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from pathlib import Path
from typing import Mapping, Optional

import jinja2

from ..errors import printable
from ..model import SEVERITIES, Analysis
from ..units import fmt_bytes, fmt_duration, fmt_frame, fmt_mib, fmt_share, fmt_time
from .files import check_output_dir, write_all_or_none
from .json import render_json
from .png import figure_png, plot_sites, plot_timeline

TEMPLATES = Path(__file__).resolve().parent / "templates"
# Files of a report folder, written in this order: the page last, so a folder with a
# report.html is complete.
REPORT_FILES = ("timeline.png", "sites.png", "analysis.json", "report.html")
LIVE_AT_PEAK_PROCESSES = 4


def render_images(analysis: Analysis) -> dict[str, bytes]:
    """The report's plots as PNG bytes, by file name: timeline.png and sites.png."""
    return {"timeline.png": figure_png(plot_timeline(analysis)), "sites.png": figure_png(plot_sites(analysis))}


def render_html(analysis: Analysis, images: Optional[Mapping[str, bytes]] = None) -> str:
    """The whole page as one string (UTF-8 HTML); `images` are reused when already drawn."""
    env = _environment()
    images = images if images is not None else render_images(analysis)
    style = env.get_template("report.css.j2").render()
    script = env.get_template("report.js.j2").render()
    csp = "; ".join([
        "default-src 'none'",
        "img-src data:",
        f"style-src '{_sha256(style)}'",
        f"script-src '{_sha256(script)}'",
        "base-uri 'none'",
        "form-action 'none'",
    ])
    data_uris = {name: "data:image/png;base64," + base64.b64encode(data).decode("ascii")
                 for name, data in images.items()}
    return env.get_template("report.html.j2").render(
        a=analysis, csp=csp, images=data_uris, process_peaks=analysis.process_peaks(LIVE_AT_PEAK_PROCESSES),
        never_freed_bytes=sum(g.never_freed_bytes for g in analysis.groups
                              if g.kind not in ("static", "managed_static")),
        diagnostics=analysis.diagnostics_by_severity(), severities=SEVERITIES,
        process_names={p.pid: p.name for p in analysis.capture.processes},
        gpus={g.id: g for g in analysis.capture.gpus}, stacks={s.id: s for s in analysis.stacks})


def write_report(analysis: Analysis, out_dir: Path) -> Path:
    """Write report.html, timeline.png, sites.png and analysis.json into `out_dir`; return the page's path.

    The four are written all or none (a full disk leaves the last run's report whole); a folder
    that can't be written is one NsysanError.
    """
    out_dir = Path(out_dir)
    check_output_dir(out_dir)
    images = render_images(analysis)
    files: dict[str, str | bytes] = {**images, "analysis.json": render_json(analysis),
                                     "report.html": render_html(analysis, images)}
    write_all_or_none({out_dir / name: files[name] for name in REPORT_FILES})
    return out_dir / "report.html"


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    """The one jinja environment: autoescape on for every template, undefined names are errors."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             finalize=_visible)
    env.filters.update(bytes=fmt_bytes, time=fmt_time, duration=fmt_duration, share=fmt_share, mib=fmt_mib,
                       frame=lambda f: fmt_frame(f.function, f.file, f.line, f.module))
    return env


def _visible(value: object) -> object:
    """Every plain string shown with control and bidi-override characters as visible escapes
    (`\\x1b`, `\\u202e`), as in the terminal: a profile's name can't hide or reorder text.
    Markup (already escaped) passes as it is; autoescape then escapes the rest."""
    return printable(value) if type(value) is str else value


def _sha256(text: str) -> str:
    """A CSP hash source of an inline element's exact text."""
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii")


