"""The PNG plots: what is drawn (the figure's artists) and what comes out (real pixels)."""

from __future__ import annotations

import dataclasses
import io

import matplotlib
import matplotlib.image
import numpy as np
import pytest
from conftest import analysis_of
from matplotlib.text import Text
from models import GiB, MiB, make_analysis

from nsysan.model import CallSite, Site
from nsysan.render.png import DPI, PANEL_HEIGHT_IN, WIDTH_IN, figure_png, plot_sites, plot_timeline
from nsysan.base.units import fmt_bytes

H200_BYTES = 150_109_880_320  # TARGET_INFO_GPU.totalMemory of the fixtures' H200 (fixtures/README.md)


def texts(fig) -> list[str]:
    return [t.get_text() for t in fig.findobj(Text)]


def with_gid(fig, gid: str) -> list:
    """Artists whose gid is `gid`, or starts with it when it ends with ':' ("series:", "peak:")."""
    return [a for a in fig.findobj() if (str(a.get_gid() or "").startswith(gid) if gid.endswith(":")
                                         else a.get_gid() == gid)]


def pixels(png: bytes) -> np.ndarray:
    return matplotlib.image.imread(io.BytesIO(png), format="png")


def assert_not_blank(image: np.ndarray) -> None:
    rgb = image[..., :3]
    assert rgb.std() > 0.05
    assert (rgb.min(axis=-1) < 0.9).mean() > 0.01  # more than 1% of the pixels are not white


# -- the timeline, on real captures ------------------------------------------------------------------


def test_known_bt_timeline_marks_the_908_mib_peak_in_burst():
    fig = plot_timeline(analysis_of("known_bt_v25"))
    # fixtures/README.md: 256 + 128 + 12 MiB live when the 512 MiB burst buffer is allocated.
    assert "peak 908.0 MiB · burst" in texts(fig)
    assert fmt_bytes((256 + 128 + 12 + 512) * MiB) == "908.0 MiB"
    (ax,) = fig.axes  # one GPU with memory (the capture's second H200 has none)
    assert [line.get_gid() for line in with_gid(fig, "series:")] == \
        ["series:1535:0:device", "series:1535:0:managed", "series:1535:0:pinned"]
    assert ax.get_ylabel() == "live memory (MiB)" and ax.get_xlabel() == "time since capture start (ms)"
    # 0.6% of an H200: no capacity line (it would squash the curve), the capacity is in the title.
    assert not with_gid(fig, "capacity")
    assert "139.8 GiB" in ax.get_title(loc="left") and "0.6%" in ax.get_title(loc="left")
    assert len(with_gid(fig, "band")) == 5  # setup, train, burst, async pool, other kinds
    assert {"setup", "train", "burst"} <= set(texts(fig))


def test_ddp_timeline_has_one_panel_per_gpu():
    analysis = analysis_of("ddp_leak_v25")
    fig = plot_timeline(analysis)
    gpu0, gpu1 = fig.axes  # rank 0 on GPU 0, rank 1 on GPU 1
    assert gpu0.get_title(loc="left").startswith("GPU 0") and gpu1.get_title(loc="left").startswith("GPU 1")

    def series_of(ax):
        return {line.get_gid() for line in ax.get_lines() if str(line.get_gid()).startswith("series:")}

    # One line per (process, device, kind) series; rank 1 (pid 2147) only has its module statics on GPU 0.
    assert len(series_of(gpu0)) + len(series_of(gpu1)) == len(analysis.timeline.series)
    assert series_of(gpu1) == {"series:2147:1:device", "series:2147:1:pinned"}
    assert "series:2147:0:static" in series_of(gpu0)
    # Each process's NVTX bands are drawn once, on the panel of its highest peak.
    assert len(with_gid(fig, "band")) == len(analysis.timeline.bands)
    peaks = {a.get_gid(): a.get_text() for a in with_gid(fig, "peak:")}
    assert peaks["peak:2147:1"] == f"peak {fmt_bytes(analysis.peak.peak_bytes)} · step 7"
    assert peaks["peak:2146:0"].startswith("2146: peak 1.0 GiB")  # two processes on GPU 0: labels say whose
    image = pixels(figure_png(fig))
    assert image.shape[:2] == (round(2 * PANEL_HEIGHT_IN * DPI), round(WIDTH_IN * DPI))
    assert_not_blank(image)


def test_real_oom_timeline_shows_the_capacity_and_the_failed_malloc():
    fig = plot_timeline(analysis_of("real_oom_v25"))
    (ax,) = fig.axes
    assert ax.get_ylabel() == "live memory (GiB)"
    # Eight 16 GiB blocks were live when cudaMalloc #9 failed; a 1 GiB retry then made the peak.
    assert "peak 129.0 GiB · retry smaller" in texts(fig)
    (capacity,) = with_gid(fig, "capacity")
    assert capacity.get_ydata()[0] == pytest.approx(H200_BYTES / GiB)
    (failed,) = with_gid(fig, "failed")
    assert failed.get_offsets()[0][1] == pytest.approx(8 * 16)
    assert any("cudaErrorMemoryAllocation" in t for t in texts(fig))


@pytest.mark.parametrize("name", ["torch_leak_v25", "known_mem_v25", "torch_expandable_v25"])
def test_timeline_png_is_a_real_picture(name):
    analysis = analysis_of(name)
    fig = plot_timeline(analysis)
    assert f"peak {fmt_bytes(analysis.peak.peak_bytes)} · {analysis.peak.nvtx_range}" in texts(fig)
    png = figure_png(fig)
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) < 300_000
    image = pixels(png)
    assert image.shape[:2] == (round(PANEL_HEIGHT_IN * DPI), round(WIDTH_IN * DPI))
    assert_not_blank(image)


