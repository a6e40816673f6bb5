"""One leak is one row (issue 29): never-freed (and live-at-the-peak) blocks of one site in ranges that
differ only in their numbers ("step 3", "step 4") are one family, "step N", counted over every block
before the list is capped; the page's never-freed table and its verdict line show that row."""

from __future__ import annotations

import re

from browser import open_page
from conftest import analysis_of
from test_html import assert_quiet_page, chromium  # noqa: F401  (the fixture)

from nsysan.commands.outputs import write_report
from nsysan.base.units import fmt_bytes, fmt_time

MiB = 1 << 20
RANK_1 = 2147  # ddp_leak_v25: rank 1 (GPU 1) leaks 64 MiB per step (fixtures/README.md)


def test_rank_1s_leak_of_every_step_is_one_group_at_the_top():
    analysis = analysis_of("ddp_leak_v25")
    top = analysis.never_freed_groups[0]
    assert (top.pid, top.kind, top.site.label, top.nvtx_range) == (
        RANK_1, "device", "cudaMalloc in step N [pt_autograd_1]", "step N")
    # its blocks, counted from the never-freed list itself (all 44 are listed)
    assert analysis.never_freed_total == len(analysis.never_freed) == 44
    mine = [a for a in analysis.never_freed if a.pid == RANK_1 and re.fullmatch(r"step \d+", a.nvtx_range)
            and a.site.label == f"cudaMalloc in {a.nvtx_range} [pt_autograd_1]"]
    assert [a for a in analysis.never_freed if top.holds(a)] == mine
    assert top.count == len(mine) == 13 and top.total_bytes == sum(a.bytes for a in mine) == 704_775_168
    assert top.members == len({a.nvtx_range for a in mine}) == 8  # steps 0-7
    # the leak itself: one 64 MiB block kept in each of steps 1-7
    assert sorted(a.nvtx_range for a in mine if a.bytes == 64 * MiB and a.nvtx_range != "step 0") == \
        [f"step {i}" for i in range(1, 8)]
    # every never-freed byte is in exactly one group; rank 0 keeps step 0 only, so its rows stay as they are
    assert sum(g.total_bytes for g in analysis.never_freed_groups) == analysis.never_freed_bytes
    assert all(g.members == 1 and "N" not in g.nvtx_range for g in analysis.never_freed_groups if g.pid != RANK_1)
    # at the peak the same blocks are one row too
    (peak,) = [p for p in analysis.peaks if p.pid == RANK_1]
    assert peak.live_groups[0].site.label == top.site.label and peak.live_groups[0].members == 8


def test_a_site_from_a_stack_keeps_its_label_and_its_steps_join():
    analysis = analysis_of("known_bt_v25")  # alloc_cache_entry keeps one 4 MiB block in steps 2, 5 and 8
    labels = [(g.site.label, g.nvtx_range, g.count, g.total_bytes, g.members) for g in analysis.never_freed_groups]
    assert labels == [("alloc_weights (known)", "setup", 1, 128 * MiB, 1),
                      ("alloc_cache_entry (known)", "step N", 3, 12 * MiB, 3),
                      ("other_kinds (known)", "other kinds", 2, 5242880 + 1024000, 1)]
    cache = analysis.never_freed_groups[1]
    assert sorted(a.nvtx_range for a in analysis.never_freed if cache.holds(a)) == ["step 2", "step 5", "step 8"]


def test_the_page_shows_the_leak_as_its_first_row_and_names_it(tmp_path, chromium):
    analysis = analysis_of("ddp_leak_v25")
    page, netlog = open_page(write_report(analysis, tmp_path / "report"), width=1400, height=900, screenshot=False,
                             evaluate={
        "rows": "Array.from(document.querySelectorAll('#never-freed-table tr.group'),"
                " r => Array.from(r.cells, c => c.textContent.replace(/^[+\u2212]/, '').trim()))",
        "members": "Array.from(document.querySelectorAll('#never-freed-table tr.members')[0].querySelectorAll('table.members > tbody > tr'),"
                   " r => Array.from(r.cells, c => c.textContent.trim()))",
        "verdict": "document.getElementById('never-freed-top').textContent"})
    assert_quiet_page(page, netlog)
    rows = page.values["rows"]
    assert len(rows) == len(analysis.never_freed_groups) == 8  # 16 before, rank 1's 8 steps on 8 rows
    assert rows[0][:8] == ["672.1 MiB", "13", "1.0 KiB – 64.0 MiB", "device", "cudaMalloc in step N [pt_autograd_1]",
                           "step N (8 ranges)", "2147", "1"]
    # opened, the row lists its 13 blocks with the range each was allocated in
    members = page.values["members"]
    assert len(members) == 13 and {m[2] for m in members} == {f"step {i}" for i in range(8)}
    assert [m[2] for m in members if m[0] == "64.0 MiB"].count("step 0") == 3  # the rest: one per step 1-7
    assert page.values["verdict"] == ("cudaMalloc in step N [pt_autograd_1] of rank 1 "
                                      "(13 × up to 64.0 MiB, 672.1 MiB, from 8 ranges)")


