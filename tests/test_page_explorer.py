"""The report page as an explorer (issue 29): the NVTX table's one row per family of ranges ("step 0 –
step 4"), nested NVTX tracks that appear as you zoom, the y axis that follows the visible window,
keyboard, drag and touch navigation, and the PNG timeline that stands in without JavaScript."""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import subprocess

import pytest
from browser import open_page
from conftest import FIXTURES, analysis_of, cli
from PIL import Image
from test_html import assert_quiet_page, chromium, pdf_text  # noqa: F401  (the fixture)

from nsysan.analyses.explore import nvtx_spans
from nsysan.analyses.steps import listed
from nsysan.analyses.timeline import top_level_bands
from nsysan.commands.outputs import write_report
from nsysan.render import html as html_module
from nsysan.render.page_data import page_data
from nsysan.base.units import fmt_bytes

RANGE_ROWS = ("Array.from(document.querySelectorAll('#ranges-table tbody tr'),"
              " r => Array.from(r.cells, c => [c.textContent.trim(), c.dataset.v]))")


def range_rows_on_page(analysis, tmp_path) -> dict[str, list]:
    """The NVTX table's rows as Chromium shows them, by range cell: each cell's text and data-v."""
    page, netlog = open_page(write_report(analysis, tmp_path / "report"), width=1400, height=900, screenshot=False,
                             evaluate={"rows": RANGE_ROWS})
    assert_quiet_page(page, netlog)
    return {r[1][0]: r for r in page.values["rows"]}


def test_steps_are_one_row_holding_their_phases_bytes(tmp_path, chromium):
    # torch_ops_v25: 5 steps, each allocating nothing itself and everything in forward/backward/optimizer
    analysis = analysis_of("torch_ops_v25")
    rows = range_rows_on_page(analysis, tmp_path)
    assert not [name for name in rows if name.startswith("step ") and "–" not in name]  # no row per step
    step = rows["step 0 – step 4 (5 ranges)"]
    assert step[2][0] == "5"  # instances
    phases = [rows[name] for name in ("forward", "backward", "optimizer")]
    # allocated, nested ranges included: the step's own bytes and all its phases' (each opened once per step)
    inside = int(step[6][1]) + sum(int(p[6][1]) for p in phases)
    assert int(step[5][1]) == inside > 4 << 30 and step[5][0] == fmt_bytes(inside) == "4.5 GiB"
    assert int(step[4][1]) == \
        sum(r.allocations for r in analysis.ranges if r.name.startswith("step ")) + sum(int(p[4][1]) for p in phases)
    # a phase has nothing nested: what it allocated is what it allocated directly
    assert all(p[5] == p[6] for p in phases)
    # the steps table, found by another analysis (live device + array bytes per step), agrees within
    # the bytes of other kinds (pinned, static) the ranges count too
    steps = sum(s.allocated_bytes for s in analysis.steps[0].steps)
    assert steps <= inside < steps + (1 << 20)


def test_a_family_sums_every_name_and_matches_the_steps_table(tmp_path, chromium):
    # known_mem_v25: steps 0-8 inside "train", two "worker N" ranges; only device memory moves
    analysis = analysis_of("known_mem_v25")
    rows = range_rows_on_page(analysis, tmp_path)
    step = rows["step 0 – step 8 (9 ranges)"]
    assert int(step[5][1]) == sum(s.allocated_bytes for s in analysis.steps[0].steps) == 314_572_800
    # named by the first and the last to open: worker 2 started first
    assert int(step[2][0]) == 9 and "worker 2 – worker 1 (2 ranges)" in rows
    # "train" holds the steps: 0 B of its own, all of theirs
    train = rows["train"]
    assert train[6][1] == "0" and int(train[5][1]) == int(step[5][1])


# -- the explorer: tracks, the y axis, keys, drag and touch ----------------------------------------
TICK = "await new Promise(r => setTimeout(r, 30));"  # uPlot applies scales and hooks a moment later


