"""The analysis cache: `check`, `compare` and `batch` analyze an input once per content, nsysan and
options, and read the same document back afterwards (pipeline/cache.py)."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest
from conftest import FIXTURES
from typer.testing import CliRunner

import nsysan
import nsysan.pipeline.cache as analysis_cache
import nsysan.pipeline.stages
from nsysan.cli import app
from nsysan.pipeline.report_or_document import load_or_analyze
from nsysan.render.json import render_json

CLEAN = FIXTURES / "torch_clean_v25.sqlite"
LEAK = FIXTURES / "torch_leak_v25.sqlite"


@pytest.fixture
def analyses(monkeypatch) -> list[Path]:
    """The inputs pipeline.analyze_report is called for (it still analyzes: a spy, not a stand-in)."""
    seen: list[Path] = []
    real = nsysan.pipeline.stages.analyze_report

    def spy(report, **kwargs):
        seen.append(Path(report))
        return real(report, **kwargs)

    monkeypatch.setattr(nsysan.pipeline.stages, "analyze_report", spy)
    return seen


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout


def test_check_then_compare_analyzes_each_run_once(analyses, own_cache_dir, tmp_path):
    # torch_leak's peak grew 3.2x over torch_clean's: the gate breaks (exit 1)
    code, _ = cli("check", str(LEAK), "--baseline", str(CLEAN), "--max-peak-increase", "10%")
    assert code == 1
    assert analyses == [LEAK, CLEAN]
    code, cached = cli("compare", str(CLEAN), str(LEAK), "--format", "json")
    assert code == 0
    assert analyses == [LEAK, CLEAN]  # read back, not analyzed again
    kept = sorted((own_cache_dir / "analyses").glob("*.analysis.json"))
    assert len(kept) == 2
    # The same comparison as from two fresh analyses, byte for byte.
    fresh = nsysan.compare(nsysan.analyze(CLEAN, keep_events=False), nsysan.analyze(LEAK, keep_events=False))
    assert json.loads(cached) == json.loads(json.dumps(fresh.to_dict()))
    assert json.loads(cached)["headline"].startswith("peak +3.5 GiB (+")  # torch_leak keeps each step's graph


def test_the_document_read_back_is_the_analysis(analyses):
    first = load_or_analyze(LEAK, keep_events=False)
    second = load_or_analyze(LEAK, keep_events=False)
    assert analyses == [LEAK]
    assert render_json(second) == render_json(first) == render_json(nsysan.analyze(LEAK, keep_events=False))
    assert second.peak.peak_bytes == first.peak.peak_bytes > 0


def test_the_same_bytes_elsewhere_are_reused_under_their_new_name(analyses, tmp_path):
    copy = tmp_path / "renamed.sqlite"
    shutil.copyfile(LEAK, copy)
    first = load_or_analyze(LEAK, keep_events=False)
    second = load_or_analyze(copy, keep_events=False)
    assert analyses == [LEAK]
    assert second.source.name == "renamed.sqlite" and second.source.path == str(copy)
    assert second.peak == first.peak


def test_other_options_other_code_or_other_bytes_analyze_again(analyses, tmp_path, monkeypatch):
    load_or_analyze(CLEAN, keep_events=False)
    load_or_analyze(CLEAN, keep_events=False, step_range="^step")  # an option of the analysis
    load_or_analyze(CLEAN, keep_events=False, step_range="^step")
    assert analyses == [CLEAN, CLEAN]
    # max_memory decides how, not what: the same document
    load_or_analyze(CLEAN, keep_events=False, max_memory=1 << 30)
    assert analyses == [CLEAN, CLEAN]
    # another nsysan (a new version, or an edited source file)
    monkeypatch.setattr(analysis_cache, "code_digest", lambda: "another nsysan")
    load_or_analyze(CLEAN, keep_events=False)
    assert analyses == [CLEAN, CLEAN, CLEAN]
    # one byte changed in a copy: another input
    changed = tmp_path / "changed.sqlite"
    data = bytearray(CLEAN.read_bytes())
    data[-1] ^= 1  # the last page's last byte: free space in SQLite's page, still a valid export
    changed.write_bytes(bytes(data))
    load_or_analyze(changed, keep_events=False)
    assert analyses[-1] == changed and len(analyses) == 4


def test_a_notebook_analysis_keeps_its_frames_and_is_never_cached(analyses, own_cache_dir):
    analysis = load_or_analyze(CLEAN, keep_events=True)
    load_or_analyze(CLEAN, keep_events=True)
    assert analyses == [CLEAN, CLEAN] and analysis.events is not None
    assert not (own_cache_dir / "analyses").exists()


def test_a_damaged_entry_is_analyzed_again_and_replaced(analyses, own_cache_dir):
    first = load_or_analyze(CLEAN, keep_events=False)
    (entry,) = (own_cache_dir / "analyses").glob("*.analysis.json")
    entry.write_text('{"schema": "nsysan/analysis@1", "peak": ')  # cut short
    again = load_or_analyze(CLEAN, keep_events=False)
    assert analyses == [CLEAN, CLEAN]
    assert render_json(again) == render_json(first) == entry.read_text()


def test_an_unwritable_cache_costs_the_reuse_not_the_answer(analyses, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("NSYSAN_CACHE_DIR", str(blocker / "cache"))
    assert load_or_analyze(CLEAN, keep_events=False).peak.peak_bytes > 0
    assert load_or_analyze(CLEAN, keep_events=False).peak.peak_bytes > 0
    assert analyses == [CLEAN, CLEAN]


def test_concurrent_writers_of_one_entry_leave_readers_a_whole_document(tmp_path):
    analysis = nsysan.analyze(LEAK, keep_events=False)
    expected = render_json(analysis)
    entry = tmp_path / "analyses" / "k.analysis.json"
    seen: list[str] = []

    def write() -> None:
        for _ in range(10):
            analysis_cache.write_entry(entry, analysis)

    writers = [threading.Thread(target=write) for _ in range(4)]

    def read() -> None:
        # while any writer runs (on a loaded machine the reader can finish 40 looks before the
        # first write), then once more
        while any(w.is_alive() for w in writers) or (not seen and entry.exists()):
            if entry.exists():
                seen.append(entry.read_text())

    threads = writers + [threading.Thread(target=read)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen and all(text == expected for text in seen)
    assert [p.name for p in entry.parent.iterdir()] == [entry.name]  # no temporary file left


def test_batch_again_reads_every_report_back(analyses, tmp_path, own_cache_dir):
    folder = tmp_path / "runs"
    folder.mkdir()
    for source in (CLEAN, LEAK):
        shutil.copyfile(source, folder / source.name)
    code, _ = cli("batch", str(folder), "-o", str(tmp_path / "first"), "-j", "1")
    assert code == 0 and len(analyses) == 2
    code, _ = cli("batch", str(folder), "-o", str(tmp_path / "second"), "-j", "1")
    assert code == 0 and len(analyses) == 2
    first = sorted((tmp_path / "first" / "analyses").iterdir())
    second = sorted((tmp_path / "second" / "analyses").iterdir())
    assert [p.name for p in first] == [p.name for p in second]
    assert [p.read_text() for p in first] == [p.read_text() for p in second]
    assert (tmp_path / "first" / "summary.csv").read_text() == (tmp_path / "second" / "summary.csv").read_text()


def test_the_cache_can_be_turned_off(analyses, own_cache_dir, monkeypatch):
    monkeypatch.setenv("NSYSAN_ANALYSIS_CACHE", "0")
    load_or_analyze(CLEAN, keep_events=False)
    load_or_analyze(CLEAN, keep_events=False)
    assert analyses == [CLEAN, CLEAN] and not (own_cache_dir / "analyses").exists()


def test_a_fifo_is_refused_in_one_line_not_waited_on(analyses, tmp_path):
    import os

    from nsysan.errors import NsysanError

    fifo = tmp_path / "run.sqlite"
    os.mkfifo(fifo)
    with pytest.raises(NsysanError, match="is a FIFO"):
        load_or_analyze(fifo, keep_events=False)
