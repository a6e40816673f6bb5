"""The report page draws what the bytes are (analysis.byte_classes, issue 30 section 3) as a stacked
area under the step chart, beside the timeline: each step's classes at its highest point."""

from __future__ import annotations

import html
import re

from browser import open_page
from conftest import analysis_of
from test_html import assert_quiet_page, chromium  # noqa: F401  (the fixture)

from nsysan.commands.outputs import write_report
from nsysan.model.bytes import BYTE_CLASSES
from nsysan.render.html import render_html

CHART = ("JSON.stringify(window.nsysanByteCharts.map(c => ({pid: c.pid, classes: c.classes, steps: c.steps, "
         "own: c.own, stacked: c.stacked})))")


def test_the_stacked_area_draws_each_steps_classes(tmp_path, chromium):  # noqa: F811
    import json

    analysis = analysis_of("torch_clean_v25")
    (b,) = analysis.byte_classes
    page, netlog = open_page(write_report(analysis, tmp_path / "report"), width=1400, height=900, evaluate={
        "chart": CHART, "legend": "Array.from(document.querySelectorAll('#bytes-1 .u-legend .u-label'), e => e.textContent)",
        "beside": "document.querySelector('#timeline .steps #bytes-1') !== null"})
    assert_quiet_page(page, netlog)
    (chart,) = json.loads(page.values["chart"])
    assert chart["pid"] == b.pid and chart["classes"] == list(BYTE_CLASSES)
    assert chart["steps"] == [s.label for s in b.steps] == [f"step {i}" for i in range(6)]
    for k, name in enumerate(BYTE_CLASSES):  # each class's own bytes, and the stack drawn from them
        assert chart["own"][k] == [getattr(s, f"{name}_bytes") for s in b.steps], name
    assert chart["stacked"][-1] == [s.live_bytes for s in b.steps]  # the top of the stack: all live bytes
    assert page.values["beside"] is True
    assert page.values["legend"][1:] == ["other", "cache", "workspaces", "optimizer state", "gradients", "activations",
                                         "weights"]


def test_the_sentence_and_rules_are_on_the_page_without_script():
    analysis = analysis_of("torch_clean_v25")
    page = render_html(analysis)
    note = html.unescape(re.sub(r"<[^>]+>", "", re.search(r'id="bytes-note-1">(.*?)</p>', page, re.S).group(1)))
    assert analysis.byte_classes[0].message in note
    assert "segment-level: the caching allocator's blocks, not tensors" in note
    rules = re.search(r'id="bytes-rules-1">(.*?)</details>', page, re.S).group(1)
    assert html.unescape(rules).count("<li>") == len(analysis.byte_classes[0].rules)


def test_no_phases_no_chart():
    page = render_html(analysis_of("known_mem_v25"))  # steps without forward/backward
    assert "byte-chart" not in page.split("<script")[0]
