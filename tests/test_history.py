"""`nsysan history`: runs of a batch database in order and their change points.

The change-point rule is tested on hand-written runs; the command on a database that `nsysan
batch --tag` wrote from real fixtures: two clean runs of the PyTorch model, then the leaking one.
"""

from __future__ import annotations

import io
import json
import re
import os
import sqlite3
from pathlib import Path

import pytest
from conftest import analysis_of, cli

from nsysan.batch.database import parse_tags
from nsysan.cli import main
from nsysan.errors import NsysanError
from nsysan.runs.history import _change_points, load_history, noise_bytes
from nsysan.model.history import HistoryRun
from nsysan.render.json import render_json

MiB = 1 << 20


def runs(*peaks_mib: float) -> list[HistoryRun]:
    return [HistoryRun(index=i + 1, report_hash=f"h{i}", name="run.sqlite", tags={"commit": f"c{i + 1}"},
                       analyzed_at="", peak_bytes=int(p * MiB), growth_bytes_per_step=None, growth_verdict=None,
                       never_freed_bytes=None) for i, p in enumerate(peaks_mib)]


def test_noise_is_twice_the_spread_with_floors():
    assert noise_bytes([100 * MiB, 102 * MiB, 98 * MiB]) == (100 * MiB, 4 * MiB)
    assert noise_bytes([1000 * MiB]) == (1000 * MiB, 20 * MiB)  # one run: 2% of it
    assert noise_bytes([10 * MiB, 10 * MiB]) == (10 * MiB, 1 * MiB)  # small: at least 1 MiB


