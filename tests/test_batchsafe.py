"""Hostile input, round three, for `batch`: its database, its inputs, and how it stops.

Most cases run the real command in this process (`nsysan.cli.main`) on analysis documents of the
fixtures (read back, not re-analyzed, so a batch takes a fraction of a second) and check the exit
code, the one stderr line and what the database holds. Signals need a real process: those tests
start `python -m nsysan batch`, signal it, and check that no process it started outlives it.
docs/reliability.md ("Batches") lists each case with its test.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import threading
from pathlib import Path

import pytest
from conftest import FIXTURES, analysis_of
from test_html import chromium  # noqa: F401 (the fixture)
from test_documents import cli

from nsysan.batch import database as batch_database
from nsysan.batch.database import ResultsDatabase, database_rows
from nsysan.render.json import render_json

MiB = 1 << 20
KNOWN_PEAK = (256 + 128 + 12 + 512) * MiB  # known_allocs.cu: live when the 512 MiB burst comes (README)


def one_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def documents(tmp_path_factory) -> Path:
    """Two analysis documents of real fixtures: inputs a batch reads back in milliseconds."""
    folder = tmp_path_factory.mktemp("documents")
    for name in ("known_mem_v25", "real_oom_v25"):
        (folder / f"{name}.analysis.json").write_text(render_json(analysis_of(name)))
    return folder


def batch(capsys, documents: Path, out: Path, *more: str) -> tuple[int, str, str]:
    return cli(capsys, "batch", str(documents), "-o", str(out), "-j", "1", "--no-progress", *more)


def reports_in(db: Path) -> list[tuple[str, int]]:
    with sqlite3.connect(db) as conn:
        return sorted(conn.execute("select name, peak_bytes from reports").fetchall())


EXPECTED = [("known_mem_v25.analysis.json", KNOWN_PEAK),
            ("real_oom_v25.analysis.json", analysis_of("real_oom_v25").peak.peak_bytes)]


# --- the database -----------------------------------------------------------------------------------


def _conflicting_reports(db: Path) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute("create table reports (x int)")


def _conflicting_groups(db: Path) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute("create table reports (report_hash text primary key)")
        conn.execute("create table groups (a text primary key, b)")


def _damaged_page(db: Path) -> None:
    """A real nsysan.db whose `reports` table's root page is overwritten."""
    _made_by_a_batch(db)
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        root = conn.execute("select rootpage from sqlite_master where name = 'reports'").fetchone()[0]
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    with open(db, "r+b") as handle:
        handle.seek((root - 1) * page_size)
        handle.write(b"\xff" * page_size)


def _made_by_a_batch(db: Path) -> None:
    database = ResultsDatabase(db)
    database.add({"path": "earlier.sqlite", "ok": False, "hash": None, "error": "earlier"}, None)
    database.close()


def _fifo(db: Path) -> None:
    os.mkfifo(db)


def _folder(db: Path) -> None:
    db.mkdir()


def _export(db: Path) -> None:
    db.write_bytes((FIXTURES / "known_mem_v25.sqlite").read_bytes())


def _text_file(db: Path) -> None:
    db.write_text("notes, not a database\n")


BAD_DATABASES = {
    "a reports table without report_hash": (_conflicting_reports, r"has a reports table that nsysan did not make "
                                            r"\(keyed by rowid, not report_hash\); give --db a new file"),
    "a groups table keyed otherwise": (_conflicting_groups, r"has a groups table that nsysan did not make \(keyed "
                                       r"by a, not report_hash, pid, device, kind\)"),
    "a damaged page": (_damaged_page, r"is damaged \(SQLite: .*\) and is never written into: move it aside .*"
                                      r"sqlite3 .*history\.db \.recover"),
    "a FIFO": (_fifo, r"history\.db is not a regular file; give --db a new file"),
    "a folder": (_folder, r"history\.db is not a regular file"),
    "an nsys export": (_export, r"history\.db is not an nsysan database \(no reports table\) and is never written"),
    "a text file": (_text_file, r"history\.db is not an nsysan database"),
}


