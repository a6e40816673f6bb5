"""PyTorch's operator ranges (`--pytorch=autograd-nvtx`) are a level of their own in the terminal,
as on the page (issue 29): the user's ranges and the operators each count an allocation once."""

from __future__ import annotations

import re

from conftest import analysis_of, cli


def table(out: str, title: str) -> list[str]:
    """The rows of the table under `title`: the lines after its rule, up to the blank line."""
    lines = out[out.index(title):].splitlines()
    rows = lines[next(i for i, line in enumerate(lines) if line.strip().startswith("─")) + 1:]
    return rows[:rows.index("")]


def test_user_ranges_and_operators_are_two_tables(capsys):
    code, out, err = cli(capsys, "analyze", "fixtures/torch_ops_v25.sqlite", "--top", "50")
    assert code == 0, err
    ranges = analysis_of("torch_ops_v25").ranges
    users = [re.split(r"\s{2,}", line.strip())[0] for line in table(out, "NVTX ranges (innermost range of each")]
    operators = [re.split(r"\s{2,}", line.strip())[0] for line in table(out, "PyTorch operator ranges (innermost")]
    # each table lists its own level, in the model's order (the steps as their family's one row,
    # where their 213.0 KiB places it): no range is in both
    named = [r.name for r in ranges if not r.operator and not r.name.startswith("step ")]
    assert users == named[:4] + ["step 0 – step 4 (5 ranges)"] + named[4:]
    assert operators == [r.name for r in ranges if r.operator][:50]
    assert "forward" in users and operators[0] == "aten::addmm" and not set(users) & set(operators)


def test_no_operators_no_second_table(capsys):
    code, out, _ = cli(capsys, "analyze", "fixtures/torch_leak_v25.sqlite")
    assert code == 0 and "PyTorch operator ranges" not in out and "NVTX ranges (innermost" in out
