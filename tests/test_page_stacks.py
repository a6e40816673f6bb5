"""What was live at a moment, by call stack (issue 29): the model's live set of each peak and its
never-freed blocks summed by stack (`Peak.live_stacks`, `Analysis.never_freed_stacks`), the page's
flame graph (icicle) drawn from them, the click list counted over what was live, and the hover
that shows an allocation's call stack, user frames first."""

from __future__ import annotations

import pytest
from conftest import analysis_of, truth

MiB = 1 << 20


def test_the_live_set_at_the_peak_by_stack_sums_to_the_peak():
    # known_bt_v25's peak is in `burst`: alloc_workspace's 512 MiB block with both of
    # alloc_weights' (256 + 128 MiB), by the truth file
    analysis = analysis_of("known_bt_v25")
    peak = analysis.peak
    made = {}
    for row in truth("known_bt_v25"):
        if row.get("truth") == "cudaMalloc" and (row["site"] == "alloc_weights" or row["bytes"] == 512 * MiB):
            made[row["site"]] = made.get(row["site"], 0) + row["bytes"]
    by_site = {s.site: (s.bytes, s.count) for s in peak.live_stacks}
    assert by_site["alloc_workspace (known)"] == (made["alloc_workspace"], 1) == (512 * MiB, 1)
    assert by_site["alloc_weights (known)"] == (made["alloc_weights"], 2) == (384 * MiB, 2)
    assert all(s.stack_id is not None for s in peak.live_stacks)  # every block was captured with its stack
    assert {s.id for s in analysis.stacks} >= {s.stack_id for s in peak.live_stacks}
    assert sum(s.bytes for s in peak.live_stacks) + peak.pool_reserve_bytes == peak.peak_bytes == 952_107_008
    assert sum(s.count for s in peak.live_stacks) == peak.live_count


def test_every_block_live_at_the_peak_counts_not_only_the_listed_ones():
    # torch_pybt_v25: 1,365 allocations live at the peak; the page carries the 300 largest
    analysis = analysis_of("torch_pybt_v25")
    peak = analysis.peak
    assert peak.live_count == 1365 and len(analysis.timeline.allocations) == 300
    assert sum(s.bytes for s in peak.live_stacks) == peak.peak_bytes == 4_916_874_581
    assert sum(s.count for s in peak.live_stacks) == 1365
    assert sum(s.bytes for s in analysis.never_freed_stacks) == analysis.never_freed_bytes == 4_915_988_480
    sizes = [s.bytes for s in peak.live_stacks]
    assert sizes == sorted(sizes, reverse=True)


# -- the page (headless Chromium) ----------------------------------------------------------------

import bisect  # noqa: E402

from browser import open_page  # noqa: E402
from test_html import assert_quiet_page, chromium, pdf_text  # noqa: E402,F401  (the fixture)

from nsysan.commands.outputs import write_report  # noqa: E402
from nsysan.model import GPU_RESIDENT_KINDS  # noqa: E402
from nsysan.base.units import fmt_bytes, fmt_frame, fmt_time  # noqa: E402

FLAME = """(() => {
  const g = document.querySelector('#flame-main .flame-graph');
  const boxes = Array.from(g.querySelectorAll('.box'), b => ({depth: +b.dataset.depth, bytes: +b.dataset.bytes,
                                                              text: b.textContent, other: b.classList.contains('other')}));
  return {mode: g.dataset.mode, root: +g.dataset.rootBytes, title: document.querySelector('#flame-main .flame-title').textContent,
          boxes: boxes};
})()"""
ZOOM_INTO = """(() => {
  const g = document.querySelector('#flame-main .flame-graph');
  Array.from(g.querySelectorAll('.box')).find(b => b.textContent.startsWith(BOX)).click();
  const out = FLAME;
  out.widths = Array.from(g.querySelectorAll('.box'), b => [b.classList.contains('caller') ? 'caller' : '', +b.dataset.depth,
                                                            b.style.width]);
  return out;
})()""".replace("FLAME", FLAME)
# the timeline's live bytes (what its lines draw) of one process and device's GPU-resident kinds at `t`
TIMELINE_LIVE = """((pid, device, t) => {
  const data = JSON.parse(document.getElementById('nsysan-data').textContent);
  let live = 0;
  data.panels.forEach(p => p.series.forEach(s => {
    if (s.pid !== pid || s.device !== device || !s.resident) return;
    let j = -1; s.ts.forEach((x, i) => { if (x <= t) j = i; });
    live += j < 0 ? 0 : s.bytes[j];
  }));
  return live;
})"""