@pytest.mark.parametrize("case", sorted(BAD_DATABASES))
def test_a_database_that_cannot_be_used_is_one_line_and_exit_2(case, documents, tmp_path, capsys):
    import re

    make, pattern = BAD_DATABASES[case]
    db = tmp_path / "history.db"
    make(db)
    before = sha256(db) if db.is_file() else None
    code, out, err = batch(capsys, documents, tmp_path / "out", "--db", str(db))
    assert code == 2 and re.search(pattern, one_line(err)), err
    assert (sha256(db) if db.is_file() else None) == before  # never written into
    assert not (tmp_path / "out" / "analyses").exists()  # refused before any analysis


def _chattr(path: Path, flag: str) -> bool:
    return subprocess.run(["chattr", flag, str(path)], capture_output=True).returncode == 0


@pytest.fixture
def unwritable():
    """Makes a path unwritable for this process: immutable (`chattr +i`) where it may (root: modes
    stop nothing), else mode 0444/0555; undone at the end."""
    undo = []

    def make(path: Path) -> None:
        if _chattr(path, "+i"):
            undo.append(lambda: _chattr(path, "-i"))
        elif os.geteuid() != 0:
            mode = path.stat().st_mode
            path.chmod(0o555 if path.is_dir() else 0o444)
            undo.append(lambda: path.chmod(mode))
        else:
            pytest.skip("root on a file system without chattr +i: nothing makes a file read-only")
    yield make
    for step in reversed(undo):
        step()


def test_a_read_only_database_is_named_as_such(documents, tmp_path, capsys, unwritable):
    db = tmp_path / "history.db"
    assert batch(capsys, documents, tmp_path / "first", "--db", str(db))[0] == 0
    before = sha256(db)
    unwritable(db)
    code, _, err = batch(capsys, documents, tmp_path / "out", "--db", str(db))
    assert code == 2 and one_line(err) == (f"nsysan: {db} can't be written (attempt to write a readonly database); "
                                           "give --db a file you may write, or copy this one where you may")
    assert sha256(db) == before


def test_a_read_only_wal_database_is_not_called_another_programs(documents, tmp_path, capsys, unwritable):
    """A database in WAL mode in a folder nobody may write: SQLite can't make its -shm, so even a
    read-only open fails; it is nsysan's, and the line says why it can't be used."""
    folder = tmp_path / "ro"
    folder.mkdir()
    db = folder / "history.db"
    assert batch(capsys, documents, tmp_path / "first", "--db", str(db))[0] == 0
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    for extra in folder.glob("history.db-*"):
        extra.unlink()
    unwritable(db)
    unwritable(folder)
    code, _, err = batch(capsys, documents, tmp_path / "out", "--db", str(db))
    line = one_line(err)
    assert code == 2 and "not an nsysan database" not in line
    assert line.startswith(f"nsysan: {db} ") and ("can't be written" in line or "could not be opened for writing" in line)


def test_a_write_lock_held_elsewhere_is_waited_for_then_named(documents, tmp_path, capsys, monkeypatch):
    db = tmp_path / "history.db"
    assert batch(capsys, documents, tmp_path / "first", "--db", str(db))[0] == 0
    monkeypatch.setattr(batch_database, "LOCK_TIMEOUT_S", 0.3)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process's write: a second connection's lock is the same
    try:
        code, _, err = batch(capsys, documents, tmp_path / "out", "--db", str(db))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert code == 2 and one_line(err) == (f"nsysan: {db} is locked by another process (waited 0.3 s to write); "
                                           "let the other batch finish, or give --db another file")
    code, _, _ = batch(capsys, documents, tmp_path / "again", "--db", str(db))  # released: the batch runs
    assert code == 0 and reports_in(db) == EXPECTED


