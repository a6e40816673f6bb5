"""Whole JSON documents of small fixtures, compared with reviewed copies in tests/golden/.

Regenerate with NSYSAN_UPDATE_GOLDEN=1 pytest tests/test_golden.py, review the diff, and say in
the commit why it moved.
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
from conftest import GOLDEN, analysis_of

from nsysan.model import Analysis
from nsysan.render.json import render_json

GOLDEN_FIXTURES = ["known_mem_v25", "known_bt_v25", "known_plain_v25", "known_mem_v22", "real_oom_v25"]


def portable(analysis: Analysis) -> Analysis:
    """The analysis with the machine-specific input path reduced to the file name."""
    return dataclasses.replace(analysis, source=dataclasses.replace(analysis.source, path=analysis.source.name))


@pytest.mark.parametrize("name", GOLDEN_FIXTURES)
def test_json_matches_golden(name):
    text = render_json(portable(analysis_of(name)))
    golden = GOLDEN / f"{name}.analysis.json"
    if os.environ.get("NSYSAN_UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert golden.exists(), f"missing {golden.name}: run with NSYSAN_UPDATE_GOLDEN=1 and review it"
    assert text == golden.read_text()


@pytest.mark.parametrize("name", GOLDEN_FIXTURES)
def test_json_round_trips(name):
    analysis = analysis_of(name)
    again = Analysis.from_dict(json.loads(render_json(analysis)))
    assert again == analysis
    assert render_json(again) == render_json(analysis)


def test_json_text_is_json_dumps_with_number_lists_on_one_line(torch_leak_v25):
    document = torch_leak_v25.to_dict()
    text = render_json(torch_leak_v25)
    # The same document as the standard library writes it, keys sorted, indent 2, ASCII.
    assert json.loads(text) == document
    assert json.dumps(json.loads(text), sort_keys=True, indent=2) == json.dumps(document, sort_keys=True, indent=2)
    assert text.isascii()
    # ...with each timeline series on one line of its own.
    series = document["timeline"]["series"]
    assert series and all(len(s["ts_ns"]) > 2 for s in series)
    for s in series:
        assert f'"ts_ns": {json.dumps(s["ts_ns"])}' in text
        assert f'"live_bytes": {json.dumps(s["live_bytes"])}' in text
    # Lists of anything else keep one item per line, as json.dumps(indent=2) writes them.
    assert '"never_freed": [\n    {\n' in text
    # json.dumps(indent=2) writes a list of n numbers on n + 1 more lines than one line does.
    saved = sum(len(values) + 1 for values in _number_lists(document))
    assert len(json.dumps(document, indent=2).splitlines()) - len(text.splitlines()) == saved > 2000


def _number_lists(value) -> list[list]:
    """Every non-empty list of numbers in a JSON document."""
    if isinstance(value, dict):
        return [found for item in value.values() for found in _number_lists(item)]
    if isinstance(value, list) and value and all(type(v) in (int, float) for v in value):
        return [value]
    if isinstance(value, list):
        return [found for item in value for found in _number_lists(item)]
    return []
