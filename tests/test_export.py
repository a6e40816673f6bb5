"""export.py against the real nsys, real reports and fake `nsys` scripts that simulate the tool
misbehaving (crash, hang, partial export). Every test passes its own cache_dir."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from nsysan.sources import export
from nsysan.errors import NsysanError
from nsysan.sources.export import nsys_memo
from nsysan.sources.export import ensure_sqlite, find_nsys, is_complete_export, nsys_version, report_version

from conftest import CORPUS, FIXTURES  # nsys_path comes from conftest too

V22 = FIXTURES / "known_mem_v22.nsys-rep"
V25 = FIXTURES / "known_mem_v25.nsys-rep"
V22_SQLITE = FIXTURES / "known_mem_v22.sqlite"  # 2022.4.2.1's own export of V22
V25_SQLITE = FIXTURES / "known_mem_v25.sqlite"  # 2025.3.2's own export of V25
DEBIAN_NSYS_VERSION = "2022.4.2.1"


@pytest.fixture(autouse=True)
def _no_timeout_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NSYSAN_EXPORT_TIMEOUT", raising=False)


# --- helpers -------------------------------------------------------------------------------------


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def copy_alone(report: Path, directory: Path) -> Path:
    """Copy `report` into `directory` without its sibling .sqlite, so nsys has to export it."""
    directory.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy2(report, directory / report.name))


def make_partial_export(path: Path) -> Path:
    """What nsys 2022.4 leaves after failing on a 2023.x report: only StringIds and ProcessStreams."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute("CREATE TABLE ProcessStreams (globalPid INTEGER, filenameId INTEGER)")
        conn.commit()
    return path


# The options `nsys export --help` lists in Debian's 2022.4.2.1, and in 2025.3 (which adds more).
HELP_2022 = ("-f, --force-overwrite=", "-l, --lazy=", "-o, --output=", "-q, --quiet=", "--separate-strings=",
             "-t, --type=")
HELP_2025 = HELP_2022 + ("--include-blobs=<true|false>", "--ts-normalize=<true|false>")


