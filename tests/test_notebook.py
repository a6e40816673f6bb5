"""nsysan in a notebook: tables as DataFrames, a short repr, the report inline, JSON read back.

The session itself is tests/notebook_torch_leak.py (plain Python in cells); the rest checks the
pieces one by one on real fixtures.
"""

from __future__ import annotations

import copy
import dataclasses
import html
import html.parser
import json
import re
import runpy
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pytest
from conftest import CAPTURES, GOLDEN, ROOT, analysis_of, truth

import nsysan
from nsysan import Analysis, NsysanError
from nsysan.model.dataframes import RAW_FRAMES

MiB = 1 << 20


def test_notebook_session_on_torch_leak(capsys):
    runpy.run_path(str(ROOT / "tests" / "notebook_torch_leak.py"), run_name="__main__")
    assert "torch_leak_v25.sqlite" in capsys.readouterr().out


# --- tables ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CAPTURES)
def test_every_table_has_one_row_per_object(name):
    analysis = analysis_of(name)
    assert len(analysis.frame("groups")) == len(analysis.groups)
    assert len(analysis.frame("sites")) == len(analysis.sites)
    assert len(analysis.frame("never_freed")) == len(analysis.never_freed)
    assert len(analysis.frame("live_at_peak")) == sum(len(p.live_at_peak) for p in analysis.peaks)
    assert len(analysis.frame("timeline")) == sum(len(s.ts_ns) for s in analysis.timeline.series)
    assert len(analysis.frame("gpus")) == len(analysis.capture.gpus)
    for table in Analysis.frame_names():
        frame = analysis.frame(table)
        assert isinstance(frame, pd.DataFrame) and frame.columns.is_unique


def test_known_mem_never_freed_table_is_the_truth(known_mem_v25):
    leaks = known_mem_v25.frame("never_freed")
    expected = sorted((r["ptr"], r["bytes"]) for r in truth("known_mem_v25") if r.get("freed") == 0)
    assert sorted(zip(leaks["address"], leaks["bytes"])) == expected
    assert leaks["free_time_ns"].isna().all() and str(leaks["free_time_ns"].dtype) == "Int64"
    # Nested objects are spread out: the call site of each block.
    assert {"site_label", "site_function", "site_from_stack"} <= set(leaks.columns)


def test_call_sites_from_stacks_group_like_the_truth(known_bt_v25):
    sites = known_bt_v25.frame("sites")
    # known_bt_v25 leaks three 4 MiB blocks from alloc_cache_entry (fixtures/README.md).
    cache = sites[sites["site_function"] == "alloc_cache_entry"]
    assert cache["never_freed_bytes"].sum() == 3 * 4 * MiB and cache["never_freed_count"].sum() == 3
    leaks = known_bt_v25.frame("never_freed").groupby("site_function")["bytes"].sum()
    assert leaks["alloc_weights"] == 128 * MiB


def test_empty_tables_keep_their_columns_and_types(torch_leak_v25):
    failed = torch_leak_v25.frame("failed_calls")
    assert failed.empty
    assert list(failed.columns) == [f.name for f in dataclasses.fields(nsysan.model.FailedCall)]
    assert str(failed["live_bytes"].dtype) == "Int64" and str(failed["time_ns"].dtype) == "int64"


def test_a_series_without_points_adds_no_timeline_row(known_mem_v25):
    empty = nsysan.model.Series(pid=1, device=0, kind="device", ts_ns=[], live_bytes=[])
    timeline = dataclasses.replace(known_mem_v25.timeline, series=[empty, *known_mem_v25.timeline.series])
    frame = dataclasses.replace(known_mem_v25, timeline=timeline).frame("timeline")
    assert len(frame) == sum(len(s.ts_ns) for s in known_mem_v25.timeline.series)
    assert str(frame["live_bytes"].dtype) == "int64" and 1 not in set(frame["pid"])


