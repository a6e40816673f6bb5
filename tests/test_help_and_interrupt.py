"""The command as a person at a terminal meets it: --help at 80 columns, -h, shell completion,
--version without the analysis stack, and Ctrl-C at any moment."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT

from nsysan.cli import command

COMMANDS = sorted(command().commands)  # type: ignore[attr-defined]


def nsysan(*args: str, columns: int = 80, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nsysan", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "COLUMNS": str(columns), **env}, timeout=120)


@pytest.mark.parametrize("name", ["", *COMMANDS])
def test_help_reads_at_80_columns(name):
    args = (name,) if name else ()
    result = nsysan(*args, "--help")
    assert result.returncode == 0 and result.stderr == ""
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    # each option's text starts at most 36 columns in, so it has 44 columns and more to say itself
    starts = [m.start(2) for line in lines if (m := re.match(r"^  (-\S.*?\s{2,})(\S)", line))]
    assert starts and max(starts) <= 36, starts
    # the examples are a user's files, not the project's fixtures
    assert "fixtures/" not in result.stdout
    # one style of metavar: FILE, DIR, N, choices in brackets; none of typer's <path> or <int range>
    assert not re.search(r"<(str|path|int|int range|float)>", result.stdout)
    assert "-h, --help" in result.stdout
    if name:
        assert nsysan(name, "-h").stdout == result.stdout


def test_choices_and_values_are_named_in_help():
    out = nsysan("analyze", "--help").stdout
    assert re.search(r"-f, --format \[text\|json\]", out) and "--json FILE" in out and "-o, --output DIR" in out
    assert "--top N" in out and "--max-memory SIZE" in out
    assert "--per [process|gpu|all]" in nsysan("check", "--help").stdout


def test_shell_completion_can_be_installed():
    top = nsysan("--help").stdout
    assert "--install-completion" in top and "--show-completion" in top
    # --show-completion takes no value: typer asks shellingham which shell runs nsysan, from the
    # process's parents, and prints "Shell  not supported." when none is a shell (pytest started
    # without one above it: a background job). Its test switch makes the shell an argument.
    shown = nsysan("--show-completion", "bash", _TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION="1")
    script = shown.stdout
    assert "_nsysan_completion" in script and "complete " in script, (shown.returncode, shown.stderr)
    # and it completes: "nsysan an<TAB>" is "analyze"
    done = nsysan(_NSYSAN_COMPLETE="complete_bash", COMP_WORDS="nsysan an", COMP_CWORD="1")
    assert done.stdout.split() == ["analyze"]


def test_version_answers_without_the_analysis_stack():
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "nsysan", "--version"], capture_output=True,
                            text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0 and result.stdout == "nsysan 0.1.0\n"
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import")}
    assert "nsysan.cli" in imported  # the whole CLI was built ...
    # ... and nothing it analyzes with
    assert {"pandas", "numpy", "pyarrow", "nsysan.pipeline.stages"} & imported == set()


@pytest.mark.parametrize("delay", [0.0, 0.02, 0.1, 0.3, 0.8])
def test_ctrl_c_at_any_moment_is_one_line_and_exit_130(delay):
    """A real SIGINT at moments from nsysan's first module on: while it imports typer, rich and
    pandas, reads the export, analyzes, prints. (Before that the Python interpreter itself is
    starting, and an interrupt there is Python's to report.) -X importtime says, on stderr, when
    nsysan's first module has loaded."""
    process = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "nsysan", "analyze",
                                "fixtures/torch_leak_v25.sqlite", "--no-progress"], cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               # analyzed each time: an analysis from the cache ends so soon after the
                               # imports that, on a loaded machine, it was over before this test had read
                               # the line that says they began
                               env={**os.environ, "NSYSAN_ANALYSIS_CACHE": "0"})
    assert process.stderr is not None
    seen = []
    for line in process.stderr:  # wait for nsysan's own first module
        seen.append(line)
        if line.rstrip().endswith("nsysan.runtime.interrupt"):
            break
    time.sleep(delay)
    finished_before = process.poll() is not None
    process.send_signal(signal.SIGINT)
    rest = process.stderr.read()
    process.wait(timeout=120)
    said = [line for line in rest.splitlines() if line.strip() and not line.startswith("import time:")]
    assert "Traceback" not in rest and "KeyboardInterrupt" not in rest, rest
    if process.returncode == 0:  # it was done before the signal came (a fast machine), never one it ignored
        assert finished_before, "the interrupt was ignored"
        return
    assert process.returncode == 130, rest
    assert said == ["nsysan: interrupted"], said


def test_the_library_keeps_pythons_own_interrupt_handling():
    # imported by a program, nsysan leaves sys.excepthook alone
    code = "import sys, nsysan; print(sys.excepthook is sys.__excepthook__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120).stdout
    assert out == "True\n"