def fake_nsys(directory: Path, export_body: str, version: str = DEBIAN_NSYS_VERSION,
              export_help: tuple[str, ...] = HELP_2022) -> Path:
    """An `nsys` shell script: answers --version and `export --help` like the real one, runs
    `export_body` for export with $out set to the --output path. Simulates the external tool,
    not export.py."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "nsys"
    help_lines = "".join(f"echo {shlex.quote(line)}; " for line in export_help)
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "--version" ]; then echo "NVIDIA Nsight Systems version {version}-fake"; exit 0; fi\n'
        f'if [ "$1" = "export" ] && [ "$2" = "--help" ]; then {help_lines}exit 0; fi\n'
        'out=""; prev=""\n'
        'for arg in "$@"; do if [ "$prev" = "--output" ]; then out="$arg"; fi; prev="$arg"; done\n'
        f"{export_body}\n"
    )
    script.chmod(0o755)
    return script


def export_files(cache: Path) -> list[str]:
    """The suffixes of what the cache holds besides the memos of what nsys said (nsys_memo.py)."""
    return [p.suffix for p in cache.iterdir() if p.name != nsys_memo.MEMO_SUBDIR]


def copying_nsys(directory: Path, log: Path, version: str = DEBIAN_NSYS_VERSION, delay_s: float = 0) -> Path:
    """A fake nsys that logs each export and writes a complete export (the fixture's own)."""
    return fake_nsys(
        directory,
        f"echo export >> {shlex.quote(str(log))}\n"
        f"sleep {delay_s}\n"
        f'cp {shlex.quote(str(V22_SQLITE))} "$out"\n'
        "exit 0",
        version=version,
    )


def exports_logged(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def export_meta(sqlite_path: Path) -> dict[str, str]:
    with contextlib.closing(sqlite3.connect(f"file:{sqlite_path}?mode=ro", uri=True)) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        table = "EXPORT_META_DATA" if "EXPORT_META_DATA" in tables else "META_DATA_EXPORT"
        return dict(conn.execute(f"SELECT name, value FROM {table}").fetchall())


def is_gone(pid: int, within_s: float = 5) -> bool:
    """True when `pid` stops running within `within_s` (SIGKILL lands asynchronously; a zombie
    awaiting its reaper counts as gone)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def assert_one_line(err: NsysanError) -> None:
    assert err.message and "\n" not in err.message and "\r" not in err.message
    assert err.exit_code == 2


# --- the real nsys -------------------------------------------------------------------------------


def test_nsys_version_of_real_nsys(nsys_path: Path) -> None:
    version = nsys_version(nsys_path)
    assert re.fullmatch(r"\d{4}\.\d+\.\d+(\.\d+)?", version)
    if str(nsys_path) == "/usr/bin/nsys":  # Debian bookworm's package, nsight-systems 2022.4.2.1
        assert version == DEBIAN_NSYS_VERSION


def test_exports_v22_report_for_real(nsys_path: Path, tmp_path: Path) -> None:
    report = copy_alone(V22, tmp_path / "in")
    before, digest = listing(report.parent), sha256(report)
    seen: list[float] = []

    result = ensure_sqlite(report, nsys=nsys_path, cache_dir=tmp_path / "cache", progress=seen.append)

    assert result.from_cache is False
    assert result.exported_with == nsys_version(nsys_path)
    assert result.sqlite_path.parent == tmp_path / "cache"
    with contextlib.closing(sqlite3.connect(f"file:{result.sqlite_path}?mode=ro", uri=True)) as conn:
        # The 2022.4 capture of a CUDA 13 program holds ONE memory event (fixtures/README.md).
        assert conn.execute("SELECT count(*) FROM CUDA_GPU_MEMORY_USAGE_EVENTS").fetchone() == (1,)
    meta = export_meta(result.sqlite_path)
    assert meta["EXPORT_PRODUCT_VERSION"] == result.exported_with
    if result.exported_with == DEBIAN_NSYS_VERSION:
        assert meta["EXPORT_SCHEMA_VERSION"] == "3.0.0"
    # nsys prints "Exporting 542 events: [..N%..]"; progress follows it up to 1.0.
    assert seen and seen == sorted(seen) and seen[-1] == 1.0
    assert listing(report.parent) == before and sha256(report) == digest
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".")]  # no temp left


def test_second_call_reuses_cache_without_running_export(nsys_path: Path, tmp_path: Path) -> None:
    report = copy_alone(V22, tmp_path / "in")
    first = ensure_sqlite(report, nsys=nsys_path, cache_dir=tmp_path / "cache")
    # Same version as the real one, but any export it is asked for fails loudly.
    broken = fake_nsys(tmp_path / "broken", 'echo "Exportation error: must not run" >&2; exit 7',
                       version=first.exported_with or DEBIAN_NSYS_VERSION)

    second = ensure_sqlite(report, nsys=broken, cache_dir=tmp_path / "cache")

    assert second == export.ExportResult(first.sqlite_path, first.exported_with, from_cache=True)


def test_too_new_v25_report_names_both_versions(nsys_path: Path, tmp_path: Path) -> None:
    found = nsys_version(nsys_path)
    if export._version_key(found) >= (2025, 3):
        pytest.skip(f"nsys {found} can read 2025.3 reports")
    report = copy_alone(V25, tmp_path / "in")

    with pytest.raises(NsysanError) as caught:
        ensure_sqlite(report, nsys=nsys_path, cache_dir=tmp_path / "cache")

    assert_one_line(caught.value)
    assert caught.value.message == (
        f"known_mem_v25.nsys-rep comes from Nsight Systems 2025.3, and the nsys found ({found} at "
        f"{nsys_path}) can't export it; point --nsys at Nsight Systems 2025.3 or newer, or export it "
        f"where it was captured: nsys export --type sqlite known_mem_v25.nsys-rep"
    )
    assert not list((tmp_path / "cache").glob("*.sqlite"))


# Captured with 2023.3.1 (ProtobufParseException + partial file in 2022.4) and 2024.2.3
# ("Version number is invalid", no file): CORPUS/INDEX.md rows 15 and 1.
@pytest.mark.parametrize("relative, wanted", [
    ("RajaATAli__SC23_Programming-Your-GPU-with-OpenMP_Tutorial/report3.nsys-rep", "2023.3"),
    ("ntua-el20062__gemm_spmm_a100/nsys_report_gemm_tiled_20000.nsys-rep", "2024.2"),
])
def test_newer_corpus_report_without_sibling_is_refused_clearly(
    nsys_path: Path, tmp_path: Path, relative: str, wanted: str
) -> None:
    if not (CORPUS / relative).exists():
        pytest.skip(f"corpus not present at {CORPUS}")
    if export._version_key(nsys_version(nsys_path)) >= export._version_key(wanted):
        pytest.skip("this nsys is new enough to export it")
    report = copy_alone(CORPUS / relative, tmp_path / "in")

    with pytest.raises(NsysanError) as caught:
        ensure_sqlite(report, nsys=nsys_path, cache_dir=tmp_path / "cache")

    assert_one_line(caught.value)
    assert f"comes from Nsight Systems {wanted}," in caught.value.message
    assert f"({nsys_version(nsys_path)} at {nsys_path})" in caught.value.message
    # The partial file 2022.4 leaves for the 2023.3 report must not become a cache entry.
    assert not list((tmp_path / "cache").glob("*.sqlite"))
    assert listing(report.parent) == [report.name]


def test_read_only_report_dir_gets_no_files(nsys_path: Path, tmp_path: Path) -> None:
    report = copy_alone(V22, tmp_path / "ro")
    digest = sha256(report)
    # As root chmod does not stop writes; the listing check below still catches any.
    report.parent.chmod(0o555)
    try:
        result = ensure_sqlite(report, nsys=nsys_path, cache_dir=tmp_path / "cache")
    finally:
        report.parent.chmod(0o755)
    assert is_complete_export(result.sqlite_path)
    assert listing(report.parent) == [report.name] and sha256(report) == digest


CORPUS_REPORTS = {  # file -> (capture version, exports with nsys 2022.4?) from CORPUS/INDEX.md
    "ntua-el20062__gemm_spmm_a100/nsys_report_gemm_tiled_20000.nsys-rep": ("2024.2.3.38", False),
    "Yu-gyoung-Yun__alpa/report1.nsys-rep": ("2022.1.3.3", True),
    "Yu-gyoung-Yun__alpa/jax_profile_mem.nsys-rep": ("2022.1.3.3", True),
    "zasdfgbnm-dumpster__tensoriterator/report2.qdrep": ("2020.3.4.32", True),
    "quasiben__nvtx-examples/cudf-groupby.qdrep": ("2020.3.2.6", True),
    "kmcho2019__Rodinia_3.1_Gaussian/report2.nsys-rep": ("2022.4.2.1", True),
    "cqhcolorado__test-case-cori-gpu-omp-06212021/report1.qdrep": ("2021.2.1.58", True),
    "Raphael-Hao__brainstorm/report2.qdrep": ("2021.1.3.14", True),
    "RajaATAli__SC23_Programming-Your-GPU-with-OpenMP_Tutorial/report3.nsys-rep": ("2023.3.1.92", False),
    "Transformer04__ToMato/tome_r5_base.nsys-rep": ("2021.5.4.19", True),
    "D-W-Chiang__JACC.jl/hudson_parallel_for.nsys-rep": ("2025.6.1.190", False),
}


@pytest.mark.parametrize("relative", sorted(CORPUS_REPORTS))
def test_corpus_report_exports_or_fails_in_one_line(nsys_path: Path, tmp_path: Path, relative: str) -> None:
    report = CORPUS / relative
    if not report.exists():
        pytest.skip(f"corpus not present at {CORPUS}")
    captured, readable_by_2022_4 = CORPUS_REPORTS[relative]
    folder_before = {p.name: sha256(p) for p in report.parent.iterdir()}

    try:
        result = ensure_sqlite(report, nsys=nsys_path, cache_dir=tmp_path / "cache")
    except NsysanError as err:
        assert_one_line(err)
        assert not readable_by_2022_4, err.message
        assert f"comes from Nsight Systems {export._major_minor(captured)}," in err.message
    else:
        assert is_complete_export(result.sqlite_path)
        if result.exported_with is None:  # reused the paired .sqlite committed next to it
            assert result.sqlite_path == report.with_suffix(".sqlite")
        else:
            assert readable_by_2022_4 or export._version_key(result.exported_with) >= export._version_key(captured)
    assert {p.name: sha256(p) for p in report.parent.iterdir()} == folder_before


def test_export_options_of_real_nsys(nsys_path: Path) -> None:
    # `nsys export --help`, read for real: the options every version has are found.
    options = export.export_options(nsys_path)
    assert {"type", "output", "force-overwrite", "lazy"} <= options
    if nsys_version(nsys_path) == DEBIAN_NSYS_VERSION:  # 2022.4 has no --include-blobs (and no Python stacks)
        assert "include-blobs" not in options and export.export_arguments(nsys_path) == []
    else:
        assert export.export_arguments(nsys_path) == (["--include-blobs", "true"] if "include-blobs" in options else [])


def test_include_blobs_is_passed_where_nsys_knows_it(tmp_path: Path) -> None:
    # --python-backtrace stacks are NVTX payloads, which `nsys export` drops without --include-blobs.
    report = copy_alone(V25, tmp_path / "in")
    exported = []
    for name, help_text in (("new", HELP_2025), ("old", HELP_2022)):
        log = tmp_path / f"{name}.log"
        nsys = fake_nsys(tmp_path / name, f'echo "$@" >> {shlex.quote(str(log))}\n'
                         f'cp {shlex.quote(str(V25_SQLITE))} "$out"; exit 0', version="2025.3.2.0",
                         export_help=help_text)
        result = ensure_sqlite(report, nsys=nsys, cache_dir=tmp_path / "cache")
        arguments = log.read_text().split()
        assert arguments[:3] == ["export", "--type", "sqlite"]
        exported.append((("--include-blobs", "true") in zip(arguments, arguments[1:]), result.sqlite_path.name))
    (new_blobs, new_entry), (old_blobs, old_entry) = exported
    assert new_blobs and not old_blobs
    # an export with payloads is another cache entry than one without
    assert new_entry.endswith("-blobs.sqlite") and not old_entry.endswith("-blobs.sqlite")


PYBT_REPORT = FIXTURES / "torch_pybt_v25.nsys-rep"


def test_export_by_nsysan_keeps_python_stacks(tmp_path: Path) -> None:
    # Needs the report itself and an nsys that can export 2025.3 reports with their payloads;
    # only the exported .sqlite is shipped, and Debian's nsys 2022.4 can read neither.
    if not PYBT_REPORT.exists():
        pytest.skip(f"{PYBT_REPORT.name} is not shipped (only its .sqlite export is), so there is no "
                    "--python-backtrace report for nsys to export")
    try:
        nsys = find_nsys()
    except NsysanError:
        pytest.skip("no nsys to export the report with")
    if "include-blobs" not in export.export_options(nsys):
        pytest.skip(f"nsys {nsys_version(nsys)} has no --include-blobs, so it can't export Python stacks")
    import nsysan

    analysis = nsysan.analyze(copy_alone(PYBT_REPORT, tmp_path / "in"), cache_dir=tmp_path / "cache")
    python_sites = [s.site.label for s in analysis.sites if s.site.source == "python"]
    assert python_sites[:2] == ["main (torch_train.py:43)", "build (torch_train.py:19)"]


# --- fake nsys: the tool misbehaving -------------------------------------------------------------


def test_partial_export_with_exit_1_is_refused_and_not_cached(tmp_path: Path) -> None:
    partial = make_partial_export(tmp_path / "partial.sqlite")
    nsys = fake_nsys(tmp_path / "bin", f'cp {shlex.quote(str(partial))} "$out"\n'
                     'echo "Exportation error: Dynamic exception type: ProtobufParseException" >&2; exit 1')
    report = copy_alone(V22, tmp_path / "in")

    with pytest.raises(NsysanError) as caught:
        ensure_sqlite(report, nsys=nsys, cache_dir=tmp_path / "cache")

    assert_one_line(caught.value)
    # V22 comes from 2022.4.2.1, the same version as this nsys: damaged, not too new.
    assert "ProtobufParseException" in caught.value.message and "damaged" in caught.value.message
    assert export_files(tmp_path / "cache") == [".lock"]


def test_partial_export_with_exit_0_is_refused_and_not_cached(tmp_path: Path) -> None:
    partial = make_partial_export(tmp_path / "partial.sqlite")
    nsys = fake_nsys(tmp_path / "bin", f'cp {shlex.quote(str(partial))} "$out"; exit 0')
    report = copy_alone(V22, tmp_path / "in")

    with pytest.raises(NsysanError, match="incomplete export of known_mem_v22.nsys-rep") as caught:
        ensure_sqlite(report, nsys=nsys, cache_dir=tmp_path / "cache")

    assert_one_line(caught.value)
    assert export_files(tmp_path / "cache") == [".lock"]


def test_crash_quotes_only_nsys_error_line(tmp_path: Path) -> None:
    nsys = fake_nsys(tmp_path / "bin", 'echo "PROCESS_0:ENV HF_TOKEN=hunter2"\n'
                     'echo "Exportation error: disk on fire" >&2\necho "bye"; exit 3')
    report = copy_alone(V22, tmp_path / "in")

    with pytest.raises(NsysanError) as caught:
        ensure_sqlite(report, nsys=nsys, cache_dir=tmp_path / "cache")

    assert_one_line(caught.value)
    assert caught.value.message == (
        "nsys export of known_mem_v22.nsys-rep failed (exit 3): Exportation error: disk on fire; "
        "run `nsys export --type sqlite known_mem_v22.nsys-rep` to see its full output"
    )


def test_crash_without_an_error_line_quotes_nothing(tmp_path: Path) -> None:
    nsys = fake_nsys(tmp_path / "bin", 'echo "PROCESS_0:ENV HF_TOKEN=hunter2"; exit 2')
    with pytest.raises(NsysanError) as caught:
        ensure_sqlite(copy_alone(V22, tmp_path / "in"), nsys=nsys, cache_dir=tmp_path / "cache")
    assert "failed (exit 2): (nsys printed no error line);" in caught.value.message
    assert "hunter2" not in caught.value.message


def test_crash_by_signal(tmp_path: Path) -> None:
    nsys = fake_nsys(tmp_path / "bin", "kill -SEGV $$")
    with pytest.raises(NsysanError, match="killed by signal 11 while exporting known_mem_v22") as caught:
        ensure_sqlite(copy_alone(V22, tmp_path / "in"), nsys=nsys, cache_dir=tmp_path / "cache")
    assert_one_line(caught.value)


def hanging_nsys(directory: Path, pid_file: Path, first_output: str = "") -> Path:
    """A fake nsys that starts a child that hangs (its pid in `pid_file`), prints
    `first_output`, and waits for the child."""
    return fake_nsys(directory, f"sleep 60 & echo $! > {shlex.quote(str(pid_file))}\n"
                     f"printf '%s' {shlex.quote(first_output)}; wait")


def test_hang_is_stopped_at_the_timeout(tmp_path: Path) -> None:
    nsys = hanging_nsys(tmp_path / "bin", tmp_path / "sleeper.pid")
    started = time.monotonic()

    with pytest.raises(NsysanError, match="did not finish within 1 s and was stopped") as caught:
        ensure_sqlite(copy_alone(V22, tmp_path / "in"), nsys=nsys, cache_dir=tmp_path / "cache", timeout_s=1)

    assert time.monotonic() - started < 10
    assert_one_line(caught.value)
    assert is_gone(int((tmp_path / "sleeper.pid").read_text()))  # the whole process group was killed
    assert export_files(tmp_path / "cache") == [".lock"]


def test_timeout_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NSYSAN_EXPORT_TIMEOUT", "0.5")
    nsys = hanging_nsys(tmp_path / "bin", tmp_path / "sleeper.pid")
    with pytest.raises(NsysanError, match="within 0.5 s"):
        ensure_sqlite(copy_alone(V22, tmp_path / "in"), nsys=nsys, cache_dir=tmp_path / "cache")


def test_bad_timeout_in_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NSYSAN_EXPORT_TIMEOUT", "ten minutes")
    nsys = copying_nsys(tmp_path / "bin", tmp_path / "log")
    with pytest.raises(NsysanError, match="NSYSAN_EXPORT_TIMEOUT='ten minutes' is not a number"):
        ensure_sqlite(copy_alone(V22, tmp_path / "in"), nsys=nsys, cache_dir=tmp_path / "cache")


def test_ctrl_c_during_export_kills_nsys_and_leaves_no_entry(tmp_path: Path) -> None:
    nsys = hanging_nsys(tmp_path / "bin", tmp_path / "sleeper.pid", "Exporting 10 events: [===50%    ]\r")
    seen: list[float] = []

    def interrupt(fraction: float) -> None:  # stands in for the user's Ctrl-C mid-export
        seen.append(fraction)
        if fraction > 0:  # 0: nsys just started (the command line starts its imports then)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ensure_sqlite(copy_alone(V22, tmp_path / "in"), nsys=nsys, cache_dir=tmp_path / "cache",
                      progress=interrupt, timeout_s=30)

    assert seen == [0.0, 0.5]
    assert is_gone(int((tmp_path / "sleeper.pid").read_text()))
    assert export_files(tmp_path / "cache") == [".lock"]


def test_concurrent_analyses_export_once(tmp_path: Path) -> None:
    log = tmp_path / "log"
    nsys = copying_nsys(tmp_path / "bin", log, delay_s=1)
    report = copy_alone(V22, tmp_path / "in")
    start = threading.Barrier(2)

    def analyze() -> export.ExportResult:
        start.wait()
        return ensure_sqlite(report, nsys=nsys, cache_dir=tmp_path / "cache")

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = [f.result() for f in [pool.submit(analyze), pool.submit(analyze)]]

    assert exports_logged(log) == 1
    assert results[0].sqlite_path == results[1].sqlite_path
    assert sorted(r.from_cache for r in results) == [False, True]


def test_changed_report_or_other_nsys_is_exported_again(tmp_path: Path) -> None:
    log = tmp_path / "log"
    nsys = copying_nsys(tmp_path / "bin", log)
    report = copy_alone(V22, tmp_path / "in")
    cache = tmp_path / "cache"

    first = ensure_sqlite(report, nsys=nsys, cache_dir=cache)
    again = ensure_sqlite(report, nsys=nsys, cache_dir=cache)
    with open(report, "ab") as handle:  # same name and header, different content
        handle.write(b"\0")
    changed = ensure_sqlite(report, nsys=nsys, cache_dir=cache)
    other = ensure_sqlite(report, nsys=copying_nsys(tmp_path / "bin2", log, version="2099.1.0.7"), cache_dir=cache)

    assert exports_logged(log) == 3
    assert (first.from_cache, again.from_cache, changed.from_cache, other.from_cache) == (False, True, False, False)
    assert len({first.sqlite_path, changed.sqlite_path, other.sqlite_path}) == 3
    assert other.exported_with == "2099.1.0.7"
    assert first.sqlite_path.name == f"{sha256(V22)}-nsys2022.4.2.1.sqlite"


def test_incomplete_cache_entry_is_not_trusted(tmp_path: Path) -> None:
    log = tmp_path / "log"
    nsys = copying_nsys(tmp_path / "bin", log)
    report = copy_alone(V22, tmp_path / "in")
    entry = ensure_sqlite(report, nsys=nsys, cache_dir=tmp_path / "cache").sqlite_path
    entry.unlink()
    make_partial_export(entry)
    leftover = entry.parent / f".{entry.stem}.killed-run.sqlite"  # a temp file from a SIGKILLed run
    leftover.write_bytes(b"half")

    result = ensure_sqlite(report, nsys=nsys, cache_dir=tmp_path / "cache")

    assert result.from_cache is False and result.sqlite_path == entry and is_complete_export(entry)
    assert exports_logged(log) == 2
    assert not leftover.exists()


def test_unwritable_cache_dir(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    nsys = copying_nsys(tmp_path / "bin", tmp_path / "log")
    with pytest.raises(NsysanError, match="can't use the export cache at .*NSYSAN_CACHE_DIR") as caught:
        ensure_sqlite(copy_alone(V22, tmp_path / "in"), nsys=nsys, cache_dir=tmp_path / "file" / "cache")
    assert_one_line(caught.value)


def test_cache_dir_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NSYSAN_CACHE_DIR", str(tmp_path / "env-cache"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert export.resolve_cache_dir() == tmp_path / "env-cache"
    assert export.resolve_cache_dir(tmp_path / "given") == tmp_path / "given"
    monkeypatch.delenv("NSYSAN_CACHE_DIR")
    assert export.resolve_cache_dir() == tmp_path / "xdg" / "nsysan"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert export.resolve_cache_dir() == Path.home() / ".cache" / "nsysan"


# --- sibling exports -----------------------------------------------------------------------------


def test_matching_sibling_is_reused_without_nsys(tmp_path: Path) -> None:
    report = copy_alone(V25, tmp_path)
    sibling = Path(shutil.copy(V25_SQLITE, tmp_path / "known_mem_v25.sqlite"))  # copied after: newer

    result = ensure_sqlite(report, nsys=tmp_path / "no-such-nsys", cache_dir=tmp_path / "cache")

    assert result == export.ExportResult(sibling, exported_with=None, from_cache=False, from_sibling=True)
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("how", ["older than the report", "export of another report", "partial"])
def test_unrelated_sibling_is_not_reused(tmp_path: Path, how: str) -> None:
    report = copy_alone(V22, tmp_path / "in")
    sibling = report.with_suffix(".sqlite")
    if how == "older than the report":
        shutil.copy(V22_SQLITE, sibling)
        stamp = report.stat().st_mtime - 3600
        os.utime(sibling, (stamp, stamp))
    elif how == "export of another report":
        shutil.copy(V25_SQLITE, sibling)  # records EXPORT_PARAM_INPUT_FILE known_mem_v25.nsys-rep
    else:
        make_partial_export(sibling)
    log = tmp_path / "log"

    result = ensure_sqlite(report, nsys=copying_nsys(tmp_path / "bin", log), cache_dir=tmp_path / "cache")

    assert result.sqlite_path.parent == tmp_path / "cache" and exports_logged(log) == 1


# --- inputs --------------------------------------------------------------------------------------


def test_sqlite_input_is_returned_as_is(tmp_path: Path) -> None:
    result = ensure_sqlite(V25_SQLITE, nsys=tmp_path / "no-such-nsys", cache_dir=tmp_path / "cache")
    assert result == export.ExportResult(V25_SQLITE, exported_with=None, from_cache=False)


def _make_input(tmp_path: Path, kind: str) -> Path:
    if kind == "missing":
        return tmp_path / "nowhere.nsys-rep"
    if kind == "directory":
        (tmp_path / "dir.nsys-rep").mkdir()
        return tmp_path / "dir.nsys-rep"
    names = {"empty report": "e.nsys-rep", "empty sqlite": "e.sqlite", "random report": "r.nsys-rep",
             "random qdrep": "r.qdrep", "random sqlite": "r.sqlite", "qdstrm": "capture.qdstrm",
             "other suffix": "notes.txt", "no suffix": "report"}
    path = tmp_path / names[kind]
    path.write_bytes(b"" if kind.startswith("empty") else os.urandom(4096))
    return path


@pytest.mark.parametrize("kind, pattern", [
    ("missing", r"nowhere.nsys-rep: no such file"),
    ("directory", r"dir.nsys-rep is a directory; pass one .nsys-rep, .qdrep or .sqlite file"),
    ("empty report", r"e.nsys-rep is empty \(0 bytes\)"),
    ("empty sqlite", r"e.sqlite is empty \(0 bytes\)"),
    ("random report", r"r.nsys-rep is not an Nsight Systems report"),
    ("random qdrep", r"r.qdrep is not an Nsight Systems report"),
    ("random sqlite", r"r.sqlite is not a SQLite file"),
    ("qdstrm", r"capture.qdstrm is an unfinished capture \(.qdstrm\); import it first with QdstrmImporter"),
    ("other suffix", r"nsysan reads .nsys-rep, .qdrep and .sqlite files from Nsight Systems, not .txt files"),
    ("no suffix", r"report: nsysan reads .*, so give the file the suffix it was written with"),
])
def test_bad_input_is_one_clear_error(tmp_path: Path, kind: str, pattern: str) -> None:
    path = _make_input(tmp_path, kind)
    digest = sha256(path) if path.is_file() else None

    with pytest.raises(NsysanError) as caught:
        ensure_sqlite(path, nsys=tmp_path / "no-such-nsys", cache_dir=tmp_path / "cache")

    assert_one_line(caught.value)
    assert re.search(pattern, caught.value.message), caught.value.message
    assert not (tmp_path / "cache").exists()
    assert (sha256(path) if path.is_file() else None) == digest


# --- finding nsys --------------------------------------------------------------------------------


# --- What nsys said, remembered per executable (nsys_memo.py) --------------------------------------

def asked_nsys(directory: Path, log: Path, version: str = DEBIAN_NSYS_VERSION) -> Path:
    """copying_nsys that also logs every call's arguments, --version and export --help included."""
    script = copying_nsys(directory, directory / "exports.log", version=version)
    body = script.read_text().split("\n", 1)[1]
    script.write_text(f'#!/bin/sh\necho "$@" >> {shlex.quote(str(log))}\n{body}')
    return script


def calls(log: Path) -> list[str]:
    """The calls made since the last look (the log is emptied)."""
    seen = log.read_text().splitlines() if log.exists() else []
    log.write_text("")
    return [line.split()[0] if line.startswith("export --type") else line for line in seen]


def as_a_new_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget what this process heard from nsys, as the next `nsysan analyze` starts knowing nothing."""
    monkeypatch.setattr(export.nsys, "_VERSIONS", {})
    monkeypatch.setattr(export.nsys, "_OPTIONS", {})


def test_an_analysis_after_the_first_asks_nsys_nothing_before_exporting(tmp_path, monkeypatch) -> None:
    log = tmp_path / "calls.log"
    nsys = asked_nsys(tmp_path / "bin", log)
    cache = tmp_path / "cache"
    as_a_new_process(monkeypatch)
    first = ensure_sqlite(copy_alone(V22, tmp_path / "a"), nsys=nsys, cache_dir=cache)
    assert sorted(calls(log)) == ["--version", "export", "export --help"]
    memo = json.loads(next((cache / nsys_memo.MEMO_SUBDIR).iterdir()).read_text())
    assert memo["version"] == DEBIAN_NSYS_VERSION and "force-overwrite" in memo["export_options"]
    assert memo["nsys"]["path"] == os.path.realpath(nsys) and memo["nsys"]["size"] == nsys.stat().st_size

    # another report (its bytes differ: a new export) with the same nsys: the export, nothing before it
    as_a_new_process(monkeypatch)
    other = copy_alone(V22, tmp_path / "b")
    with other.open("ab") as out:
        out.write(b"\0")
    second = ensure_sqlite(other, nsys=nsys, cache_dir=cache)
    assert calls(log) == ["export"]
    assert second.exported_with == first.exported_with == DEBIAN_NSYS_VERSION and not second.from_cache
    assert second.sqlite_path.name.split("-", 1)[1] == first.sqlite_path.name.split("-", 1)[1]

    # the same nsys touched (reinstalled, upgraded in place): asked again
    as_a_new_process(monkeypatch)
    stat = nsys.stat()
    os.utime(nsys, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert ensure_sqlite(other, nsys=nsys, cache_dir=cache).from_cache
    assert sorted(calls(log)) == ["--version", "export --help"]

    # replaced by another version at the same path: asked again, and its version keys the export
    as_a_new_process(monkeypatch)
    asked_nsys(tmp_path / "bin", log, version="2025.3.2.0")
    third = ensure_sqlite(other, nsys=nsys, cache_dir=cache)
    assert sorted(calls(log)) == ["--version", "export", "export --help"]
    assert third.exported_with == "2025.3.2.0" and "-nsys2025.3.2.0" in third.sqlite_path.name


@pytest.mark.parametrize("damage", [b"", b"\xff\xfe not text", b'{"nsys": ', b"[1, 2]",
                                    b'{"nsys": null, "version": "2022.4.2.1", "export_options": []}'])
def test_a_damaged_memo_is_ignored_and_made_again(tmp_path, monkeypatch, damage) -> None:
    log = tmp_path / "calls.log"
    nsys = asked_nsys(tmp_path / "bin", log)
    report = copy_alone(V22, tmp_path / "in")
    as_a_new_process(monkeypatch)
    first = ensure_sqlite(report, nsys=nsys, cache_dir=tmp_path / "cache")
    (memo,) = (tmp_path / "cache" / nsys_memo.MEMO_SUBDIR).iterdir()
    good = memo.read_bytes()
    calls(log)
    memo.write_bytes(damage)
    as_a_new_process(monkeypatch)
    assert ensure_sqlite(report, nsys=nsys, cache_dir=tmp_path / "cache") == \
        export.ExportResult(first.sqlite_path, DEBIAN_NSYS_VERSION, from_cache=True)
    assert sorted(calls(log)) == ["--version", "export --help"]
    assert memo.read_bytes() == good


def test_a_memo_with_wrong_answers_for_its_nsys_is_not_believed(tmp_path, monkeypatch) -> None:
    """A memo is read only for the executable it names: one copied from another nsys's is not."""
    log = tmp_path / "calls.log"
    nsys = asked_nsys(tmp_path / "bin", log)
    report = copy_alone(V22, tmp_path / "in")
    as_a_new_process(monkeypatch)
    ensure_sqlite(report, nsys=nsys, cache_dir=tmp_path / "cache")
    (memo,) = (tmp_path / "cache" / nsys_memo.MEMO_SUBDIR).iterdir()
    kept = json.loads(memo.read_text())
    kept["nsys"]["path"] = str(tmp_path / "elsewhere" / "nsys")
    memo.write_text(json.dumps(kept))
    calls(log)
    as_a_new_process(monkeypatch)
    ensure_sqlite(report, nsys=nsys, cache_dir=tmp_path / "cache")
    assert sorted(calls(log)) == ["--version", "export --help"]


def test_explicit_nsys_that_does_not_exist_is_named(tmp_path: Path) -> None:
    with pytest.raises(NsysanError) as caught:
        find_nsys(tmp_path / "nope" / "nsys")
    assert_one_line(caught.value)
    assert caught.value.message.startswith(f"--nsys {tmp_path / 'nope' / 'nsys'}: no runnable nsys there")


def test_explicit_nsys_may_be_an_install_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    binary = fake_nsys(tmp_path / "install" / "bin", "exit 0")
    other = fake_nsys(tmp_path / "other", "exit 0")
    monkeypatch.setenv("NSYSAN_NSYS", str(other.parent))
    assert find_nsys(tmp_path / "install") == binary  # --nsys beats NSYSAN_NSYS
    assert find_nsys(binary) == binary
    assert find_nsys() == other
    monkeypatch.setenv("NSYSAN_NSYS", str(tmp_path / "missing"))
    with pytest.raises(NsysanError, match=r"^NSYSAN_NSYS=.*missing: no runnable nsys there"):
        find_nsys()


def test_no_nsys_anywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NSYSAN_NSYS", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(export.nsys, "INSTALL_GLOBS", ())  # pretend no installer put nsys anywhere
    with pytest.raises(NsysanError) as caught:
        ensure_sqlite(copy_alone(V22, tmp_path / "in"), cache_dir=tmp_path / "cache")
    assert_one_line(caught.value)
    assert caught.value.message == (
        "Nsight Systems' nsys is needed to read known_mem_v22.nsys-rep; install it, or pass "
        "--nsys PATH, or export a .sqlite yourself with `nsys export --type sqlite known_mem_v22.nsys-rep`"
    )


def test_nsys_without_a_version(tmp_path: Path) -> None:
    script = tmp_path / "nsys"
    script.write_text("#!/bin/sh\necho hello\n")
    script.chmod(0o755)
    with pytest.raises(NsysanError, match="printed no Nsight Systems version"):
        nsys_version(script)


# --- report versions and completeness ------------------------------------------------------------


@pytest.mark.parametrize("report, expected", [
    (V22, "2022.4.2.1"),
    # fixtures/README.md says 2025.3.2 (its .sqlite says EXPORT_PRODUCT_VERSION 2025.3.2.0); the
    # report's own session record says 2025.3.1.0 (nsys bundled with Nsight Compute 2025.3.1).
    (V25, "2025.3.1.0"),
    *[(CORPUS / rel, version) for rel, (version, _) in sorted(CORPUS_REPORTS.items())],
])
def test_report_version(report: Path, expected: str) -> None:
    if not report.exists():
        pytest.skip(f"corpus not present at {CORPUS}")
    assert report_version(report) == expected


def test_report_version_of_non_reports(tmp_path: Path) -> None:
    (tmp_path / "r.nsys-rep").write_bytes(os.urandom(1000))
    assert report_version(tmp_path / "r.nsys-rep") is None
    assert report_version(tmp_path / "missing.nsys-rep") is None
    assert report_version(V22_SQLITE) is None


def test_is_complete_export(tmp_path: Path) -> None:
    assert is_complete_export(V22_SQLITE) and is_complete_export(V25_SQLITE)
    assert not is_complete_export(make_partial_export(tmp_path / "partial.sqlite"))
    assert not is_complete_export(tmp_path / "missing.sqlite")
    (tmp_path / "noise.sqlite").write_bytes(os.urandom(8192))
    assert not is_complete_export(tmp_path / "noise.sqlite")
    odd = Path(shutil.copy(V22_SQLITE, tmp_path / "my report #1?%20.sqlite"))  # URI-special characters
    assert is_complete_export(odd)
    stats_only = CORPUS / "quasiben__nvtx-examples" / "cudf-groupby.sqlite"  # --stats export, no meta table
    if stats_only.exists():
        assert is_complete_export(stats_only)