def test_a_capture_without_sizes_says_so_instead_of_drawing_axes():
    fig = plot_timeline(analysis_of("known_plain_v25"))
    assert fig.axes == []
    assert any("--cuda-memory-usage=true" in t for t in texts(fig))
    assert_not_blank(pixels(figure_png(fig)))


# -- the timeline, from a hand-built model -----------------------------------------------------------


def test_hand_built_timeline_draws_every_part():
    fig = plot_timeline(make_analysis())
    (ax,) = fig.axes
    (line,) = with_gid(fig, "series:")
    # The step line starts at 0 at the capture start and holds its last value to the end.
    assert line.get_drawstyle() == "steps-post"
    # 768 MiB is 75% of the 1 GiB GPU: the capacity line is drawn, so the axis reaches 1 GiB, in GiB.
    assert ax.get_ylabel() == "live memory (GiB)" and ax.get_xlabel() == "time since capture start (ms)"
    assert list(line.get_ydata()) == [0, 0.25, 0.75, 0.25, 0.25]
    assert list(line.get_xdata()) == [0, 1, 5, 6, 10]
    (peak,) = with_gid(fig, "peak:")
    assert peak.get_text() == "peak 768.0 MiB · step 1" and peak.xy == (5, 0.75)
    (capacity,) = with_gid(fig, "capacity")
    assert capacity.get_ydata()[0] == 1.0
    (failed,) = with_gid(fig, "failed")
    assert [list(p) for p in failed.get_offsets()] == [[6.5, 0.25]]
    assert len(with_gid(fig, "band")) == 2 and {"setup", "step 1"} <= set(texts(fig))


def test_profile_strings_never_become_mathtext():
    # "$...$" would be parsed as a formula, and a broken one fails when drawn.
    fig = plot_timeline(make_analysis(nvtx=r"$\frac{1}{$ step", process_name="a$b"))
    assert_not_blank(pixels(figure_png(fig)))
    assert r"peak 768.0 MiB · \$\frac{1}{\$ step" in texts(fig)  # escaped: shown with its dollars


def test_users_matplotlibrc_does_not_leak_in():
    with matplotlib.rc_context({"text.usetex": True, "font.size": 30}):  # would need LaTeX to draw
        fig = plot_timeline(make_analysis())
        png = figure_png(fig)
    assert pixels(png).shape[:2] == (round(PANEL_HEIGHT_IN * DPI), round(WIDTH_IN * DPI))
    assert matplotlib.rcParams["text.usetex"] is False  # restored


# -- the sites chart ----------------------------------------------------------------------------------


def test_sites_chart_overlays_never_freed_bytes():
    analysis = analysis_of("ddp_leak_v25")
    fig = plot_sites(analysis)
    (ax,) = fig.axes
    allocated, never = with_gid(fig, "allocated"), with_gid(fig, "never_freed")
    assert len(allocated) == len(never) == min(15, len(analysis.sites))
    labels = [t.get_text() for t in ax.get_yticklabels()]  # top to bottom
    # The biggest on top; rank 1 leaks 64 MiB each step from step 1 on (fixtures/README.md).
    assert max(allocated, key=lambda bar: bar.get_y()).get_width() == max(bar.get_width() for bar in allocated)
    assert labels[0] == f"{analysis.sites[0].site.label} · {analysis.sites[0].kind}"
    assert "cudaMalloc in step 3 [pt_autograd_1] · device" in labels
    assert ax.get_xlabel() == "bytes allocated during the capture (MiB)"
    assert any(t.startswith("64.0 MiB · never freed 64.0 MiB (1)") for t in texts(fig))
    image = pixels(figure_png(fig))
    assert image.shape[1] == round(WIDTH_IN * DPI)
    assert_not_blank(image)


def test_hand_built_sites_chart():
    fig = plot_sites(make_analysis())
    bars = {(b.get_gid(), round(b.get_width())) for b in with_gid(fig, "allocated") + with_gid(fig, "never_freed")}
    assert bars == {("allocated", 512), ("allocated", 256), ("never_freed", 0), ("never_freed", 256)}  # MiB
    assert "256.0 MiB · never freed 256.0 MiB (1)" in texts(fig)


def test_sites_chart_never_draws_static_memory_as_never_freed():
    # Module statics stay until the process exits by design (docs/analyses.md): a site of static
    # memory with 1 MiB "never freed" gets no red bar and says it is not a leak.
    analysis = make_analysis()
    static = Site(site=CallSite(label="(module load)"), kind="static", apis=["(module load)"], allocations=3,
                  allocated_bytes=1 << 20, never_freed_count=3, never_freed_bytes=1 << 20, max_live_bytes=1 << 20,
                  pid=100)
    fig = plot_sites(dataclasses.replace(analysis, sites=[*analysis.sites, static]))
    never = {round(b.get_width() * 1024) for b in with_gid(fig, "never_freed")}  # KiB: the unit is MiB
    assert never == {0, 256 * 1024}  # the weights' 256 MiB, and nothing for the workspace or the statics
    assert "1.0 MiB · static, not a leak" in texts(fig)


def test_sites_chart_without_sites_says_so():
    fig = plot_sites(analysis_of("known_plain_v25"))
    assert fig.axes == [] and any("No allocation sites" in t for t in texts(fig))
