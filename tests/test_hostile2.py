"""Hostile input, round two: outputs that are inputs, exports that are not the report's, SQLite
state beyond the main file, overflow, special files, failing outputs, terminal injection and
pathological sizes.

Every case builds its hostile input for real (a hard link, a FIFO, an sqlite3 connection holding
a lock, a write-ahead log left by a process that died) and runs the real command in a subprocess;
it checks the exit code, the one stderr line, the input's sha256 (and its folder's listing) before
and after, and that no raw control character reaches the terminal. docs/reliability.md lists each
class with its result.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import resource
import sqlite3
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Optional

import pytest
from conftest import FIXTURES, ROOT
from test_export import copying_nsys, exports_logged
from test_hostile import (MEM, MiB, assert_one_error_line, copy_fixture, corrupted_page, original, report_copy,
                          run_cli, same_memory_numbers, sha256, snapshot)

V22_SQLITE = FIXTURES / "known_mem_v22.sqlite"


def doc_of(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


# --- no output replaces an input -------------------------------------------------------------------


def _same_path(folder: Path, report: Path) -> list[str]:
    return ["--json", str(report)]


def _hard_link(folder: Path, report: Path) -> list[str]:
    os.link(report, folder / "analysis.json")
    return ["--json", str(folder / "analysis.json")]


def _symlink(folder: Path, report: Path) -> list[str]:
    (folder / "analysis.json").symlink_to(report.name)
    return ["--json", str(folder / "analysis.json")]


def _json_dir(folder: Path, report: Path) -> list[str]:
    os.link(report, folder / f"{report.name}.analysis.json")
    return ["--json-dir", str(folder)]


def _report_folder(folder: Path, report: Path) -> list[str]:
    (folder / "report").mkdir()
    os.link(report, folder / "report" / "timeline.png")
    return ["-o", str(folder / "report")]


def _relative_name(folder: Path, report: Path) -> list[str]:
    return ["--json", os.path.relpath(report, ROOT)]  # another spelling of the same path


OUTPUT_IS_INPUT = {"--json the input itself": _same_path, "--json a hard link of the input": _hard_link,
                   "--json a symlink to the input": _symlink, "--json-dir holding a hard link": _json_dir,
                   "-o folder holding a hard link": _report_folder, "--json a relative spelling": _relative_name}


@pytest.mark.parametrize("how", sorted(OUTPUT_IS_INPUT))
def test_no_output_replaces_an_input(tmp_path: Path, how: str) -> None:
    folder = tmp_path / "in"
    report = copy_fixture("known_mem_v25", folder, "run.sqlite")
    digest = sha256(report)
    args = OUTPUT_IS_INPUT[how](folder, report)
    before = snapshot(folder)

    result = run_cli("analyze", str(report), "--no-progress", *args)

    assert_one_error_line(result, r"refusing to write .*: it is the input .*run\.sqlite.*; choose another output path")
    assert sha256(report) == digest and snapshot(folder) == before


def test_the_sibling_export_of_a_report_is_an_input_too(tmp_path: Path) -> None:
    report = report_copy(tmp_path / "in")
    sibling = Path(shutil_copy(V22_SQLITE, report.with_suffix(".sqlite")))
    digest = sha256(sibling)
    result = run_cli("analyze", str(report), "--no-progress", "--json", str(sibling),
                     "--cache-dir", str(tmp_path / "cache"))
    assert_one_error_line(result, r"refusing to write .*known_mem_v22\.sqlite: it is the input")
    assert sha256(sibling) == digest


def test_json_dir_with_two_reports_of_one_name_is_refused(tmp_path: Path) -> None:
    first = copy_fixture("known_mem_v25", tmp_path / "a", "run.sqlite")
    second = copy_fixture("known_plain_v25", tmp_path / "b", "run.sqlite")
    result = run_cli("analyze", str(first), str(second), "--no-progress", "--json-dir", str(tmp_path / "out"))
    assert_one_error_line(result, r"several reports are named run\.sqlite; --json-dir writes "
                                  r"DIR/<report name>\.analysis\.json for each")
    assert not (tmp_path / "out").exists()


def test_json_inside_the_report_folder_is_the_same_document_so_both_are_written(tmp_path: Path) -> None:
    # Not a clash: -o's analysis.json and --json name one file, and both are the same document.
    out = tmp_path / "report"
    result = run_cli("analyze", "fixtures/known_mem_v25.sqlite", "--no-progress", "-o", str(out),
                     "--json", str(out / "analysis.json"))
    assert result.returncode == 0, result.stderr
    assert json.loads((out / "analysis.json").read_text())["peak"]["peak_bytes"] == 952_107_008


def shutil_copy(source: Path, target: Path) -> Path:
    import shutil

    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(source, target))


# --- a sibling export is used only when it is provably the report's --------------------------------


def _sibling(folder: Path, *statements: str) -> Path:
    """known_mem_v22.sqlite beside the report as known_mem_v22.sqlite, altered, newer than the report."""
    sibling = shutil_copy(V22_SQLITE, folder / "known_mem_v22.sqlite")
    with contextlib.closing(sqlite3.connect(sibling)) as conn:
        for statement in statements:
            conn.executescript(statement)
        conn.commit()
    return sibling


# Each is a newer known_mem_v22.sqlite beside known_mem_v22.nsys-rep whose numbers differ (every
# size doubled): a different capture saved under the same name, or an export of another report.
DOUBLED = f"UPDATE {MEM} SET bytes = bytes * 2;"
NOT_THE_REPORTS = {
    "another capture (started an hour later)": DOUBLED + "UPDATE TARGET_INFO_SESSION_START_TIME SET "
    "utcTime = '2026-11-29T19:10:59', localTime = '2026-11-29T19:10:59', utcEpochNs = utcEpochNs + 3600000000000;",
    "another input recorded": DOUBLED + "UPDATE EXPORT_META_DATA SET value = 'other.nsys-rep' "
                                        "WHERE name = 'EXPORT_INPUT_FILE';",
    "no capture start recorded": DOUBLED + "DROP TABLE TARGET_INFO_SESSION_START_TIME;",
    "exported by an nsys older than the report": DOUBLED + "UPDATE EXPORT_META_DATA SET value = '2021.5.1.77' "
                                                           "WHERE name = 'EXPORT_PRODUCT_VERSION';",
}


@pytest.mark.parametrize("how", sorted(NOT_THE_REPORTS))
def test_a_sibling_that_is_not_the_reports_export_is_not_used(tmp_path: Path, how: str) -> None:
    report = report_copy(tmp_path / "in")
    _sibling(tmp_path / "in", NOT_THE_REPORTS[how])
    before = snapshot(tmp_path / "in")
    log = tmp_path / "nsys.log"

    result = run_cli("analyze", str(report), "--format", "json", "--nsys", str(copying_nsys(tmp_path / "bin", log)),
                     "--cache-dir", str(tmp_path / "cache"))

    doc = doc_of(result)
    assert exports_logged(log) == 1 and doc["source"]["exported_with"] == "2022.4.2.1"
    assert doc["source"]["sibling_export"] is None
    assert doc["peak"]["peak_bytes"] == original("known_mem_v22")["peak"]["peak_bytes"]  # not doubled
    assert snapshot(tmp_path / "in") == before


def test_the_reports_own_sibling_is_used_and_the_output_says_so(tmp_path: Path) -> None:
    report = report_copy(tmp_path / "in")
    sibling = _sibling(tmp_path / "in")
    args = ["--nsys", str(tmp_path / "no-nsys-here"), "--cache-dir", str(tmp_path / "cache")]

    doc = doc_of(run_cli("analyze", str(report), "--format", "json", *args))
    text = run_cli("analyze", str(report), "--no-progress", *args, env={"COLUMNS": "200"})

    assert doc["source"]["sibling_export"] == str(sibling)
    (note,) = [d for d in doc["diagnostics"] if d["code"] == "sibling_export"]
    assert note["message"].startswith("read known_mem_v22.sqlite, the export of known_mem_v22.nsys-rep found beside it")
    assert text.returncode == 0 and "read known_mem_v22.sqlite, the export of" in text.stdout
    assert doc["peak"]["peak_bytes"] == original("known_mem_v22")["peak"]["peak_bytes"]


def test_a_damaged_sibling_falls_back_to_exporting_the_report(tmp_path: Path) -> None:
    report = report_copy(tmp_path / "in")
    # Its table list reads fine (so it looks complete); its memory table does not.
    corrupted_page("known_mem_v22", MEM)(tmp_path / "in")
    before = snapshot(tmp_path / "in")
    log = tmp_path / "nsys.log"

    result = run_cli("analyze", str(report), "--format", "json", "--nsys", str(copying_nsys(tmp_path / "bin", log)),
                     "--cache-dir", str(tmp_path / "cache"))

    doc = doc_of(result)
    assert result.stderr == "" and exports_logged(log) == 1 and doc["source"]["sibling_export"] is None
    (note,) = [d for d in doc["diagnostics"] if d["code"] == "sibling_export_damaged"]
    assert note["message"].startswith("known_mem_v22.sqlite, the export beside the report, could not be read")
    assert doc["peak"]["peak_bytes"] == original("known_mem_v22")["peak"]["peak_bytes"]
    assert snapshot(tmp_path / "in") == before


# --- SQLite state beyond the main file: the committed state, or one line -----------------------------

LEAK = 128 * MiB  # known_mem_v25's never-freed cudaMalloc, an allocation with no free


def die_after(path: Path, body: str) -> None:
    """Run `body` on an sqlite3 connection `conn` to `path` in a child process that then dies on
    the spot (os._exit): no checkpoint, no rollback, no cleanup — what a crashed writer leaves."""
    code = textwrap.dedent(f"""
        import os, sqlite3
        conn = sqlite3.connect({str(path)!r}, isolation_level=None)
        {body}
        os._exit(0)
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_committed_transactions_in_a_write_ahead_log_are_read(tmp_path: Path) -> None:
    report = copy_fixture("known_mem_v25", tmp_path / "in")
    # In WAL mode a commit goes to known_mem_v25.sqlite-wal; the main file still holds the leak.
    die_after(report, f"conn.execute('PRAGMA journal_mode=WAL'); conn.execute('DELETE FROM {MEM} WHERE bytes = {LEAK}')")
    assert Path(f"{report}-wal").stat().st_size > 32
    before = snapshot(tmp_path / "in")

    doc = doc_of(run_cli("analyze", str(report), "--format", "json", "--cache-dir", str(tmp_path / "cache")))

    leaked = [a["bytes"] for a in doc["never_freed"]]
    assert LEAK not in leaked and LEAK in [a["bytes"] for a in original("known_mem_v25")["never_freed"]]
    assert snapshot(tmp_path / "in") == before  # main file, -wal and -shm untouched
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]  # the private snapshot is gone


