"""The report page as an explorer (issue 29): the NVTX table's one row per family of ranges ("step 0 –
step 4"), nested NVTX tracks that appear as you zoom, the y axis that follows the visible window,
keyboard, drag and touch navigation, and the PNG timeline that stands in without JavaScript."""

from __future__ import annotations

from browser import open_page
from conftest import analysis_of
from test_html import assert_quiet_page, chromium  # noqa: F401  (the fixture)

from nsysan.commands.outputs import write_report
from nsysan.units import fmt_bytes

RANGE_ROWS = ("Array.from(document.querySelectorAll('#ranges-table tbody tr'),"
              " r => Array.from(r.cells, c => [c.textContent.trim(), c.dataset.v]))")


def range_rows_on_page(analysis, tmp_path) -> dict[str, list]:
    """The NVTX table's rows as Chromium shows them, by range cell: each cell's text and data-v."""
    page, netlog = open_page(write_report(analysis, tmp_path / "report"), width=1400, height=900, screenshot=False,
                             evaluate={"rows": RANGE_ROWS})
    assert_quiet_page(page, netlog)
    return {r[1][0]: r for r in page.values["rows"]}


def test_steps_are_one_row_holding_their_phases_bytes(tmp_path, chromium):
    # torch_ops_v25: 5 steps, each allocating nothing itself and everything in forward/backward/optimizer
    analysis = analysis_of("torch_ops_v25")
    rows = range_rows_on_page(analysis, tmp_path)
    assert not [name for name in rows if name.startswith("step ") and "–" not in name]  # no row per step
    step = rows["step 0 – step 4 (5 ranges)"]
    assert step[2][0] == "5"  # instances
    phases = [rows[name] for name in ("forward", "backward", "optimizer")]
    # allocated, nested ranges included: the step's own bytes and all its phases' (each opened once per step)
    inside = int(step[6][1]) + sum(int(p[6][1]) for p in phases)
    assert int(step[5][1]) == inside > 4 << 30 and step[5][0] == fmt_bytes(inside) == "4.5 GiB"
    assert int(step[4][1]) == \
        sum(r.allocations for r in analysis.ranges if r.name.startswith("step ")) + sum(int(p[4][1]) for p in phases)
    # a phase has nothing nested: what it allocated is what it allocated directly
    assert all(p[5] == p[6] for p in phases)
    # the steps table, found by another analysis (live device + array bytes per step), agrees within
    # the bytes of other kinds (pinned, static) the ranges count too
    steps = sum(s.allocated_bytes for s in analysis.steps[0].steps)
    assert steps <= inside < steps + (1 << 20)


def test_a_family_sums_every_name_and_matches_the_steps_table(tmp_path, chromium):
    # known_mem_v25: steps 0-8 inside "train", two "worker N" ranges; only device memory moves
    analysis = analysis_of("known_mem_v25")
    rows = range_rows_on_page(analysis, tmp_path)
    step = rows["step 0 – step 8 (9 ranges)"]
    assert int(step[5][1]) == sum(s.allocated_bytes for s in analysis.steps[0].steps) == 314_572_800
    # named by the first and the last to open: worker 2 started first
    assert int(step[2][0]) == 9 and "worker 2 – worker 1 (2 ranges)" in rows
    # "train" holds the steps: 0 B of its own, all of theirs
    train = rows["train"]
    assert train[6][1] == "0" and int(train[5][1]) == int(step[5][1])
