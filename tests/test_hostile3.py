"""Hostile input, round three (issue 28): the surfaces added since round two (compare, check and its
CI reports, --smi logs, numbers in options and settings, the Python API, compare across capture
kinds). Every case runs the command line in this process (conftest.cli) and, where the API takes
the same input, the Python API; docs/reliability.md lists each case with its test.

The promise: one clear line on stderr and exit 2, never a traceback or exit 3, never a hang (an
alarm stops a case after 30 s), the inputs byte-identical, no output onto an input.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import FIXTURES, ROOT, analysis_of, cli

import nsysan
from nsysan.render.json import render_json

BIG = "9" * 400  # a number of 400 digits: infinite as a float


@pytest.fixture(autouse=True)
def never_hangs():
    """A case that waits (on a FIFO, on /dev/zero) fails after 30 s instead of stopping the suite."""
    def stop(signum, frame):
        raise TimeoutError("the case hung")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(30)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def document(folder: Path, name: str, change=None) -> Path:
    """fixtures/<name>'s analysis as a JSON document in `folder`, `change`d (a function of the dict)."""
    data = json.loads(render_json(analysis_of(name)))
    if change is not None:
        change(data)
    path = folder / f"{name}.analysis.json"
    path.write_text(json.dumps(data))
    return path


def one_line(code: int, out: str, err: str, pattern: str) -> str:
    assert code == 2, (code, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("nsysan: ") and "Traceback" not in err, err
    assert re.search(pattern, lines[0]), lines[0]
    return lines[0]


@pytest.fixture
def inputs(tmp_path: Path) -> dict[str, Path]:
    """A run (its analysis document), a baseline document, a report, an nvidia-smi log, a FIFO and
    a link to /dev/zero, in a folder of their own."""
    folder = tmp_path / "in"
    folder.mkdir()
    run = document(folder, "known_mem_v25")
    base = folder / "base.analysis.json"
    base.write_bytes(run.read_bytes())
    report = folder / "run.sqlite"
    report.write_bytes((FIXTURES / "known_mem_v25.sqlite").read_bytes())
    smi = folder / "gpu.csv"
    smi.write_bytes((FIXTURES / "torch_smi_v25.smi-gpu.csv").read_bytes())
    for name in ("fifo.json", "fifo.csv", "fifo.toml", "fifo.md", "fifo.sqlite"):
        os.mkfifo(folder / name)
    for name in ("zero.json", "zero.csv", "zero.nsys-rep", "zero.sqlite"):
        (folder / name).symlink_to("/dev/zero")
    return {"run": run, "base": base, "report": report, "smi": smi, "folder": folder}


def hashes(paths: dict[str, Path]) -> dict[str, str]:
    return {k: sha256(p) for k, p in paths.items() if k in ("run", "base", "report", "smi")}


# --- Special files on the new inputs -------------------------------------------------------------

SPECIAL = {  # case -> (arguments, environment, the one line)
    "compare BASE a FIFO": (["compare", "{folder}/fifo.json", "{run}"], {}, r"fifo\.json is a FIFO \(named pipe\)"),
    "compare NEW a FIFO": (["compare", "{run}", "{folder}/fifo.json"], {}, r"fifo\.json is a FIFO"),
    "check --baseline a FIFO": (["check", "{run}", "--baseline", "{folder}/fifo.json", "--max-peak", "1GiB"], {},
                                r"fifo\.json is a FIFO"),
    "check --baseline /dev/zero": (["check", "{run}", "--baseline", "{folder}/zero.json", "--max-peak", "1GiB"], {},
                                   r"zero\.json is a character device, not a file"),
    "check the run a FIFO": (["check", "{folder}/fifo.json", "--max-peak", "1GiB"], {}, r"fifo\.json is a FIFO"),
    # Reports by name: the analysis cache hashed them with a plain open() first (a wait, an endless read)
    "compare BASE a FIFO named .sqlite": (["compare", "{folder}/fifo.sqlite", "{run}"], {},
                                          r"fifo\.sqlite is a FIFO \(named pipe\), not a file; nsysan reads report"),
    "check --baseline /dev/zero named .nsys-rep": (["check", "{run}", "--baseline", "{folder}/zero.nsys-rep",
                                                    "--max-peak", "1GiB"], {}, r"zero\.nsys-rep is a character device"),
    "check the run /dev/zero named .sqlite": (["check", "{folder}/zero.sqlite", "--max-peak", "1GiB"], {},
                                              r"zero\.sqlite is a character device, not a file"),
    "check --config a FIFO": (["check", "{run}", "--config", "{folder}/fifo.toml"], {}, r"fifo\.toml is a FIFO"),
    "analyze --smi a FIFO": (["analyze", "{report}", "--smi", "{folder}/fifo.csv"], {},
                             r"--smi fifo\.csv is a FIFO \(named pipe\), not a file"),
    "analyze --smi /dev/zero": (["analyze", "{report}", "--smi", "{folder}/zero.csv"], {},
                                r"--smi zero\.csv is a character device"),
    "$GITHUB_STEP_SUMMARY a FIFO": (["check", "{run}", "--max-peak", "1GiB", "--github-summary"],
                                    {"GITHUB_STEP_SUMMARY": "{folder}/fifo.md"},
                                    r"could not write \$GITHUB_STEP_SUMMARY .*fifo\.md.*: a FIFO"),
    "$GITHUB_STEP_SUMMARY /dev/zero": (["check", "{run}", "--max-peak", "1GiB", "--github-summary"],
                                       {"GITHUB_STEP_SUMMARY": "/dev/zero"}, r"it is a character device, not a file"),
}


@pytest.mark.parametrize("case", sorted(SPECIAL))
def test_a_special_file_on_a_new_input_is_one_line_never_a_wait(case, inputs, capsys, monkeypatch):
    args, env, pattern = SPECIAL[case]
    for key, value in env.items():
        monkeypatch.setenv(key, value.format(**inputs))
    before = hashes(inputs)
    one_line(*cli(capsys, *(a.format(**inputs) for a in args)), pattern)
    assert hashes(inputs) == before


def test_the_api_opens_the_new_inputs_as_the_command_does(inputs):
    fifo, zero = inputs["folder"] / "fifo.json", inputs["folder"] / "zero.json"
    calls = {
        "load_analysis": lambda: nsysan.load_analysis(fifo),
        "compare": lambda: nsysan.compare(fifo, inputs["run"]),
        "check baseline": lambda: nsysan.check(inputs["run"], zero, max_peak_increase="1%"),
        "analyze smi": lambda: nsysan.analyze(inputs["report"], smi=str(inputs["folder"] / "fifo.csv")),
    }
    for name, call in calls.items():
        with pytest.raises(nsysan.NsysanError, match=r"is a (FIFO \(named pipe\)|character device), not a file"):
            call()


@pytest.mark.parametrize("what,args,size,pattern", [
    ("baseline", ["check", "{run}", "--baseline", "{big}", "--max-peak", "1GiB"], 600 << 20,
     r"big\.json is 629,145,600 bytes, more than the 536,870,912 such a file can be"),
    ("smi log", ["analyze", "{report}", "--smi", "{big}"], (1 << 30) + 1,
     r"--smi big\.csv is 1,073,741,825 bytes, more than the 1,073,741,824"),
])
def test_an_input_beyond_its_formats_size_is_refused_before_it_is_read(what, args, size, pattern, inputs, capsys):
    big = inputs["folder"] / ("big.json" if what == "baseline" else "big.csv")
    with open(big, "wb") as handle:  # sparse: no disk, but read whole it would be gigabytes of memory
        handle.truncate(size)
    one_line(*cli(capsys, *(a.format(big=big, **inputs) for a in args)), pattern)


# --- Outputs that reach an input -----------------------------------------------------------------


def _link(target_key: str, name: str, hard: bool = False):
    def make(paths: dict[str, Path], out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        (os.link if hard else os.symlink)(paths[target_key], out / name)
    return make


OUTPUTS = {  # case -> (arguments, environment, prepare(paths, out folder), the one line)
    "check --json the run": (["check", "{run}", "--max-peak", "1GiB", "--json", "{run}"], {}, None,
                             r"refusing to write .*known_mem_v25\.analysis\.json: it is the input"),
    "check --json a link to the baseline": (
        ["check", "{run}", "--baseline", "{base}", "--max-peak", "1GiB", "--json", "{out}/verdict.json"], {},
        _link("base", "verdict.json"), r"refusing to write .*verdict\.json: it is the input .*base\.analysis\.json "
                                       r"\(the same file under another name\)"),
    "check --junit a hard link of the report": (
        ["check", "{report}", "--max-peak", "1GiB", "--junit", "{out}/junit.xml"], {},
        _link("report", "junit.xml", hard=True), r"junit\.xml: it is the input .*run\.sqlite"),
    "check --markdown the config": (
        ["check", "{run}", "--config", "{out}/nsysan.toml", "--markdown", "{out}/nsysan.toml"], {},
        lambda paths, out: (out.mkdir(), (out / "nsysan.toml").write_text('[check]\nmax-peak = "1GiB"\n')),
        r"nsysan\.toml: it is the input"),
    "check --json and --junit one file": (
        ["check", "{run}", "--max-peak", "1GiB", "--json", "{out}/a.out", "--junit", "{out}/a.out"], {}, None,
        r"refusing to write .*a\.out \(--junit\): it is the file of --json too"),
    "check --markdown and the step summary one file": (
        ["check", "{run}", "--max-peak", "1GiB", "--markdown", "{out}/s.md", "--github-summary"],
        {"GITHUB_STEP_SUMMARY": "{out}/s.md"}, None, r"\(\$GITHUB_STEP_SUMMARY\): it is the file of --markdown too"),
    "$GITHUB_STEP_SUMMARY the report": (["check", "{report}", "--max-peak", "1GiB", "--github-summary"],
                                        {"GITHUB_STEP_SUMMARY": "{report}"}, None,
                                        r"refusing to write .*run\.sqlite: it is the input"),
    "check --baseline-out the baseline": (
        ["check", "{run}", "--baseline", "{base}", "--max-peak", "1GiB", "--baseline-out", "{base}"], {}, None,
        r"base\.analysis\.json: it is the input"),
    "compare -o DIR whose compare.json links to the baseline": (
        ["compare", "{base}", "{run}", "-o", "{out}"], {}, _link("base", "compare.json"),
        r"compare\.json: it is the input .*base\.analysis\.json \(the same file under another name\)"),
    "compare -o DIR whose compare.html is a hard link of NEW": (
        ["compare", "{base}", "{run}", "-o", "{out}"], {}, _link("run", "compare.html", hard=True),
        r"compare\.html: it is the input"),
    "analyze --json-dir DIR whose document links to the --smi log": (
        ["analyze", "{report}", "--smi", "{smi}", "--json-dir", "{out}"], {}, _link("smi", "run.sqlite.analysis.json"),
        r"run\.sqlite\.analysis\.json: it is the input .*gpu\.csv"),
    "analyze --baseline-out the report": (["analyze", "{report}", "--baseline-out", "{report}"], {}, None,
                                          r"run\.sqlite: it is the input"),
    "batch -o DIR whose summary.csv links to an input": (
        ["batch", "{run}", "-o", "{out}", "-j", "1", "--no-progress"], {}, _link("run", "summary.csv"),
        r"summary\.csv: it is the input"),
    "batch --db an input": (["batch", "{run}", "-o", "{out}", "-j", "1", "--no-progress", "--db", "{run}"], {}, None,
                            r"known_mem_v25\.analysis\.json: it is the input"),
    "batch --db onto its own summary.csv": (
        ["batch", "{run}", "-o", "{out}", "-j", "1", "--no-progress", "--db", "{out}/summary.csv"], {}, None,
        r"summary\.csv \(the database\): it is the file of summary\.csv too"),
}


@pytest.mark.parametrize("case", sorted(OUTPUTS))
def test_no_output_of_any_command_reaches_an_input_or_another_output(case, inputs, tmp_path, capsys, monkeypatch):
    args, env, prepare, pattern = OUTPUTS[case]
    out = tmp_path / "out"
    if prepare is not None:
        prepare(inputs, out)
    fill = {**inputs, "out": out}
    for key, value in env.items():
        monkeypatch.setenv(key, value.format(**fill))
    before, listing = hashes(inputs), sorted(p.name for p in out.iterdir()) if out.exists() else []
    one_line(*cli(capsys, *(a.format(**fill) for a in args)), pattern)
    assert hashes(inputs) == before  # every input byte-identical
    assert (sorted(p.name for p in out.iterdir()) if out.exists() else []) == listing  # nothing written


@pytest.mark.parametrize("command", [["analyze", "{report}", "--format", "json"], ["check", "{run}", "--max-peak", "1GiB"],
                                     ["compare", "{base}", "{run}"]])
def test_stdout_appended_onto_an_input_is_refused(command, inputs):
    """`nsysan analyze run.sqlite --format json >> run.sqlite`: the shell opened the input as stdout.
    A subprocess, since only a real descriptor 1 can be the input."""
    import subprocess
    import sys

    args = [a.format(**inputs) for a in command]
    target = Path(args[1])
    before = sha256(target)
    with open(target, "ab") as out:
        result = subprocess.run([sys.executable, "-m", "nsysan", *args], stdout=out, stderr=subprocess.PIPE,
                                text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert f"refusing to write to stdout: it is the input {target} (sent there by the shell's >>)" in result.stderr
    assert sha256(target) == before


def test_a_link_planted_as_a_batch_documents_temporary_file_is_never_written_through(inputs, tmp_path, capsys):
    """batch writes DIR/analyses/<name>-<content hash>.analysis.json through `.<that name>.tmp`:
    both names follow from the input's bytes, so a link can be planted there beforehand."""
    run = inputs["run"]
    name = f"{run.name}-{sha256(run)[:12]}.analysis.json"
    (tmp_path / "out" / "analyses").mkdir(parents=True)
    (tmp_path / "out" / "analyses" / f".{name}.tmp").symlink_to(inputs["base"])
    before = hashes(inputs)
    code, out, err = cli(capsys, "batch", str(run), "-o", str(tmp_path / "out"), "-j", "1", "--no-progress")
    assert code == 0, err
    assert hashes(inputs) == before  # the baseline the link pointed to is untouched
    assert json.loads((tmp_path / "out" / "analyses" / name).read_text())["schema"] == "nsysan/analysis@1"


def test_an_output_that_cannot_be_written_is_one_line(inputs, capsys, monkeypatch):
    one_line(*cli(capsys, "check", str(inputs["run"]), "--max-peak", "1GiB", "--json",
                  str(inputs["report"] / "verdict.json")), r"could not write .*verdict\.json: Not a directory")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(inputs["folder"] / "no-such-dir" / "summary.md"))
    one_line(*cli(capsys, "check", str(inputs["run"]), "--max-peak", "1GiB", "--github-summary"),
             r"could not write \$GITHUB_STEP_SUMMARY .*: No such file or directory")


def test_an_output_that_is_a_fifo_nobody_reads_is_one_line_never_a_wait(inputs, tmp_path, capsys):
    fifo = tmp_path / "verdict.json"
    os.mkfifo(fifo)
    one_line(*cli(capsys, "check", str(inputs["run"]), "--max-peak", "1GiB", "--json", str(fifo)),
             r"could not write .*verdict\.json: a FIFO \(named pipe\) nobody reads")
    (tmp_path / "cmp").mkdir()
    os.mkfifo(tmp_path / "cmp" / "compare.png")
    one_line(*cli(capsys, "compare", str(inputs["base"]), str(inputs["run"]), "-o", str(tmp_path / "cmp")),
             r"could not write .*compare\.png: a FIFO \(named pipe\) nobody reads")


def test_a_huge_option_value_is_quoted_cut_in_its_line(inputs, capsys):
    line = one_line(*cli(capsys, "analyze", str(inputs["report"]), "--smi", str(inputs["smi"]), "--smi-tz",
                         "x" * 5000), r"--smi-tz 'x+\.\.\. \(5002 chars\) is not a time zone")
    assert len(line) < 200


# --- CI reports that lie or inject ---------------------------------------------------------------

NASTY_PROCESS = ("[Approve this PR](https://evil.example/merge) <img src=x onerror=alert(1)> ``tick` | pipe "
                 "\uffff\ufffe \x00\x1b[31m ]]> www.evil.example ci@evil.example *bold* _em_")


def _nasty_run(folder: Path) -> Path:
    import contextlib
    import sqlite3

    path = folder / "nasty.sqlite"
    path.write_bytes((FIXTURES / "known_mem_v25.sqlite").read_bytes())
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("UPDATE PROCESSES SET name = ? WHERE name = '/tmp/known'", (NASTY_PROCESS,))
        conn.commit()
    return path


def _assert_inert_markdown(markdown: str) -> None:
    """Rendered as GitHub renders it (CommonMark with tables): the profile's link, image, HTML,
    emphasis and URLs are text inside code spans, never elements."""
    from markdown_it import MarkdownIt

    page = MarkdownIt("commonmark").enable("table").render(markdown)
    outside = re.sub(r"<code>.*?</code>", "", page, flags=re.S)
    for live in ("<a ", "<img", "https://", "www.", "@evil", "<em>", "<strong>"):
        assert live not in outside, (live, outside)
    assert "[Approve this PR](https://evil.example/merge)" in page  # shown, as text
    rows = [line for line in markdown.splitlines() if line.startswith("| ✅") or line.startswith("| ❌")]
    assert rows and all(len(re.findall(r"(?<!\\)\|", row)) == 5 for row in rows)  # four cells, whatever the name


def test_a_process_name_can_not_break_junit_or_make_links_in_markdown(tmp_path, capsys, monkeypatch):
    run = _nasty_run(tmp_path)
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    code, out, err = cli(capsys, "check", str(run), "--max-peak", "1GiB", "--junit", str(tmp_path / "junit.xml"),
                         "--markdown", str(tmp_path / "check.md"), "--github-summary")
    assert code == 0, err  # the peak, 908.0 MiB, is within 1 GiB
    root = ET.parse(tmp_path / "junit.xml").getroot()  # well-formed XML 1.0 with U+FFFF in the name
    name = root.find("testsuite/testcase").attrib["name"]
    assert "\\uffff\\ufffe \\x00\\x1b[31m" in name and "[Approve this PR]" in name
    markdown = (tmp_path / "check.md").read_text()
    _assert_inert_markdown(markdown)
    assert summary.read_text() == markdown
    # The Python API's verdict renders the same way
    from nsysan.render.check_verdict import render_junit, render_markdown

    verdict = nsysan.check(run, max_peak="1GiB")
    ET.fromstring(render_junit(verdict))
    _assert_inert_markdown(render_markdown(verdict))


BAD_BASELINES = {  # case -> (change to the document, the one line)
    "a negative peak": (lambda d: d["peaks"][0].update(peak_bytes=-5368709120),
                        r"field 'peaks\[0\]\.peak_bytes' is negative \(-5368709120\), which no capture measures"),
    "a negative never-freed size": (lambda d: d["never_freed"][0].update(bytes=-1),
                                    r"field 'never_freed\[0\]\.bytes' is negative"),
    "a negative headline peak": (lambda d: d["peak"].update(peak_bytes=-1), r"field 'peak\.peak_bytes' is negative"),
    "a peak as text": (lambda d: d["peaks"][0].update(peak_bytes="908 MiB"),
                       r"field 'peaks\[0\]\.peak_bytes' should be an integer, not '908 MiB'"),
    "a peak as a fraction": (lambda d: d["groups"][0].update(peak_bytes=1.5),
                             r"field 'groups\[0\]\.peak_bytes' should be an integer, not 1\.5"),
    "groups removed": (lambda d: d.pop("groups"), r"field 'groups' is missing"),
    "failed_calls removed": (lambda d: d.pop("failed_calls"), r"field 'failed_calls' is missing"),
    "peaks an object": (lambda d: d.update(peaks={}), r"field 'peaks' should be a list, not \{\}"),
}


@pytest.mark.parametrize("case", sorted(BAD_BASELINES))
def test_a_baseline_is_validated_like_a_report(case, tmp_path, capsys):
    change, pattern = BAD_BASELINES[case]
    run = document(tmp_path, "known_mem_v25")
    bad = tmp_path / "bad"
    bad.mkdir()
    baseline = document(bad, "known_mem_v25", change)
    line = one_line(*cli(capsys, "check", str(run), "--baseline", str(baseline), "--max-peak-increase", "10%"),
                    pattern)
    with pytest.raises(nsysan.NsysanError) as raised:  # the API: the same line
        nsysan.check(run, baseline, max_peak_increase="10%")
    assert f"nsysan: {raised.value.message}" == line
    with pytest.raises(nsysan.NsysanError, match=pattern):
        nsysan.load_analysis(baseline)


def _without_gpu(gpu: int, rename: str = ""):
    """The document of a run that lost GPU `gpu` (its peaks, groups and the GPU itself), or, with
    `rename`, ran on GPUs of another model."""
    def change(d: dict) -> None:
        def keep(x: dict) -> bool:
            return (x["gpu"] if x.get("gpu") is not None else x["device"]) != gpu
        d["peaks"] = [p for p in d["peaks"] if keep(p)]
        d["groups"] = [g for g in d["groups"] if keep(g)]
        d["capture"]["gpus"] = [g for g in d["capture"]["gpus"] if g["id"] != gpu]
        for g in d["capture"]["gpus"]:
            if rename:
                g["name"], g["uuid"] = rename, None
        d["peak"] = max(d["peaks"], key=lambda p: p["peak_bytes"])
    return change


def test_per_gpu_matches_gpus_by_identity_and_says_when_one_was_lost(tmp_path, capsys):
    base = document(tmp_path, "ddp_leak_v25")  # two ranks: GPU 0 peaks at 1,125,666,996 B, GPU 1 at 1,745,094,656 B
    lost = tmp_path / "lost"
    lost.mkdir()
    new = document(lost, "ddp_leak_v25", _without_gpu(0))
    code, out, err = cli(capsys, "check", str(new), "--baseline", str(base), "--per", "gpu",
                         "--max-peak-increase", "5%", "--json", str(tmp_path / "verdict.json"))
    verdict = json.loads((tmp_path / "verdict.json").read_text())
    by_place = {o["where"]: o for o in verdict["outcomes"]}
    # GPU 1 against GPU 1 (1.6 GiB both): by position it was against GPU 0, +55.0%, broken
    assert by_place["GPU 1"]["status"] == "held" and by_place["GPU 1"]["measured"] == 0.0
    assert by_place["GPU 0 of the baseline"]["status"] == "not_measured"
    assert "this run has no GPU 0 (NVIDIA H200) of the baseline: it lost a GPU" in \
        by_place["GPU 0 of the baseline"]["message"]
    assert code == 2  # not measured: the gate says so instead of passing
    assert cli(capsys, "check", str(new), "--baseline", str(base), "--per", "gpu", "--max-peak-increase", "5%",
               "--allow-unmeasured")[0] == 0
    # The same through the API
    api = nsysan.check(new, base, per="gpu", max_peak_increase="5%")
    assert [(o.where, o.status) for o in api.outcomes] == [("GPU 1", "held"), ("GPU 0 of the baseline", "not_measured")]
    # A run on GPUs of another model is never paired with the baseline's by position
    other = tmp_path / "other"
    other.mkdir()
    moved = document(other, "ddp_leak_v25", _without_gpu(-1, rename="NVIDIA A100-SXM4-80GB"))
    statuses = {o.where: o.status for o in nsysan.check(moved, base, per="gpu", max_peak_increase="5%").outcomes}
    assert statuses == {"GPU 0": "not_measured", "GPU 1": "not_measured", "GPU 0 of the baseline": "not_measured",
                        "GPU 1 of the baseline": "not_measured"}


# --- nvidia-smi logs -----------------------------------------------------------------------------

GPU_LOG = FIXTURES / "torch_smi_v25.smi-gpu.csv"
APPS_LOG = FIXTURES / "torch_smi_v25.smi-apps.csv"


def _iso(line: str, zone: str, hours: int = 0) -> str:
    """A sample line with its nvidia-smi time as ISO 8601 in `zone`, `hours` ahead of UTC."""
    import datetime as dt

    stamp, rest = line.split(",", 1)
    when = dt.datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f") + dt.timedelta(hours=hours)
    return f"{when.isoformat(timespec='milliseconds')}{zone},{rest}"


@pytest.mark.parametrize("zone,hours", [("+00:00", 0), ("Z", 0), ("+02:00", 2), ("-0530", -5.5)])
def test_iso_timestamps_with_a_zone_are_read_in_their_zone(zone, hours, tmp_path, capsys):
    from nsysan.sources.smi_log import read_smi_log

    lines = GPU_LOG.read_text().splitlines()
    iso = tmp_path / "iso.csv"
    iso.write_text("\n".join([lines[0]] + [_iso(line, zone, hours) for line in lines[1:]]) + "\n")
    original = read_smi_log(GPU_LOG).samples
    read = read_smi_log(iso, tz="Asia/Tokyo").samples  # the line's own zone wins over --smi-tz
    assert read["utc_ns"].tolist() == original["utc_ns"].tolist() and len(read) == 183
    code, out, err = cli(capsys, "analyze", str(FIXTURES / "torch_smi_v25.sqlite"), "--smi", str(iso),
                         "--format", "json")
    assert code == 0, err
    logs = json.loads(out)["smi"]["logs"]
    assert logs[0]["aligned"] is True and logs[0]["best_offset_ns"] == -2631910  # as the original log's


@pytest.mark.parametrize("encoding", ["utf-16", "utf-8-sig"])
def test_a_log_written_by_windows_powershell_or_excel_is_read(encoding, tmp_path):
    """Windows PowerShell's `nvidia-smi ... > gpu.csv` writes UTF-16LE with a byte-order mark and
    CRLF; Excel and PowerShell 7 (utf8BOM) put a UTF-8 byte-order mark ahead of the header."""
    from nsysan.sources.smi_log import read_smi_log

    log = tmp_path / "gpu.csv"
    log.write_bytes(GPU_LOG.read_text().replace("\n", "\r\n").encode(encoding))
    read = read_smi_log(log).samples
    assert read.equals(read_smi_log(GPU_LOG).samples) and len(read) == 183
    analysis = nsysan.analyze(FIXTURES / "torch_smi_v25.sqlite", smi=log)
    assert analysis.smi.logs[0].aligned and analysis.smi.logs[0].best_offset_ns == -2631910


SMI_VALUES = {  # case -> (log, line number (1 = header), column index, value, the one line)
    "9e12 MiB used": (GPU_LOG, 6, 3, " 9000000000000 MiB",
                      r"line 6: memory\.used of 9,437,184,000,000,000,000 bytes is more than 1 PiB"),
    "a GPU index of 2^32": (GPU_LOG, 8, 1, " 4294967296", r"line 8: GPU index 4294967296 is not one nvidia-smi writes"),
    "memory.total of 1e20 bytes": (GPU_LOG, 3, 4, " 100000000000000000000 B", r"line 3: memory\.total of "),
    "a pid of 2^40": (APPS_LOG, 4, 2, " 1099511627776", r"line 4: process id 1099511627776 is not one a process can"),
    "400-digit used memory": (APPS_LOG, 2, 4, f" {BIG} MiB", r"line 2: used_memory of inf bytes is more than 1 PiB"),
}


@pytest.mark.parametrize("case", sorted(SMI_VALUES))
def test_an_impossible_smi_sample_is_refused_with_its_line(case, tmp_path, capsys):
    log, number, column, value, pattern = SMI_VALUES[case]
    lines = log.read_text().splitlines()
    fields = lines[number - 1].split(",")
    fields[column] = value
    lines[number - 1] = ",".join(fields)
    bad = tmp_path / f"bad{log.suffix}"
    bad.write_text("\n".join(lines) + "\n")
    line = one_line(*cli(capsys, "analyze", str(FIXTURES / "torch_smi_v25.sqlite"), "--smi", str(bad)),
                    r"--smi bad\.csv " + pattern)
    with pytest.raises(nsysan.NsysanError) as raised:
        nsysan.analyze(FIXTURES / "torch_smi_v25.sqlite", smi=str(bad))  # one path as a str
    assert f"nsysan: {raised.value.message}" == line


# --- Numbers in options and settings -------------------------------------------------------------

OPTIONS = {  # case -> (arguments after the input, the one line)
    "--max-peak of 400 digits": (["check", "{run}", "--max-peak", BIG],
                                 r"--max-peak '9{26}\.\.\. \(402 chars\) is larger than 8 EiB"),
    "--max-never-freed of 400 digits GiB": (["check", "{run}", "--max-never-freed", BIG + "GiB"],
                                            r"--max-never-freed .* is larger than 8 EiB"),
    "--max-growth-per-step 1e3GiB": (["check", "{run}", "--max-growth-per-step", "1e3GiB"],
                                     r"--max-growth-per-step '1e3GiB' is not a size"),
    "--max-peak-increase of 400 digits %": (["check", "{run}", "--baseline", "{base}", "--max-peak-increase",
                                             BIG + "%"], r"--max-peak-increase .* is more than 1,000,000%"),
    "--max-peak-increase 9 EiB": (["check", "{run}", "--baseline", "{base}", "--max-peak-increase", "9EiB"],
                                  r"--max-peak-increase '9EiB' is neither a size nor a percentage"),
    "--max-memory of 400 digits": (["analyze", "{report}", "--max-memory", BIG], r"--max-memory .* larger than 8 EiB"),
    "--max-memory for batch": (["batch", "{run}", "-o", "{folder}/b", "--max-memory", BIG], r"larger than 8 EiB"),
    "--jobs of 400 digits": (["batch", "{run}", "-o", "{folder}/b", "-j", BIG],  # --dask local: that many workers
                             r"--jobs 9{20}\.\.\. is more than the 1024 analyses at once this machine can run"),
    "--spike-window of 400 digits": (["analyze", "{report}", "--spike-window", BIG + "ms"],
                                     r"--spike-window .* is longer than a day, the most it can be"),
    "--spike-window 0.1ns": (["analyze", "{report}", "--spike-window", "0.1ns"],
                             r"--spike-window '0\.1ns' is not a duration: it must be at least 1 ns"),
    "--spike-window nan": (["analyze", "{report}", "--spike-window", "nan"], r"--spike-window 'nan' is not a duration"),
    "--no-warnings misspelled": (["check", "{run}", "--no-warnings", "allocation_faild"],
                                 r"--no-warnings 'allocation_faild' is not a diagnostic code; did you mean "
                                 r"allocation_failed\?"),
    "--no-warnings numeric": (["check", "{run}", "--no-warnings", "5"], r"--no-warnings '5' is not a diagnostic code"),
    "--no-warnings one of two misspelled": (["check", "{run}", "--no-warnings", "allocation_failed,near_capacty"],
                                            r"'near_capacty' is not a diagnostic code; did you mean near_capacity"),
}


@pytest.mark.parametrize("case", sorted(OPTIONS))
def test_every_number_and_code_in_an_option_has_a_range_and_one_line(case, inputs, capsys):
    args, pattern = OPTIONS[case]
    one_line(*cli(capsys, *(a.format(**inputs) for a in args)), pattern)


CONFIGS = {  # case -> (pyproject.toml, the one line)
    "an array nested 100,000 deep": ("[tool.nsysan.check]\nmax-peak = " + "[" * 100_000 + "]" * 100_000 + "\n",
                                     r"pyproject\.toml could not be read \(nested too deeply\)"),
    "a misspelled code in no-warnings": ('[tool.nsysan.check]\nno-warnings = ["allocation_faild"]\n',
                                         r"'allocation_faild' is not a diagnostic code"),
    "a numeric code in no-warnings": ("[tool.nsysan.check]\nno-warnings = [5]\n", r"'5' is not a diagnostic code"),
    "a size of 400 digits": (f'[tool.nsysan.check]\nmax-peak = "{BIG}GiB"\n', r"larger than 8 EiB"),
    "a float size of 1e400 (inf)": ("[tool.nsysan.check]\nmax-never-freed = 1e400\n",
                                    r"max-never-freed = inf is a number without a unit"),
}


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_every_setting_in_pyproject_has_a_range_and_one_line(case, inputs, tmp_path, capsys, monkeypatch):
    text, pattern = CONFIGS[case]
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)  # the top of a repository: no config above it is read
    (project / "pyproject.toml").write_text(text)
    monkeypatch.chdir(project)
    one_line(*cli(capsys, "check", str(inputs["run"])), pattern)
    with pytest.raises(nsysan.NsysanError, match=pattern):
        nsysan.check(inputs["run"], config=project / "pyproject.toml")


# --- The Python API validates like the command line ----------------------------------------------

def test_the_api_refuses_what_the_command_refuses_with_the_same_line(inputs, capsys):
    run, report = inputs["run"], inputs["report"]
    same_line = {  # API call -> the command line that must say the same
        lambda: nsysan.check(run, max_peak=BIG): ["check", str(run), "--max-peak", BIG],
        lambda: nsysan.check(run, no_warnings=["allocation_faild"]): ["check", str(run), "--no-warnings",
                                                                       "allocation_faild"],
        lambda: nsysan.check(run, no_warnings="5"): ["check", str(run), "--no-warnings", "5"],
        lambda: nsysan.analyze(report, smi_tz="Mars/Olympus"): ["analyze", str(report), "--smi", str(inputs["smi"]),
                                                                "--smi-tz", "Mars/Olympus"],
        lambda: nsysan.analyze(report, max_memory=BIG): ["analyze", str(report), "--max-memory", BIG],
    }
    for call, args in same_line.items():
        with pytest.raises(nsysan.NsysanError) as raised:
            call()
        assert f"nsysan: {raised.value.message}" == one_line(*cli(capsys, *args), "")
    refused = {  # API values the command line can't even spell
        lambda: nsysan.check(run, max_peak=10**400): r"--max-peak '1000.* is larger than 8 EiB",
        lambda: nsysan.check(run, max_peak=-1): r"--max-peak '-1' is not a size",
        lambda: nsysan.check(run, no_warnings=[5]): r"'5' is not a diagnostic code",
        lambda: nsysan.analyze(report, smi_tz=5): r"--smi-tz 5 is not a time zone",
        lambda: nsysan.analyze(report, spike_window_ns=-1): r"spike_window_ns -1 is not a duration: it must be at "
                                                            r"least 1 ns",
        lambda: nsysan.analyze(report, spike_window_ns=0): r"spike_window_ns 0 is not a duration",
        lambda: nsysan.analyze(report, spike_window_ns=10**30): r"spike_window_ns .* is longer than a day",
        lambda: nsysan.analyze(report, spike_window_ns=True): r"spike_window_ns True is not a duration",
        lambda: nsysan.analyze(report, spike_window_ns=1.5): r"spike_window_ns 1\.5 is not a duration",
        lambda: nsysan.analyze(report, max_memory=-1): r"--max-memory -1 is negative",
        lambda: nsysan.analyze(report, max_memory=10**400): r"--max-memory .* is larger than 8 EiB",
    }
    for call, pattern in refused.items():
        with pytest.raises(nsysan.NsysanError, match=pattern):
            call()


def test_the_api_refuses_a_value_of_the_wrong_type_in_one_line(inputs):
    run, report = inputs["run"], inputs["report"]
    refused = {  # was a TypeError, an AttributeError, or (quick="no") silently true
        lambda: nsysan.analyze(None): r"^path None: give a path \(a str or a pathlib\.Path\)$",
        lambda: nsysan.load_analysis(5): r"^path 5: give a path",
        lambda: nsysan.compare(5, run): r"^run 5: give a path \(a str or a pathlib\.Path\) or an Analysis$",
        lambda: nsysan.analyze(report, smi=[5]): r"^smi 5: give a path",
        lambda: nsysan.analyze(report, smi=str(inputs["smi"]), smi_columns=[5]): r"^smi_columns: give the columns",
        lambda: nsysan.analyze(report, step_range=5): r"^--step-range 5 is not a regular expression",
        lambda: nsysan.analyze(report, quick="no"): r"^quick='no': use True or False$",
        lambda: nsysan.analyze(report, keep_events=1): r"^keep_events=1: use True or False$",
        lambda: nsysan.check(run, no_warnings=5): r"^--no-warnings 5: give diagnostic codes as a string",
        lambda: nsysan.check(run, config=inputs["folder"] / "fifo.toml"): r"fifo\.toml is a FIFO",
    }
    for call, pattern in refused.items():
        with pytest.raises(nsysan.NsysanError, match=pattern):
            call()


def test_a_misspelled_code_never_passes_the_gate_on_a_run_whose_allocation_failed(tmp_path):
    run = document(tmp_path, "real_oom_v25")  # one cudaMalloc failed: diagnostic allocation_failed
    assert nsysan.check(run, no_warnings=["allocation_failed"]).ok is False
    with pytest.raises(nsysan.NsysanError, match="did you mean allocation_failed"):
        nsysan.check(run, no_warnings=["allocation_faild"])


def test_one_smi_log_as_a_str_is_one_log(capsys):
    analysis = nsysan.analyze(FIXTURES / "torch_smi_v25.sqlite", smi=str(GPU_LOG))
    assert [log.name for log in analysis.smi.logs] == ["torch_smi_v25.smi-gpu.csv"]


# --- compare across capture kinds ----------------------------------------------------------------

@pytest.mark.parametrize("base,new,code,said", [
    ("known_plain_v25", "known_mem_v25", "sizes_missing",
     "known_plain_v25.sqlite (base) was captured without --cuda-memory-usage, so it has no sizes"),
    ("known_mem_v25", "known_plain_v25", "sizes_missing", "known_plain_v25.sqlite (new) was captured without"),
    ("known_mem_v25", "known_bt_v25", "stacks_differ", "only known_bt_v25.sqlite (new) has call stacks"),
    ("torch_clean_v25", "torch_expandable_v25", "allocators_differ",
     "the runs use different allocators (pytorch_caching → pytorch_expandable)"),
    ("torch_nonvtx_leak_v25", "torch_async_v25", "allocators_differ",  # PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
     "the runs use different allocators (pytorch_caching → cudaMallocAsync pool)"),
])
def test_compare_says_what_differs_in_the_captures_instead_of_vanished_and_appeared(base, new, code, said,
                                                                                       tmp_path, capsys):
    b, n = document(tmp_path, base), document(tmp_path, new)
    exit_code, out, err = cli(capsys, "compare", str(b), str(n), "--format", "json")
    assert exit_code == 0, err
    doc = json.loads(out)
    assert [note["code"] for note in doc["notes"]] == [code]
    assert said in doc["notes"][0]["message"] and said in doc["headline"]
    # The same allocations are never listed as sites that vanished and appeared (known_mem_v25 vs
    # known_bt_v25 listed 24 such rows; known_plain_v25 vs known_mem_v25 18 sites "grown from 0 B")
    assert doc["sites"] == [] and doc["identical"] is False
    if code == "sizes_missing":
        assert doc["ranges"] == []  # no range "grew from 0 B" either
        assert "top new site" not in doc["headline"] and "new: GPU 0" not in doc["headline"]
    api = nsysan.compare(analysis_of(base), analysis_of(new))
    assert [note.code for note in api.notes] == [code] and api.sites == []
    exit_code, out, err = cli(capsys, "compare", str(b), str(n))
    assert said in out.splitlines()[0]  # the first line of the terminal says it


def test_compare_of_a_quick_analysis_with_a_full_one_compares_no_site(tmp_path, capsys):
    quick = tmp_path / "quick.analysis.json"
    quick.write_text(render_json(nsysan.analyze(FIXTURES / "known_mem_v25.sqlite", quick=True)))
    full = document(tmp_path, "known_mem_v25")
    code, out, err = cli(capsys, "compare", str(quick), str(full), "--format", "json")
    doc = json.loads(out)
    # was: "same peak; top new site: cudaMalloc in burst [known] (+512.0 MiB)", every site "appeared"
    assert [n["code"] for n in doc["notes"]] == ["quick_analysis"] and doc["sites"] == [] and doc["ranges"] == []
    assert doc["headline"].startswith("same peak; known_mem_v25.sqlite (base) is a --quick analysis")


def test_the_compare_page_says_what_is_not_compared(tmp_path, capsys):
    plain, mem = document(tmp_path, "known_plain_v25"), document(tmp_path, "known_mem_v25")
    code, out, err = cli(capsys, "compare", str(plain), str(mem), "-o", str(tmp_path / "page"))
    assert code == 0, err
    page = (tmp_path / "page" / "compare.html").read_text()
    assert 'id="note-sizes_missing"' in page and "was captured without --cuda-memory-usage" in page
    assert json.loads((tmp_path / "page" / "compare.json").read_text())["notes"][0]["code"] == "sizes_missing"


def test_compare_of_captures_made_alike_has_no_note(tmp_path, capsys):
    comparison = nsysan.compare(analysis_of("torch_clean_v25"), analysis_of("torch_leak_v25"))
    assert comparison.notes == [] and any(s.status == "grew" for s in comparison.sites)


def test_check_against_a_baseline_without_sizes_is_not_measured(tmp_path, capsys):
    plain, mem = document(tmp_path, "known_plain_v25"), document(tmp_path, "known_mem_v25")
    code, out, err = cli(capsys, "check", str(mem), "--baseline", str(plain), "--max-peak-increase", "5%")
    assert code == 2 and "not measured" in out


# --- The diagnostic codes --no-warnings knows --------------------------------------------------------

def test_the_known_diagnostic_codes_are_the_documented_ones():
    from nsysan.model import DIAGNOSTIC_CODES

    doc = (ROOT / "docs" / "analyses.md").read_text()
    table = doc[doc.index("## Diagnostics"):]
    listed = set(re.findall(r"^\| `([a-z_0-9]+)` \|", table, flags=re.M))
    assert listed <= DIAGNOSTIC_CODES, listed - DIAGNOSTIC_CODES
    assert all(f"`{code}`" in doc for code in DIAGNOSTIC_CODES)
    for name in ("known_mem_v25", "known_bt_v25", "known_plain_v25", "real_oom_v25", "torch_leak_v25",
                 "torch_smi_v25", "jax_prealloc_v25"):
        raised = {d.code for d in analysis_of(name).diagnostics}
        assert raised <= DIAGNOSTIC_CODES, (name, raised - DIAGNOSTIC_CODES)