def test_a_hot_journal_is_rolled_back_in_a_private_copy_never_read_torn(tmp_path: Path) -> None:
    report = copy_fixture("known_mem_v25", tmp_path / "in")
    # A writer multiplies every size by 1000, then rewrites every string: its 2-page cache spills
    # the pages into the main file, and it dies before committing. The main file holds torn
    # pages, the journal the committed ones.
    die_after(report, f"conn.execute('PRAGMA cache_size=2'); conn.execute('BEGIN');"
                      f"conn.execute('UPDATE {MEM} SET bytes = bytes * 1000');"
                      "conn.execute('UPDATE StringIds SET value = value || randomblob(100)')")
    with contextlib.closing(sqlite3.connect(f"file:{report}?mode=ro&immutable=1", uri=True)) as torn:
        assert torn.execute(f"SELECT max(bytes) FROM {MEM}").fetchone()[0] == 512 * MiB * 1000  # really torn
    before = snapshot(tmp_path / "in")

    doc = doc_of(run_cli("analyze", str(report), "--format", "json", "--cache-dir", str(tmp_path / "cache")))

    same_memory_numbers()(doc)
    assert snapshot(tmp_path / "in") == before


@contextlib.contextmanager
def writer_holding_its_lock(path: Path, journal_mode: str):
    """A child process in the middle of a write transaction on `path` (its lock held) until the
    block ends; yields its pid. A child, not this process: closing any descriptor of the file
    here (reading it for a checksum) would drop this process's POSIX locks."""
    code = textwrap.dedent(f"""
        import sqlite3, sys
        conn = sqlite3.connect({str(path)!r}, isolation_level=None)
        conn.execute('PRAGMA journal_mode={journal_mode}')
        conn.execute('BEGIN IMMEDIATE')
        conn.execute('UPDATE {MEM} SET bytes = bytes * 1000')
        print('holding', flush=True)
        sys.stdin.readline()
        conn.execute('ROLLBACK')
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "holding"
        yield child.pid
    finally:
        child.communicate("done\n", timeout=60)


@pytest.mark.parametrize("journal_mode", ["DELETE", "WAL"])
def test_a_live_writer_is_refused_in_one_line(tmp_path: Path, journal_mode: str) -> None:
    report = copy_fixture("known_mem_v25", tmp_path / "in")
    with writer_holding_its_lock(report, journal_mode) as pid:
        before = snapshot(tmp_path / "in")

        result = run_cli("analyze", str(report), "--no-progress", "--cache-dir", str(tmp_path / "cache"))

        assert_one_error_line(result, rf"known_mem_v25\.sqlite is being written by another process \(pid {pid} "
                                      r"holds its write lock\).*; analyze it once that process has finished")
        assert snapshot(tmp_path / "in") == before


# --- special files: never opened for reading, never waited on ----------------------------------------


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _socket(path: Path) -> None:
    import socket

    with contextlib.closing(socket.socket(socket.AF_UNIX)) as sock:
        sock.bind(str(path))  # the socket file stays after the socket is closed


def _char_device(path: Path) -> None:
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # what /dev/null is
    except OSError as err:
        pytest.skip(f"cannot make a device node here ({err.strerror})")


SPECIAL_FILES = {"a FIFO": (_fifo, "a FIFO \\(named pipe\\)"), "a socket": (_socket, "a socket"),
                 "a character device": (_char_device, "a character device")}


@pytest.mark.parametrize("suffix", [".sqlite", ".nsys-rep"])
@pytest.mark.parametrize("kind", sorted(SPECIAL_FILES))
def test_a_special_file_as_input_is_named_not_opened(tmp_path: Path, kind: str, suffix: str) -> None:
    make, said = SPECIAL_FILES[kind]
    (tmp_path / "in").mkdir()
    path = tmp_path / "in" / f"run{suffix}"
    make(path)
    before = snapshot(tmp_path / "in")

    result = run_cli("analyze", str(path), "--no-progress", "--cache-dir", str(tmp_path / "cache"), timeout=60)

    assert_one_error_line(result, rf"run{re.escape(suffix)} is {said}, not a file; nsysan reads report files")
    assert snapshot(tmp_path / "in") == before


@pytest.mark.parametrize("where", ["sibling", "cache entry and its lock"])
def test_a_fifo_as_sibling_or_cache_entry_is_passed_by(tmp_path: Path, where: str) -> None:
    report = report_copy(tmp_path / "in")
    cache = tmp_path / "cache"
    log = tmp_path / "nsys.log"
    nsys = copying_nsys(tmp_path / "bin", log)
    if where == "sibling":
        os.mkfifo(report.with_suffix(".sqlite"))
    else:
        cache.mkdir()
        key = f"{hashlib.sha256(report.read_bytes()).hexdigest()}-nsys2022.4.2.1"  # export.py's cache key
        os.mkfifo(cache / f"{key}.sqlite")
        os.mkfifo(cache / f"{key}.lock")
    before = snapshot(tmp_path / "in")

    result = run_cli("analyze", str(report), "--format", "json", "--nsys", str(nsys), "--cache-dir", str(cache),
                     timeout=60)

    doc = doc_of(result)
    assert exports_logged(log) == 1 and doc["peak"]["peak_bytes"] == original("known_mem_v22")["peak"]["peak_bytes"]
    assert snapshot(tmp_path / "in") == before


# --- outputs that fail: one line and exit 2 (141 for a closed pipe), never half an output ---------------


def run_with(args: list[str], stdout=None, stderr=subprocess.PIPE, env: Optional[dict] = None,
             preexec_fn=None) -> subprocess.CompletedProcess:
    """`python -m nsysan ARGS` with stdout and stderr as given (a file, /dev/full, closed)."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("NSYSAN_DEBUG", "COLUMNS")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "nsysan", *args], stdout=stdout, stderr=stderr, cwd=ROOT,
                          env=full_env, timeout=300, preexec_fn=preexec_fn)