def test_failed_call_table_of_a_real_oom(real_oom_v25):
    failed = real_oom_v25.frame("failed_calls")
    # fixtures/README.md: cudaMalloc call #9 fails with returnValue 2 inside NVTX range "fill".
    assert list(zip(failed["api"], failed["return_value"], failed["nvtx_range"])) == [("cudaMalloc", 2, "fill")]
    assert failed["error"].iloc[0] == "cudaErrorMemoryAllocation"


def test_live_set_at_an_out_of_memory_failure(real_oom_v25):
    live = real_oom_v25.frame("live_at_failure")
    # fixtures/README.md: 16 GiB blocks until call #9 of cudaMalloc fails, so 8 are live then.
    assert (live["oom_failure_call_number"] == 9).all() and (live["oom_failure_api"] == "cudaMalloc").all()
    assert live["bytes"].tolist() == [16 << 30] * 8
    assert (live["oom_failure_total_memory_bytes"] == 150_109_880_320).all()


def test_raw_frames_are_kept_and_not_serialized(known_mem_v25):
    assert RAW_FRAMES == ("events", "calls", "nvtx_ranges")
    assert known_mem_v25.frame("events") is known_mem_v25.events
    # Every allocating API the program called (its truth file) is in the API-call frame.
    called = {r["truth"] for r in truth("known_mem_v25") if r.get("truth")}
    assert called <= set(known_mem_v25.calls["api"]) and "cudaMallocAsync" in called
    assert {"name", "start_ns", "end_ns"} <= set(known_mem_v25.nvtx_ranges.columns)
    assert "burst" in set(known_mem_v25.nvtx_ranges["name"])
    doc = known_mem_v25.to_dict()
    assert not set(RAW_FRAMES) & set(doc)


def test_unknown_table_names_the_tables():
    analysis = analysis_of("known_mem_v25")
    with pytest.raises(NsysanError, match="no table 'site' in an Analysis; the tables are: groups, .*, sites, "):
        analysis.frame("site")
    loaded = Analysis.from_dict(analysis.to_dict())
    with pytest.raises(NsysanError, match="events frame is read from the export"):
        loaded.frame("events")


@dataclass(frozen=True)
class _Holder:
    site: str
    bytes: int


@dataclass(frozen=True)
class _Step:
    number: int
    growth_bytes: int
    peak_time_ns: int | None = None
    kept: list[_Holder] = field(default_factory=list)


@dataclass(frozen=True)
class _StepSeries:
    pid: int
    device: int
    steps: list[_Step] = field(default_factory=list)


@dataclass(frozen=True)
class _WithSteps(Analysis):
    steps: list[_StepSeries] = field(default_factory=list)


def test_a_section_added_later_gets_its_tables_without_code():
    """How sections other issues add (steps, growth, pools ...) become tables: by type hints,
    lists in lists included; the steps are "steps", their per-process lists "step_series"."""
    base = analysis_of("known_mem_v25")
    steps = [_Step(0, 4 * MiB, kept=[_Holder("alloc_cache_entry", 4 * MiB)]), _Step(1, 0, peak_time_ns=25)]
    analysis = _WithSteps(**{f.name: getattr(base, f.name) for f in dataclasses.fields(Analysis) if f.name != "steps"},
                          steps=[_StepSeries(1313, 0, steps)])
    assert {"step_series", "steps", "kept"} <= set(analysis.frame_names())
    table = analysis.frame("steps")
    assert list(table.columns) == ["step_series_pid", "step_series_device", "number", "growth_bytes", "peak_time_ns"]
    assert table["growth_bytes"].tolist() == [4 * MiB, 0] and table["step_series_pid"].tolist() == [1313, 1313]
    assert table["peak_time_ns"].isna().tolist() == [True, False]
    kept = analysis.frame("kept")
    assert kept[["step_series_pid", "step_number", "site", "bytes"]].values.tolist() == [
        [1313, 0, "alloc_cache_entry", 4 * MiB]]
    assert analysis.frame("step_series").to_dict("records") == [{"pid": 1313, "device": 0}]
    # and JSON documents written before the section existed still load, with no steps
    before = {k: v for k, v in base.to_dict().items() if k != "steps"}
    assert _WithSteps.from_dict(before).steps == []