def live_on_lines(analysis, t, resident_only=True):
    """What the model's timeline series hold at `t` (each carried forward), all processes."""
    total = 0
    for s in analysis.timeline.series:
        if resident_only and s.kind not in GPU_RESIDENT_KINDS:
            continue
        j = bisect.bisect_right(s.ts_ns, t) - 1
        total += s.live_bytes[j] if j >= 0 else 0
    return total


CLICK = """(async () => {
  const tl = window.nsysanTimelines[0], box = document.querySelector('#timeline-main .live-list');
  tl.list(%f, %d, %f);
  const out = {title: box.querySelector('h3').textContent, total: +box.dataset.liveBytes,
               notes: Array.from(box.querySelectorAll('p.note'), p => p.textContent),
               rows: Array.from(box.querySelectorAll('table.live > tbody > tr'), r => ({
                 other: r.classList.contains('other'),
                 cells: Array.from(r.cells, c => (c.querySelector(':scope > details > summary') || c).textContent)}))};
  out.flame = %s;
  return out;
})()"""


HOVER = """(() => {
  const tip = () => document.querySelector('.stack-tip');
  const read = () => ({hidden: tip().hidden, title: tip().querySelector('b').textContent,
                       lines: Array.from(tip().querySelectorAll(':scope > div:not(.folded)'), d => d.textContent),
                       frames: Array.from(tip().querySelectorAll('ol.stack li'), l => l.textContent),
                       folded: (tip().querySelector('.folded') || {textContent: null}).textContent});
  const over = el => { const r = el.getBoundingClientRect();
    el.dispatchEvent(new MouseEvent('mousemove', {clientX: r.left + 3, clientY: r.top + 3, bubbles: true})); };
  over(Array.from(document.querySelectorAll('#flame-main .flame-graph .box'))
       .find(b => b.textContent.startsWith('main (torch_train.py:43)')));
  const out = {flame: read()};
  over(document.querySelector('#timeline-main .live-list table.live > tbody > tr'));
  out.row = read();
  document.querySelector('#timeline-main .live-list table.live > tbody > tr').dispatchEvent(new MouseEvent('mouseleave'));
  out.after = tip().hidden;
  return out;
})()"""


@pytest.fixture(scope="module")
def pybt(chromium, tmp_path_factory):
    """torch_pybt_v25's page, loaded once, and what it showed, in this order: the flame graph as it
    opens, the timeline's live bytes at the peak, a click on the flame graph's <module> box, a click
    on the timeline at the peak (1 µs after, within 5 px), the pointer over a flame graph box and a
    click list row, a click 50 ms before the peak."""
    analysis = analysis_of("torch_pybt_v25")
    peak = analysis.peak
    page, netlog = open_page(write_report(analysis, tmp_path_factory.mktemp("pybt") / "report"), width=1400,
                             height=900, screenshot=False, evaluate={
        "flame": FLAME, "timeline": f"{TIMELINE_LIVE}({peak.pid}, {peak.device}, {peak.peak_time_ns})",
        "zoomed": ZOOM_INTO.replace("BOX", "'<module> (torch_train.py:72)'"),
        "at_peak": CLICK % ((peak.peak_time_ns + 1_000) / 1e9, peak.gpu, 1e-5, FLAME), "hover": HOVER,
        "elsewhere": CLICK % (elsewhere(analysis) / 1e9, peak.gpu, 0.0, FLAME)})
    assert_quiet_page(page, netlog)
    return analysis, page.values


def elsewhere(analysis):
    return analysis.peak.peak_time_ns - 50_000_000  # in step 3, 50 ms before the peak