def stderr_line(result: subprocess.CompletedProcess) -> str:
    text = result.stderr.decode()
    assert "Traceback" not in text and "internal error" not in text, text
    lines = text.splitlines()
    assert len(lines) == 1 and lines[0].startswith("nsysan: "), text
    return lines[0]


GOOD = "fixtures/known_mem_v25.sqlite"


def test_a_closed_stdout_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = run_with(["analyze", GOOD, "--json", str(tmp_path / "a.json")], preexec_fn=lambda: os.close(1))
    assert result.returncode == 2
    assert stderr_line(result).startswith("nsysan: stdout is closed (the command was started with >&-)")
    assert not (tmp_path / "a.json").exists()


def test_a_closed_stderr_keeps_the_exit_codes_and_the_outputs_whole(tmp_path: Path) -> None:
    # Closed, stderr's descriptor would go to the next file nsysan opens: messages would land in it.
    bad = run_with(["analyze", "nowhere.sqlite"], stdout=subprocess.PIPE, preexec_fn=lambda: os.close(2))
    good = run_with(["analyze", GOOD, "--format", "json", "--json", str(tmp_path / "a.json")],
                    stdout=subprocess.PIPE, preexec_fn=lambda: os.close(2))
    assert bad.returncode == 2 and bad.stdout == b""
    assert good.returncode == 0
    assert json.loads(good.stdout) == json.loads((tmp_path / "a.json").read_text())