def test_two_batches_appending_to_one_new_database_at_once_both_land(tmp_path):
    """Two writers open one new file at the same moment and add reports turn about: each open
    makes or checks the tables inside a write transaction, so neither finds the other's table
    half-made, and every report lands once."""
    db = tmp_path / "history.db"
    names = ("known_mem_v25", "real_oom_v25")
    rows = {(name, i): database_rows(f"{name}-{i}", analysis_of(name), name) for name in names for i in range(20)}
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def writer(name: str) -> None:
        try:
            start.wait()
            database = ResultsDatabase(db, tags=[name])
            for i in range(20):
                path = f"{name}-{i}.sqlite"
                database.add({"path": path, "ok": True, "hash": f"{name}-{i}", "tables": rows[name, i]}, None)
            database.close()
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=writer, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    with sqlite3.connect(db) as conn:
        assert conn.execute("select tag, count(*) from reports group by tag order by tag").fetchall() == \
            [("known_mem_v25", 20), ("real_oom_v25", 20)]
        groups = len(analysis_of("known_mem_v25").groups) + len(analysis_of("real_oom_v25").groups)
        assert conn.execute("select count(*) from groups").fetchone() == (20 * groups,)
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


@pytest.mark.slow  # two commands' start-up: 3-5 s
def test_two_batch_commands_appending_to_one_new_database_at_once(many_documents, documents, tmp_path):
    """The same as two real `nsysan batch` processes started together, each with its own folder
    of documents, both appending to one --db that does not exist yet."""
    import sys

    from conftest import ROOT

    db = tmp_path / "history.db"
    procs = [subprocess.Popen([sys.executable, "-m", "nsysan", "batch", str(folder), "-o", str(tmp_path / f"out{i}"),
                               "--db", str(db), "-j", "1", "--no-progress", "--tag", f"run{i}"],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))
             for i, folder in enumerate((many_documents, documents))]
    results = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], results
    with sqlite3.connect(db) as conn:
        # run00.analysis.json has the bytes of known_mem_v25.analysis.json: one report (keyed by
        # content), tagged by whichever batch wrote it last; 12 + 2 - 1 reports in all
        assert conn.execute("select count(*), count(distinct report_hash) from reports").fetchone() == (13, 13)
        tags = dict(conn.execute("select tag, count(*) from reports group by tag").fetchall())
        assert tags in ({"run0": 12, "run1": 1}, {"run0": 11, "run1": 2})
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_a_batch_that_failed_leaves_a_database_the_next_one_uses(documents, tmp_path, capsys, monkeypatch):
    """An unreachable Dask scheduler stops the batch after nsysan.db was opened: the next batch
    into the same folder must not call it "not an nsysan database"."""
    pytest.importorskip("distributed")
    from nsysan.batch import engines

    monkeypatch.setattr(engines, "DASK_CONNECT_TIMEOUT", "0.5s")
    out = tmp_path / "out"
    code, _, err = batch(capsys, documents, out, "--dask", "tcp://127.0.0.1:9")
    assert code == 2 and one_line(err).startswith("nsysan: could not reach the Dask scheduler at tcp://127.0.0.1:9")
    code, out_text, err = batch(capsys, documents, out)
    assert code == 0, err
    assert reports_in(out / "nsysan.db") == EXPECTED


def test_a_half_made_database_of_an_older_nsysan_is_used(documents, tmp_path, capsys):
    """What a failed batch of an older nsysan left: a file holding only the `steps` table."""
    db = tmp_path / "history.db"
    with sqlite3.connect(db) as conn:
        conn.execute("create table steps (report_hash text, pid int, device int, step int, "
                     "primary key (report_hash, pid, device, step))")
    code, _, err = batch(capsys, documents, tmp_path / "out", "--db", str(db))
    assert code == 0, err
    assert reports_in(db) == EXPECTED


