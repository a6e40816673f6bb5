"""The HTML report: its content, its escaping, its size, the folder `-o` writes, and the page as
headless Chromium shows it (no network request, no console error, no script but ours)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import matplotlib.image
import pytest
from browser import find_chromium, open_page
from builders import make_export
from conftest import CAPTURES, FIXTURES, ROOT, analysis_of
from models import MiB, make_analysis

import nsysan
from nsysan.errors import NsysanError
from nsysan.model import Analysis
from nsysan.render.html import render_html, render_images, write_report
from nsysan.units import fmt_bytes

XSS = "<script>alert(1)</script>"
MAX_PAGE_BYTES = 2 * 1024 * 1024


class _Tables(HTMLParser):
    """Text of every cell of every table with an id: {id: [[cell, ...], ...]} (body rows only)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self._table = None
        self._in_body = False
        self._cell = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table" and attrs.get("id"):
            self._table = self.tables.setdefault(attrs["id"], [])
        elif tag == "tbody":
            self._in_body = True
        elif tag == "tr" and self._table is not None and self._in_body:
            self._table.append([])
        elif tag in ("td", "th") and self._table is not None and self._in_body:
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "table":
            self._table = None
        elif tag == "tbody":
            self._in_body = False
        elif tag in ("td", "th") and self._cell is not None:
            self._table[-1].append("".join(self._cell).strip())
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
    assert cells["never-freed-table"] == [["256.0 MiB", "device", "cudaMalloc", "alloc_weights (train)", "setup",
                                           "100", "0", "1.00 ms"]]
    # Live at the peak: largest first, with the age at the peak (5 ms - 1 ms).
    assert cells["live-at-peak-1"] == [
        ["512.0 MiB", "device", "cudaMalloc", "cudaMalloc in step 1 [trainer]", "step 1", "0 ns", "5.00 ms"],
        ["256.0 MiB", "device", "cudaMalloc", "alloc_weights (train)", "setup", "4.00 ms", "1.00 ms"]]
    # The site opens to its whole stack, innermost frame first; the table has the process.
    assert cells["sites-table"][1] == ["alloc_weights (train)cudaMalloc (libcudart.so.13)alloc_weights (train)main (train)",
                                       "100", "device", "cudaMalloc", "1", "256.0 MiB", "256.0 MiB", "1", "256.0 MiB"]
    assert "<details><summary>alloc_weights (train)</summary>" in html
    assert cells["failed-table"] == [["6.50 ms", "100", "100", "cudaMalloc", "cudaErrorMemoryAllocation (2)",
                                      "step 1", "256.0 MiB"]]
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
    # size, kind, age, allocated at: no API, site or NVTX range; the values are the full analysis's
    assert cells["live-at-peak-1"][0] == ["130.0 MiB", "device", "360.29 ms", "13.316 s"]
    assert cells["never-freed-table"][0] == ["130.0 MiB", "device", "2146", "0", "13.316 s"]
    assert [row[2] for row in cells["peaks-table"]] == [fmt_bytes(p.peak_bytes)
                                                       for p in analysis_of("ddp_leak_v25").peaks]
    assert "(not read)" not in html and "reached by" not in html and "threads calling" not in html
    assert "Not read: a quick analysis" in html and "No allocation sites were recorded" not in html


def test_profile_strings_are_escaped_everywhere():
    analysis = make_analysis(nvtx=XSS, process_name='"><img src=x onerror=alert(2)>',
                             site_label="</td><script>alert(3)</script>", symbol='" onmouseover="alert(4)',
                             module="{{ 7 * 7 }}", gpu_name="<b>GPU</b>", source_name="<i>run</i>.sqlite")
    html = render_html(analysis)
    assert html.count("<script") == 1  # ours, at the end
    assert "alert(" not in re.findall(r"<script>(.*?)</script>", html, re.S)[0]
    for raw in (XSS, "<img src=x", "</td><script>", '" onmouseover="', "<b>GPU</b>", "<i>run</i>"):
        assert raw not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&#34;&gt;&lt;img src=x onerror=alert(2)&gt;" in html
    assert 'title="&#34; onmouseover=&#34;alert(4) in {{ 7 * 7 }}"' in html  # data, never a template
    # The text a reader sees is the profile's own string.
    assert tables(html)["live-at-peak-1"][0][4] == XSS and tables(html)["ranges-table"][0][0] == XSS


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
    assert {base64.b64decode(s.split(",", 1)[1]) for s in sources} <= set(images.values())
    anchors = re.findall(r'\bhref="([^"]*)"', html)
    assert all(h.startswith("#") for h in anchors)
    assert {h[1:] for h in anchors} <= set(re.findall(r'\bid="([^"]*)"', html))  # each link leads somewhere
    assert "<link" not in html and "@import" not in html and "url(" not in html
    assert "<iframe" not in html and "<object" not in html and "<embed" not in html