@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "PYTHONUNBUFFERED=1"])
@pytest.mark.parametrize("form", ["text", "json"])
def test_stdout_on_a_full_device_is_one_line_and_exit_2(form: str, unbuffered: bool) -> None:
    env = {"PYTHONUNBUFFERED": "1"} if unbuffered else {}
    with open("/dev/full", "wb") as full:
        result = run_with(["analyze", GOOD, "--format", form], stdout=full, env=env)
    assert result.returncode == 2
    assert stderr_line(result) == "nsysan: could not write to stdout (No space left on device); the output is incomplete"


def test_stdout_into_a_file_that_cannot_grow_is_one_line_and_exit_2(tmp_path: Path) -> None:
    # RLIMIT_FSIZE: every write past 4 KiB fails (EFBIG), as on a full disk; the JSON is ~60 KiB.
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    with open(tmp_path / "out.json", "wb") as out:
        result = run_with(["analyze", GOOD, "--format", "json"], stdout=out, preexec_fn=limit,
                          env={"PYTHONUNBUFFERED": "1"})
    assert result.returncode == 2
    assert stderr_line(result) == "nsysan: could not write to stdout (File too large); the output is incomplete"


def test_an_error_with_stderr_on_a_full_device_still_exits_2() -> None:
    with open("/dev/full", "wb") as full:
        result = run_with(["analyze", "nowhere.sqlite"], stdout=subprocess.PIPE, stderr=full)
    assert result.returncode == 2 and result.stdout == b""