def explore(analysis, tmp_path, script: str, width: int = 1400):
    """Open the page and run `script` (an async function body; `t` is the main timeline, `u` its
    first plot, `tr` that plot's tracks) in Chromium; return what it returns."""
    page, netlog = open_page(write_report(analysis, tmp_path / "report"), width=width, height=900, screenshot=False,
                             evaluate={"out": "(async () => { const t = window.nsysanTimelines[0], u = t.plots[0],"
                                              f" tr = t.nav.tracks[0]; {TICK} {script} }})()"})
    assert_quiet_page(page, netlog)
    return page.values["out"]


def live_max(analysis, lo_ns: float, hi_ns: float) -> int:
    """The most any line of the panel reaches from lo to hi: each series holds its value from its
    last point at or before lo (step lines) and every point inside."""
    top = 0
    for s in analysis.timeline.series:
        before = [b for t, b in zip(s.ts_ns, s.live_bytes) if t <= lo_ns]
        inside = [b for t, b in zip(s.ts_ns, s.live_bytes) if lo_ns < t <= hi_ns]
        top = max([top] + before[-1:] + inside)
    return top


def test_zoom_rescales_the_y_axis_to_the_visible_lines(tmp_path, chromium):
    analysis = analysis_of("torch_ops_v25")
    forward = [s for s in analysis.timeline.spans if s.name == "forward"][2]  # step 2's, 11 ms
    lo, hi = forward.start_ns / 1e9, forward.end_ns / 1e9
    out = explore(analysis, tmp_path, f"""
        const opening = u.scales.y.max, label = u.axes[1].label;
        t.setView([{lo}, {hi}]); {TICK}
        const zoomed = u.scales.y.max;
        t.nav.reset(); {TICK}
        return [opening, zoomed, u.scales.y.max, label];""")
    opening, zoomed, reset, label = out
    assert label == "live (GiB)"
    top = live_max(analysis, forward.start_ns, forward.end_ns)
    assert 2 << 30 < top < analysis.peak.peak_bytes / 1.5  # step 2's forward: 2.6 GiB of the 4.6 GiB peak
    assert abs(zoomed / 1.22 * (1 << 30) - top) < 1  # the axis reaches the highest visible value, 22% headroom
    assert opening > zoomed and reset == opening  # Home brings the whole axis back (peak callouts, GPU line)


def test_keys_pan_and_zoom_the_time_axis(tmp_path, chromium):
    analysis = analysis_of("torch_ops_v25")
    out = explore(analysis, tmp_path, f"""
        const panels = document.querySelector('#timeline-main .panels'), views = [t.view()];
        const key = k => panels.dispatchEvent(new KeyboardEvent('keydown', {{key: k, bubbles: true, cancelable: true}}));
        for (const k of ['+', 'ArrowRight', 'ArrowLeft', 'ArrowLeft', '-', 'Home']) {{ key(k); {TICK} views.push(t.view()); }}
        return [views, panels.tabIndex, panels.getAttribute('aria-label')];""")
    views, tab, label = out
    start, zoomed, right, back, left, out_again, home = views
    assert tab == 0 and "arrow keys pan" in label
    assert (start[0], start[1]) == (analysis.timeline.focus_start_ns / 1e9, analysis.timeline.focus_end_ns / 1e9)
    width = start[1] - start[0]
    middle = (start[0] + start[1]) / 2
    assert abs((zoomed[1] - zoomed[0]) - 0.75 * width) < 1e-9 and abs((zoomed[0] + zoomed[1]) / 2 - middle) < 1e-9
    step = 0.2 * (zoomed[1] - zoomed[0])
    assert abs(right[0] - (zoomed[0] + step)) < 1e-9 and abs((right[1] - right[0]) - (zoomed[1] - zoomed[0])) < 1e-9
    assert abs(back[0] - zoomed[0]) < 1e-9 and abs(left[0] - (zoomed[0] - step)) < 1e-9
    assert abs((out_again[1] - out_again[0]) - (left[1] - left[0]) / 0.75) < 1e-9
    assert home == start


