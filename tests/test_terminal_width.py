"""The terminal at 80, 100 and 120 columns, on every shipped fixture: numbers and units are never
cut, names are cut only where a word or a `::` ends, and nothing runs past the width.

Each fixture is analyzed once (the session cache of conftest) and drawn at the three widths.
"""

from __future__ import annotations

import io
import re

import pytest
from conftest import FIXTURES, analysis_of
from rich.console import Console

import nsysan
from nsysan.runs.compare_runs import compare_analyses
from nsysan.runs.gate import evaluate_limits
from nsysan.runs.limits import Limits
from nsysan.render.compare_terminal import render_comparison_terminal
from nsysan.render.layout import ELLIPSIS, NAME, Sheet, cut_name, fitted, plan_columns, plain, wrap
from nsysan.render.terminal import render_terminal, summary_parts
from nsysan.render.check_verdict import render_verdict_terminal

WIDTHS = (80, 100, 120)
EVERY_FIXTURE = sorted(path.stem for path in FIXTURES.glob("*.sqlite"))
SMI_LOGS = [FIXTURES / "torch_smi_v25.smi-gpu.csv", FIXTURES / "torch_smi_v25.smi-apps.csv"]
UNIT = r"(?:B|KiB|MiB|GiB|TiB|ns|µs|ms|s|%)"


def text_of(width: int, analysis: nsysan.Analysis) -> str:
    console = Console(width=width, file=io.StringIO(), record=True, color_system=None)
    render_terminal(analysis, console)
    return console.export_text()


def assert_reads_whole(text: str, width: int) -> None:
    """No line is wider than the terminal, no number ends in `…`, and no number is parted from
    its unit at a line's end."""
    lines = text.splitlines()
    wide = [line for line in lines if len(line.rstrip()) > width]
    assert wide == [], f"lines wider than {width}"
    # (a name may end in a digit before its `…`: "cudaMalloc in step 0…" is a name cut after "0")
    assert not re.search(r"\d\.\d*" + ELLIPSIS, text), "a decimal number cut with an ellipsis"
    assert not re.search(r"\d (?:Ki|Mi|Gi|Ti|m|µ|n)?" + ELLIPSIS, text), "a unit cut"
    for line, after in zip(lines, lines[1:]):
        if re.search(r"\d$", line.rstrip()):
            assert not re.match(r"\s*" + UNIT + r"(?:\W|$)", after), f"unit parted from its number: {line!r}"


def assert_cells_whole(sheet: Sheet, width: int) -> int:
    """Every cell as drawn: numbers and words whole, a name whole or cut where a word ends.
    Returns how many names were cut (so a test can say the cutting was exercised)."""
    plan = plan_columns(sheet, width)
    if plan is None:
        return 0  # stacked: the text checks cover it
    keep, widths = plan
    _, rows = fitted(sheet, keep, widths)
    cut = 0
    for row, drawn in zip(sheet.rows, rows):
        for i, cell in zip(keep, drawn):
            original, shown = plain(row[i]).split("\n"), cell.plain.split("\n")
            for whole, line in zip(original, shown):
                if sheet.columns[i].kind != NAME or line == whole:
                    assert line == whole, f"{sheet.columns[i].header}: {whole!r} drawn as {line!r}"
                    continue
                cut += 1
                assert line.endswith(ELLIPSIS), line
                prefix = line[:-1]
                assert whole.startswith(prefix) and prefix, (whole, line)
                # cut where a word ends: the characters on either side are not both letters or digits
                assert not (re.match(r"\w", whole[len(prefix) - 1]) and re.match(r"\w", whole[len(prefix)])), \
                    f"{whole!r} cut inside a word as {line!r}"
    return cut


@pytest.mark.parametrize("name", EVERY_FIXTURE)
def test_every_fixture_reads_whole_at_80_100_and_120_columns(name):
    analysis = analysis_of(name) if name != "torch_smi_v25" else nsysan.analyze(FIXTURES / f"{name}.sqlite",
                                                                                  smi=SMI_LOGS)
    sheets = [part for part in summary_parts(analysis) if isinstance(part, Sheet)]
    for width in WIDTHS:
        text = text_of(width, analysis)
        assert_reads_whole(text, width)
        for sheet in sheets:
            assert_cells_whole(sheet, width)
        # every number of every table that keeps its columns is printed whole
        for sheet in sheets:
            keep, _ = plan_columns(sheet, width) or ([], [])
            numbers = {plain(row[i]) for row in sheet.rows for i in keep if sheet.columns[i].kind != NAME}
            assert {n for n in numbers if n not in text} == set(), sheet.title


@pytest.mark.parametrize("name,options", [("known_bt_v25", {"quick": True}), ("torch_pybt_v25", {"stacks": True})])
def test_quick_and_stacks_read_whole_too(name, options):
    quick = options.get("quick", False)
    analysis = nsysan.analyze(FIXTURES / f"{name}.sqlite", quick=True) if quick else analysis_of(name)
    for width in WIDTHS:
        console = Console(width=width, file=io.StringIO(), record=True, color_system=None)
        render_terminal(analysis, console, stacks=options.get("stacks", False))
        text = console.export_text()
        assert_reads_whole(text, width)
        if quick:  # a quick analysis reads no NVTX ranges: no column of them, not even one of "-"
            header = text.split("Spikes:")[1].splitlines()[2]
            assert header.split() == ["process", "peak", "at", "rise", "freed", "after"]
        else:  # the Python stack of torch_pybt_v25's top site, innermost frame first (truth: torch_train.py:43)
            assert "main (torch_train.py:43) · process 476 · python stack" in text.replace("\n    ", " ")