def test_unbuffered_json_through_a_pipe_is_whole() -> None:
    result = run_with(["analyze", GOOD, "--format", "json"], stdout=subprocess.PIPE, env={"PYTHONUNBUFFERED": "1"})
    assert result.returncode == 0 and json.loads(result.stdout)["peak"]["peak_bytes"] == 952_107_008


# --- environments: odd names, consoles and values of nsysan's own variables -------------------------


@pytest.mark.parametrize("value", ["inf", "1e300", "-5", "0"])
def test_odd_export_timeouts_mean_no_limit(tmp_path: Path, value: str) -> None:
    report = report_copy(tmp_path / "in")
    nsys = copying_nsys(tmp_path / "bin", tmp_path / "nsys.log")
    result = run_cli("analyze", str(report), "--format", "json", "--nsys", str(nsys),
                     "--cache-dir", str(tmp_path / "cache"), env={"NSYSAN_EXPORT_TIMEOUT": value})
    assert doc_of(result)["source"]["exported_with"] == "2022.4.2.1" and result.stderr == ""


def test_a_timeout_that_is_no_number_is_one_line(tmp_path: Path) -> None:
    report = report_copy(tmp_path / "in")
    result = run_cli("analyze", str(report), "--nsys", str(copying_nsys(tmp_path / "bin", tmp_path / "log")),
                     "--cache-dir", str(tmp_path / "cache"), env={"NSYSAN_EXPORT_TIMEOUT": "nan"})
    assert_one_error_line(result, r"NSYSAN_EXPORT_TIMEOUT='nan' is not a number of seconds")


