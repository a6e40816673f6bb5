"""The verdict in one line (issue 29, "the answer on top"): the first answer, the page's headline
and the terminal's first line say what happened, not the largest number. Each fixture's verdict
follows from what fixtures/README.md says of the program that made it."""

from __future__ import annotations

import re

import pytest
from conftest import analysis_of, cli

# fixture -> (kind, the sentence's start)
EXPECTED = {
    "torch_leak_v25": ("growing", "grows 735.0 MiB per step from cudaMalloc in backward [pt_autograd_0]; full at "
                                  "step ~193"),
    "ddp_leak_v25": ("growing", "rank 1 grows 64.0 MiB per step"),
    "torch_oom_v25": ("out_of_memory", "ran out of memory in 'step 5 > hoard': the allocator gave up with 5.5 GiB live"),
    "real_oom_v25": ("out_of_memory", "ran out of memory: cudaMalloc failed in 'fill' with 128.0 GiB live on GPU 0 "
                                      "of 139.8 GiB"),
    "jax_prealloc_v25": ("preallocated", "XLA preallocated 104.9 GiB (75% of the GPU): the real use is not visible"),
    "known_mem_v25": ("uneven", "keeps memory in some steps, not every step: 12.0 MiB over steps 1-8"),
    "known_plain_v25": ("no_sizes", "sizes were not collected"),
    "torch_clean_v25": ("healthy", "healthy: grew during steps 0-2 (+1.7 GiB), flat since step 2"),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_first_answer_is_the_verdict(name):
    kind, start = EXPECTED[name]
    first = analysis_of(name).answers[0]
    assert (first.topic, first.code) == ("verdict", kind)
    assert first.message.startswith(start), first.message
    assert first.severity == {"out_of_memory": "error", "healthy": "info", "peak": "info"}.get(kind, "warning")


def test_a_healthy_run_never_reads_as_a_leak():
    """The clean PyTorch run keeps 1.8 GiB of cache to the end: its verdict is healthy, with the peak."""
    first = analysis_of("torch_clean_v25").answers[0]
    assert "; peak 1.8 GiB (1.3% of the GPU)" in first.message and "never freed" not in first.message
    # flat is flat as far as the driver sees: tensors inside the cache are not in the trace
    assert first.message.endswith("; PyTorch's caching allocator holds 1.6 GiB reserved, and what tensors use "
                                  "inside it is not in the trace")


def test_a_leak_inside_the_cache_is_not_called_healthy_without_its_caveat():
    """torch_startend_v25 keeps 64 MiB of tensors per step (its truth file's `allocated`) while
    PyTorch's reserve stays at 4068474880 B from step 2: no CUDA call shows that growth, so the
    verdict says what the trace can't see instead of a bare 'healthy'."""
    from conftest import truth

    reserved = [r["reserved"] for r in truth("torch_startend_v25") if r.get("step", -1) >= 2]
    assert len(set(reserved)) == 1
    first = analysis_of("torch_startend_v25").answers[0]
    assert first.code == "healthy" and "what tensors use inside it is not in the trace" in first.message


def test_the_terminal_opens_its_answers_with_the_verdict(capsys):
    code, out, _ = cli(capsys, "analyze", "fixtures/real_oom_v25.sqlite")
    lines = out.splitlines()
    assert code == 0 and re.match(r" verdict +ran out of memory: cudaMalloc failed in 'fill'", lines[lines.index("Answers") + 1])


@pytest.mark.parametrize("name,expected", [("torch_clean_v25", "info"), ("torch_leak_v25", "bad")])
def test_a_healthy_runs_cache_is_never_a_red_never_freed_line(name, expected):
    """On the page: the clean run's 1.8 GiB still reserved at exit is PyTorch's cache, drawn as
    information; the leaking run's never-freed blocks stay red."""
    from nsysan.render.html import render_html

    page = render_html(analysis_of(name))
    line = re.search(r'<li class="(\w+)" id="verdict-never-freed">', page)
    assert line and line.group(1) == expected
    import html as html_module

    shown = re.search(r'id="headline-verdict">(.*?)<', page).group(1)
    assert html_module.unescape(shown) == analysis_of(name).answers[0].message


@pytest.mark.parametrize("name", ["ddp_leak_v25", "known_mem_v22", "torch_oom_v25"])
def test_every_warning_the_terminal_answers_with_is_in_the_pages_first_box(name):
    """The page's warnings box (on its first screen, above the timeline) lists each warning the
    terminal prints among its answers that no verdict line draws: ddp_leak_v25's two
    vmm_without_access, known_mem_v22's cuda_trace_incomplete, ..."""
    import html as html_module

    from nsysan.render.html import first_screen_warnings, render_html

    analysis = analysis_of(name)
    page = render_html(analysis)
    shown = first_screen_warnings(analysis)
    if name == "torch_oom_v25":  # its warnings are all out-of-memory verdict lines: no box
        assert shown == [] and 'id="warnings"' not in page
        return
    box = page[page.index('<div class="warnings" id="warnings">'):page.index('<section id="timeline">')]
    assert shown and len(shown) == box.count("<li class=")
    for answer in shown:
        assert html_module.escape(answer.message, quote=False) in box or answer.message in html_module.unescape(box)
    codes = [a.code for a in shown]
    if name == "ddp_leak_v25":
        assert codes == ["vmm_without_access", "vmm_without_access"]
    if name == "known_mem_v22":
        assert "cuda_trace_incomplete" in codes


def test_an_oom_the_trace_cannot_show_reads_from_the_log():
    """torch_fraction_oom_v25: PyTorch refused 2 GiB under a 2.8 GiB fraction cap with nothing
    cached, so no call failed and nothing was released: the trace alone can only say where the
    process ended; its stderr (fixtures/torch_fraction_oom_v25.stderr.txt) gives the request and cap."""
    import nsysan
    from conftest import FIXTURES

    alone = analysis_of("torch_fraction_oom_v25").answers[0]
    assert (alone.code, alone.severity) == ("ended_inside", "warning")
    assert alone.message.startswith("ended inside 'big request' without closing it, with 1.4 GiB live")
    logged = nsysan.analyze(FIXTURES / "torch_fraction_oom_v25.sqlite",
                            log=[FIXTURES / "torch_fraction_oom_v25.stderr.txt"]).answers[0]
    assert (logged.code, logged.message) == ("out_of_memory", "ran out of memory in 'big request' asking for 2.0 GiB "
                                                              "under a 2.8 GiB cap")