def test_change_points_first_move_beyond_noise_then_a_new_baseline():
    changes = _change_points(runs(1000, 1003, 998, 1001, 1040, 1600, 1605, 1598, 1010), "peak_bytes")
    # 1040 is 40 MiB above a median of 1000.5 whose noise is max(2 x 2.5, 2% = 20) MiB: a change;
    # then 1600 against the baseline {1040}; then 1010 against {1600, 1605, 1598}.
    assert [(c.run, c.before_bytes // MiB, c.after_bytes // MiB, c.runs_before) for c in changes] == \
        [(5, 1000, 1040, 4), (6, 1040, 1600, 1), (9, 1600, 1010, 3)]


def test_no_change_within_noise():
    assert _change_points(runs(500, 505, 495, 503, 497, 506), "peak_bytes") == []


def test_tags_parse_and_refuse():
    assert parse_tags(["commit=abc", "date=2026-12-01"]) == {"commit": "abc", "date": "2026-12-01"}
    assert parse_tags(["abc123"]) == {"tag": "abc123"}
    for bad in (["=x"], ["a b=1"], ["k=" + "x" * 300], ["k=a\x1bb"], ["k=1", "k=2"]):
        with pytest.raises(NsysanError):
            parse_tags(bad)


@pytest.fixture(scope="module")
def history_db(tmp_path_factory) -> Path:
    """A database `batch` appended to four times: clean, clean again (another file, same numbers),
    leak, leak again; tagged with a commit, a date and a workload. The inputs are analysis.json
    documents of the real fixtures (batch reads them without analyzing again)."""
    root = tmp_path_factory.mktemp("history")
    db = root / "history.db"
    for day, (name, source) in enumerate([("torch_clean_v25", "clean-a"), ("torch_clean_v25", "clean-b"),
                                          ("torch_leak_v25", "leak-a"), ("torch_leak_v25", "leak-b")], start=1):
        doc = json.loads(render_json(analysis_of(name)))
        doc["source"]["name"] = f"{source}.sqlite"  # another run: other bytes, another report
        folder = root / source
        folder.mkdir()
        (folder / f"{source}.analysis.json").write_text(json.dumps(doc))
        try:
            main(["batch", str(folder), "-o", str(root / f"out-{source}"), "--db", str(db), "-j", "1",
                  "--no-progress", "--tag", f"commit=c{day}", "--tag", f"date=2026-11-0{day}",
                  "--tag", "workload=gpt"])  # no capsys in a module fixture: main itself
        except SystemExit as done:
            assert done.code in (0, None)
    return db


def test_history_finds_the_leak_commit(history_db):
    clean, leak = analysis_of("torch_clean_v25"), analysis_of("torch_leak_v25")
    h = load_history(history_db)
    assert h.ordered_by == "tag:date"
    assert [r.tags["commit"] for r in h.runs] == ["c1", "c2", "c3", "c4"]
    assert [r.peak_bytes for r in h.runs] == [clean.peak.peak_bytes] * 2 + [leak.peak.peak_bytes] * 2
    leak_growth = max(g.bytes_per_step for g in leak.growth if g.first_step is not None)
    assert [r.growth_bytes_per_step for r in h.runs][2:] == [leak_growth] * 2
    by_metric = {c.metric: c for c in h.changes}
    assert set(by_metric) == {"peak_bytes", "growth_bytes_per_step", "never_freed_bytes"}
    assert all(c.run == 3 for c in h.changes)  # the leak commit, once: run 4 is the new baseline
    peak = by_metric["peak_bytes"]
    assert (peak.before_bytes, peak.after_bytes, peak.runs_before) == (clean.peak.peak_bytes, leak.peak.peak_bytes, 2)
    # the site whose most-live bytes rose most between c2 and c3, from the analyses' own sites
    def max_live(a, label):
        return sum(s.max_live_bytes for s in a.sites if s.site.label == label)
    top = peak.movers[0]
    assert top.label == "cudaMalloc in forward [python3]"
    assert (top.before_bytes, top.after_bytes) == (max_live(clean, top.label), max_live(leak, top.label))
    assert "at run 3 (commit=c3" in peak.message


def test_history_command_text_json_and_page(history_db, tmp_path, capsys):
    code, out, err = cli(capsys, "history", str(history_db))
    assert code == 0, err
    assert out.splitlines()[0] == "History of 4 runs in history.db (ordered by tag date)"
    assert sum(line.startswith("change: ") for line in out.splitlines()) == 3
    code, out, _ = cli(capsys, "history", str(history_db), "--format", "json", "--where", "commit=c3")
    doc = json.loads(out)
    assert code == 0 and doc["schema"] == "nsysan/history@1" and doc["series"] == "commit=c3"
    assert [r["tags"]["commit"] for r in doc["runs"]] == ["c3"] and doc["changes"] == [] and doc["skipped"] == 3
    page = tmp_path / "history.html"
    code, out, _ = cli(capsys, "history", str(history_db), "-o", str(page))
    html = page.read_text()
    assert code == 0 and html.count('class="change"') == 3 and html.count("<svg") == 3
    assert 'data-run="3"' in html and "<script" not in html


def test_history_escapes_tags_on_the_page(tmp_path, capsys):
    db = tmp_path / "h.db"
    doc = json.loads(render_json(analysis_of("torch_clean_v25")))
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.analysis.json").write_text(json.dumps(doc))
    code, _, err = cli(capsys, "batch", str(tmp_path / "in"), "-o", str(tmp_path / "out"), "--db", str(db), "-j", "1",
                       "--no-progress", "--tag", "commit=<script>alert(1)</script>")
    assert code == 0, err
    cli(capsys, "history", str(db), "-o", str(tmp_path / "h.html"))
    html = (tmp_path / "h.html").read_text()
    assert "<script>alert" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_history_bad_inputs_exit_2(history_db, tmp_path, capsys):
    export = tmp_path / "not.db"
    sqlite3.connect(export).execute("create table t(x)").connection.commit()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    cases = [([str(tmp_path / "missing.db")], "missing.db"), ([str(export)], "not an nsysan database"),
             ([str(fifo)], "not a regular file"), ([str(history_db), "--order-by", "branch"], "no tag 'branch'"),
             ([str(history_db), "--where", "commit"], "KEY=VALUE"),
             ([str(history_db), "-o", str(history_db)], "is the database itself"),
             ([str(history_db), "--format", "xml"], "unknown --format")]
    before = history_db.read_bytes()
    for args, said in cases:
        code, out, err = cli(capsys, "history", *args)
        assert code == 2 and said in err and "Traceback" not in err, (args, err)
    assert history_db.read_bytes() == before


def test_older_database_bare_tag_reads(tmp_path):
    """A database written before KEY=VALUE tags (a `tag` column, no `tags`) still reads: the bare
    tag is {"tag": VALUE} and the runs keep their order of analysis."""
    db = tmp_path / "old.db"
    conn = sqlite3.connect(db)
    conn.execute("create table reports (report_hash text primary key, path text, name text, ok integer, "
                 "tag text, analyzed_at text, peak_bytes integer, never_freed_bytes integer)")
    conn.executemany("insert into reports values (?, ?, ?, 1, ?, ?, ?, ?)",
                     [("h1", "a", "a.sqlite", "v1", "2026-11-01T00:00:00+00:00", 100 * MiB, 0),
                      ("h2", "b", "b.sqlite", "v2", "2026-11-02T00:00:00+00:00", 300 * MiB, 0)])
    conn.commit()
    h = load_history(db)
    assert [r.tags for r in h.runs] == [{"tag": "v1"}, {"tag": "v2"}] and h.ordered_by == "analyzed_at"
    assert [(c.metric, c.run, c.movers) for c in h.changes] == [("peak_bytes", 2, [])]


HISTORY_DOC = Path(__file__).resolve().parents[1] / "docs" / "history.md"
DOC_BLOCK = re.compile(r"(```text\n\$ nsysan history history.db\n)(.*?)(```)", re.S)


def test_docs_history_example_is_the_real_output(history_db):
    """docs/history.md shows what the command prints on the database above (100 columns);
    NSYSAN_UPDATE_DOCS=1 rewrites it."""
    from rich.console import Console

    from nsysan.render.history import render_history_terminal

    buffer = io.StringIO()
    render_history_terminal(load_history(history_db), Console(file=buffer, width=100, highlight=False, markup=False,
                                                              emoji=False, soft_wrap=False))
    printed = "\n".join(line.rstrip() for line in buffer.getvalue().rstrip("\n").splitlines()) + "\n"
    text = HISTORY_DOC.read_text()
    if os.environ.get("NSYSAN_UPDATE_DOCS") == "1":
        HISTORY_DOC.write_text(DOC_BLOCK.sub(lambda m: m.group(1) + printed + m.group(3), text))
        return
    assert DOC_BLOCK.search(text).group(2) == printed
