"""The HTML report: its content, its escaping, its size, the folder `-o` writes, and the page as
headless Chromium shows it (no network request, no console error, no script but ours)."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import matplotlib.image
import pytest
from browser import find_chromium, open_page
from builders import make_export
from conftest import CAPTURES, FIXTURES, ROOT, analysis_of, truth
from models import MiB, make_analysis

import nsysan
from nsysan.errors import NsysanError
from nsysan.model import Analysis
from nsysan.commands.outputs import write_report
from nsysan.render.html import render_html, render_images
from nsysan.render.png import stand_in_png
from nsysan.base.units import fmt_bytes

XSS = "<script>alert(1)</script>"
MAX_PAGE_BYTES = 2 * 1024 * 1024


class _Tables(HTMLParser):
    """Text of every cell of every table with an id: {id: [[cell, ...], ...]} (body rows only).

    A grouped table's member rows (the allocations under a group, in a nested table) are kept
    apart: "<id>:members" holds one list of rows per group that has them.
    """

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list] = {}
        self._open: list[dict] = []  # one per open table: its id, rows (None: not recorded), state
        self._cell = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        top = self._open[-1] if self._open else None
        if tag == "table":
            name = attrs.get("id")
            if name:
                rows = self.tables.setdefault(name, [])
            elif top and top["rows"] is not None:
                name, rows = top["id"] + ":members", []
                self.tables.setdefault(name, []).append(rows)
            else:
                rows = None
            self._open.append({"id": name, "rows": rows, "body": False, "row": False})
        elif not top or top["rows"] is None:
            return
        elif tag == "tbody":
            top["body"] = True
        elif tag == "tr" and top["body"]:
            top["row"] = "members" not in (attrs.get("class") or "").split()
            if top["row"]:
                top["rows"].append([])
        elif tag in ("td", "th") and top["body"] and top["row"] and self._cell is None:
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "table" and self._open:
            self._open.pop()
        elif tag == "tbody" and self._open:
            self._open[-1]["body"] = False
        elif tag in ("td", "th") and self._cell is not None:
            self._open[-1]["rows"][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def tables(html: str) -> dict[str, list[list[str]]]:
    parser = _Tables()
    parser.feed(html)
    return parser.tables


def attribute_names(html: str) -> set[str]:
    names: set[str] = set()

    class Collect(HTMLParser):
        def handle_starttag(self, tag, attrs):
            names.update(name for name, _ in attrs)

    Collect().feed(html)
    return names


def csp_of(html: str) -> str:
    match = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">', html)
    assert match, "no Content-Security-Policy meta tag"
    return match.group(1).replace("&#39;", "'")


def sha256_source(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


# -- the page, from a hand-built model ----------------------------------------------------------


def test_page_of_a_hand_built_model():
    html = render_html(make_analysis())
    assert '<div class="value" id="headline-peak">768.0 MiB</div>' in html
    cells = tables(html)
    # One group per (site, NVTX range): total, count, sizes, kind, site, range, process, device, when.
    # A site opens to its stack, the user's frames first (the cell's text is the label, then the
    # frames from the site's outward, then one line for the frames inside it, which opens to them),
    # in the sites table and in the grouped tables alike.
    weights = "alloc_weights (train)" + "alloc_weights (train)main (train)" \
        + "+ 1 frame inside it (framework, allocator, CUDA driver, profiler)cudaMalloc (libcudart.so.13)"
    assert cells["never-freed-table"] == [["256.0 MiB", "1", "256.0 MiB", "device", weights, "setup",
                                           "100", "0", "1.00 ms"]]
    # Live at the peak: largest first.
    assert cells["live-at-peak-1"] == [
        ["512.0 MiB", "1", "512.0 MiB", "device", "cudaMalloc in step 1 [trainer]", "step 1", "100", "0", "5.00 ms"],
        ["256.0 MiB", "1", "256.0 MiB", "device", weights, "setup", "100", "0", "1.00 ms"]]
    # The sites table has the process.
    assert cells["sites-table"][1] == [weights, "100", "device", "cudaMalloc", "1", "256.0 MiB", "256.0 MiB", "1",
                                       "256.0 MiB"]
    assert html.count("<details><summary>alloc_weights (train)</summary>") == 3  # sites, never freed, live at peak
    assert cells["failed-table"] == [["6.50 ms", "100", "100", "cudaMalloc", "cudaErrorMemoryAllocation (2)",
                                      "step 1", "256.0 MiB"]]
    # NVTX ranges in the order they first opened: "setup" (0.5 ms) before "step 1" (4 ms).
    assert [row[:2] for row in cells["ranges-table"]] == [["0.50 ms", "setup"], ["4.00 ms", "step 1"]]
    assert cells["peaks-table"][0][6] == "75.0%"  # of the 1 GiB GPU
    assert cells["gpus-table"] == [["0", "Test GPU", "1.0 GiB", "0000:00:01.0"]]
    # Diagnostics, most serious first.
    assert html.index("allocation_failed") < html.index("caching_allocator")
    # The symbol is the site's tooltip.
    assert 'title="alloc_weights(unsigned long) in train"' in html


def test_page_of_a_quick_analysis_shows_no_column_it_could_not_fill():
    quick = nsysan.analyze(FIXTURES / "ddp_leak_v25.sqlite", quick=True)
    html = render_html(quick)
    cells = tables(html)
    # total, count, sizes, kind, process, device, allocated: no site or NVTX range column, so a
    # process's device allocations make one group; its total is the full analysis's never-freed bytes
    full = analysis_of("ddp_leak_v25")
    never_freed = {(g.pid, g.device): g for g in full.groups if g.kind == "device"}
    rows = cells["never-freed-table"]
    assert all(len(row) == 7 for row in rows + cells["live-at-peak-1"])
    assert sorted((row[4], row[0], row[1]) for row in rows if row[3] == "device") == sorted(
        (str(pid), fmt_bytes(g.never_freed_bytes), str(g.never_freed_count)) for (pid, _), g in never_freed.items())
    assert [row[2] for row in cells["peaks-table"]] == [fmt_bytes(p.peak_bytes)
                                                       for p in analysis_of("ddp_leak_v25").peaks]
    assert "(not read)" not in html and "reached by" not in html and "threads calling" not in html
    assert "Not read: a quick analysis" in html and "No allocation sites were recorded" not in html


def test_profile_strings_are_escaped_everywhere():
    analysis = make_analysis(nvtx=XSS, process_name='"><img src=x onerror=alert(2)>',
                             site_label="</td><script>alert(3)</script>", symbol='" onmouseover="alert(4)',
                             module="{{ 7 * 7 }}", gpu_name="<b>GPU</b>", source_name="<i>run</i>.sqlite")
    html = render_html(analysis)
    # ours at the end, and before it the page's data, which is JSON and never runs
    assert html.count("<script") == 2 and html.count('<script type="application/json" id="nsysan-data">') == 1
    assert "alert(" not in re.findall(r"<script>(.*?)</script>", html, re.S)[0]
    (data,) = re.findall(r'<script type="application/json" id="nsysan-data">(.*?)</script>', html, re.S)
    assert "<" not in data and json.loads(data)["spans"][1][1] == XSS  # |tojson wrote it as \u003c
    for raw in (XSS, "<img src=x", "</td><script>", '" onmouseover="', "<b>GPU</b>", "<i>run</i>"):
        assert raw not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&#34;&gt;&lt;img src=x onerror=alert(2)&gt;" in html
    assert 'title="&#34; onmouseover=&#34;alert(4) in {{ 7 * 7 }}"' in html  # data, never a template
    # The text a reader sees is the profile's own string.
    assert tables(html)["live-at-peak-1"][0][5] == XSS and tables(html)["ranges-table"][1][1] == XSS


def test_csp_allows_only_our_inline_style_and_script():
    html = render_html(make_analysis())
    policy = csp_of(html)
    (style,) = re.findall(r"<style>(.*?)</style>", html, re.S)
    (script,) = re.findall(r"<script>(.*?)</script>", html, re.S)
    assert policy == (f"default-src 'none'; img-src data:; style-src '{sha256_source(style)}'; "
                      f"script-src '{sha256_source(script)}'; base-uri 'none'; form-action 'none'")
    assert html.index("Content-Security-Policy") < html.index("<style>")  # in force before anything loads
    # No style attribute or event handler anywhere: the CSP would (rightly) block them.
    names = attribute_names(html)
    assert "style" not in names and not [n for n in names if n.startswith("on")]


def test_page_and_pngs_come_from_the_model_alone():
    analysis = analysis_of("torch_leak_v25")
    from_json = Analysis.from_dict(json.loads(json.dumps(analysis.to_dict())))
    assert from_json.events is None  # no events frame to peek into
    assert render_html(from_json) == render_html(analysis)


# -- every shipped fixture ----------------------------------------------------------------------


@pytest.mark.parametrize("name", CAPTURES)
def test_report_of_every_fixture_is_small_and_self_contained(name):
    analysis = analysis_of(name)
    images = render_images(analysis)
    html = render_html(analysis, images)
    assert len(html.encode()) < MAX_PAGE_BYTES
    # Nothing to fetch: every src is a data: URI of our PNGs, every href an anchor of the page.
    sources = re.findall(r'\bsrc="([^"]*)"', html)
    assert all(s.startswith("data:image/png;base64,") for s in sources)
    # (timeline.png stands in for the chart where JavaScript is off, palette-reduced)
    assert {base64.b64decode(s.split(",", 1)[1]) for s in sources} <= \
        set(images.values()) | {stand_in_png(images["timeline.png"])}
    anchors = re.findall(r'\bhref="([^"]*)"', html)
    assert all(h.startswith("#") for h in anchors)
    assert {h[1:] for h in anchors} <= set(re.findall(r'\bid="([^"]*)"', html))  # each link leads somewhere
    assert "<link" not in html and "@import" not in html and "url(" not in html
    assert "http://" not in html and "https://" not in html  # no address at all, not even in a comment
    assert "Copyright (c) 2022 Leon Sorokin" in html  # uPlot's MIT notice travels with its code
    assert "<iframe" not in html and "<object" not in html and "<embed" not in html


def test_known_bt_page_shows_the_truth():
    html = render_html(analysis_of("known_bt_v25"))
    # fixtures/README.md: the peak is 256 + 128 + 12 + 512 MiB, inside NVTX range "burst".
    assert '<div class="value" id="headline-peak">908.0 MiB</div>' in html and "<b>burst</b>" in html
    # Grouped by site and NVTX range: the three 4 MiB cache entries were kept in steps 2, 5 and 8,
    # one row for the three steps (test_page_leaks).
    # A group's site opens to its call stack (label, then frames innermost first): the label is the
    # cell's text up to the first frame.
    leaked = [(row[0], row[1], row[4].split(" (known)")[0] + " (known)", row[5])
              for row in tables(html)["never-freed-table"]]
    assert ("128.0 MiB", "1", "alloc_weights (known)", "setup") in leaked
    assert [r for r in leaked if r[2] == "alloc_cache_entry (known)"] == [
        ("12.0 MiB", "3", "alloc_cache_entry (known)", "step N (3 ranges)")]
    # fixtures/workloads/known_allocs.cu: main calls train_step, which calls alloc_cache_entry.
    cache = next(row[4] for row in tables(html)["never-freed-table"] if row[4].startswith("alloc_cache_entry"))
    assert "alloc_cache_entry (known)train_step (known)main (known)" in cache


# -- the report folder and `nsysan analyze -o` --------------------------------------------------


def test_write_report_writes_the_page_the_plots_and_the_json(tmp_path):
    analysis = analysis_of("known_bt_v25")
    page = write_report(analysis, tmp_path / "out" / "report")
    folder = page.parent
    assert page == tmp_path / "out" / "report" / "report.html"
    assert sorted(p.name for p in folder.iterdir()) == ["analysis.json", "report.html", "sites.png", "timeline.png"]
    assert nsysan.load_analysis(folder / "analysis.json") == analysis
    html = page.read_text(encoding="utf-8")
    # the page draws its own plots; the PNGs are for trackers and chat, and timeline.png stands in
    # for the chart only where JavaScript is off
    assert html.count("<img") == 1 and re.search(r'<noscript><img class="timeline-picture" src="data:[^"]*"[^>]*>', html)
    for name in ("timeline.png", "sites.png"):
        png = (folder / name).read_bytes()
        assert matplotlib.image.imread(io.BytesIO(png), format="png").shape[1] == 2400  # 12 in at 200 dpi


def test_write_report_where_a_file_is_is_one_clear_error(tmp_path):
    (tmp_path / "taken").write_text("a file")
    with pytest.raises(NsysanError, match="taken exists and is not a folder"):
        write_report(make_analysis(), tmp_path / "taken")
    with pytest.raises(NsysanError, match="is not a folder"):
        write_report(make_analysis(), tmp_path / "taken" / "report")


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nsysan", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def test_analyze_output_writes_the_report(tmp_path):
    out = tmp_path / "report"
    result = run("analyze", str(FIXTURES / "real_oom_v25.sqlite"), "-o", str(out), "--no-progress")
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip().endswith(f"Report: {out / 'report.html'} (with timeline.png, sites.png and "
                                           "analysis.json)")
    assert "Failed memory calls" in result.stdout  # the summary is still printed
    assert sorted(p.name for p in out.iterdir()) == ["analysis.json", "report.html", "sites.png", "timeline.png"]
    assert "cudaErrorMemoryAllocation" in (out / "report.html").read_text()


def test_analyze_output_with_several_reports_and_json(tmp_path):
    result = run("analyze", "fixtures/known_mem_v25.sqlite", "fixtures/known_plain_v25.sqlite", "--output",
                 str(tmp_path), "--format", "json")
    assert result.returncode == 0, result.stderr
    names = [d["source"]["name"] for d in json.loads(result.stdout)]
    assert names == ["known_mem_v25.sqlite", "known_plain_v25.sqlite"]
    for name in ("known_mem_v25.sqlite", "known_plain_v25.sqlite"):
        assert (tmp_path / name / "report.html").is_file() and (tmp_path / name / "timeline.png").is_file()
    assert "sizes not collected" in (tmp_path / "known_plain_v25.sqlite" / "report.html").read_text()


@pytest.mark.parametrize("where", ["a_file", "a_file/report"])
def test_analyze_output_not_writable_is_one_line_and_exit_2(tmp_path, where):
    (tmp_path / "a_file").write_text("not a folder")
    result = run("analyze", "fixtures/known_bt_v25.sqlite", "-o", str(tmp_path / where))
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("nsysan: ") and "not a folder" in line and "Traceback" not in result.stderr
    assert result.stdout == ""  # refused before analyzing


def test_analyze_output_refuses_two_reports_of_the_same_name(tmp_path):
    result = run("analyze", "fixtures/known_bt_v25.sqlite", str(FIXTURES / "known_bt_v25.sqlite"), "-o",
                 str(tmp_path))
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "several reports are named known_bt_v25.sqlite" in line


# -- in a real browser --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chromium() -> str:
    """Debian's chromium; tests skip without it, but fail in CI (NSYSAN_REQUIRE_BROWSER=1)."""
    executable = find_chromium()
    if not executable:
        if os.environ.get("NSYSAN_REQUIRE_BROWSER") == "1":
            pytest.fail("NSYSAN_REQUIRE_BROWSER=1 but chromium is not installed (apt-get install chromium)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return executable


PAGE_PROBES = {
    "ready": "document.documentElement.getAttribute('data-sortable')",  # our script ran under the CSP
    "interactive_ms": "Number(document.documentElement.getAttribute('data-interactive-ms'))",
    "scripts": "document.scripts.length",
    "peak": "document.getElementById('headline-peak').textContent",
    "never_freed": "Array.from(document.querySelectorAll('#never-freed-table tr.group'),"
                   " r => Array.from(r.cells, c => c.textContent.replace(/^[+\u2212]/, '').trim()))",
    # Click "total": the groups come back smallest first (they start largest first).
    "totals_after_click": "(() => { const t = document.getElementById('never-freed-table');"
                          " if (!t) return null; t.tHead.rows[0].cells[0].querySelector('button.sort').click();"
                          " return Array.from(t.tBodies, b => Number(b.rows[0].cells[0].dataset.v)); })()",
    # The step chart's lines as drawn (bytes per step number) and the timeline legend's names.
    "step_charts": "(window.nsysanStepCharts || []).map(c => ({labels: c.labels, data: c.data, steps: c.steps}))",
    "legend": "Array.from(document.querySelectorAll('.timeline .u-legend .u-series:not(:first-child) .u-label'),"
              " e => e.textContent)",
    # Where the answer and the first timeline panel end on the first screen (px from the top).
    "first_screen": "(() => { const bottom = s => { const e = document.querySelector(s);"
                    " return e ? e.getBoundingClientRect().bottom : null; };"
                    " return {headline: bottom('#headline'), verdicts: bottom('#verdicts'),"
                    " warnings: bottom('#warnings'), panel: bottom('.timeline .panel')}; })()",
}

# Hover, drag, wheel, click and double-click on the first timeline panel, as a mouse would (uPlot
# ignores a drag's moves without movementX; at whole pixels, as a mouse is, and not on the last
# pixel, where uPlot clamps the cursor and takes the click for a drag), recording what the page
# shows after each.
INTERACT = """(async () => {
  const tl = window.nsysanTimelines[0], u = tl.plots[0], r = u.over.getBoundingClientRect();
  const frame = () => new Promise(done => requestAnimationFrame(() => setTimeout(done, 20)));
  const fire = (type, fx, target) => (target || u.over).dispatchEvent(new MouseEvent(type, {
      clientX: Math.round(r.left + fx * r.width), clientY: Math.round(r.top + r.height / 2), bubbles: true, cancelable: true,
      view: window, buttons: 1, movementX: 5}));
  const picture = () => u.ctx.canvas.toDataURL();
  const readout = () => u.root.closest('.timeline').querySelector('.readout').textContent;
  const out = {opened: tl.view(), picture: picture(), readout: readout()};
  fire('mouseenter', 0.5); fire('mousemove', 0.5); await frame();
  out.hovered = readout();
  fire('mousedown', 0.2); await frame(); fire('mousemove', 0.45); await frame(); fire('mouseup', 0.45, document);
  await frame();
  out.dragged = tl.view(); out.dragged_picture = picture();
  u.over.dispatchEvent(new WheelEvent('wheel', {clientX: r.left + r.width / 2, clientY: r.top + 20, deltaY: 100,
                                                bubbles: true, cancelable: true}));
  out.wheeled = tl.view();
  u.over.dispatchEvent(new MouseEvent('dblclick', {bubbles: true}));
  out.reset = tl.view();
  u.root.closest('.timeline').querySelector('button[data-view="all"]').click();
  out.whole = tl.view();
  fire('mousemove', 0.995); await frame();
  fire('mousedown', 0.995); fire('mouseup', 0.995, document); fire('click', 0.995);
  out.listed = Array.from(u.root.closest('.timeline').querySelectorAll('.live-list tbody tr'),
                          row => Array.from(row.cells, c => c.textContent));
  return out;
})()"""


def assert_quiet_page(page, netlog_requests) -> None:
    assert page.requests and page.requests[0].startswith("file:")  # the recording works
    assert page.remote_requests == [] and netlog_requests == []
    assert page.errors == [] and page.dialogs == []
    assert page.values.get("ready", "ready") == "ready"


def assert_screenshot(png: bytes, size: tuple[int, int]) -> None:
    image = matplotlib.image.imread(io.BytesIO(png), format="png")
    assert (image.shape[1], image.shape[0]) == size
    assert image[..., :3].std() > 0.1  # text, tables and a plot, not a blank page


BROWSER_FIXTURES = ["torch_leak_v25", "ddp_leak_v25", "real_oom_v25", "known_plain_v25", "known_bt_v25",
                    "torch_clean_v25"]


def reserved_per_step(name: str) -> list[int]:
    """PyTorch's own `reserved` bytes after each step (the .truth.jsonl): the driver-level live
    bytes follow them plus a constant of library workspaces (fixtures/README.md)."""
    return [r["reserved"] for r in truth(name) if "step" in r]


def deltas(values: list[int]) -> list[int]:
    return [b - a for a, b in zip(values, values[1:])]


def assert_step_chart(name: str, charts: list[dict], legend: list[str]) -> None:
    """The chart draws the live bytes at each step's end per process, and the growth verdict's line."""
    if name in ("torch_leak_v25", "torch_clean_v25"):
        (chart,) = charts
        # One process without a rank: named by its process name and pid, in the legends too.
        assert chart["labels"][0] == {"torch_leak_v25": "python3 (1644)", "torch_clean_v25": "python3 (2373)"}[name]
        assert chart["steps"] == list(range(6))
        assert deltas(chart["data"][0]) == deltas(reserved_per_step(name))
        assert all(label.startswith(chart["labels"][0] + " · ") for label in legend)
    if name == "torch_leak_v25":
        # The growth line: the median of the reserved deltas of steps 2-5 (step 1 is warm-up),
        # (765460480 + 775946240) / 2 = 770703360 B = 735.0 MiB per step, up to step 5's bytes.
        assert chart["labels"][1] == "python3 (1644) growing: 735.0 MiB/step"
        line = chart["data"][1]
        assert line[5] == chart["data"][0][5] and line[5] - line[2] == 3 * 770703360
    if name == "torch_clean_v25":  # flat after step 2: the verdict's line is flat at 0 B/step
        assert chart["labels"][1] == "python3 (2373) stable: 0 B/step"
    if name == "ddp_leak_v25":
        (chart,) = charts
        lines = dict(zip(chart["labels"], chart["data"]))
        # fixtures/README.md: rank 1 leaks 64 MiB per step, rank 0 does not. Step 0 is warm-up.
        assert deltas(lines["rank 1"])[1:] == [64 * MiB] * 6 and deltas(lines["rank 0"])[1:] == [0] * 6
        assert "rank 1 growing: 64.0 MiB/step" in lines and "rank 0 stable: 0 B/step" in lines
        # Ranks, not pids, name the processes in the timeline's legends.
        assert legend and all(label.startswith(("rank 0 · ", "rank 1 · ")) for label in legend)
    if name == "known_bt_v25":
        # fixtures/README.md (known_allocs.cu): steps 0-8 free their workspace; steps 2, 5 and 8 keep
        # one 4 MiB cache entry each.
        (chart,) = charts
        assert chart["steps"] == list(range(9))
        assert deltas(chart["data"][0]) == [4 * MiB if step in (2, 5, 8) else 0 for step in range(1, 9)]
    if name in ("real_oom_v25", "known_plain_v25"):  # no steps (real_oom), no sizes (known_plain)
        assert charts == []


@pytest.mark.parametrize("name", BROWSER_FIXTURES)
def test_report_in_chromium(name, tmp_path, chromium):
    analysis = analysis_of(name)
    page_path = write_report(analysis, tmp_path / "report")
    has_timeline = bool(analysis.timeline.series)
    probes = {**PAGE_PROBES, "interact": INTERACT} if has_timeline else PAGE_PROBES
    page, netlog = open_page(page_path, width=1400, height=900, evaluate=probes)
    (tmp_path / "screenshot.png").write_bytes(page.screenshot)
    assert_quiet_page(page, netlog)
    assert page.values["scripts"] == 2  # the data (JSON, never run) and ours
    # the page says when it became interactive (navigation start to the timeline drawn); how
    # soon is benchmarks/page.py's to measure (docs/report.md), not a timed test's
    assert page.values["interactive_ms"] > 0
    assert_screenshot(page.screenshot, (1400, 900))
    # The first screen holds the answer and the timeline.
    screen = page.values["first_screen"]
    assert all(v is None or v <= 900 for v in screen.values()) and screen["verdicts"] is not None
    if not analysis.peak:
        assert page.values["peak"] == "sizes not collected"  # known_plain_v25: no sizes
        return
    assert page.values["peak"] == fmt_bytes(analysis.peak.peak_bytes)
    assert screen["panel"] is not None
    rows = page.values["never_freed"]
    assert [(r[0], r[1]) for r in rows] == [(fmt_bytes(g.total_bytes), str(g.count)) for g in analysis.never_freed_groups]
    if rows:
        assert page.values["totals_after_click"] == sorted(g.total_bytes for g in analysis.never_freed_groups)
    # Hover shows the time, the live bytes and the NVTX path; drag and wheel zoom; double-click
    # goes back to the opening view; "Whole capture" shows the capture from its start.
    seen = page.values["interact"]
    assert seen["readout"].startswith("Hover over") and seen["hovered"].startswith("at ")
    assert "process " in seen["hovered"]
    start, end = seen["opened"]
    assert (start, end) == (analysis.timeline.focus_start_ns / 1e9, analysis.timeline.focus_end_ns / 1e9)
    left, right = seen["dragged"]
    assert start < left < right < end and (right - left) < 0.5 * (end - start)
    assert seen["dragged_picture"] != seen["picture"]  # the plot was redrawn zoomed
    assert seen["wheeled"][1] - seen["wheeled"][0] > right - left  # wheel down zooms out
    assert seen["reset"] == seen["opened"]
    assert seen["whole"] == [analysis.timeline.start_ns / 1e9, analysis.timeline.end_ns / 1e9]
    # A click at the end of the capture lists what was still live: the never-freed blocks among them
    listed_sizes = [row[2] for row in seen["listed"]]  # grouped by site: each row's sizes
    assert any(fmt_bytes(analysis.never_freed[0].bytes) in sizes for sizes in listed_sizes) if analysis.never_freed else True
    assert_step_chart(name, page.values["step_charts"], page.values["legend"])
    if name == "known_bt_v25":  # fixtures/README.md
        assert page.values["peak"] == "908.0 MiB"
    if name == "ddp_leak_v25":  # rank 1 (pid 2147) leaks 64 MiB in each step: one row for its steps (test_page_leaks)
        assert rows[0][4:7] == ["cudaMalloc in step N [pt_autograd_1]", "step N (8 ranges)", "2147"]
    if name == "real_oom_v25":  # the 16 GiB blocks of "fill" until cudaMalloc failed
        assert "cudaErrorMemoryAllocation" in page.dom and 'id="verdict-oom"' in page.dom


@pytest.mark.parametrize("name", BROWSER_FIXTURES[:4])
def test_report_at_420_px_has_no_page_scroll(name, tmp_path, chromium):
    page_path = write_report(analysis_of(name), tmp_path / "report")
    page, netlog = open_page(page_path, width=420, height=900, evaluate={
        "widths": "[document.documentElement.scrollWidth, document.body.scrollWidth, window.innerWidth]",
        "plots": "Array.from(document.querySelectorAll('.uplot canvas'), c => c.getBoundingClientRect().right)"})
    assert_quiet_page(page, netlog)
    page_width, body_width, viewport = page.values["widths"]
    assert viewport == 420 and page_width <= viewport and body_width <= viewport
    assert all(right <= viewport for right in page.values["plots"])


def pdf_text(pdf: bytes, tmp_path: Path) -> str:
    if not shutil.which("pdftotext"):
        if os.environ.get("NSYSAN_REQUIRE_BROWSER") == "1":
            pytest.fail("NSYSAN_REQUIRE_BROWSER=1 but pdftotext is not installed (apt-get install poppler-utils)")
        pytest.skip("pdftotext is not installed (apt-get install poppler-utils)")
    (tmp_path / "page.pdf").write_bytes(pdf)
    return subprocess.run(["pdftotext", "-layout", str(tmp_path / "page.pdf"), "-"], capture_output=True, text=True,
                          check=True).stdout


def test_printed_report_repeats_table_headers_with_their_text(tmp_path, chromium):
    # 120 never-freed groups, each site 80 words long: the 25 rows a long table prints run over
    # several A4 pages, and each page's copy of the header must carry its text (a <button> inside
    # a <th> printed blank in repeated headers).
    base = make_analysis()
    group = base.never_freed_groups[0]
    groups = [dataclasses.replace(group, nvtx_range=f"step {i}", total_bytes=(200 - i) * MiB,
                                  site=dataclasses.replace(group.site, label=" ".join(["frame"] * 80) + f" site {i}"))
              for i in range(120)]
    page_path = write_report(dataclasses.replace(base, never_freed_groups=groups), tmp_path / "report")
    page, netlog = open_page(page_path, width=1400, height=900, screenshot=False, pdf=True)
    assert_quiet_page(page, netlog)
    text = pdf_text(page.pdf, tmp_path)
    pages = text.count("\f")
    header = re.compile(r"total\s+count\s+sizes\s+kind\s+site\s+NVTX range\s+process\s+device\s+allocated \(ms\)")
    assert pages >= 3 and len(header.findall(text)) >= 3  # the first page of the table and its repeats
    # the first 25 rows in the order shown, and a line that says so; no controls
    assert "step 24" in text and "step 25" not in text and "filter" not in text
    assert re.search(r"Printed:\s+the\s+first\s+25\s+of\s+120\s+rows", text)
    assert "Where memory moves" not in text and "Whole capture" not in text


def test_nvtx_range_named_script_is_text_in_chromium(tmp_path, chromium):
    # One 64 MiB block allocated inside the range and never freed, then a 32 MiB one: both in it.
    export = make_export(tmp_path / "xss.sqlite",
                         memory=[(2_000_000, 0xA000, 64 * MiB, 0, 1), (3_000_000, 0xB000, 32 * MiB, 0, 2)],
                         calls=[(2_000_000, 2_000_100, "cudaMalloc_v3020", 1),
                                (3_000_000, 3_000_100, "cudaMalloc_v3020", 2)],
                         nvtx=[(1_000_000, 5_000_000, XSS)])
    analysis = nsysan.analyze(export)
    assert analysis.peak.nvtx_range == XSS and analysis.timeline.bands[0].name == XSS
    page_path = write_report(analysis, tmp_path / "report")
    html = page_path.read_text(encoding="utf-8")
    assert XSS not in html and html.count("<script") == 2
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    page, netlog = open_page(page_path, evaluate={
        "ready": PAGE_PROBES["ready"], "scripts": PAGE_PROBES["scripts"],
        "text": "document.body.innerText",
        "ranges": "Array.from(document.querySelectorAll('#ranges-table tbody td:nth-child(2)'), c => c.textContent)",
        # the hover readout at 2.5 ms (inside the range) and the click list there
        "hovered": "(() => { const t = window.nsysanTimelines[0]; t.show(0.0025); t.list(0.0025);"
                   " return [document.querySelector('.readout').textContent,"
                   " Array.from(document.querySelectorAll('.live-list td'), c => c.textContent)]; })()"})
    assert_quiet_page(page, netlog)  # no alert() dialog opened
    assert page.values["scripts"] == 2
    assert XSS in page.values["text"] and page.values["ranges"] == [XSS]  # shown as text
    readout, listed = page.values["hovered"]
    assert readout.endswith("NVTX " + XSS) and listed.count(XSS) == 1  # the 64 MiB block, in the range


def test_csp_stops_a_script_that_escaping_missed(tmp_path, chromium):
    # Defence in depth: pretend escaping failed and a profile string landed in the page raw.
    page_path = write_report(make_analysis(), tmp_path / "report")
    html = page_path.read_text(encoding="utf-8")
    injected = "<script>alert('injected')</script><img src=x onerror=\"alert('handler')\">"
    page_path.write_text(html.replace("<h1>", injected + "<h1>", 1), encoding="utf-8")
    page, netlog = open_page(page_path, evaluate={"ready": PAGE_PROBES["ready"]})
    assert page.dialogs == []
    assert page.values["ready"] == "ready"  # our own script still runs
    assert any("Content Security Policy" in text for level, text in page.console if level == "error")
    assert page.remote_requests == [] and netlog == []


def test_the_browser_checks_do_see_requests_and_dialogs(tmp_path, chromium):
    # The checks above mean something only if a page that does reach out is caught.
    leaky = tmp_path / "leaky.html"
    leaky.write_text('<img src="https://img.example.invalid/a.png">'
                     '<script>fetch("https://fetch.example.invalid/x").catch(() => {}); alert("hi")</script>')
    page, netlog = open_page(leaky, screenshot=False)
    assert "https://img.example.invalid/a.png" in page.remote_requests
    assert any(url.startswith("https://fetch.example.invalid/") for url in netlog)
    assert page.dialogs == ["alert: hi"]


def test_page_without_sizes_counts_calls_per_range_instead_of_zero_bytes():
    html = render_html(analysis_of("known_plain_v25"))
    rows = {row[1]: row for row in tables(html)["ranges-table"]}
    # fixtures/README.md (known_allocs.cu): each step allocates its workspace; steps 2, 5 and 8 also
    # keep a cache entry; setup allocates the two weight blocks. 29 allocation calls in all.
    assert {name: int(rows[name][4]) for name in rows if name.startswith("step ")} == {
        f"step {i}": 2 if i in (2, 5, 8) else 1 for i in range(9)}
    assert rows["setup"][4] == "2" and rows["train"][4] == "-"  # train only encloses the steps
    assert sum(int(row[4]) for row in rows.values() if row[4] != "-") == 29
    assert [row[1] for row in tables(html)["ranges-table"]][:3] == ["setup", "train", "step 0"]  # time order
    assert "0 B" not in html and "allocation calls" in html


def test_page_names_the_report_file_and_full_paths_brings_the_path_back(tmp_path):
    report = FIXTURES / "real_oom_v25.sqlite"  # an absolute path: the page must not show it
    for options, shown in (((), "real_oom_v25.sqlite"), (("--full-paths",), str(report))):
        out = tmp_path / ("full" if options else "short")
        result = run("analyze", str(report), "-o", str(out), "--no-progress", "--format", "json", *options)
        assert result.returncode == 0, result.stderr
        html = (out / "report.html").read_text(encoding="utf-8")
        assert f"<dt>report</dt><dd><code>{shown}</code>" in html
        assert (str(FIXTURES) in html) == bool(options)
