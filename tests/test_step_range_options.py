"""`check`, `compare` and `batch` take `--step-range REGEX` as `analyze` does (issue 27).

known_mem_v25 marks nine NVTX steps `step 0` .. `step 8`, and keeps 4 MiB in steps 2, 5 and 8
(its truth's alloc_cache_entry): with every step it is "uneven"; with `^step [2-4]$` three steps
are too few to judge growth, which check says is not measured.
"""

from __future__ import annotations

import json

import pytest
from conftest import FIXTURES
from test_check_measured import cli, fixture

PATTERN = "^step [2-4]$"


@pytest.fixture(autouse=True)
def no_config(tmp_path, monkeypatch):
    (tmp_path / ".git").mkdir()
    monkeypatch.chdir(tmp_path)


def test_check_takes_the_steps_it_is_told(capsys):
    code, out, _ = cli(capsys, "check", fixture("known_mem_v25"), "--max-growth-per-step", "1MiB")
    assert code == 0 and "growth per step 0 B is within the limit of 1.0 MiB" in out  # the median step keeps nothing
    code, out, _ = cli(capsys, "check", fixture("known_mem_v25"), "--max-growth-per-step", "1MiB",
                       "--step-range", PATTERN)
    assert code == 2
    assert ("growth per step not measured: process 1313 on GPU 0: 3 complete steps, too few to judge growth "
            "(needs 4)") in out
    code, _, err = cli(capsys, "check", fixture("known_mem_v25"), "--max-peak", "1GiB", "--step-range", "step [")
    assert code == 2 and "--step-range 'step [' is not a regular expression" in err


def test_compare_takes_it_for_both_runs_and_a_document_must_agree(tmp_path, capsys):
    code, out, _ = cli(capsys, "compare", fixture("known_mem_v25"), fixture("known_bt_v25"), "--format", "json",
                       "--step-range", PATTERN)
    assert code == 0
    (row,) = json.loads(out)["processes"]
    assert row["growth_per_step"] is None  # three steps: no rate on either side
    document = tmp_path / "known.analysis.json"
    assert cli(capsys, "analyze", fixture("known_mem_v25"), "--json", str(document), "--format", "json")[0] == 0
    code, _, err = cli(capsys, "compare", str(document), fixture("known_bt_v25"), "--step-range", PATTERN)
    assert code == 2 and err.strip() == (
        f"nsysan: known.analysis.json: the steps of this analysis of known_mem_v25.sqlite are 'step N' (nvtx), not "
        f"--step-range {PATTERN!r}; analyze the report again with --step-range, or give the report itself")
    cli(capsys, "analyze", fixture("known_mem_v25"), "--json", str(document), "--format", "json",
        "--step-range", PATTERN)
    code, _, _ = cli(capsys, "compare", str(document), fixture("known_bt_v25"), "--step-range", PATTERN)
    assert code == 0


def test_batch_passes_it_to_every_analysis(tmp_path, capsys):
    code, _, err = cli(capsys, "batch", str(FIXTURES / "known_mem_v25.sqlite"), "-o", str(tmp_path / "out"), "-j", "1",
                       "--no-progress", "--step-range", PATTERN)
    assert code == 0, err
    (document,) = (tmp_path / "out" / "analyses").glob("*.json")
    steps = json.loads(document.read_text())["steps"]
    assert [(s["range_name"], s["found_by"], [x["name"] for x in s["steps"]]) for s in steps] == [
        (PATTERN, "step-range", ["step 2", "step 3", "step 4"])]