def test_a_relative_xdg_cache_home_is_ignored(tmp_path: Path) -> None:
    report = report_copy(tmp_path / "in")
    nsys = copying_nsys(tmp_path / "bin", tmp_path / "nsys.log")
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("NSYSAN_CACHE_DIR", "NSYSAN_DEBUG")}
    env.update(XDG_CACHE_HOME="relative-cache", HOME=str(tmp_path / "home"), PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-m", "nsysan", "analyze", str(report), "--no-progress",
                             "--nsys", str(nsys)], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert list(work.iterdir()) == []  # nothing relative to the working folder
    assert len(list((tmp_path / "home" / ".cache" / "nsysan").glob("*.sqlite"))) == 1  # the XDG default


def test_a_file_name_that_is_not_utf8_is_shown_with_escapes_and_kept_apart(tmp_path: Path) -> None:
    folder = os.fsencode(tmp_path)
    name = b"run\xff\xfe.sqlite"
    shutil_copy(FIXTURES / "known_mem_v25.sqlite", Path(os.fsdecode(folder + b"/" + name)))
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "nsysan", "analyze", folder + b"/" + name, "--no-progress",
                             "-o", str(out)], cwd=ROOT, capture_output=True, timeout=300)
    assert result.returncode == 0 and result.stderr == b"", result.stderr
    text = result.stdout.decode("utf-8")  # the terminal gets valid UTF-8
    assert "nsysan · run\ufffd\ufffd.sqlite" in text
    doc = json.loads((out / "analysis.json").read_text(encoding="utf-8"))
    assert doc["source"]["name"] == "run\ufffd\ufffd.sqlite" and doc["peak"]["peak_bytes"] == 952_107_008
    assert "run\ufffd\ufffd.sqlite" in (out / "report.html").read_text(encoding="utf-8")