def test_touch_drags_pan_and_two_fingers_pinch_the_chart(tmp_path, chromium):
    analysis = analysis_of("torch_ops_v25")
    out = explore(analysis, tmp_path, f"""
        const over = u.over, box = over.getBoundingClientRect(), y = box.top + box.height / 2;
        const touch = (type, id, x) => over.dispatchEvent(new PointerEvent(type, {{pointerId: id, pointerType: 'touch',
            isPrimary: id === 1, clientX: x, clientY: y, bubbles: true, cancelable: true}}));
        const start = t.view();
        touch('pointerdown', 1, box.left + 500); touch('pointermove', 1, box.left + 400); touch('pointerup', 1, box.left + 400);
        {TICK} const dragged = t.view();
        // two fingers 100 px apart around x = 300 spread to 200 px: half as wide, the time under them kept
        touch('pointerdown', 1, box.left + 250); touch('pointerdown', 2, box.left + 350);
        touch('pointermove', 1, box.left + 200); touch('pointermove', 2, box.left + 400);
        touch('pointerup', 1, box.left + 200); touch('pointerup', 2, box.left + 400);
        {TICK} const pinched = t.view();
        return [start, dragged, pinched, box.width, getComputedStyle(over).touchAction,
                getComputedStyle(tr.canvas).touchAction];""")
    start, dragged, pinched, width, action, track_action = out
    assert action == track_action == "pan-y"  # a finger sideways moves the chart; up and down, the page; no page zoom
    w = start[1] - start[0]
    assert abs(dragged[0] - (start[0] + 100 / width * w)) < 1e-9 and abs((dragged[1] - dragged[0]) - w) < 1e-9
    assert abs((pinched[1] - pinched[0]) - w / 2) < 1e-9
    at = dragged[0] + 300 / width * w  # the time under the fingers' midpoint stays under it
    assert abs(pinched[0] + 300 / width * (w / 2) - at) < 1e-9


def drawn_by_hand(analysis, view: list, per_second: float) -> set:
    """The ranges a track draws in this view: inside it and TRACK_MIN_PX (2) pixels wide or more."""
    wide = lambda s: s.end_ns / 1e9 > view[0] and s.start_ns / 1e9 < view[1] \
        and (s.end_ns - s.start_ns) / 1e9 * per_second >= 2
    return {(False, s.depth, s.name, s.start_ns) for s in analysis.timeline.spans if wide(s)} | \
        {(True, s.depth, s.name, s.start_ns) for s in analysis.timeline.operator_spans if wide(s)}


def test_nested_tracks_appear_as_you_zoom_in(tmp_path, chromium):
    # torch_ops_v25 (--pytorch=autograd-nvtx): steps > forward/backward/optimizer, and 2000 operator ranges
    analysis = analysis_of("torch_ops_v25")
    forward = [s for s in analysis.timeline.spans if s.name == "forward"][2]
    out = explore(analysis, tmp_path, f"""
        const seen = () => [t.view(), tr.shown, tr.drawn.map(d => [d[1], d[2], d[3], d[4]]), tr.pxPerSecond,
                            tr.canvas.height > 0 && !tr.canvas.hidden];
        t.setView([{analysis.timeline.start_ns / 1e9}, {analysis.timeline.end_ns / 1e9}], 'all'); {TICK}
        const whole = seen();
        t.setView([{forward.start_ns / 1e9}, {forward.end_ns / 1e9}]); {TICK}
        return [whole, seen()];""")
    for view, shown, drawn, per_second, visible in out:
        assert visible
        drawn = {tuple(d) for d in drawn}
        assert drawn == drawn_by_hand(analysis, view, per_second)
        assert sorted({(d[0], d[1]) for d in drawn}) == sorted((op, depth) for pid, op, depth in shown)
    (_, whole_rows, whole_drawn, _, _), (_, zoomed_rows, zoomed_drawn, _, _) = out
    # the whole capture: steps and their phases, and the few operators of 30 ms or more
    assert [r[1:] for r in whole_rows][:2] == [[False, 1], [False, 2]]
    assert {d[2] for d in whole_drawn if not d[0]} >= {"setup", "step 0", "forward", "backward"}
    assert not [d for d in whole_drawn if d[0] and forward.start_ns <= d[3] < forward.end_ns]
    # step 2's forward (11 ms): its operators, four deep, aten::addmm among them
    assert [r[1:] for r in zoomed_rows] == [[False, 1], [False, 2], [True, 1], [True, 2], [True, 3], [True, 4]]
    inside = {d[2] for d in zoomed_drawn if d[0] and forward.start_ns <= d[3] < forward.end_ns}
    assert {"aten::linear", "aten::addmm"} <= inside