def test_a_rerun_replaces_rows_in_one_transaction(documents, tmp_path, capsys):
    db = tmp_path / "history.db"
    for _ in range(2):
        assert batch(capsys, documents, tmp_path / "out", "--db", str(db))[0] == 0
    assert reports_in(db) == EXPECTED
    with sqlite3.connect(db) as conn:
        assert conn.execute("select count(*) from groups").fetchone() == \
            (len(analysis_of("known_mem_v25").groups) + len(analysis_of("real_oom_v25").groups),)


# --- stopping: real signals, no process left, a consistent database ----------------------------------


def _session_processes(sid: int) -> list:
    """Every live process of session `sid` (the batch was started in a new session, so its fork
    servers, workers and their helpers are exactly these), zombies aside."""
    import psutil

    found = []
    for process in psutil.process_iter(["pid", "status"]):
        try:
            if os.getsid(process.pid) == sid and process.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(process)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return found


@pytest.fixture(scope="module")
def many_documents(tmp_path_factory) -> Path:
    """12 analysis documents with distinct bytes (so 12 reports in nsysan.db): read back in
    milliseconds each, so a batch of them spends its time keeping results."""
    folder = tmp_path_factory.mktemp("many")
    text = render_json(analysis_of("known_mem_v25"))
    for i in range(12):
        (folder / f"run{i:02d}.analysis.json").write_text(text + " " * i)
    return folder


def _wait_for(condition, proc, seconds: float = 60) -> None:
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None and not condition():
        time.sleep(0.02)


def _rows(db: Path) -> int:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
            return conn.execute("select count(*) from reports").fetchone()[0]
    except sqlite3.Error:
        return 0


MOMENTS = {
    # the first process the batch starts exists: a fork server importing nsysan, Dask starting
    "start-up": lambda proc, out: _wait_for(lambda: len(_session_processes(proc.pid)) >= 2, proc),
    # the workers exist (fork server and pool, or Dask's nannies and workers)
    "workers running": lambda proc, out: _wait_for(lambda: len(_session_processes(proc.pid)) >= 4, proc),
    # reports are being kept: documents written, rows going into nsysan.db
    "writing the database": lambda proc, out: _wait_for(lambda: _rows(out / "nsysan.db") >= 1, proc),
}
# (engine, signal, moment, sent to): "group" is a terminal's Ctrl-C (every process of the
# foreground group gets it), "batch" a CI runner's signal to the command alone. Dask's take 7-10 s
# on 2 busy cores (a LocalCluster's start and stop), so they are marked slow.
_DASK = pytest.mark.slow
# SIGHUP: the terminal closed; SIGKILL: nothing of the batch runs, the kernel ends its fork
# servers and workers (PR_SET_PDEATHSIG) and SQLite's journal keeps nsysan.db whole.
STOPS = [("pool", "SIGINT", m, "batch") for m in MOMENTS] + [("pool", "SIGINT", "workers running", "group"),
                                                             ("pool", "SIGTERM", "writing the database", "batch"),
                                                             ("pool", "SIGHUP", "writing the database", "batch"),
                                                             ("pool", "SIGKILL", "workers running", "batch")] + \
        [pytest.param("dask", "SIGINT", m, "batch", marks=_DASK) for m in MOMENTS] + \
        [pytest.param("dask", "SIGINT", "workers running", "group", marks=_DASK),
         pytest.param("dask", "SIGTERM", "workers running", "batch", marks=_DASK),
         pytest.param("dask", "SIGKILL", "workers running", "batch", marks=_DASK)]