def test_the_flame_graph_of_the_peak_sums_to_the_peak_and_the_timeline(pybt):
    analysis, values = pybt
    peak = analysis.peak
    flame = values["flame"]
    assert flame["mode"] == "peak"
    # the root's bytes == the timeline's live bytes at the peak == the model's peak
    assert flame["root"] == values["timeline"] == peak.peak_bytes == 4_916_874_581
    assert flame["title"] == f"python3 (476)'s peak, at 14.5037 s: {fmt_bytes(peak.peak_bytes)}"
    top = [b for b in flame["boxes"] if b["depth"] == 1]
    assert sum(b["bytes"] for b in top) == peak.peak_bytes  # nothing left out: no box is too small at the first level
    # the model has every stack (26, under its cap): no "other" box; the smallest are one "+ N smaller" per row
    assert not any(b["text"].startswith("other") for b in flame["boxes"])
    (small,) = [b for b in top if b["other"]]
    assert small["text"].startswith("+ ") and small["bytes"] < 0.002 * 3 * peak.peak_bytes
    # the user's line that allocated most, its bytes summed over its stacks from the model
    line_43 = sum(s.bytes for s in peak.live_stacks if s.stack_id is not None
                  and any(f.function == "main" and f.line == 43 for f in next(x for x in analysis.stacks
                                                                               if x.id == s.stack_id).frames))
    (box,) = [b for b in flame["boxes"] if b["text"].startswith("main (torch_train.py:43)")]
    assert box["bytes"] == line_43 and box["depth"] == 2 and box["text"].endswith(fmt_bytes(line_43))
    # a click on a box zooms into it: its caller (the top box) above it, full width; it full width
    # too, and the rows under it add up to it
    module = next(b for b in top if b["text"].startswith("<module> (torch_train.py:72)"))
    zoomed = values["zoomed"]
    assert zoomed["widths"][:2] == [["caller", 0, "100%"], ["", 1, "100%"]]
    assert [b["bytes"] for b in zoomed["boxes"][:2]] == [peak.peak_bytes, module["bytes"]]
    assert sum(b["bytes"] for b in zoomed["boxes"] if b["depth"] == 2) == module["bytes"]


def test_a_click_at_the_peak_lists_every_allocation_live_then(pybt):
    # before, the list counted over the 300 largest allocations of the capture: 300 of the 1,365
    analysis, values = pybt
    peak = analysis.peak
    seen = values["at_peak"]
    assert seen["total"] == peak.peak_bytes
    assert seen["notes"] == [f"At python3 (476)'s peak: all 1365 allocations live then ({fmt_bytes(peak.peak_bytes)}), "
                             "by site and NVTX range."]
    counts = [int(r["cells"][1]) for r in seen["rows"] if not r["other"]]
    groups = peak.live_groups
    assert sum(g.count for g in groups) == peak.live_count == 1365  # every live block is in a group (under the cap)
    assert len(seen["rows"]) == min(50, len(groups)) and counts == [g.count for g in groups][:50]
    assert seen["rows"][0]["cells"][:3] == [fmt_bytes(groups[0].total_bytes), str(groups[0].count),
                                            f"{fmt_bytes(groups[0].min_bytes)} – {fmt_bytes(groups[0].max_bytes)}"]
    assert seen["flame"]["mode"] == "peak" and seen["flame"]["root"] == peak.peak_bytes


def test_a_click_elsewhere_counts_the_carried_allocations_and_the_rest_as_other(pybt):
    analysis, values = pybt
    t = elsewhere(analysis)
    live_listed = [a for a in analysis.timeline.allocations
                   if a.alloc_time_ns <= t and (a.free_time_ns is None or a.free_time_ns > t)]
    resident = live_on_lines(analysis, t)
    listed_resident = sum(a.bytes for a in live_listed if a.kind in GPU_RESIDENT_KINDS)
    assert 0 < listed_resident < resident  # the page carries some of it, not all
    seen = values["elsewhere"]
    # the list: every byte the lines show then, the carried allocations by site and one "other" row per kind
    assert seen["total"] == live_on_lines(analysis, t, resident_only=False)
    others = [r["cells"] for r in seen["rows"] if r["other"]]
    by_kind = {}
    for s in analysis.timeline.series:
        j = bisect.bisect_right(s.ts_ns, t) - 1
        rest = (s.live_bytes[j] if j >= 0 else 0) - sum(a.bytes for a in live_listed if a.kind == s.kind)
        if rest > 0:
            by_kind[s.kind] = rest
    assert {c[5]: c[0] for c in others} == {kind: fmt_bytes(b) for kind, b in by_kind.items()}
    assert sum(int(r["cells"][1]) for r in seen["rows"] if not r["other"]) == len(live_listed)
    assert "the 300 largest of the capture's 1365" in seen["notes"][0]
    # the flame graph: the carried allocations by stack, and the rest in one box; it sums to the lines
    flame = seen["flame"]
    assert flame["mode"] == "moment" and flame["root"] == resident
    top = [b for b in flame["boxes"] if b["depth"] == 1]
    assert sum(b["bytes"] for b in top) == resident
    (other,) = [b for b in top if b["text"].startswith("other")]
    assert other["bytes"] == resident - listed_resident


