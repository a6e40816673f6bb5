"""The report page holds the steps table the terminal prints (issue 29): each step's live bytes at
its end, change, peak, allocated and kept, with who keeps them and the growth verdict above."""

from __future__ import annotations

import html
import re

from conftest import analysis_of

from nsysan.render.html import render_html
from nsysan.base.units import fmt_bytes


def rows_of(page: str, table_id: str) -> list[list[str]]:
    table = page[page.index(f'id="{table_id}"'):]
    table = table[:table.index("</table>")]
    return [[html.unescape(re.sub(r"<[^>]+>", "", cell)).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
            for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table.split("<tbody>")[1], re.S)]


def test_the_leaks_steps_are_on_the_page_with_the_verdict():
    analysis = analysis_of("torch_leak_v25")
    page = render_html(analysis)
    (series,) = analysis.steps
    rows = rows_of(page, "steps-table-1")
    assert [r[0] for r in rows] == [f"step {i}" for i in range(6)]
    for row, step in zip(rows, series.steps):
        assert row[2:7] == [fmt_bytes(step.end_live_bytes), ("+" if step.delta_bytes > 0 else "") + fmt_bytes(step.delta_bytes),
                            fmt_bytes(step.peak_live_bytes), fmt_bytes(step.allocated_bytes), fmt_bytes(step.kept_bytes)]
    assert rows[5][2:4] == ["5.3 GiB", "+730.0 MiB"]  # the staircase's last step
    assert "cudaMalloc in backward [pt_autograd_0] (386.0 MiB)" in rows[5][7]
    verdict = re.search(r'id="steps-verdict-1">(.*?)</p>', page).group(1)
    assert html.unescape(verdict) == analysis.growth[0].message


def test_each_rank_has_its_table():
    page = render_html(analysis_of("ddp_leak_v25"))
    assert 'id="steps-table-1"' in page and 'id="steps-table-2"' in page and 'href="#steps"' in page
    rank_1 = rows_of(page, "steps-table-2")
    assert [r[3] for r in rank_1[2:]] == ["+64.0 MiB"] * 6


def test_no_steps_no_section():
    page = render_html(analysis_of("real_oom_v25"))
    assert 'id="steps"' not in page and 'href="#steps"' not in page


def test_what_each_phase_costs_and_the_spikes_are_on_the_page():
    analysis = analysis_of("torch_leak_v25")
    page = render_html(analysis)
    assert 'href="#phases"' in page and 'href="#spikes"' in page
    phases = rows_of(page, "phases-table")
    assert [r[1] for r in phases] == [p.path for p in analysis.phases]
    # every step keeps its phases' bytes: step N rises 741 MiB at the median, forward and backward under it
    assert phases[0] == ["1644", "step N", "6", "2.8 GiB", "741.0 MiB", "1.4 GiB", "+741.0 MiB",
                         "+728.0 MiB … +1.4 GiB"]
    assert phases[2][1:7] == ["step N > backward", "6", "3.1 GiB", "386.0 MiB", "456.1 MiB", "+386.0 MiB"]
    spikes = rows_of(page, "spikes-table")
    assert len(spikes) == len(analysis.spikes) == 5
    assert [int(r[2].replace("+", "").split()[0].split(".")[0]) for r in spikes] == \
        sorted((s.rise_bytes >> 20 for s in analysis.spikes), reverse=True)
    assert spikes[0][:6] == ["1644", "9.767 s", "+968.1 MiB", "98.0 MiB", "1.0 GiB", "step 0 > forward"]
    assert spikes[0][6] == "cudaMalloc in forward [python3] (968.1 MiB)"


def test_a_capture_without_phases_has_no_such_sections():
    page = render_html(analysis_of("known_plain_v25"))  # no sizes: no phases, no spikes
    assert 'id="phases"' not in page and 'id="spikes"' not in page


def test_the_nvtx_table_says_where_a_steps_bytes_are():
    # torch_ops_v25: "step 1" allocates nothing outside forward/backward/optimizer; the steps are one
    # row that holds its phases' bytes, never 0 B (tests/test_page_explorer.py checks the sums)
    analysis = analysis_of("torch_ops_v25")
    page = render_html(analysis)
    rows = rows_of(page, "ranges-table")
    assert not [r for r in rows if r[1] == "step 1"]
    (family,) = [r for r in rows if r[1].startswith("step 0 – step 4")]
    assert family[5] == "4.5 GiB" and family[6] == "213.0 KiB"  # allocated inside, of it directly
    (series,) = analysis.steps
    assert next(s for s in series.steps if s.name == "step 1").allocated_bytes > 0
    note = html.unescape(re.sub(r"<[^>]+>", "", page[page.index('id="ranges-table"'):].split('<p class="note">')[1]))
    assert "a step holds its phases' bytes" in note
    assert "is in the steps table, and each phase across the steps in what each phase costs." in note
