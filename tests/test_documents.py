"""Hostile JSON documents: an analysis.json or a compare document that is cut short, of another
schema, missing a field or holding a wrong type is one NsysanError line (exit 2 at the CLI) for
`compare`, `check` and the library, and one failed row for `batch`, never a traceback."""

from __future__ import annotations

import copy
import csv
import json
from pathlib import Path

import pytest
from conftest import FIXTURES, ROOT, cli

import nsysan
from nsysan.runs.compare_runs import compare_analyses
from nsysan.model import Comparison
from nsysan.errors import NsysanError

GOOD_TEXT = (ROOT / "tests" / "golden" / "known_mem_v25.analysis.json").read_text()
GOOD = json.loads(GOOD_TEXT)


def changed(edit) -> str:
    doc = copy.deepcopy(GOOD)
    edit(doc)
    return json.dumps(doc)


# name -> (file content, what the one line says)
BAD_DOCUMENTS = {
    "truncated": (GOOD_TEXT[: len(GOOD_TEXT) // 2], "could not be read as an analysis JSON ("),
    "empty": ("", "could not be read as an analysis JSON (Expecting value"),
    "not json": ("peak: 8GiB\n", "could not be read as an analysis JSON (Expecting value"),
    "not utf-8": (b"{\"schema\": \"\xff\xfe\"}", "could not be read as an analysis JSON ('utf-8' codec can't decode"),
    "a list": ("[1, 2, 3]", "not an nsysan analysis: the document is a list, not an object"),
    "null": ("null", "not an nsysan analysis: the document is null, not an object"),
    "nested too deeply": ("[" * 100_000, "could not be read as an analysis JSON (nested too deeply)"),
    "another schema": (changed(lambda d: d.update(schema="nsysan/analysis@2")),
                       "not an nsysan analysis (schema 'nsysan/analysis@2', expected 'nsysan/analysis@1')"),
    "no schema": (changed(lambda d: d.pop("schema")), "not an nsysan analysis (schema None, expected"),
    "a schema that is no string": (changed(lambda d: d.update(schema=["nsysan/analysis@1"])),
                                   "(schema ['nsysan/analysis@1'], expected"),
    "missing source": (changed(lambda d: d.pop("source")), "field 'source' is missing"),
    "missing nested field": (changed(lambda d: d["peak"].pop("peak_bytes")), "field 'peak.peak_bytes' is missing"),
    "bytes as text": (changed(lambda d: d["groups"][0].update(peak_bytes="952107008")),
                      "field 'groups[0].peak_bytes' should be an integer, not '952107008'"),
    "bytes as a fraction": (changed(lambda d: d["groups"][0].update(end_bytes=1.5)),
                            "field 'groups[0].end_bytes' should be an integer, not 1.5"),
    "a count as true": (changed(lambda d: d.update(never_freed_total=True)),
                        "field 'never_freed_total' should be an integer, not True"),
    "an object for a list": (changed(lambda d: d.update(groups={"pid": 1})),
                             "field 'groups' should be a list, not {'pid': 1}"),
    "a list for an object": (changed(lambda d: d.update(capture=[])), "field 'capture' should be an object, not []"),
    "a number beyond 64 bits": (changed(lambda d: d["capture"].update(duration_ns=2**70)),
                                "field 'capture.duration_ns' should be an integer of at most 64 bits, not "
                                "1180591620717411303424"),
    # Python's json writes and reads NaN and Infinity; a document that held one would carry it
    # into every JSON and database made from it, which strict JSON readers refuse.
    "NaN for a number": (GOOD_TEXT.replace('"peak_bytes": 952107008', '"peak_bytes": NaN', 1),
                         "could not be read as an analysis JSON (NaN is not a JSON number"),
    "Infinity for a number": (GOOD_TEXT.replace('"peak_bytes": 952107008', '"peak_bytes": -Infinity', 1),
                              "could not be read as an analysis JSON (-Infinity is not a JSON number"),
    "a number for a name": (changed(lambda d: d["diagnostics"][0].update(code=7)),
                            "field 'diagnostics[0].code' should be a string, not 7"),
}
CASES = sorted(BAD_DOCUMENTS)


def write(folder: Path, name: str) -> Path:
    content, _ = BAD_DOCUMENTS[name]
    path = folder / f"{name.replace(' ', '_')}.analysis.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


@pytest.mark.parametrize("case", CASES)
def test_load_analysis_says_what_is_wrong_in_one_line(case, tmp_path):
    path = write(tmp_path, case)
    with pytest.raises(NsysanError) as raised:
        nsysan.load_analysis(path)
    assert raised.value.exit_code == 2 and "\n" not in raised.value.message
    assert raised.value.message.startswith(f"{path.name}")
    assert BAD_DOCUMENTS[case][1] in raised.value.message


@pytest.mark.parametrize("case", CASES)
def test_compare_and_check_exit_2_with_one_line(case, tmp_path, capsys):
    path = write(tmp_path, case)
    before = path.read_bytes()
    good = str(FIXTURES / "known_mem_v25.sqlite")
    for args in (["compare", good, str(path)], ["compare", str(path), good, "--format", "json"],
                 ["check", str(path), "--max-peak", "1GiB"],
                 ["check", good, "--baseline", str(path), "--max-peak-increase", "5%"]):
        code, out, err = cli(capsys, *args)
        assert code == 2, (args, err)
        assert out == "" and err.count("\n") == 1 and "Traceback" not in err, (args, err)
        assert err.startswith(f"nsysan: {path.name}") and BAD_DOCUMENTS[case][1] in err, (args, err)
    assert path.read_bytes() == before


def test_batch_makes_each_bad_document_a_failed_row(tmp_path, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    bad = {str(write(folder, case)): case for case in CASES}
    (folder / "good.analysis.json").write_text(GOOD_TEXT)
    code, out, err = cli(capsys, "batch", str(folder), "-o", str(tmp_path / "out"), "-j", "1", "--no-progress")
    assert code == 0, err
    with open(tmp_path / "out" / "summary.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    failed = {r["report"]: r["error"] for r in rows if r["status"] == "failed"}
    assert set(failed) == set(bad)
    for path, error in failed.items():
        assert "\n" not in error and BAD_DOCUMENTS[bad[path]][1] in error, (path, error)
    ok = [r for r in rows if r["status"] == "ok"]
    assert [int(r["peak_bytes"]) for r in ok] == [GOOD["peak"]["peak_bytes"]]
    # with nothing readable the batch exits 2
    (folder / "good.analysis.json").unlink()
    code, _, _ = cli(capsys, "batch", str(folder), "-o", str(tmp_path / "out2"), "-j", "1", "--no-progress")
    assert code == 2


def test_a_number_sqlite_cannot_hold_fails_its_row_not_the_batch(tmp_path, capsys):
    # 2**63 fits the JSON's uint64 (an address may be that large) but not SQLite's INTEGER.
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "huge.analysis.json").write_text(changed(lambda d: d["capture"].update(duration_ns=2**63)))
    (folder / "good.analysis.json").write_text(GOOD_TEXT)
    code, out, err = cli(capsys, "batch", str(folder), "-o", str(tmp_path / "out"), "-j", "1", "--no-progress")
    assert code == 0 and "Traceback" not in err, err
    with open(tmp_path / "out" / "summary.csv", newline="") as handle:
        rows = {Path(r["report"]).name: r for r in csv.DictReader(handle)}
    assert rows["good.analysis.json"]["status"] == "ok"
    assert rows["huge.analysis.json"]["status"] == "failed"
    assert rows["huge.analysis.json"]["error"] == ("huge.analysis.json: duration_ns = 9223372036854775808 is too large "
                                                   "for nsysan.db (SQLite integers are 64-bit); is the analysis "
                                                   "document hand-edited?")


@pytest.fixture(scope="module")
def comparison_document() -> dict:
    known = nsysan.load_analysis(ROOT / "tests" / "golden" / "known_mem_v25.analysis.json")
    return json.loads(json.dumps(compare_analyses(known, known).to_dict()))


def _edit(doc: dict, edit) -> dict:
    doc = copy.deepcopy(doc)
    edit(doc)
    return doc


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(schema="nsysan/analysis@1"),
     "not an nsysan comparison (schema 'nsysan/analysis@1', expected 'nsysan/compare@1')"),
    (lambda d: d.pop("schema"), "not an nsysan comparison (schema None, expected 'nsysan/compare@1')"),
    (lambda d: d.pop("headline"), "field 'headline' is missing"),
    (lambda d: d["base"].pop("name"), "field 'base.name' is missing"),
    (lambda d: d.update(processes="all"), "field 'processes' should be a list, not 'all'"),
    (lambda d: d["processes"][0]["peak"].update(before="1 GiB"),
     "field 'processes[0].peak.before' should be an integer, not '1 GiB'"),
    (lambda d: d["processes"][0].update(peak=None), "field 'processes[0].peak' should be an object, not None"),
    (lambda d: d.update(identical="yes"), "field 'identical' should be true or false, not 'yes'"),
], ids=["analysis schema", "no schema", "no headline", "no base name", "text for a list", "text for bytes",
        "null for an object", "text for a bool"])