def test_at_80_columns_names_are_cut_at_words_and_columns_left_out_say_so():
    # torch_leak_v25: site names such as "cudaMalloc in backward [pt_autograd_0]" do not fit 80 columns
    analysis = analysis_of("torch_leak_v25")
    sheets = [part for part in summary_parts(analysis) if isinstance(part, Sheet)]
    assert sum(assert_cells_whole(sheet, 80) for sheet in sheets) > 10
    text = text_of(80, analysis)
    assert "cudaMalloc in backward…" in text
    steps = next(s for s in sheets if s.title.startswith("Steps of process 1644"))
    keep, _ = plan_columns(steps, 80)
    assert [steps.columns[i].header for i in keep] == ["step", "start", "length", "at end", "change", "peak", "kept"]
    assert "left out at 80 columns: allocated" in text
    # at 120 columns the steps table is whole
    keep, _ = plan_columns(steps, 120)
    assert len(keep) == len(steps.columns)
    assert "10.024 s" in text and "+944.0 MiB" in text  # step 1's start and change (truth: 944 MiB kept)


def test_names_are_cut_where_a_word_or_a_scope_ends():
    # NVTX ranges of torch_leak_v25 (cub kernels) and a site of known_bt_v25
    assert cut_name("cub::DeviceSelect::UniqueByKey", 20) == "cub::DeviceSelect…"
    assert cut_name("cudaMalloc in backward [pt_autograd_0]", 26) == "cudaMalloc in backward…"
    assert cut_name("step 0 > forward", 12) == "step 0…"
    assert cut_name("alloc_cache_entry (known)", 25) == "alloc_cache_entry (known)"
    # one word wider than its column is the only thing cut inside a word
    assert cut_name("a" * 40, 10) == "a" * 9 + ELLIPSIS


def test_a_number_stays_with_its_unit_when_a_sentence_wraps():
    sentence = "5.3 GiB on GPU 0 (3.8% of 139.8 GiB), process 1644 at 10.125 s"
    for width in range(12, 60):
        for line in wrap(sentence, width):
            assert not re.match(UNIT + r"(\W|$)", line), (width, line)


def test_below_a_width_a_table_is_stacked_as_name_value_lines():
    analysis = analysis_of("known_bt_v25")
    sheets = [part for part in summary_parts(analysis) if isinstance(part, Sheet)]
    stacked = [s for s in sheets if plan_columns(s, 40) is None]
    assert stacked, "some table does not fit 40 columns"
    text = text_of(40, analysis)
    assert_reads_whole(text, 40)
    # the steps table, stacked: each step, then header: value (truth: steps 2, 5 and 8 keep 4 MiB)
    assert " step 2  start: 637.47 ms\n" in text
    assert "change: +4.0 MiB  peak: 420.0 MiB" in text and "kept: 4.0 MiB" in text


PAIRS = [("torch_clean_v25", "torch_leak_v25"), ("known_mem_v25", "known_bt_v25"),
         ("torch_clean_v25", "torch_oom_v25"), ("known_mem_v22", "known_mem_v25")]


@pytest.mark.parametrize("base,new", PAIRS)
def test_compare_and_check_read_whole_at_80_100_and_120_columns(base, new):
    before, after = analysis_of(base), analysis_of(new)
    comparison = compare_analyses(before, after)
    limits = Limits.parse(max_peak_increase="5%", max_never_freed="0", max_growth_per_step="16MiB",
                          no_failed_allocations=True)
    verdict = evaluate_limits(after, before, limits)
    for width in WIDTHS:
        # a terminal: check's lines are wrapped there (one line each in a log, for grep)
        console = Console(width=width, file=io.StringIO(), record=True, color_system=None, force_terminal=True)
        render_comparison_terminal(comparison, console)
        render_verdict_terminal(verdict, console)
        text = console.export_text()
        assert_reads_whole(text, width)
        assert not re.search(r"(^|  )0(  |$)", text, flags=re.M), "a zero without its unit"
    if (base, new) == ("torch_clean_v25", "torch_leak_v25"):
        assert "+3.5 GiB (+201.9%)" in text  # the peak grew from 1.8 to 5.3 GiB: one percentage format


def test_the_never_freed_heading_is_the_models_total():
    # known_bt_v25 (truth): alloc_weights' 128 MiB, three 4 MiB cache entries, other_kinds' 5 MiB and
    # 1000 KiB stay allocated; its module statics are not counted
    analysis = analysis_of("known_bt_v25")
    assert analysis.never_freed_bytes == 128 * 2**20 + 3 * 4 * 2**20 + 5 * 2**20 + 1000 * 2**10
    assert "Never freed during the capture: 6 allocations, 146.0 MiB" in text_of(80, analysis)


def test_names_from_a_profile_stay_inert_in_every_part_of_the_layout():
    # a console that reads markup and :emoji: codes (as a library user's may): a Sheet's title,
    # cells and caption, labelled lines and parts print them as they are
    from nsysan.render.layout import Column, Lines, Parts

    hostile = "[reverse]step:fire: 0[/]"
    sheet = Sheet(f"Title {hostile}", Column("name", NAME), Column("size"), caption=hostile)
    sheet.add_row(hostile, "1.0 MiB")
    console = Console(width=80, file=io.StringIO(), record=True, color_system=None, markup=True, emoji=True)
    for part in (sheet, Lines([(hostile, hostile)]), Parts([hostile, hostile])):
        console.print(part)
    text = console.export_text()
    assert text.count(hostile) == 7 and "\U0001f525" not in text  # title, cell, caption, label, line, 2 parts