# --- repr and the inline report ----------------------------------------------------------------


@pytest.mark.parametrize("name", CAPTURES)
def test_repr_is_one_short_line(name):
    analysis = analysis_of(name)
    text = repr(analysis)
    assert len(text) < 500 and "\n" not in text
    assert analysis.source.name in text


def test_repr_says_out_of_memory(real_oom_v25, torch_leak_v25):
    # fixtures/README.md: real_oom_v25's cudaMalloc call #9 fails; in torch_oom_v25 PyTorch's
    # allocator refuses by itself (no cudaMalloc fails); torch_leak_v25 never runs out.
    assert "out of memory: 1 failed, 0 allocator gave up;" in repr(real_oom_v25)
    assert "out of memory: 0 failed, 1 allocator gave up;" in repr(analysis_of("torch_oom_v25"))
    assert "out of memory" not in repr(torch_leak_v25)


def test_repr_says_peak_and_counts(known_mem_v25):
    # fixtures/README.md: 908 MiB peak in "burst"; 6 blocks (146 MiB) never freed, per the truth.
    leaked = sum(r["bytes"] for r in truth("known_mem_v25") if r.get("freed") == 0)
    assert leaked == 153_067_520
    text = repr(known_mem_v25)
    assert "peak 908.0 MiB" in text and "'burst'" in text
    assert "never freed 6 (146.0 MiB)" in text and "failed calls 0" in text


class _Page(html.parser.HTMLParser):
    """Tags in order, checking that every element that needs closing is closed in order."""

    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[str] = []
        self.tags: list[tuple[str, dict]] = []
        self.misnested: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag not in self.VOID:
            self.open.append(tag)

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        if not self.open or self.open[-1] != tag:
            self.misnested.append(tag)
        else:
            self.open.pop()


def parse(text: str) -> _Page:
    page = _Page()
    page.feed(text)
    page.close()
    return page


@pytest.fixture(scope="module")
def inline_report() -> str:
    return analysis_of("torch_leak_v25")._repr_html_()


def test_repr_html_is_the_report_page_in_a_sandboxed_frame(inline_report, torch_leak_v25):
    assert len(inline_report.encode("utf-8")) < 2 * 2**20
    outer = parse(inline_report)
    assert [t for t, _ in outer.tags] == ["iframe"] and outer.open == [] and outer.misnested == []
    attrs = outer.tags[0][1]
    assert attrs["sandbox"] == "allow-scripts"  # no allow-same-origin: the page can't reach the notebook
    assert "width:100%" in attrs["style"]
    page_text = attrs["srcdoc"]
    assert page_text.startswith("<!DOCTYPE html>")
    page = parse(page_text)
    assert page.open == [] and page.misnested == []
    names = [t for t, _ in page.tags]
    assert names[:2] == ["html", "head"] and "body" in names
    # Self-contained: images are data URIs, no stylesheet or script is fetched, nothing else loads.
    for tag, tag_attrs in page.tags:
        assert "src" not in tag_attrs or tag_attrs["src"].startswith("data:image/png;base64,"), tag
        assert tag != "link" and not (tag == "script" and "src" in tag_attrs)
        assert not tag_attrs.get("href", "#").startswith(("http:", "https:", "//"))
    assert "http://" not in page_text.replace("http://www.w3.org", "") and "https://" not in page_text
    # It is the page of this analysis.
    from nsysan.base.units import fmt_bytes

    assert fmt_bytes(torch_leak_v25.peak.peak_bytes) in page_text