@pytest.mark.parametrize("engine,signame,moment,to", STOPS)
def test_a_stopped_batch_leaves_no_process_and_a_database_a_rerun_completes(engine, signame, moment, to,
                                                                           many_documents, tmp_path, capsys):
    import signal
    import sys
    import time

    from conftest import ROOT

    if engine == "dask":
        pytest.importorskip("distributed")
    out = tmp_path / "out"
    command = [sys.executable, "-m", "nsysan", "batch", str(many_documents), "-o", str(out), "-j", "2",
               "--no-progress", *(["--dask", "local"] if engine == "dask" else [])]
    # stdout and stderr are pipes, as in `nsysan batch ... | cat`: communicate() returns only when
    # every process holding them has ended
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        time.sleep(0.3)
        MOMENTS[moment](proc, out)
        signum = getattr(signal, signame)
        if to == "group":
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=30)
        time.sleep(0.5 if signame == "SIGKILL" else 0.2)  # the kernel's SIGKILLs down the tree
        left = _session_processes(proc.pid)
    finally:
        for process in _session_processes(proc.pid):  # never leave one behind, whatever failed
            process.kill()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert not left, [p.cmdline() for p in left]
    assert "Traceback" not in stderr and "Warning" not in stderr, stderr
    if proc.returncode != 0:  # a batch that finished before the signal came is fine too
        expected = {"SIGINT": (130, "nsysan: interrupted"), "SIGTERM": (143, "nsysan: stopped by SIGTERM"),
                    "SIGHUP": (129, "nsysan: stopped by SIGHUP"), "SIGKILL": (-9, "")}
        assert (proc.returncode, stderr.strip()) == expected[signame], stderr
    db = out / "nsysan.db"
    if db.exists():
        with sqlite3.connect(db) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            conn.row_factory = sqlite3.Row
            kept = [(row["report_hash"], row["analysis_file"]) for row in conn.execute("select * from reports")]
            groups = dict(conn.execute("select report_hash, count(*) from groups group by report_hash").fetchall()
                          if kept else [])
        per_report = len(analysis_of("known_mem_v25").groups)
        assert all(groups.get(key) == per_report and (out / file).is_file() for key, file in kept)
    # a re-run into the same folder: every report once, none twice
    code, _, err = cli(capsys, "batch", str(many_documents), "-o", str(out), "-j", "1", "--no-progress")
    assert code == 0, err
    with sqlite3.connect(db) as conn:
        assert conn.execute("select count(*), count(distinct path) from reports").fetchone() == (12, 12)
        assert conn.execute("select count(*) from groups").fetchone() == (12 * len(analysis_of("known_mem_v25").groups),)


# --- inputs -------------------------------------------------------------------------------------------


def _summary(out: Path) -> dict[str, dict]:
    import csv

    with open(out / "summary.csv", newline="") as handle:
        return {row["report"]: row for row in csv.DictReader(handle)}


def test_links_that_lead_nowhere_in_a_folder_are_failed_rows(documents, tmp_path, capsys):
    """A link to itself, a loop of two, a link to `..` (a folder loop) and a dangling link, each
    named like a report, beside a real document: the document is analyzed, each named link is one
    failed row with its reason, and the folder loop is not entered."""
    folder = tmp_path / "reports"
    folder.mkdir()
    (folder / "known.analysis.json").write_text((documents / "known_mem_v25.analysis.json").read_text())
    (folder / "self.sqlite").symlink_to("self.sqlite")
    (folder / "one.sqlite").symlink_to("two.sqlite")
    (folder / "two.sqlite").symlink_to("one.sqlite")
    (folder / "up").symlink_to("..")
    (folder / "gone.sqlite").symlink_to("nowhere.sqlite")
    code, out, err = cli(capsys, "batch", str(folder), "-o", str(tmp_path / "out"), "-j", "1", "--no-progress")
    assert code == 0 and err == "", err
    rows = _summary(tmp_path / "out")
    assert int(rows[str(folder / "known.analysis.json")]["peak_bytes"]) == KNOWN_PEAK
    failed = {Path(k).name: r["error"] for k, r in rows.items() if r["status"] == "failed"}
    loop = "could not be read: Too many levels of symbolic links"
    assert failed == {"self.sqlite": f"self.sqlite {loop}", "one.sqlite": f"one.sqlite {loop}",
                      "two.sqlite": f"two.sqlite {loop}",
                      "gone.sqlite": "gone.sqlite could not be read: No such file or directory"}
    assert out.startswith("analyzed 1 of 5 reports, 4 failed")


