"""The page on any screen and on paper (issue 29): at 420 px tables keep whole words, a site name wraps
between words and never letter by letter, and the table scrolls in its box; printed, a long table
prints its first rows and says how many it leaves out."""

from __future__ import annotations

import re

import pytest
from browser import open_page
from conftest import analysis_of
from test_html import assert_quiet_page, chromium, pdf_text  # noqa: F401  (the fixture)

from nsysan.commands.outputs import write_report
from nsysan.base.units import fmt_frame, fmt_time_in

# Every shown cell against its longest word, measured in the font of the element holding it:
# [table, word, word px, cell's content px] for each cell narrower than its longest word.
NARROW = """(() => {
  const ctx = document.createElement('canvas').getContext('2d'), bad = [];
  document.querySelectorAll('td').forEach(td => {
    if (!td.offsetParent || td.closest('[hidden]')) return;
    const style = getComputedStyle(td);
    const room = td.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    const walker = document.createTreeWalker(td, NodeFilter.SHOW_TEXT);
    let longest = 0, word = '';
    for (let n = walker.nextNode(); n; n = walker.nextNode()) {
      const el = n.parentElement;
      if (!el.offsetParent && el !== td) continue;
      if (el.closest('details:not([open]) > :not(summary)')) continue;
      ctx.font = getComputedStyle(el).font;
      const indent = el === td ? 0 : el.getBoundingClientRect().left - td.getBoundingClientRect().left - parseFloat(style.paddingLeft);
      n.textContent.split(/\\s+/).forEach(w => { const px = ctx.measureText(w).width + Math.max(indent, 0);
        if (px > longest) { longest = px; word = w; } });
    }
    if (longest > room + 1) bad.push([td.closest('table').id || td.closest('table').className, word, Math.round(longest), Math.round(room)]);
  });
  return bad;
})()"""


@pytest.mark.parametrize("name, width", [("ddp_leak_v25", 420), ("torch_ops_v25", 420), ("known_bt_v25", 420),
                                         ("torch_async_v25", 420), ("known_bt_v25", 1400)])
def test_no_cell_is_narrower_than_its_longest_word(name, width, tmp_path, chromium):
    # before: 67 cells on ddp_leak_v25 ("[pt_autograd_1]" in 90 px of a 104 px word), 21 on known_bt_v25
    page, netlog = open_page(write_report(analysis_of(name), tmp_path / "report"), width=width, height=900,
                             screenshot=False, evaluate={
        "narrow": NARROW, "cells": "document.querySelectorAll('td').length",
        "page": "[document.documentElement.scrollWidth, window.innerWidth]"})
    assert_quiet_page(page, netlog)
    assert page.values["cells"] > 50 and page.values["narrow"] == []
    # the tables scroll in their own box: the page itself never does
    assert page.values["page"][0] <= page.values["page"][1] == width


def test_a_long_table_prints_its_top_rows_and_says_how_many_more(tmp_path, chromium):
    # jax_prealloc_v25: 200 NVTX ranges (XLA's passes); printed whole, the page was 28 A4 pages
    analysis = analysis_of("jax_prealloc_v25")
    assert len(analysis.ranges) == 200
    page, netlog = open_page(write_report(analysis, tmp_path / "report"), width=1400, height=900, screenshot=False,
                             pdf=True, evaluate={"shown": "document.querySelectorAll('#ranges-table tbody tr').length",
                                                 "note": "getComputedStyle(document.querySelector('.print-only')).display"})
    assert_quiet_page(page, netlog)
    # on screen: every row (ranges of one family, "step N", are one row), no note
    rows = analysis.range_rows()
    assert page.values["shown"] == len(rows) == 226 and page.values["note"] == "none"
    text = pdf_text(page.pdf, tmp_path)
    assert text.count("\f") <= 12  # with the phases and spikes sections since
    assert re.search(r"Printed:\s+the\s+first\s+25\s+of\s+226\s+rows", text)
    # the table's first 25 rows, in its order (first opened first): their "first at" times, one a row
    start = text.index("first at (s)")
    section = text[start:text.index("Printed:", start)]
    starts = sorted(r.first_start_ns for r in rows)[:25]
    assert re.findall(r"^\s*(\d+\.\d{3} s)\s", section, re.M) == [fmt_time_in(t, "s") for t in starts]


def test_the_call_stacks_of_the_top_sites_print(tmp_path, chromium):
    # known_bt_v25 (--cudabacktrace): each site opens to its stack on screen; on paper the top rows'
    # stacks print, the user's frames first (from the site's frame outward: alloc_workspace,
    # train_step, main), the frames inside it (cudaMalloc, the driver, the profiler) as one line
    analysis = analysis_of("known_bt_v25")
    stacks = {s.id: s for s in analysis.stacks}
    page, netlog = open_page(write_report(analysis, tmp_path / "report"), width=1400, height=900, screenshot=False,
                             pdf=True, evaluate={"open": "document.querySelectorAll('details[open]').length"})
    assert_quiet_page(page, netlog)
    assert page.values["open"] == 0  # closed on screen
    text = pdf_text(page.pdf, tmp_path)
    squashed = re.sub(r"\s+", "", text[text.index("Allocation sites"):])  # paper breaks long names anywhere
    printed = 0
    for site in [s.site for s in analysis.sites[:10] if s.site.stack_id is not None]:
        frames = stacks[site.stack_id].frames
        at = next(i for i, f in enumerate(frames) if f.function == site.function)
        row = squashed.index(site.label.split()[0])  # its row (the layout puts the label's words apart)
        where = row
        for frame in frames[at:at + 3]:  # the site's frame and its callers, in that order
            where = squashed.index(re.sub(r"\s+", "", fmt_frame(frame.function, frame.file, frame.line, frame.module)),
                                   where)
        folded = squashed.index(f"+{at}framesinsideit(framework,allocator,CUDAdriver,profiler)", row)
        assert where < folded
        assert "cudaMalloc(known)" not in squashed[row:folded]  # the frames inside it are not printed one by one
        printed += 1
    assert printed >= 3