# -- without JavaScript ------------------------------------------------------------------------------
def pdf_images(pdf: bytes, tmp_path) -> list[tuple[int, int]]:
    """(width, height) of each image in a PDF (poppler's pdfimages, installed with pdftotext)."""
    if not shutil.which("pdfimages"):
        if os.environ.get("NSYSAN_REQUIRE_BROWSER") == "1":
            pytest.fail("NSYSAN_REQUIRE_BROWSER=1 but pdfimages is not installed (apt-get install poppler-utils)")
        pytest.skip("pdfimages is not installed (apt-get install poppler-utils)")
    (tmp_path / "page.pdf").write_bytes(pdf)
    listed = subprocess.run(["pdfimages", "-list", str(tmp_path / "page.pdf")], capture_output=True, text=True,
                            check=True).stdout.splitlines()[2:]  # below its two heading lines
    return [(int(line.split()[3]), int(line.split()[4])) for line in listed if line.split()[2] == "image"]


PICTURE = ("(() => { const img = document.querySelector('#timeline-main img.timeline-picture');"
           " return img && [img.naturalWidth, img.naturalHeight, img.getBoundingClientRect().width,"
           " document.querySelectorAll('#timeline-main canvas').length, img.src.length]; })()")


def test_without_javascript_the_png_timeline_stands_in_on_screen_and_on_paper(tmp_path, chromium):
    analysis = analysis_of("ddp_leak_v25")
    path = write_report(analysis, tmp_path / "report")
    png = Image.open(path.parent / "timeline.png")
    page, netlog = open_page(path, width=1400, height=900, javascript=False, pdf=True, evaluate={"picture": PICTURE})
    assert page.remote_requests == [] and netlog == [] and page.errors == []
    width, height, shown, canvases, uri = page.values["picture"]
    # timeline.png (2400 px wide) at 1000 px, no chart drawn
    assert png.size[0] == 2400 and (width, height) == (1000, round(png.size[1] * 1000 / 2400)) and canvases == 0
    assert 600 < shown <= 1000  # in the page's column
    # palette-reduced: the page carries it in fewer bytes than the file next to it
    assert uri < 1 / 3 * (path.parent / "timeline.png").stat().st_size
    text = pdf_text(page.pdf, tmp_path)
    assert "the same lines as a picture" not in text  # the note stays on screen; the picture prints
    assert (width, height) in pdf_images(page.pdf, tmp_path)
    # with JavaScript on, the chart is drawn and the picture never loads
    page, netlog = open_page(path, width=1400, height=900, screenshot=False, evaluate={"picture": PICTURE})
    assert_quiet_page(page, netlog)
    assert page.values["picture"] is None and "timeline.png" in page.dom