def test_operator_ranges_are_a_level_of_their_own(tmp_path, chromium):
    # torch_ops_v25: every ATen op an NVTX range (--pytorch=autograd-nvtx); before, the one NVTX table
    # listed forward and aten::addmm for the same blocks: 9.2 GiB allocated against a 4.6 GiB peak
    analysis = analysis_of("torch_ops_v25")
    page, netlog = open_page(write_report(analysis, tmp_path / "report"), width=1400, height=900, screenshot=False,
                             evaluate={table: f"Array.from(document.querySelectorAll('#{table} tbody tr'),"
                                              " r => Array.from(r.cells, c => [c.textContent.trim(), c.dataset.v]))"
                                       for table in ("ranges-table", "operators-table")}
                             | {"idle": "document.getElementById('operators-idle').textContent"})
    assert_quiet_page(page, netlog)
    user, operators = page.values["ranges-table"], page.values["operators-table"]
    assert {r[1][0] for r in user} >= {"setup", "forward", "backward", "optimizer"}
    assert not any(r[1][0].startswith("aten::") for r in user)
    allocated = sum(g.allocated_bytes for g in analysis.groups)  # every allocation once
    user_bytes = sum(int(r[6][1]) for r in user)  # "of it directly": each allocation once, its innermost range
    assert user_bytes == sum(r.allocated_bytes for r in analysis.ranges if not r.operator) <= allocated
    assert user_bytes < 1.01 * analysis.peak.peak_bytes  # nothing freed in this capture: counted once
    assert operators[0][0][0] == "aten::addmm" and operators[0][4][0] == "1.2 GiB"
    assert sum(int(r[4][1]) for r in operators) <= allocated
    # the operators that allocated nothing are named, not listed
    idle = [r for r in analysis.ranges if r.operator and not r.allocations]
    assert len(operators) + len(idle) == sum(r.operator for r in analysis.ranges)
    assert page.values["idle"].startswith(f"{len(idle)} other operators (aten::as_strided, ")


CLICK_AT_END = """(async () => {
  const tl = window.nsysanTimelines[0], box = document.querySelector('#timeline-main .live-list');
  tl.list(JSON.parse(document.getElementById('nsysan-data').textContent).end / 1e9);
  const out = {title: box.querySelector('h3').textContent,
               note: (box.querySelector('p.note') || {textContent: null}).textContent,
               rows: Array.from(box.querySelectorAll('table.live > tbody > tr'),  // a site's label, not its stack
                                r => Array.from(r.cells, c => (c.querySelector(':scope > details > summary') || c).textContent))};
  out.stacks = Array.from(box.querySelectorAll('tbody tr td:nth-child(7) > details'), d => ({
    site: d.querySelector(':scope > summary').textContent,
    frames: Array.from(d.querySelectorAll(':scope > ol.stack > li'), li => li.textContent),
    folded: (d.querySelector(':scope > details.inner > summary') || {textContent: null}).textContent,
    inner: Array.from(d.querySelectorAll(':scope > details.inner li'), li => li.textContent)}));
  box.querySelector('button.close').click();
  out.after_close = box.textContent;
  return out;
})()"""


def clicked_at_the_end(name, tmp_path):
    analysis = analysis_of(name)
    page, netlog = open_page(write_report(analysis, tmp_path / "report"), width=1400, height=900, screenshot=False,
                             evaluate={"clicked": CLICK_AT_END})
    assert_quiet_page(page, netlog)
    return analysis, page.values["clicked"]


def expected_rows(analysis):
    """The never-freed groups, counted over the allocations the page carries (timeline.allocations)."""
    carried = [a for a in analysis.timeline.allocations if a.free_time_ns is None]
    rows = []
    for g in analysis.never_freed_groups:
        mine = [a for a in carried if g.holds(a)]
        if mine:
            rows.append((sum(a.bytes for a in mine), len(mine), g.pid, g.site.label))
    assert sum(n for _, n, _, _ in rows) == len(carried)  # every carried block is in one group
    return sorted(rows, key=lambda r: -r[0])