def test_known_bt_page_shows_the_truth():
    html = render_html(analysis_of("known_bt_v25"))
    # fixtures/README.md: the peak is 256 + 128 + 12 + 512 MiB, inside NVTX range "burst".
    assert '<div class="value" id="headline-peak">908.0 MiB</div>' in html and "<b>burst</b>" in html
    leaked = [(row[0], row[3]) for row in tables(html)["never-freed-table"]]
    assert ("128.0 MiB", "alloc_weights (known)") in leaked
    assert [size for size, site in leaked if site == "alloc_cache_entry (known)"] == ["4.0 MiB"] * 3


# -- the report folder and `nsysan analyze -o` --------------------------------------------------


def test_write_report_writes_the_page_the_plots_and_the_json(tmp_path):
    analysis = analysis_of("known_bt_v25")
    page = write_report(analysis, tmp_path / "out" / "report")
    folder = page.parent
    assert page == tmp_path / "out" / "report" / "report.html"
    assert sorted(p.name for p in folder.iterdir()) == ["analysis.json", "report.html", "sites.png", "timeline.png"]
    assert nsysan.load_analysis(folder / "analysis.json") == analysis
    html = page.read_text(encoding="utf-8")
    for name in ("timeline.png", "sites.png"):
        png = (folder / name).read_bytes()
        assert f'src="data:image/png;base64,{base64.b64encode(png).decode()}"' in html  # the same picture
        assert matplotlib.image.imread(io.BytesIO(png), format="png").shape[1] == 1200


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
    "scripts": "document.scripts.length",
    "peak": "document.getElementById('headline-peak').textContent",
    "never_freed": "Array.from(document.querySelectorAll('#never-freed-table tbody tr'),"
                   " r => Array.from(r.cells, c => c.textContent.trim()))",
    "timeline_width": "document.getElementById('timeline-plot').naturalWidth",
    # Click "size": the rows come back smallest first (they start largest first).
    "sizes_after_click": "(() => { const t = document.getElementById('never-freed-table');"
                         " t.tHead.rows[0].cells[0].querySelector('button').click();"
                         " return Array.from(t.tBodies[0].rows, r => Number(r.cells[0].dataset.v)); })()",
}


def assert_quiet_page(page, netlog_requests) -> None:
    assert page.requests and page.requests[0].startswith("file:")  # the recording works
    assert page.remote_requests == [] and netlog_requests == []
    assert page.errors == [] and page.dialogs == []
    assert page.values.get("ready", "ready") == "ready"


def assert_screenshot(png: bytes, size: tuple[int, int]) -> None:
    image = matplotlib.image.imread(io.BytesIO(png), format="png")
    assert (image.shape[1], image.shape[0]) == size
    assert image[..., :3].std() > 0.1  # text, tables and a plot, not a blank page


@pytest.mark.parametrize("name", ["torch_leak_v25", "ddp_leak_v25", "known_bt_v25"])
def test_report_in_chromium(name, tmp_path, chromium):
    analysis = analysis_of(name)
    page_path = write_report(analysis, tmp_path / "report")
    page, netlog = open_page(page_path, width=1400, height=2000, evaluate=PAGE_PROBES)
    (tmp_path / "screenshot.png").write_bytes(page.screenshot)
    assert_quiet_page(page, netlog)
    assert page.values["scripts"] == 1
    assert_screenshot(page.screenshot, (1400, 2000))
    assert page.values["peak"] == fmt_bytes(analysis.peak.peak_bytes)
    assert page.values["timeline_width"] == 1200  # the embedded PNG decoded
    rows = page.values["never_freed"]
    assert len(rows) == len(analysis.never_freed)
    assert [(r[0], r[3]) for r in rows] == [(fmt_bytes(a.bytes), a.site.label) for a in analysis.never_freed]
    assert page.values["sizes_after_click"] == sorted(a.bytes for a in analysis.never_freed)
    if name == "known_bt_v25":  # fixtures/README.md
        assert page.values["peak"] == "908.0 MiB"
        assert ["4.0 MiB", "alloc_cache_entry (known)"] in [[r[0], r[3]] for r in rows]
    if name == "ddp_leak_v25":  # rank 1 (pid 2147) leaks 64 MiB in each step from step 1 on
        steps = [r[4] for r in rows if r[0] == "64.0 MiB" and r[5] == "2147"]
        assert {f"step {i}" for i in range(1, 8)} <= set(steps)


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
    assert XSS not in html and html.count("<script") == 1
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    page, netlog = open_page(page_path, evaluate={
        "ready": PAGE_PROBES["ready"], "scripts": PAGE_PROBES["scripts"],
        "text": "document.body.innerText",
        "ranges": "Array.from(document.querySelectorAll('#ranges-table tbody td:first-child'), c => c.textContent)"})
    assert_quiet_page(page, netlog)  # no alert() dialog opened
    assert page.values["scripts"] == 1
    assert XSS in page.values["text"] and page.values["ranges"] == [XSS]  # shown as text


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
