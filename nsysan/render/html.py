"""One self-contained HTML page of an `Analysis`, and the report folder around it.

The page loads nothing: the CSS, our script and the charting library (uPlot, vendored in
render/vendor/ with its license) are inline, the page's data is a JSON element, and a
Content-Security-Policy meta tag allows exactly the one style and the one script by their SHA-256.
So even if escaping failed somewhere, a `<script>` smuggled in through an NVTX name could not run,
and the page could not reach the network. Every string from the profile goes through jinja's
autoescape (or `|tojson` for the data); nothing from a profile is marked safe. The only Markup is
our own CSS and JS, read from the package.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
from html import escape as escape_html
from pathlib import Path
from typing import Mapping, Optional

import jinja2
from markupsafe import Markup

from ..errors import printable
from ..model import SEVERITIES, TRUST_BREAKING, Allocation, AllocationGroup, Analysis
from ..base.units import (fmt_bytes, fmt_duration, fmt_frame, fmt_mib, fmt_percent, fmt_share, fmt_signed_bytes,
                          fmt_time, fmt_time_in, time_unit)
from .json import render_json
from .page_data import page_data, site_stack

TEMPLATES = Path(__file__).resolve().parent / "templates"
VENDOR = Path(__file__).resolve().parent / "vendor"
UPLOT_VERSION = "1.6.32"  # render/vendor/uPlot.iife.min.js, unchanged from the npm package
# Files of a report folder, written in this order: the page last, so a folder with a
# report.html is complete.
REPORT_FILES = ("timeline.png", "sites.png", "analysis.json", "report.html")
LIVE_AT_PEAK_PROCESSES = 4


def render_images(analysis: Analysis) -> dict[str, bytes]:
    """The report's plots as PNG bytes, by file name: timeline.png and sites.png."""
    # Imported here: matplotlib takes 1-2 s to import, and pages without plots (batch's
    # summary.html) render through this module too.
    from .png import figure_png, plot_sites, plot_timeline

    return {"timeline.png": figure_png(plot_timeline(analysis)), "sites.png": figure_png(plot_sites(analysis))}


def render_html(analysis: Analysis, images: Optional[Mapping[str, bytes]] = None, full_paths: bool = False) -> str:
    """The whole page as one string (UTF-8 HTML). It shows the report's file name, not the path it
    was read from (`full_paths` brings the path back). `images`: the PNGs, when drawn already; the
    page draws its own plots and embeds timeline.png only to stand in where JavaScript is off."""
    env = _environment()
    style, script = page_style(), page_script()
    csp = content_security_policy(style, script)
    diagnostics = analysis.diagnostics_by_severity()
    # Documents written before the groups existed: each listed allocation is its own group.
    if analysis.never_freed and not analysis.never_freed_groups:
        analysis = dataclasses.replace(analysis, never_freed_groups=_one_per_group(analysis.never_freed))
    if any(p.live_at_peak and not p.live_groups for p in analysis.peaks):
        analysis = dataclasses.replace(analysis, peaks=[
            p if p.live_groups else dataclasses.replace(p, live_groups=_one_per_group(p.live_at_peak))
            for p in analysis.peaks])
    return env.get_template("report.html.j2").render(
        a=analysis, csp=csp, style=style, script=script, data=page_data(analysis), full_paths=full_paths,
        timeline_image=timeline_stand_in(images), page_steps=PAGE_STEPS,
        process_peaks=analysis.process_peaks(LIVE_AT_PEAK_PROCESSES),
        never_freed_bytes=analysis.never_freed_bytes,
        diagnostics=diagnostics, severities=SEVERITIES,
        trust_breaking=[d for d in diagnostics if d.code in TRUST_BREAKING],
        other_warnings=[d for d in diagnostics if d.severity in ("error", "warning") and d.code not in TRUST_BREAKING],
        first_screen_warnings=first_screen_warnings(analysis), first_screen_limit=FIRST_SCREEN_WARNINGS,
        caching=any(d.code == "caching_allocator" for d in diagnostics),
        used_pools=[p for p in analysis.reserved.pools if p.peak_used_bytes and p.end_reserved_bytes][:3],
        ranges_in_time_order=sorted(analysis.range_rows(),  # in the order they first opened
                                    key=lambda r: (r.first_start_ns is None, r.first_start_ns or 0)),
        operators=[r for r in analysis.ranges if r.operator],
        process_names={p.pid: p.name for p in analysis.capture.processes},
        gpus={g.id: g for g in analysis.capture.gpus}, stacks={s.id: s for s in analysis.stacks})


# The report page in a notebook cell: this tall, and as wide as the cell.
FRAME_HEIGHT_PX = 720


def report_frame(analysis: Analysis) -> str:
    """An `<iframe>` element holding the report page of `analysis` (a string of HTML), for a
    notebook cell (Jupyter, VS Code: `Analysis._repr_html_`).

    The page of `nsysan analyze -o` is a whole document with its own styles, script and
    Content-Security-Policy. Pasted into a notebook, its styles would restyle the notebook and its
    policy would be ignored; inside an `<iframe srcdoc>` it keeps all three to itself. The frame is
    sandboxed (scripts run, for the table sorting, but in an origin of their own: they can't reach
    the notebook), with a height that can be dragged."""
    return (f'<iframe title="nsysan report: {escape_html(analysis.source.name)}" sandbox="allow-scripts" '
            f'style="box-sizing:border-box;width:100%;height:{FRAME_HEIGHT_PX}px;border:1px solid #ccc;'
            'resize:vertical" '
            f'srcdoc="{escape_html(render_html(analysis), quote=True)}"></iframe>')