def test_odd_lines_of_a_list_are_failed_rows(tmp_path, capsys):
    long_name = "x" * 5000
    listing = tmp_path / "reports.txt"
    listing.write_text(f"{FIXTURES / 'known_mem_v25.sqlite'}\n{long_name}\n{tmp_path}/a\0b.sqlite\n")
    code, out, err = cli(capsys, "batch", f"@{listing}", "-o", str(tmp_path / "out"), "-j", "1", "--no-progress")
    assert code == 0 and err == "", err
    rows = _summary(tmp_path / "out")
    assert int(rows[str(FIXTURES / "known_mem_v25.sqlite")]["peak_bytes"]) == KNOWN_PEAK
    assert rows[str(tmp_path / long_name)]["error"] == f"{long_name} could not be read: File name too long"
    assert rows[f"{tmp_path}/a\0b.sqlite"]["error"] == "a\\x00b.sqlite could not be read: a file name can't hold a NUL character"
    assert "a\\x00b.sqlite" in out and "\0" not in out  # printed as an escape


def test_a_fifo_as_an_input_is_a_failed_row_not_a_hang(tmp_path, capsys):
    fifo = tmp_path / "run.sqlite"
    os.mkfifo(fifo)
    code, out, err = cli(capsys, "batch", str(fifo), str(FIXTURES / "known_mem_v25.sqlite"), "-o",
                         str(tmp_path / "out"), "-j", "1", "--no-progress")
    assert code == 0 and err == "", err
    assert _summary(tmp_path / "out")[str(fifo)]["error"] == "run.sqlite could not be read: it is a FIFO (named pipe), not a file"


@pytest.mark.parametrize("special", ["a FIFO", "/dev/zero", "a folder"])
def test_a_list_that_is_not_a_file_is_refused_in_one_line(special, tmp_path, capsys):
    listing = {"a FIFO": tmp_path / "list.txt", "/dev/zero": Path("/dev/zero"), "a folder": tmp_path}[special]
    if special == "a FIFO":
        os.mkfifo(listing)
    what = {"a FIFO": "it is a FIFO (named pipe), not a file", "/dev/zero": "it is a character device, not a file",
            "a folder": "it is a directory, not a file"}[special]
    code, _, err = cli(capsys, "batch", f"@{listing}", "-o", str(tmp_path / "out"), "-j", "1", "--no-progress")
    assert code == 2 and one_line(err) == (f"nsysan: @{listing}: could not be read ({what}); give a file of paths, "
                                           "one a line")


def test_a_240_character_name_is_analyzed_and_its_document_written(tmp_path, capsys):
    """Legal (255 bytes is the limit), but `<name>-<hash>.analysis.json` is not: the document's
    name is cut, the report is analyzed like any other."""
    report = tmp_path / ("n" * 233 + ".sqlite")
    report.write_bytes((FIXTURES / "known_mem_v25.sqlite").read_bytes())
    code, _, err = cli(capsys, "batch", str(report), "-o", str(tmp_path / "out"), "-j", "1", "--no-progress")
    assert code == 0, err
    row = _summary(tmp_path / "out")[str(report)]
    assert int(row["peak_bytes"]) == KNOWN_PEAK
    (document,) = (tmp_path / "out" / "analyses").iterdir()
    assert len(document.name.encode()) <= 255 and document.name.startswith("n" * 200)
    assert json.loads(document.read_text())["peak"]["peak_bytes"] == KNOWN_PEAK