def test_the_click_list_groups_by_site_and_says_what_it_counts_over(tmp_path, chromium):
    analysis, clicked = clicked_at_the_end("ddp_leak_v25", tmp_path)
    # 300 of the capture's 4248 allocations are carried, 30 of them live at the end
    assert (len(analysis.timeline.allocations), analysis.timeline.allocations_total) == (300, 4248)
    assert clicked["note"].startswith("Counted over everything live then: the allocations the page carries (the 300 "
                                      "largest of the capture's 4248) by site, and for each process and kind one \"other\" row")
    listed = [r for r in clicked["rows"] if not r[6].startswith("other: ")]
    rows = [(r[0], int(r[1]), int(r[3]), r[6]) for r in listed]
    assert rows == [(fmt_bytes(b), n, pid, site) for b, n, pid, site in expected_rows(analysis)]
    # what the lines hold at the end beyond the carried blocks: one "other" row per process, device and kind
    carried = [a for a in analysis.timeline.allocations if a.free_time_ns is None]
    rest = {(s.pid, s.device, s.kind): s.live_bytes[-1] - sum(a.bytes for a in carried if (a.pid, a.device, a.kind)
                                                              == (s.pid, s.device, s.kind)) for s in analysis.timeline.series}
    assert {(int(r[3]), int(r[4]), r[5]): r[0] for r in clicked["rows"] if r[6].startswith("other: ")} == \
        {key: fmt_bytes(b) for key, b in rest.items() if b > 0}
    # the capture ends at 15634381655 ns; the opening view (0.1 s) asks for 5 decimals
    total = sum(s.live_bytes[-1] for s in analysis.timeline.series)
    assert clicked["title"] == f"Live at 15.63438 s: {fmt_bytes(total)} from {len(rows)} sites and the rest"
    leak = next(r for r in clicked["rows"] if r[6] == "cudaMalloc in step N [pt_autograd_1]")
    assert leak[3] == str(RANK_1) and leak[7].endswith(" ranges)")  # one row for every step's block
    assert clicked["after_close"] == ""  # the close button empties the list


def test_the_click_list_of_every_allocation_is_the_never_freed_table(tmp_path, chromium):
    analysis, clicked = clicked_at_the_end("known_bt_v25", tmp_path)  # 29 allocations, all carried
    assert clicked["note"] is None
    assert [(r[0], r[1], r[6]) for r in clicked["rows"]] == [
        (fmt_bytes(g.total_bytes), str(g.count), g.site.label) for g in analysis.never_freed_groups]
    assert clicked["rows"][1][6:8] == ["alloc_cache_entry (known)", "step 2, step 5, step 8 (3 ranges)"]
    # each site opens to its call stack, the user's frames first (fixtures/workloads/known_allocs.cu:
    # main calls train_step, which calls alloc_cache_entry), what it called (cudaMalloc, the driver,
    # the profiler) folded behind one line
    stack = next(s for s in clicked["stacks"] if s["site"] == "alloc_cache_entry (known)")
    assert stack["frames"][:3] == ["alloc_cache_entry (known)", "train_step (known)", "main (known)"]
    assert stack["folded"] == "+ 5 frames inside it (framework, allocator, CUDA driver, profiler)"
    assert stack["inner"][-1] == "cudaMalloc (known)" and "libcupti.so" in stack["inner"][0]
    assert {s["site"] for s in clicked["stacks"]} == {r[6] for r in clicked["rows"] if r[6] != "cudaMallocAsync in async pool [known]"}


ONE_CURSOR = """(async () => {
  const tl = window.nsysanTimelines[0], u = tl.plots[0], peak = %d / 1e9;
  const frame = () => new Promise(done => requestAnimationFrame(() => setTimeout(done, 20)));
  u.setCursor({left: u.valToPos(peak, 'x'), top: 10}); tl.show(peak); tl.list(peak); await frame();
  const box = u.root.closest('.timeline');
  return {axis: u.axes[0]._values, view: tl.view(),
          legend: box.querySelector('.u-legend .u-series:first-child .u-value').textContent,
          readout: box.querySelector('.readout b').textContent,
          listed: box.querySelector('.live-list h3').textContent};
})()"""


def test_axis_readout_legend_click_list_and_tables_tell_one_time_in_one_unit(tmp_path, chromium):
    # torch_ops_v25's steps run from 9.3 s: the tables write seconds; the readout used to say
    # "9921.24 ms" for the peak at 9.921 s
    analysis = analysis_of("torch_ops_v25")
    t = analysis.peak.peak_time_ns
    page, netlog = open_page(write_report(analysis, tmp_path / "report"), width=1400, height=900, screenshot=False,
                             evaluate={"cursor": ONE_CURSOR % t,
                                       "peak_at": "document.querySelector('#peaks-table tbody td:nth-child(4)').textContent"})
    assert_quiet_page(page, netlog)
    seen = page.values["cursor"]
    assert 1 <= seen["view"][0] < seen["view"][1] < 10  # a view of a few steps, all between 1 and 10 s
    table = page.values["peak_at"]
    assert table == fmt_time(t) and table.endswith(" s")
    shown = [seen["legend"], seen["readout"], seen["listed"].split("Live at ")[1].split(":")[0]]
    assert all(text.endswith(" s") and abs(float(text[:-2]) - t / 1e9) < 5e-4 for text in shown), shown
    assert seen["readout"] == "9.9212 s"  # the 128 ms opening view: one more decimal (docs/report.md)
    assert seen["axis"] and all(label.endswith(" s") for label in seen["axis"] if label)