def test_an_ascii_console_gets_escapes_not_a_crash(tmp_path: Path) -> None:
    report = copy_fixture("known_mem_v25", tmp_path / "in", "café.sqlite")
    with contextlib.closing(sqlite3.connect(report)) as conn:
        conn.execute("UPDATE PROCESSES SET name = '/tmp/步骤☃' WHERE name = '/tmp/known'")
        conn.commit()
    result = run_cli("analyze", str(report), "--no-progress", env={"PYTHONIOENCODING": "ascii", "LANG": "C",
                                                                 "LC_ALL": "C"})
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert result.stdout.isascii() and "/tmp/\\u6b65\\u9aa4\\u2603" in result.stdout


def test_a_huge_columns_value_does_not_blow_up_the_summary() -> None:
    result = run_cli("analyze", GOOD, "--no-progress", env={"COLUMNS": "1000000000"})
    assert result.returncode == 0 and len(result.stdout) < 100_000


# --- terminal injection: every string that reaches the terminal is inert ----------------------------

HOSTILE_FILE = "run\x1b[2J\x07[reverse]7:fire:\u202e.sqlite"


def assert_inert(text: str) -> None:
    assert "\x1b[2J" not in text and "\x07" not in text and "\u202e" not in text and "\U0001f525" not in text
    assert "[reverse]7:fire:" in text  # markup and emoji codes stay literal
    assert "\\x1b[2J\\x07[reverse]7:fire:\\u202e" in text  # control characters shown as escapes


def test_a_hostile_file_name_is_inert_in_the_summary_the_report_line_and_errors(tmp_path: Path) -> None:
    report = copy_fixture("known_mem_v25", tmp_path / "in", HOSTILE_FILE)
    out = tmp_path / f"out\x1b]0;PWNED\x07[bold]:fire:"
    result = run_cli("analyze", str(report), "--no-progress", "-o", str(out), env={"COLUMNS": "250"})
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert_inert(result.stdout)
    (report_line,) = [line for line in result.stdout.splitlines() if line.startswith("Report: ")]
    assert "\\x1b]0;PWNED\\x07[bold]:fire:" in report_line and "\x1b" not in report_line

    missing = run_cli("analyze", str(tmp_path / "in" / ("missing-" + HOSTILE_FILE)))
    assert_inert(assert_one_error_line(missing, r"no such file"))


def test_a_hostile_file_name_is_inert_in_the_progress_bar(tmp_path: Path) -> None:
    import pty

    report = copy_fixture("known_mem_v25", tmp_path / "in", HOSTILE_FILE)
    leader, follower = pty.openpty()  # stderr a terminal: the progress bar is drawn
    try:
        result = subprocess.run([sys.executable, "-m", "nsysan", "analyze", str(report), "--format", "json"],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=follower, timeout=300,
                                env={**os.environ, "TERM": "xterm", "COLUMNS": "200"})
        os.close(follower)
        drawn = b""
        with contextlib.suppress(OSError):
            while chunk := os.read(leader, 65536):
                drawn += chunk
    finally:
        os.close(leader)
    assert result.returncode == 0
    text = drawn.decode("utf-8", "replace")
    assert "run\\x1b[2J\\x07[reverse]7:fire:" in text  # the bar was drawn, with the name inert
    assert "\x1b[2J" not in text and "\x07" not in text and "\U0001f525" not in text


# --- pathological sizes: bounded output, bounded time --------------------------------------------------


def _long_names(folder: Path) -> Path:
    report = copy_fixture("known_mem_v25", folder, "long.sqlite")
    with contextlib.closing(sqlite3.connect(report)) as conn:
        conn.execute("UPDATE PROCESSES SET name = ? WHERE name = '/tmp/known'", ("/tmp/" + "x" * 10_000_000,))
        conn.execute("UPDATE TARGET_INFO_GPU SET name = ?", ("H200 " + "y" * 10_000_000,))
        conn.commit()
    return report