def test_repr_html_in_chromium(inline_report, tmp_path):
    from browser import find_chromium, open_page

    import os

    if not find_chromium():
        if os.environ.get("NSYSAN_REQUIRE_BROWSER") == "1":
            pytest.fail("NSYSAN_REQUIRE_BROWSER=1 but chromium is not installed")
        pytest.skip("chromium is not installed")
    # A notebook's output area, much reduced: the cell's HTML inside a page of the notebook.
    cell = tmp_path / "notebook.html"
    cell.write_text("<!DOCTYPE html><html><head><meta charset='utf-8'><title>cell</title></head>"
                    f"<body><div class='output_html' style='width:900px'>{inline_report}</div></body></html>",
                    encoding="utf-8")
    page, netlog = open_page(cell, width=1000, height=900, evaluate={
        "frame_width": "document.querySelector('iframe').getBoundingClientRect().width",
        "frame_height": "document.querySelector('iframe').getBoundingClientRect().height",
        # sandboxed without allow-same-origin: the notebook can't read the frame, nor it the notebook
        "isolated": "document.querySelector('iframe').contentDocument === null",
    })
    assert page.remote_requests == [] and netlog == []
    assert page.errors == [] and page.dialogs == []
    assert page.values["frame_width"] == 900 and page.values["frame_height"] >= 600
    assert page.values["isolated"] is True


# --- reading JSON back -------------------------------------------------------------------------


def test_a_document_of_an_older_nsysan_loads():
    # Written by nsysan at b2fae8a, before "scope" existed (tests/golden/older/README.md).
    older = nsysan.load_analysis(GOLDEN / "older" / "known_mem_v25.b2fae8a.analysis.json")
    assert older.scope == "full" and older.peak.peak_bytes == 908 * MiB
    assert len(older.frame("never_freed")) == 6


def test_lists_and_optional_fields_added_later_read_as_empty(known_mem_v25):
    doc = known_mem_v25.to_dict()
    for key in ("caps", "steps", "growth", "spikes"):  # sections added within @1 after its first documents
        del doc[key]
    del doc["source"]["exported_with"], doc["capture"]["gpus"]
    loaded = Analysis.from_dict(doc)
    assert loaded.caps == [] and loaded.steps == [] and loaded.capture.gpus == []
    assert loaded.frame("spikes").empty


@pytest.mark.parametrize("key", ["groups", "peaks", "failed_calls", "api_calls", "ranges", "peak", "diagnostics"])
def test_a_section_every_document_has_is_refused_when_missing(known_mem_v25, key):
    """In every @1 document since the first: absent means cut or edited, and read as empty it would
    pass a gate (no failed_calls: --no-failed-allocations holds on a run whose allocation failed)."""
    doc = known_mem_v25.to_dict()
    del doc[key]
    with pytest.raises(NsysanError, match=f"^field '{key}' is missing$"):
        Analysis.from_dict(doc)


def _broken(doc: dict, change) -> dict:
    doc = copy.deepcopy(doc)
    change(doc)
    return doc


BROKEN = {
    "source missing": (lambda d: d.pop("source"), "field 'source' is missing"),
    "peak bytes a string": (lambda d: d["peaks"][0].update(peak_bytes="big"),
                            "field 'peaks[0].peak_bytes' should be an integer, not 'big'"),
    "size a float": (lambda d: d["never_freed"][2].update(bytes=4194304.5),
                     "field 'never_freed[2].bytes' should be an integer, not 4194304.5"),
    "site label missing": (lambda d: d["never_freed"][0]["site"].pop("label"),
                           "field 'never_freed[0].site.label' is missing"),
    "sites not a list": (lambda d: d.update(sites={}), "field 'sites' should be a list, not {}"),
    "gpu not an object": (lambda d: d["capture"]["gpus"].__setitem__(0, 3),
                          "field 'capture.gpus[0]' should be an object, not 3"),
    "flag a string": (lambda d: d["capture"].update(nvtx="yes"), "field 'capture.nvtx' should be true or false"),
    "count a bool": (lambda d: d.update(never_freed_total=True), "field 'never_freed_total' should be an integer"),
    "timeline point": (lambda d: d["timeline"]["series"][0]["ts_ns"].__setitem__(1, None),
                       "field 'timeline.series[0].ts_ns[1]' should be an integer, not None"),
    "other schema": (lambda d: d.update(schema="nsysan/analysis@2"), "not an nsysan analysis"),
}