# -- a long, many-GPU capture ------------------------------------------------------------------------
def test_every_process_keeps_its_share_of_bands_and_spans():
    # ddp_leak_v25: two ranks, one per GPU. Capped to 10 (a 1e6-event capture has thousands), the
    # longest ranges used to be one rank's, and the other GPU drew no band at all.
    analysis = analysis_of("ddp_leak_v25")
    ranges, events = analysis.nvtx_ranges, analysis.events
    bands = top_level_bands(ranges, events, limit=10)
    assert sorted(b.pid for b in bands) == [2146] * 5 + [2147] * 5
    mine = [b for b in top_level_bands(ranges, events) if b.pid == 2147]  # uncapped: each one's longest 5
    longest = sorted(mine, key=lambda b: b.start_ns - b.end_ns)[:5]
    assert {(b.name, b.start_ns) for b in bands if b.pid == 2147} == {(b.name, b.start_ns) for b in longest}
    spans = nvtx_spans(ranges, events, limit=10)
    assert sorted(s.pid for s in spans) == [2146] * 5 + [2147] * 5
    assert [s.start_ns for s in spans] == sorted(s.start_ns for s in spans)  # still in time order
    # the page puts each rank's bands on its own GPU's panel
    analysis = dataclasses.replace(analysis, timeline=dataclasses.replace(analysis.timeline, bands=bands))
    data = page_data(analysis)
    assert {b["panel"] for b in data["bands"]} == {p["gpu"] for p in data["panels"]} == {0, 1}


def test_a_long_runs_steps_chart_breaks_where_steps_are_not_listed(tmp_path, chromium, monkeypatch):
    # ddp_leak_v25's 8 steps listed as the model lists a long run's (first and last halves, here 2 + 2)
    analysis = analysis_of("ddp_leak_v25")
    analysis = dataclasses.replace(analysis, steps=[listed(s, 4) for s in analysis.steps])
    monkeypatch.setattr(html_module, "PAGE_STEPS", 2)  # and the table its first and last step
    out = explore(analysis, tmp_path, """
        const c = window.nsysanStepCharts[0], chart = c.plot;
        return [c.steps, chart.series.slice(1).map(s => [s.label, s.spanGaps, s._paths && s._paths.gaps]), chart.valToPos(1, "x", true), chart.valToPos(6, "x", true),
                Array.from(document.querySelectorAll('#steps-table-1 tbody tr td:first-child'), c => c.textContent),
                document.querySelector('#steps-table-1').closest('section').textContent];""")
    steps, lines, at_1, at_6, rows, section = out
    assert steps == [0, 1, 6, 7]
    for label, span_gaps, gaps in lines:
        if "/step" in label:  # the growth verdict's line: two points, always joined
            assert span_gaps
            continue
        assert not span_gaps
        assert gaps == [[math.ceil(at_1) + 1, math.floor(at_6) - 1]]  # no stroke from step 1 to step 6
    assert rows == ["step 0", "step 7"]
    assert "The first and last 1 of 8 steps; analysis.json has the first and last 2, the step chart draws them." \
        in " ".join(section.split())


def test_the_terminal_shows_a_family_as_one_row_too(capsys):
    # known_mem_v25: steps 0-8 (one allocation or two each, 300 MiB in all) and workers 1-2
    code, out, _ = cli(capsys, "analyze", str(FIXTURES / "known_mem_v25.sqlite"), "--no-progress")
    assert code == 0
    table = out[out.index("NVTX ranges (innermost range of each allocation)"):].split("\n\n")[1]
    rows = [line.split() for line in table.splitlines()[2:]]
    assert not [r for r in rows if r[0] == "step" and r[2] != "–"]  # no row of a step of its own
    (steps,) = [r for r in rows if r[:5] == ["step", "0", "–", "step", "8"]]
    analysis = analysis_of("known_mem_v25")
    family = analysis.range_families[0]
    assert steps[5:7] == ["(9", "ranges)"] and steps[7] == "9"
    assert " ".join(steps[8:10]) == fmt_bytes(family.allocated_bytes) == fmt_bytes(
        sum(r.allocated_bytes for r in analysis.ranges if r.name.startswith("step "))) == "300.0 MiB"