def test_ten_megabyte_names_are_cut_for_the_terminal_and_the_json(tmp_path: Path) -> None:
    report = _long_names(tmp_path / "in")
    out = tmp_path / "out"
    result = run_cli("analyze", str(report), "--no-progress", "-o", str(out), timeout=120)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert len(result.stdout) < 50_000  # was 21 MB and 82 s
    assert "/tmp/xxxx" in result.stdout and result.stdout.count("x") < 400  # the name cut at 200 characters
    doc = json.loads((out / "analysis.json").read_text())
    gpu = doc["capture"]["gpus"][0]["name"]
    assert len(gpu) == 4096 and gpu.startswith("H200 yyy") and gpu.endswith("… (cut from 10000005 characters)")
    assert all(len(p["name"]) <= 4096 for p in doc["capture"]["processes"])  # the JSON keeps at most 4 KiB
    assert re.match(r"\d+ strings from the profile .* were longer than 4096 characters", message_of(doc, "long_strings"))
    assert doc["peak"]["peak_bytes"] == 952_107_008 and (out / "analysis.json").stat().st_size < 100_000


def message_of(doc: dict, code: str) -> str:
    (text,) = [d["message"] for d in doc["diagnostics"] if d["code"] == code]
    return text


def _many(folder: Path, processes: int = 1, devices: int = 1) -> Path:
    """known_mem_v25 with its memory events copied to `processes` more processes (the first six
    events each) or `devices` - 1 more devices (all of them), at fresh addresses."""
    report = copy_fixture("known_mem_v25", folder, "many.sqlite")
    with contextlib.closing(sqlite3.connect(report)) as conn:
        columns = [r[1] for r in conn.execute(f"PRAGMA table_info({MEM})")]
        rows = conn.execute(f"SELECT * FROM {MEM} ORDER BY start").fetchall()
        pid_at, device_at, address_at = (columns.index(c) for c in ("globalPid", "deviceId", "address"))
        copies = []
        for p in range(1, processes):
            for row in rows[:6]:
                row = list(row)
                row[pid_at] = (row[pid_at] & ~(0xFFFFFF << 24)) | ((2000 + p) << 24)
                row[address_at] += p << 32
                copies.append(row)
        for d in range(1, devices):
            for row in rows:
                row = list(row)
                row[device_at], row[address_at] = d, row[address_at] + (d << 36)
                copies.append(row)
        conn.executemany(f"INSERT INTO {MEM} VALUES ({', '.join('?' * len(columns))})", copies)
        conn.commit()
    return report


@pytest.mark.parametrize("processes, devices", [(5_000, 1), (1, 200)], ids=["5,000 processes", "200 devices"])
def test_thousands_of_processes_or_hundreds_of_devices_stay_bounded(tmp_path: Path, processes: int,
                                                                     devices: int) -> None:
    report = _many(tmp_path / "in", processes, devices)
    out = tmp_path / "out"
    result = run_cli("analyze", str(report), "--no-progress", "-o", str(out), timeout=240)  # was > 600 s, 116 s
    assert result.returncode == 0 and result.stderr == "", result.stderr  # no library warning either
    doc = json.loads((out / "analysis.json").read_text())
    assert len(doc["groups"]) >= max(processes, devices)  # the JSON keeps every one
    assert len(result.stdout.splitlines()) < 400
    assert re.search(r"… and \d+ more, with smaller peaks \(see --format json\)", result.stdout)
    if processes > 1:
        assert "… and 4980 more processes, with smaller peaks (see --format json)" in result.stdout
    from PIL import Image

    from nsysan.render.png import DPI, MAX_PANELS, PANEL_HEIGHT_IN

    with Image.open(out / "timeline.png") as png:  # one panel per GPU up to 8, not 1200 x 78000 px
        assert png.size[1] <= (MAX_PANELS * PANEL_HEIGHT_IN + 0.3) * DPI