def test_a_report_and_its_export_in_one_folder_are_one_capture(tmp_path, capsys):
    """known_mem_v25.nsys-rep and the export nsys made of it, side by side: one row, read from
    the export (no nsys needed); an export of another capture beside a report stays a row of its own."""
    import shutil

    folder = tmp_path / "runs"
    folder.mkdir()
    for suffix in (".nsys-rep", ".sqlite"):  # copy2 keeps the times: the export is not older than the report
        shutil.copy2(FIXTURES / f"known_mem_v25{suffix}", folder / f"known_mem_v25{suffix}")
    shutil.copy2(FIXTURES / "known_mem_v22.nsys-rep", folder / "other.nsys-rep")
    shutil.copy2(FIXTURES / "known_mem_v25.sqlite", folder / "other.sqlite")  # not other.nsys-rep's export
    from nsysan.batch.report_paths import expand_inputs

    assert [p.name for p in expand_inputs([str(folder)])] == ["known_mem_v25.sqlite", "other.nsys-rep", "other.sqlite"]
    code, out, err = cli(capsys, "batch", str(folder / "known_mem_v25.*"), "-o", str(tmp_path / "out"), "-j", "1",
                         "--no-progress")
    assert code == 0, err
    assert list(_summary(tmp_path / "out")) == [str(folder / "known_mem_v25.sqlite")]
    assert out.startswith("analyzed 1 of 1 reports")


# --- summary.html ------------------------------------------------------------------------------------


def test_warnings_are_on_the_process_rows_they_concern(tmp_path, capsys):
    """ddp_leak_v25: rank 1 grows 64 MiB per step (its truth), so memory_growth is on rank 1's row
    only; each rank's vmm_without_access names that rank, so each row has its own."""
    folder = tmp_path / "ddp"
    folder.mkdir()
    (folder / "ddp.analysis.json").write_text(render_json(analysis_of("ddp_leak_v25")))
    code, _, err = cli(capsys, "batch", str(folder), "-o", str(tmp_path / "out"), "-j", "1", "--no-progress")
    assert code == 0, err
    rows = {r["process"]: r["warnings"] for r in _summary_rows(tmp_path / "out")}
    assert rows == {"rank 0": "vmm_without_access", "rank 1": "memory_growth,vmm_without_access"}
    page = (tmp_path / "out" / "summary.html").read_text()
    assert '<td class="codes">memory_growth, vmm_without_access</td>' in page  # wraps between codes only


def _summary_rows(out: Path) -> list[dict]:
    import csv

    with open(out / "summary.csv", newline="") as handle:
        return list(csv.DictReader(handle))


# each cell's text and how many lines it takes (a range's rectangles: one per line box)
COLUMN_PROBE = """Array.from(document.querySelectorAll('#summary th, #summary td:not(.wrap):not(.codes)'),
  c => { const r = document.createRange(); r.selectNodeContents(c);
         return [c.textContent, new Set(Array.from(r.getClientRects(), x => Math.round(x.top))).size]; })"""


def test_summary_columns_are_as_wide_as_their_content(tmp_path, capsys, chromium):
    """A long report path used to squeeze the other columns to a letter or two ("pro/ces/s",
    "1.2/GiB"): at 800 px every header, name and number cell is one line."""
    from browser import open_page

    folder = tmp_path / ("a-long-folder-name-" * 6)
    folder.mkdir()
    (folder / "ddp_leak_with_a_long_report_name.analysis.json").write_text(render_json(analysis_of("ddp_leak_v25")))
    assert cli(capsys, "batch", str(folder), "-o", str(tmp_path / "out"), "-j", "1", "--no-progress")[0] == 0
    page, _ = open_page(tmp_path / "out" / "summary.html", width=800, height=600, evaluate={"cells": COLUMN_PROBE})
    cells = page.values["cells"]
    assert [c for c, _ in cells[:10]] == ["report", "status", "process", "GPU", "peak", "at end", "never freed",
                                         "growth / step", "failed allocs", "warnings"]
    assert "rank 1" in [c for c, _ in cells] and "64.0 MiB" in [c for c, _ in cells]  # rank 1's growth per step
    assert all(lines == 1 for text, lines in cells if text), cells