def test_hovering_shows_the_call_stack_user_frames_first_size_range_and_age(pybt):
    analysis, values = pybt
    peak = analysis.peak
    hover = values["hover"]
    # a flame graph leaf: main (torch_train.py:43), every block of it live at the peak
    mine = [s for s in peak.live_stacks if s.site == "main (torch_train.py:43)"]
    stacks = {s.id: s for s in analysis.stacks}
    largest = stacks[max(mine, key=lambda s: s.bytes).stack_id].frames
    at = next(i for i, f in enumerate(largest) if f.function == "main" and f.line == 43)
    seen = hover["flame"]
    assert not seen["hidden"] and seen["title"] == "main (torch_train.py:43)"
    assert seen["lines"][0] == f"{fmt_bytes(sum(s.bytes for s in mine))} · {sum(s.count for s in mine)} allocations · device"
    oldest = min(s.first_alloc_ns for s in mine)  # its age at the peak: from its oldest block
    assert f"age: {fmt_time(peak.peak_time_ns - oldest)} (the oldest), allocated at {fmt_time(oldest)}" in seen["lines"]
    # the user's frames first (the line that allocated, then its callers), then one line for the rest
    assert seen["frames"] == ["main (torch_train.py:43)", "<module> (torch_train.py:72)"]
    assert seen["folded"].startswith(f"+ {at} frames inside it (framework, allocator, CUDA driver, profiler): ")
    innermost = largest[0]
    assert seen["folded"].endswith(fmt_frame(innermost.function, innermost.file, innermost.line, innermost.module))
    # a row of the click list at the peak: its group's size, range and age at the peak
    group = peak.live_groups[0]
    row = hover["row"]
    assert row["title"] == group.site.label
    assert row["lines"][0] == (f"{fmt_bytes(group.total_bytes)} · {group.count} allocations · "
                               f"{fmt_bytes(group.min_bytes)} – {fmt_bytes(group.max_bytes)} · {group.kind}")
    assert f"NVTX range: {group.nvtx_range}" in row["lines"]
    assert f"age: {fmt_time(peak.peak_time_ns - group.first_alloc_ns)} (the oldest), allocated at " \
           f"{fmt_time(group.first_alloc_ns)}" in row["lines"]
    assert row["frames"][0] == group.site.label and hover["after"] is True


def test_hovering_a_moment_names_the_block_allocated_there_with_its_stack(tmp_path, chromium):
    # known_bt_v25: alloc_workspace's 512 MiB block in `burst` (the truth file), called from main
    analysis = analysis_of("known_bt_v25")
    block = max(analysis.timeline.allocations, key=lambda a: a.bytes)
    assert block.bytes == 512 * MiB and block.site.label == "alloc_workspace (known)"
    page, netlog = open_page(write_report(analysis, tmp_path / "report"), width=1400, height=900, screenshot=False,
                             evaluate={"readout": f"""(() => {{ window.nsysanTimelines[0].show({block.alloc_time_ns / 1e9});
        const r = document.querySelector('#timeline-main .readout');
        return [r.querySelector('.made').textContent, r.querySelector('.stack-line').textContent]; }})()"""})
    assert_quiet_page(page, netlog)
    made, stack_line = page.values["readout"]
    name = next(p.name for p in analysis.capture.processes if p.pid == block.pid)  # "/tmp/known"
    assert made == (f"allocated here: 512.0 MiB device by {name} ({block.pid}), at alloc_workspace (known) in burst · "
                    f"freed {fmt_time(block.free_time_ns - block.alloc_time_ns)} later")
    frames = next(s for s in analysis.stacks if s.id == block.stack_id).frames
    at = next(i for i, f in enumerate(frames) if f.function == "alloc_workspace")
    shown = [fmt_frame(f.function, f.file, f.line, f.module) for f in frames]
    assert stack_line == " ← ".join(shown[at:]) + f" · + {at} frames inside it (framework, allocator, CUDA driver, profiler)"
    assert stack_line.startswith("alloc_workspace (known) ← main (known)")