@pytest.mark.parametrize("case", BROKEN, ids=list(BROKEN))
def test_malformed_document_names_the_field(case, known_mem_v25, tmp_path):
    change, message = BROKEN[case]
    path = tmp_path / "analysis.json"
    path.write_text(json.dumps(_broken(known_mem_v25.to_dict(), change)))
    with pytest.raises(NsysanError, match=re.escape(message)) as caught:
        nsysan.load_analysis(path)
    assert caught.value.message.startswith("analysis.json: ")
    assert "\n" not in caught.value.message


@pytest.mark.parametrize("text", ["[]", "3", "null", '"x"', "{}", "{\"schema\": 1}", "not json"])
def test_not_a_document_at_all(text, tmp_path):
    path = tmp_path / "analysis.json"
    path.write_text(text)
    with pytest.raises(NsysanError, match="^analysis.json"):
        nsysan.load_analysis(path)


# --- compare and check from Python -------------------------------------------------------------

CLEAN, LEAK = "fixtures/torch_clean_v25.sqlite", "fixtures/torch_leak_v25.sqlite"


def _last_reserved(name: str) -> int:
    return [r["reserved"] for r in truth(name) if "step" in r][-1]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nsysan", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)


def test_compare_mirrors_the_command():
    from nsysan.model import Comparison

    comparison = nsysan.compare(ROOT / CLEAN, analysis_of("torch_leak_v25"))  # a path and an Analysis
    result = _cli("compare", CLEAN, LEAK, "--format", "json")
    assert result.returncode == 0, result.stderr
    from_command = Comparison.from_dict(json.loads(result.stdout))
    assert comparison.headline == from_command.headline
    for table in ("processes", "sites", "ranges"):
        pd.testing.assert_frame_equal(comparison.frame(table), from_command.frame(table))
    processes = comparison.frame("processes")
    # Both runs end with the caching allocator's segments (`reserved` after the last step, their
    # truth files) plus the same library workspaces, all never freed: the difference is the leak.
    assert processes.loc[0, "never_freed_delta"] == (
        _last_reserved("torch_leak_v25") - _last_reserved("torch_clean_v25")) == 3_800_039_424
    assert processes.loc[0, "never_freed_before"] + 3_800_039_424 == processes.loc[0, "never_freed_after"]


def test_check_mirrors_the_command(tmp_path):
    verdict = nsysan.check(LEAK, CLEAN, max_peak_increase="10%", max_never_freed=6 << 30)
    result = _cli("check", LEAK, "--baseline", CLEAN, "--max-peak-increase", "10%",
                  "--max-never-freed", str(6 << 30), "--json", str(tmp_path / "verdict.json"))
    assert result.returncode == 1, result.stderr  # a limit broke
    assert json.loads((tmp_path / "verdict.json").read_text())["outcomes"] == verdict.to_dict()["outcomes"]
    outcomes = verdict.frame("outcomes").set_index("limit")
    assert not verdict.ok and not outcomes.loc["max-peak-increase", "ok"]
    # never freed at the end: reserved after step 5 plus the workspaces, under 6 GiB
    assert outcomes.loc["max-never-freed", "measured"] == _last_reserved("torch_leak_v25") + 134_481_920
    assert outcomes.loc["max-never-freed", "ok"]


def test_check_without_limits_is_an_error():
    with pytest.raises(NsysanError, match="no limits to check"):
        nsysan.check(analysis_of("known_mem_v25"))


def test_comparison_and_verdict_show_themselves_in_one_line():
    comparison = nsysan.compare(analysis_of("torch_clean_v25"), analysis_of("torch_leak_v25"))
    text = repr(comparison)
    assert len(text) < 500 and text.endswith(comparison.headline + ">")
    verdict = nsysan.check(analysis_of("torch_leak_v25"), analysis_of("torch_clean_v25"), max_peak_increase="10%")
    assert repr(verdict) == ("<nsysan.Verdict of torch_leak_v25.sqlite against torch_clean_v25.sqlite: "
                             "1 of 1 limits broke (max-peak-increase)>")
