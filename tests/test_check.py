"""`check`: limits with human units, exit codes 0/1/2, and the JSON, JUnit and Markdown verdicts.

known_mem_v25's peak, from its program (fixtures/README.md): 256 + 128 + 12 MiB live when the
512 MiB burst is allocated = 908 MiB. Its never-freed device bytes are the truth file's
allocations with freed = 0.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import FIXTURES, ROOT, analysis_of, truth

from nsysan.cli import main
from nsysan.errors import NsysanError
from nsysan.runs.gate import evaluate_limits
from nsysan.runs.limits import Amount, Limits
from nsysan.base.units import parse_size
from nsysan.base.units import fmt_bytes

MiB = 1 << 20
KNOWN_PEAK = (256 + 128 + 12 + 512) * MiB
KNOWN_NEVER_FREED = sum(r["bytes"] for r in truth("known_mem_v25") if r.get("freed") == 0)
# The leak keeps each step's graph: PyTorch's reserved bytes after the last step, leak - clean.
LEAK_GROWTH = [r for r in truth("torch_leak_v25") if "step" in r][-1]["peak_reserved"] - \
    [r for r in truth("torch_clean_v25") if "step" in r][-1]["peak_reserved"]


def run(*args: str, cwd: Path = ROOT, env: dict | None = None) -> subprocess.CompletedProcess:
    """`nsysan ARGS` in this process, in `cwd` and with `env`, as a CompletedProcess: a subprocess
    proves nothing more here and costs a Python start and an import each."""
    out, err = io.StringIO(), io.StringIO()
    saved_cwd, saved_env = os.getcwd(), dict(os.environ)
    try:
        os.chdir(cwd)
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(list(args))
                code = 0
            except SystemExit as done:
                code = done.code
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def fixture(name: str) -> str:
    return str(FIXTURES / f"{name}.sqlite")


@pytest.mark.parametrize("text,expected", [
    ("8GiB", 8 << 30), ("512 MiB", 512 * MiB), ("900MB", 900_000_000), ("1.5G", 3 << 29), ("0", 0),
    ("16mib", 16 * MiB), ("4096", 4096), ("2k", 2048), ("1TB", 10**12),
])
def test_sizes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "8 GiBs", "-1MiB", "eight", "5%", "1e9"])
def test_malformed_sizes(text):
    with pytest.raises(NsysanError):
        parse_size(text, "max-peak")


def test_amounts_are_percentages_or_sizes():
    assert Amount.parse("10%", "max-peak-increase") == Amount(percent=10.0)
    assert Amount.parse("512MiB", "max-peak-increase") == Amount(bytes=512 * MiB)
    with pytest.raises(NsysanError):
        Amount.parse("ten percent", "max-peak-increase")


def test_leak_against_clean_breaks_the_increase_limit():
    result = run("check", fixture("torch_leak_v25"), "--baseline", fixture("torch_clean_v25"),
                 "--max-peak-increase", "10%")
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "FAIL: 1 of 1 limit checks broken (torch_leak_v25.sqlite against torch_clean_v25.sqlite)"
    assert lines[1].startswith(f"  broken  max-peak-increase: peak increase +{fmt_bytes(LEAK_GROWTH)} (+201.9%)")
    assert "over the limit of +10%" in lines[1] and "on GPU 0" in lines[1]


def test_increase_in_bytes():
    leak, clean = analysis_of("torch_leak_v25"), analysis_of("torch_clean_v25")
    just_over = evaluate_limits(leak, clean, Limits.parse(max_peak_increase=str(LEAK_GROWTH - 1)))
    at_limit = evaluate_limits(leak, clean, Limits.parse(max_peak_increase=str(LEAK_GROWTH)))
    assert not just_over.ok and at_limit.ok
    assert just_over.outcomes[0].measured == LEAK_GROWTH


def test_clean_against_clean_passes():
    result = run("check", fixture("torch_clean_v25"), "--baseline", fixture("torch_clean_v25"),
                 "--max-peak-increase", "10%")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("PASS: all 1 limit checks hold")


def test_known_mem_peak_over_900_mib():
    result = run("check", fixture("known_mem_v25"), "--max-peak", "900MiB")
    assert result.returncode == 1
    assert f"peak {fmt_bytes(KNOWN_PEAK)} is over the limit of 900.0 MiB" in result.stdout
    assert fmt_bytes(KNOWN_PEAK) == "908.0 MiB"
    assert run("check", fixture("known_mem_v25"), "--max-peak", "908MiB").returncode == 0


def test_never_freed_and_per_options():
    known = analysis_of("known_mem_v25")
    for per in ("process", "gpu", "all"):
        verdict = evaluate_limits(known, None, Limits.parse(per=per, max_never_freed="0", max_peak="1GiB"))
        kept = next(o for o in verdict.outcomes if o.limit == "max-never-freed")
        peak = next(o for o in verdict.outcomes if o.limit == "max-peak")
        assert (kept.ok, kept.measured) == (False, KNOWN_NEVER_FREED)
        assert (peak.ok, peak.measured) == (True, KNOWN_PEAK)
        assert kept.where == {"process": kept.where, "gpu": "GPU 0", "all": "all"}[per]


def test_failed_allocations_and_warnings():
    # real_oom_v25: cudaMalloc call #9 fails with cudaErrorMemoryAllocation (truth: error 2)
    failures = [r for r in truth("real_oom_v25") if r.get("error")]
    assert len(failures) == 1
    verdict = evaluate_limits(analysis_of("real_oom_v25"), None,
                              Limits.parse(no_failed_allocations=True, no_warnings="allocation_failed,quick"))
    assert not verdict.ok
    failed = [o for o in verdict.outcomes if o.limit == "no-failed-allocations"]
    assert [(o.ok, o.measured) for o in failed] == [(False, 1)]
    assert "cudaMalloc → cudaErrorMemoryAllocation" in failed[0].message
    warned = {o.where: o.ok for o in verdict.outcomes if o.limit == "no-warnings"}
    assert warned == {"allocation_failed": False, "quick": True}
    clean = evaluate_limits(analysis_of("torch_clean_v25"), None, Limits.parse(no_failed_allocations=True,
                                                                               no_warnings="all"))
    assert clean.ok  # torch_clean_v25 has only info diagnostics (no_backtraces, statics, the caching allocator)
    # known_mem_v25 keeps 4 MiB in steps 2, 5 and 8 (its truth's alloc_cache_entry leak): a warning
    leaky = evaluate_limits(analysis_of("known_mem_v25"), None, Limits.parse(no_warnings="all"))
    assert [(o.where, o.ok) for o in leaky.outcomes if not o.ok] == [("memory_kept_unevenly", False)]


@pytest.mark.parametrize("args,message", [
    (["--max-peak", "9XB"], "--max-peak '9XB' is not a size"),
    (["--max-peak-increase", "5%"], "--max-peak-increase needs a baseline"),
    (["--per", "node", "--max-peak", "1GiB"], "--per 'node'"),
    ([], "no limits to check"),
])
def test_malformed_limits_exit_2(args, message):
    result = run("check", fixture("known_mem_v25"), *args)
    assert result.returncode == 2
    assert result.stdout == "" and result.stderr.count("\n") == 1 and message in result.stderr


def test_corrupt_report_exits_2_with_one_line(tmp_path):
    corrupt = tmp_path / "corrupt.sqlite"
    corrupt.write_bytes((FIXTURES / "known_mem_v25.sqlite").read_bytes()[:3000])
    result = run("check", str(corrupt), "--max-peak", "1GiB")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "corrupt.sqlite" in result.stderr and "Traceback" not in result.stderr


def test_growth_limit_without_sizes_is_not_measured():
    result = run("check", fixture("known_plain_v25"), "--max-growth-per-step", "16MiB")
    assert result.returncode == 2 and "could not be measured" in result.stderr
    assert "growth per step not measured: known_plain_v25.sqlite: sizes were not collected" in result.stdout


def test_limits_from_pyproject_and_nsysan_toml(tmp_path):
    (tmp_path / ".git").mkdir()  # the top of a repository: the search stops here
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n\n[tool.nsysan.check]\nmax-peak = "900MiB"\n')
    result = run("check", fixture("known_mem_v25"), cwd=tmp_path)
    assert result.returncode == 1 and "over the limit of 900.0 MiB" in result.stdout
    # the command line wins over the file
    assert run("check", fixture("known_mem_v25"), "--max-peak", "1GiB", cwd=tmp_path).returncode == 0
    (tmp_path / "nsysan.toml").write_text('[check]\nmax_peak = "1GiB"\nno_failed_allocations = true\n')
    assert run("check", fixture("known_mem_v25"), cwd=tmp_path).returncode == 0  # nsysan.toml comes first
    (tmp_path / "nsysan.toml").write_text('[check]\nmax-peek = "1GiB"\n')
    result = run("check", fixture("known_mem_v25"), cwd=tmp_path)
    assert result.returncode == 2 and "unknown check setting 'max-peek'" in result.stderr


# The common JUnit schema (Ant's format, windyroad/JUnit-Schema JUnit.xsd), rule by rule: the
# attributes each element may have (an XSD without anyAttribute allows no others) and must have,
# their types, and each element's children in order.
DECIMAL = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)$")  # xs:decimal: no exponent, no inf/nan
XS_INT = range(-(1 << 31), 1 << 31)
SUITE_REQUIRED = {"name", "timestamp", "hostname", "tests", "failures", "errors", "time", "package", "id"}
SUITE_ALLOWED = SUITE_REQUIRED | {"skipped"}
CASE_ATTRIBUTES = {"name", "classname", "time"}


def _token(value: str) -> str:
    """An xs:token as the validator sees it: whitespace collapsed."""
    return " ".join(value.split())


def assert_junit_schema(root: ET.Element) -> None:
    assert root.tag == "testsuites" and root.attrib == {} and (root.text or "").strip() == ""
    for suite in root:
        assert suite.tag == "testsuite"
        attrs = suite.attrib
        assert SUITE_REQUIRED <= set(attrs) <= SUITE_ALLOWED, set(attrs) ^ SUITE_REQUIRED
        assert _token(attrs["name"]) and _token(attrs["hostname"]) and _token(attrs["package"])
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}", attrs["timestamp"])  # no time zone
        for count in ("tests", "failures", "errors", "id", "skipped"):
            if count in attrs:
                assert re.fullmatch(r"[+-]?\d+", attrs[count]) and int(attrs[count]) in XS_INT
        assert DECIMAL.match(attrs["time"])
        tags = [child.tag for child in suite]
        assert tags[0] == "properties" and tags[-2:] == ["system-out", "system-err"]
        assert set(tags[1:-2]) <= {"testcase"}
        assert suite[0].attrib == {}
        for prop in suite[0]:
            assert prop.tag == "property" and set(prop.attrib) == {"name", "value"} and _token(prop.attrib["name"])
        for out in suite[-2:]:
            assert out.attrib == {} and len(out) == 0  # text only
        cases = suite.findall("testcase")
        assert int(attrs["tests"]) == len(cases)
        assert int(attrs["failures"]) == sum(1 for c in cases if c.find("failure") is not None)
        assert int(attrs["errors"]) == sum(1 for c in cases if c.find("error") is not None)
        for case in cases:
            assert set(case.attrib) == CASE_ATTRIBUTES and DECIMAL.match(case.attrib["time"])
            assert len(case) <= 1  # a choice of one: skipped, error or failure
            for result in case:
                assert result.tag in ("skipped", "failure", "error")
                if result.tag != "skipped":
                    assert "type" in result.attrib and set(result.attrib) <= {"type", "message"}
                    assert len(result) == 0


def test_the_schema_check_finds_what_the_xsd_forbids():
    good = ET.fromstring(JUNIT_EXAMPLE)
    assert_junit_schema(good)
    for bad in (JUNIT_EXAMPLE.replace("<testsuites>", '<testsuites tests="1">'),  # no attributes on the root
                JUNIT_EXAMPLE.replace('time="0.5"', 'time="1e3"'),  # decimal, not a float
                JUNIT_EXAMPLE.replace('timestamp="2026-11-30T12:00:00"', 'timestamp="2026-11-30T12:00:00Z"'),
                JUNIT_EXAMPLE.replace("</failure>", '</failure><error type="x"/>'),  # one result per case
                JUNIT_EXAMPLE.replace('classname="c"', 'classname="c" file="x.py"'),  # no other attributes
                JUNIT_EXAMPLE.replace("<properties/>", "")):  # properties is required
        with pytest.raises(AssertionError):
            assert_junit_schema(ET.fromstring(bad))


JUNIT_EXAMPLE = """<testsuites><testsuite name="s" package="p" id="0" timestamp="2026-11-30T12:00:00"
hostname="localhost" tests="1" failures="1" errors="0" time="0.5"><properties/><testcase name="t"
classname="c" time="0"><failure type="x" message="m">m</failure></testcase><system-out/><system-err/>
</testsuite></testsuites>"""


def test_junit_json_and_markdown_outputs(tmp_path):
    summary = tmp_path / "step-summary.md"
    summary.write_text("earlier steps\n")
    env = dict(os.environ, GITHUB_STEP_SUMMARY=str(summary))
    result = run("check", fixture("torch_leak_v25"), "--baseline", fixture("torch_clean_v25"),
                 "--max-peak-increase", "10%", "--max-peak", "8GiB", "--junit", str(tmp_path / "junit.xml"),
                 "--json", str(tmp_path / "verdict.json"), "--markdown", str(tmp_path / "check.md"),
                 "--github-summary", env=env)
    assert result.returncode == 1, result.stderr
    root = ET.parse(tmp_path / "junit.xml").getroot()
    assert_junit_schema(root)
    cases = {c.attrib["classname"]: c for c in root.iter("testcase")}
    assert set(cases) == {"nsysan.check.max-peak", "nsysan.check.max-peak-increase"}
    assert cases["nsysan.check.max-peak"].find("failure") is None
    failure = cases["nsysan.check.max-peak-increase"].find("failure")
    assert failure is not None and "+10%" in failure.attrib["message"]
    verdict = json.loads((tmp_path / "verdict.json").read_text())
    assert verdict["schema"] == "nsysan/check@1" and verdict["ok"] is False
    assert verdict["baseline"] == "torch_clean_v25.sqlite"
    broken = [o for o in verdict["outcomes"] if not o["ok"]]
    assert [(o["limit"], o["threshold"]) for o in broken] == [("max-peak-increase", "10%")]
    markdown = (tmp_path / "check.md").read_text()
    assert markdown.startswith("### ❌ nsysan check: FAIL: `1 of 2") and "| ❌ | `max-peak-increase` `10%` |" in markdown
    assert summary.read_text() == "earlier steps\n" + markdown


def test_a_profile_string_cannot_break_the_junit_or_markdown(tmp_path):
    from nsysan.model import Outcome, Verdict
    from nsysan.render.check_verdict import render_junit, render_markdown

    nasty = "<b>x</b> | `y` \x1b[31m ]]> & \"q\""
    verdict = Verdict(schema="nsysan/check@1", report=nasty, baseline=None, per="process", ok=False,
                      outcomes=[Outcome(limit="max-peak", where=nasty, ok=False, measured=1, threshold="1 B",
                                        message=nasty)])
    root = ET.fromstring(render_junit(verdict))
    assert_junit_schema(root)
    assert root.find("testsuite/testcase/failure").attrib["message"] == "<b>x</b> | `y` \\x1b[31m ]]> & \"q\""
    markdown = render_markdown(verdict)
    assert "\x1b" not in markdown
    row = markdown.splitlines()[-1]
    assert len(re.findall(r"(?<!\\)\|", row)) == 5  # unescaped pipes: the cells stay four
    # Rendered as GitHub does (tables on): the profile's HTML is text inside code spans, never an element
    from markdown_it import MarkdownIt

    page = MarkdownIt("commonmark").enable("table").render(markdown)
    assert "<b>" not in re.sub(r"<code>.*?</code>", "", page) and "&lt;b&gt;x&lt;/b&gt;" in page


def test_the_ci_jobs_use_options_that_exist():
    """Every `nsysan COMMAND --option` of docs/ci.md is an option of that command."""
    import typer.main

    from nsysan.cli import app

    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    text = (ROOT / "docs" / "ci.md").read_text().replace(">\n", " ").replace("\n          ", " ")
    used = re.findall(r"nsysan (analyze|compare|check|batch)\b([^\n|&]*)", text)
    assert {c for c, _ in used} == {"analyze", "compare", "check", "batch"}
    for command, rest in used:
        known = {opt for param in commands[command].params for opt in [*param.opts, *param.secondary_opts]}
        for option in re.findall(r"(?<!\S)(--[a-z][a-z-]*)", rest):
            assert option in known, f"nsysan {command} has no {option}"


def reserved_step_growth(name: str) -> float:
    """The median growth of PyTorch's reserved bytes from step to step, after the first step
    (warm-up), from the truth file: what the driver-level growth per step should be close to."""
    import statistics

    reserved = [r["reserved"] for r in truth(name) if "step" in r]
    return statistics.median(b - a for a, b in zip(reserved[1:], reserved[2:]))


def test_growth_per_step_limit():
    leak = run("check", fixture("torch_leak_v25"), "--max-growth-per-step", "16MiB")
    assert leak.returncode == 1, leak.stderr
    verdict = evaluate_limits(analysis_of("torch_leak_v25"), None, Limits.parse(max_growth_per_step="16MiB"))
    (outcome,) = verdict.outcomes
    # the kept graph: PyTorch reserves about 740 MiB more after every step (truth), and the
    # driver-level growth the analysis measures is within 2% of it
    assert abs(outcome.measured - reserved_step_growth("torch_leak_v25")) < 0.02 * reserved_step_growth("torch_leak_v25")
    assert "growth per step" in leak.stdout and "over the limit of 16.0 MiB" in leak.stdout
    clean = run("check", fixture("torch_clean_v25"), "--max-growth-per-step", "16MiB")
    assert clean.returncode == 0, clean.stdout + clean.stderr
