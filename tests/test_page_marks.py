"""What the page's interactive timeline draws beside the traced lines (issue 29): nvidia-smi's logs with
the values of their own samples, and where a process ran out of memory without a failed call."""

from __future__ import annotations

import csv

import pytest
from browser import open_page
from conftest import FIXTURES
from test_html import assert_quiet_page, chromium  # noqa: F401  (the fixture)

import nsysan
from nsysan.commands.outputs import write_report
from nsysan.render.page_data import page_data

MiB = 1 << 20


@pytest.fixture(scope="module")
def with_smi():
    return nsysan.analyze(FIXTURES / "torch_smi_v25.sqlite", smi=[FIXTURES / "torch_smi_v25.smi-gpu.csv",
                                                                  FIXTURES / "torch_smi_v25.smi-apps.csv"])


def test_the_page_data_carries_each_logs_samples_on_its_gpu(with_smi):
    (panel,) = page_data(with_smi)["panels"]
    labels = [line["label"] for line in panel["smi"]]
    assert labels == ["nvidia-smi torch_smi_v25.smi-gpu.csv: memory.used",
                      "nvidia-smi torch_smi_v25.smi-apps.csv: python3 (481) used_memory"]
    gpu_line = panel["smi"][0]
    # the samples are the log's own memory.used of GPU 0, in MiB as nvidia-smi wrote them
    with open(FIXTURES / "torch_smi_v25.smi-gpu.csv", newline="") as handle:
        logged = {int(row[" memory.used [MiB]"].split()[0]) * MiB for row in csv.DictReader(handle)
                  if row[" index"].strip() == "0"}
    assert set(gpu_line["bytes"]) <= logged and max(gpu_line["bytes"]) == 6071 * MiB  # fixtures/README.md
    assert gpu_line["ts"] == sorted(gpu_line["ts"])


def test_no_logs_no_lines():
    analysis = nsysan.analyze(FIXTURES / "torch_smi_v25.sqlite")
    assert all(panel["smi"] == [] for panel in page_data(analysis)["panels"])


def test_the_interactive_timeline_draws_nvidia_smi(with_smi, tmp_path, chromium):  # noqa: F811
    page_path = write_report(with_smi, tmp_path / "report")
    page, netlog = open_page(page_path, width=1400, height=900, evaluate={
        "legend": "Array.from(document.querySelectorAll('#timeline .u-legend .u-label'), e => e.textContent)",
        "readout": "(function () { var o = document.querySelector('#timeline .u-over'); var r = o.getBoundingClientRect();"
                   " o.dispatchEvent(new MouseEvent('mousemove', {clientX: r.left + r.width * 0.6, clientY: r.top + 20,"
                   " bubbles: true})); return document.querySelector('#timeline-readout, .readout').textContent; })()"})
    assert_quiet_page(page, netlog)
    legend = page.values["legend"]
    assert "nvidia-smi torch_smi_v25.smi-gpu.csv: memory.used" in legend
    assert "nvidia-smi torch_smi_v25.smi-apps.csv: python3 (481) used_memory" in legend
    assert "nvidia-smi torch_smi_v25.smi-gpu.csv: memory.used: " in page.values["readout"]


def test_an_oom_without_a_failed_call_is_marked_where_the_allocator_gave_up(tmp_path, chromium):  # noqa: F811
    """torch_oom_v25: PyTorch raised OutOfMemoryError under its fraction cap without a failed
    cudaMalloc; the page draws a red line where its allocator released its cache for the last time."""
    analysis = nsysan.analyze(FIXTURES / "torch_oom_v25.sqlite")
    (gave_up,) = analysis.oom.allocator_ooms
    assert page_data(analysis)["ooms"] == [{
        "pid": 1872, "panel": 0, "t": gave_up.release.start_ns, "bytes": gave_up.release.live_before_bytes,
        "label": "out of memory: the allocator gave up in step 5 > hoard"}]
    page, netlog = open_page(write_report(analysis, tmp_path / "report"), width=1400, height=900, evaluate={
        "marks": "Array.from(document.querySelectorAll('#timeline .panel'), p => p.getAttribute('data-oom-marks'))"})
    assert_quiet_page(page, netlog)
    assert page.values["marks"] == ["1"]
    # a run whose failed call is its OOM keeps its ✕ and gets no second mark
    assert page_data(nsysan.analyze(FIXTURES / "real_oom_v25.sqlite"))["ooms"] == []