def test_a_malformed_comparison_document_is_one_nsysan_error(comparison_document, edit, message):
    assert Comparison.from_dict(comparison_document).identical  # the document itself is fine
    with pytest.raises(NsysanError) as raised:
        Comparison.from_dict(_edit(comparison_document, edit))
    assert raised.value.message == message


@pytest.mark.parametrize("data", [None, [], "nsysan/compare@1", 3])
def test_a_comparison_document_that_is_no_object(data):
    with pytest.raises(NsysanError, match="not an nsysan comparison: the document is"):
        Comparison.from_dict(data)


# --- any one field of a real document changed: refused in one line, or read and used whole ------

MUTATIONS = [None, "x", 1.5, [], {}, True, -1, 2**63, 2**70, float("nan"), "<delete>"]


def _paths(node, path=()):
    """Every field of a document (the first two items of each list), as key/index paths."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield path + (key,)
            yield from _paths(value, path + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node[:2]):
            yield path + (i,)
            yield from _paths(value, path + (i,))


@pytest.mark.parametrize("seed", range(3))
def test_a_document_with_any_field_changed_is_refused_in_one_line_or_used_whole(seed, tmp_path):
    """120 random single-field changes of known_mem_v25's document per seed: each is an
    NsysanError of one line, or an Analysis that compare, check, JSON and the batch rows take
    without any other exception (a wrong type must never get past from_dict to break them), and
    nsysan.db stores."""
    import random

    from nsysan.batch.database import ResultsDatabase, database_rows
    from nsysan.runs.gate import evaluate_limits
    from nsysan.runs.limits import Limits
    from nsysan.model import Analysis
    from nsysan.render.json import render_json

    rng = random.Random(seed)
    paths = list(_paths(GOOD))
    base = Analysis.from_dict(GOOD)
    limits = Limits.parse(max_peak="1GiB", max_peak_increase="5%", max_never_freed="0",
                          no_failed_allocations=True, no_warnings="all")
    database = ResultsDatabase(tmp_path / "nsysan.db")
    refused = used = 0
    for _ in range(120):
        path, value = rng.choice(paths), rng.choice(MUTATIONS)
        doc = copy.deepcopy(GOOD)
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        if value == "<delete>":
            del parent[path[-1]]
        else:
            parent[path[-1]] = value
        try:
            analysis = Analysis.from_dict(doc)
        except NsysanError as err:
            assert "\n" not in err.message and err.exit_code == 2, (path, value)
            refused += 1
            continue
        compare_analyses(base, analysis)
        compare_analyses(analysis, base)
        evaluate_limits(analysis, base, limits)
        render_json(analysis)
        try:
            tables = database_rows("0" * 64, analysis, "changed.analysis.json")
        except NsysanError as err:  # a number SQLite can't hold: that report's row fails
            assert "too large for nsysan.db" in err.message
        else:
            database.add({"path": "changed.analysis.json", "ok": True, "hash": "0" * 64, "tables": tables}, None)
        used += 1
    database.close()
    assert refused and used  # both outcomes were exercised