def test_the_never_freed_flame_graph_and_a_time_range(tmp_path, chromium):
    analysis = analysis_of("known_bt_v25")
    (train,) = [b for b in analysis.timeline.bands if b.name == "train"]
    script = f"""(() => {{
      const flame = document.getElementById('flame-main'), out = {{}};
      flame.querySelector('button[data-mode="never"]').click();
      out.never = {FLAME};
      const box = flame.querySelector('input.ranged');
      box.checked = true; box.dispatchEvent(new Event('change'));
      out.whole = {FLAME};
      window.nsysanTimelines[0].setView([{train.start_ns / 1e9}, {train.end_ns / 1e9}]);  // the flame graph follows
      out.ranged = {FLAME};
      return out;
    }})()"""
    page, netlog = open_page(write_report(analysis, tmp_path / "report"), width=1400, height=900, screenshot=False,
                             evaluate={"flame": script})
    assert_quiet_page(page, netlog)
    never, ranged = page.values["flame"]["never"], page.values["flame"]["ranged"]
    # every never-freed block (static memory aside): 128 MiB of weights, three 4 MiB cache entries,
    # the other kinds' 5 MiB and 1000 KiB
    assert never["mode"] == "never" and never["root"] == analysis.never_freed_bytes == 153_067_520
    assert sum(b["bytes"] for b in never["boxes"] if b["depth"] == 1) == never["root"]
    leaves = {b["text"].rsplit(" · ", 1)[0]: b["bytes"] for b in never["boxes"] if b["text"].startswith("alloc_")}
    assert leaves == {"alloc_weights (known)": 128 * MiB, "alloc_cache_entry (known)": 3 * 4 * MiB}
    # the opening view holds every never-freed block the page carries (all 29 allocations are carried)
    assert page.values["flame"]["whole"]["root"] == never["root"]
    # in `train` (steps 0-9) only the cache entries of steps 2, 5 and 8 were allocated and kept
    assert ranged["root"] == 3 * 4 * MiB and "allocated in the visible range" in ranged["title"]
    assert [b["text"] for b in ranged["boxes"] if b["text"].startswith("alloc_")] == ["alloc_cache_entry (known) · 12.0 MiB"]


HEADINGS = "Array.from(document.querySelectorAll('h2, h3'), h => h.textContent.replace(/\\s+/g, ' ').trim())"


@pytest.mark.parametrize("name", ["torch_leak_v25", "torch_oom_v25", "torch_pybt_v25"])
def test_printed_headings_keep_with_what_they_head(name, tmp_path, chromium):
    # No printed page ends with a heading whose table or text is on the next one: torch_leak_v25's
    # "process 1644 on GPU 0: step N" ended page 2 and torch_oom_v25's "Process 1872 on device 0:
    # 5.5 GiB at 8.729 s, in hoard (1314 allocations)" page 3, with only h2 kept with what follows
    analysis = analysis_of(name)
    page, netlog = open_page(write_report(analysis, tmp_path / "report"), width=1400, height=900, screenshot=False,
                             pdf=True, evaluate={"headings": HEADINGS})
    assert_quiet_page(page, netlog)
    text = pdf_text(page.pdf, tmp_path)
    pages = [p for p in text.split("\f") if p.strip()]
    assert len(pages) >= 5
    headings = [h for h in page.values["headings"] if len(h) > 8]
    assert "What was live at the peak" in headings
    for number, body in enumerate(pages, 1):
        last = " ".join(body.split()[-6:])  # the page's last words
        ended = [h for h in headings if " ".join(h.split()[-6:]) == last]
        assert not ended, f"page {number} ends with the heading {ended[0]!r}"
    if analysis.stacks:  # the flame graph prints (at the peak), under its heading
        assert "Bytes by call stack" in headings
        assert f"python3 (476)'s peak, at 14.5037 s: {fmt_bytes(analysis.peak.peak_bytes)}" in text