def timeline_stand_in(images: Optional[Mapping[str, bytes]]) -> Optional[str]:
    """timeline.png as a data: URI (palette-reduced: png.stand_in_png) for the page to show where
    JavaScript is off; None when the PNGs were not drawn (render_html alone draws none: matplotlib
    takes seconds to import) or hold no bytes."""
    if not images or not images.get("timeline.png"):
        return None
    from .png import stand_in_png

    return "data:image/png;base64," + base64.b64encode(stand_in_png(images["timeline.png"])).decode("ascii")


def content_security_policy(style: str, script: Optional[str] = None, images: bool = True) -> str:
    """The pages' policy: nothing loads from anywhere; the one inline style and the one inline
    script (if any) run only by their SHA-256; `images`: data: URIs may be shown."""
    allowed = ["default-src 'none'", *(["img-src data:"] if images else []), f"style-src '{_sha256(style)}'",
               *([f"script-src '{_sha256(script)}'"] if script is not None else []), "base-uri 'none'",
               "form-action 'none'"]
    return "; ".join(allowed)


def _one_per_group(allocations: list[Allocation]) -> list[AllocationGroup]:
    return [AllocationGroup(pid=a.pid, device=a.device, kind=a.kind, site=a.site, nvtx_range=a.nvtx_range, count=1,
                            total_bytes=a.bytes, min_bytes=a.bytes, max_bytes=a.bytes, first_alloc_ns=a.alloc_time_ns,
                            last_alloc_ns=a.alloc_time_ns) for a in allocations]


@functools.lru_cache(maxsize=1)
def page_style() -> Markup:
    """The page's CSS: ours, then uPlot's (one <style>, one hash)."""
    ours = _environment().get_template("report.css.j2").render()
    return Markup(ours + "\n" + (VENDOR / "uPlot.min.css").read_text(encoding="utf-8"))


@functools.lru_cache(maxsize=1)
def page_script() -> Markup:
    """The page's JavaScript: uPlot (MIT, vendored unchanged), then ours (one <script>, one hash)."""
    uplot = (VENDOR / "uPlot.iife.min.js").read_text(encoding="utf-8")
    # Its banner names its home page; the page carries no address at all, so the banner becomes
    # the license's own text (MIT asks for the notice in every copy).
    _banner, code = uplot.split("\n", 1) if uplot.startswith("/*!") else ("", uplot)
    license_text = (VENDOR / "uPlot.LICENSE").read_text(encoding="utf-8").replace("*/", "* /")
    # what the bytes are (report_bytes.js.j2): a file of its own beside the explorer's script
    ours = _environment().get_template("report.js.j2").render() + "\n" + \
        _environment().get_template("report_bytes.js.j2").render()
    return Markup(f"/*! uPlot {UPLOT_VERSION}\n{license_text}*/\n" + code + "\n" + ours)


def report_files(analysis: Analysis, full_paths: bool = False) -> dict[str, str | bytes]:
    """report.html, timeline.png, sites.png and analysis.json, by name, in REPORT_FILES' order (the
    command writes them, all or none: commands/outputs.py)."""
    images = render_images(analysis)
    files: dict[str, str | bytes] = {**images, "analysis.json": render_json(analysis),
                                     "report.html": render_html(analysis, images, full_paths)}
    return {name: files[name] for name in REPORT_FILES}


# Warnings the page's verdict lines draw themselves (the allocator's cache, XLA's preallocation).
_DRAWN_AS_VERDICTS = ("caching_allocator", "preallocation")
FIRST_SCREEN_WARNINGS = 8
# Rows of a steps table: its first and last 20 (the model lists 200 of a 1000-step run, 280 KB of
# a 1e6-event page's 4 ranks); the step chart draws every listed step
PAGE_STEPS = 40


def first_screen_warnings(analysis: Analysis) -> list:
    """The warnings the terminal prints among its answers that no verdict line of the page shows
    (the answers of topics trust and reserved), those about the numbers themselves first."""
    found = [v for v in analysis.answers if v.topic in ("trust", "reserved") and v.severity in ("error", "warning")
             and v.code not in _DRAWN_AS_VERDICTS]
    return sorted(found, key=lambda v: (v.code not in TRUST_BREAKING, v.severity != "error"))


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    """The one jinja environment: autoescape on for every template, undefined names are errors."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             finalize=_visible)
    env.filters.update(bytes=fmt_bytes, time=fmt_time, duration=fmt_duration, share=fmt_share, mib=fmt_mib,
                       frame=lambda f: fmt_frame(f.function, f.file, f.line, f.module), time_in=fmt_time_in,
                       change_percent=lambda percent: fmt_percent(percent / 100, signed=True),
                       held_by=lambda allocations, group: [a for a in allocations if group.holds(a)],
                       signed_bytes=fmt_signed_bytes, split_at=site_stack,
                       ends=lambda items, n: items if len(items) <= n else items[:n // 2] + items[-(n // 2):])
    env.globals.update(time_unit=lambda *columns: time_unit(v for column in columns for v in column))
    return env


def _visible(value: object) -> object:
    """Every plain string shown with control and bidi-override characters as visible escapes
    (`\\x1b`, `\\u202e`), as in the terminal: a profile's name can't hide or reorder text.
    Markup (already escaped) passes as it is; autoescape then escapes the rest."""
    return printable(value) if type(value) is str else value


def _sha256(text: str) -> str:
    """A CSP hash source of an inline element's exact text."""
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii")


