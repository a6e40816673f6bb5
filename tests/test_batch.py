"""`batch`: every fixture, the public corpus and bad files, on the local pool and on a real Dask
LocalCluster, with the same numbers both ways, in the CSV, the JSON documents and nsysan.db.

Both engines share one export cache, so the corpus's reports are exported by nsys once.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import CORPUS, FIXTURES, ROOT, analysis_of, truth

from nsysan.batch.report_paths import expand_inputs
from nsysan.render.json import render_json

MiB = 1 << 20
KNOWN_PEAK = (256 + 128 + 12 + 512) * MiB  # known_allocs.cu: live when the 512 MiB burst comes (README)
KNOWN_NEVER_FREED = sum(r["bytes"] for r in truth("known_mem_v25") if r.get("freed") == 0)


def run(*args: str, cwd: Path = ROOT, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nsysan", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, env=env)


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def numbers(rows: list[dict]) -> list[tuple]:
    """Every column but the seconds an analysis took."""
    return [tuple(v for k, v in row.items() if k != "seconds") for row in rows]


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory) -> list[Path]:
    folder = tmp_path_factory.mktemp("bad")
    corrupt = folder / "corrupt.sqlite"
    corrupt.write_bytes((FIXTURES / "known_mem_v25.sqlite").read_bytes()[:3000])
    not_a_report = folder / "notes.nsys-rep"
    not_a_report.write_text("this is not a report\n")
    return [corrupt, not_a_report, folder / "missing.sqlite"]


@pytest.fixture(scope="module")
def inputs(bad_files) -> list[str]:
    found = [str(FIXTURES)] + [str(p) for p in bad_files]
    return found + ([str(CORPUS)] if CORPUS.is_dir() else [])


@pytest.fixture(scope="module")
def local_run(inputs, tmp_path_factory):
    out = tmp_path_factory.mktemp("local")
    cache = tmp_path_factory.getbasetemp() / "export-cache"
    result = run("batch", *inputs, "-o", str(out), "-j", "2", "--cache-dir", str(cache))
    return result, out


@pytest.fixture(scope="module")
def dask_run(inputs, local_run, tmp_path_factory):
    pytest.importorskip("distributed")
    out = tmp_path_factory.mktemp("dask")
    cache = tmp_path_factory.getbasetemp() / "export-cache"
    result = run("batch", *inputs, "-o", str(out), "-j", "2", "--dask", "local", "--cache-dir", str(cache))
    return result, out


def test_one_row_per_readable_report_and_one_failed_row_per_bad_one(local_run, inputs, bad_files):
    result, out = local_run
    assert result.returncode == 0, result.stderr
    rows = read_csv(out / "summary.csv")
    reports = {r["report"] for r in rows}
    expected = {str(p) for p in expand_inputs(inputs)}
    assert reports == expected
    failed = {r["report"]: r["error"] for r in rows if r["status"] == "failed"}
    for bad in bad_files:
        assert bad.name in failed[str(bad)]
    assert "is truncated" in failed[str(bad_files[0])]
    assert all(error and "\n" not in error for error in failed.values())
    assert all(len([r for r in rows if r["report"] == f and r["status"] == "failed"]) == 1 for f in failed)
    # every shipped export is analyzed
    for sqlite in FIXTURES.glob("*.sqlite"):
        assert str(sqlite) not in failed, failed.get(str(sqlite))
    ok = {r["report"] for r in rows if r["status"] == "ok"}
    assert result.stdout.startswith(f"analyzed {len(ok)} of {len(expected)} reports, {len(failed)} failed in ")
    assert len(list((out / "analyses").glob("*.analysis.json"))) == len(ok)


def test_fixture_numbers_in_the_summary(local_run):
    _, out = local_run
    rows = {r["report"]: r for r in read_csv(out / "summary.csv") if r["status"] == "ok"}
    known = rows[str(FIXTURES / "known_mem_v25.sqlite")]
    assert int(known["peak_bytes"]) == KNOWN_PEAK
    assert int(known["never_freed_bytes"]) == KNOWN_NEVER_FREED
    oom = [r for r in read_csv(out / "summary.csv") if r["report"] == str(FIXTURES / "real_oom_v25.sqlite")]
    assert [r["failed_allocations"] for r in oom] == ["1"]  # cudaMalloc call #9 fails (truth: error 2)
    ddp = [r for r in read_csv(out / "summary.csv") if r["report"] == str(FIXTURES / "ddp_leak_v25.sqlite")]
    assert [r["process"] for r in ddp] == ["rank 0", "rank 1"]


def test_dask_gives_the_same_numbers(local_run, dask_run):
    (local, local_out), (dask, dask_out) = local_run, dask_run
    assert dask.returncode == 0, dask.stderr
    assert "on a Dask LocalCluster of 2 worker processes" in dask.stdout.splitlines()[0]
    assert numbers(read_csv(dask_out / "summary.csv")) == numbers(read_csv(local_out / "summary.csv"))
    def documents(out: Path) -> dict[str, dict]:
        docs = {p.name: json.loads(p.read_text()) for p in (out / "analyses").iterdir()}
        for doc in docs.values():  # the local run exported the corpus's reports, Dask found them cached
            doc["source"].pop("from_cache")
        return docs

    assert documents(local_out) == documents(dask_out)


def test_an_existing_dask_cluster_gives_the_same_numbers(local_run, inputs, tmp_path_factory):
    """`--dask tcp://...`: a cluster nsysan did not start, whose nanny starts the workers with
    MALLOC_TRIM_THRESHOLD_=65536 (so the analyses tune the allocator only while they run), and
    whose small reports go a few to a task."""
    distributed = pytest.importorskip("distributed")
    out = tmp_path_factory.mktemp("cluster")
    cache = tmp_path_factory.getbasetemp() / "export-cache"
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None) as cluster:
        result = run("batch", *inputs, "-o", str(out), "--dask", cluster.scheduler_address, "--cache-dir", str(cache))
    local, local_out = local_run
    assert result.returncode == 0, result.stderr
    assert f"on the Dask cluster at {cluster.scheduler_address}" in result.stdout.splitlines()[0]
    assert numbers(read_csv(out / "summary.csv")) == numbers(read_csv(local_out / "summary.csv"))


# Run in a process of its own (a fork server is one per process): one analysis on a worker of
# `--dask local`, then on a worker of a plain LocalCluster (as an existing cluster's are, tuned by
# the task only), and what each worker's allocator looks like afterwards.
ARENAS_OF_DASK_WORKERS = """
import json, sys

import distributed

from nsysan.batch import engines, worker


def allocator_of_this_process():
    import ctypes, tempfile
    libc = ctypes.CDLL("libc.so.6")
    libc.fopen.restype = ctypes.c_void_p
    with tempfile.NamedTemporaryFile(suffix=".xml") as xml:
        stream = ctypes.c_void_p(libc.fopen(xml.name.encode(), b"w"))
        libc.malloc_info(0, stream)  # one <heap nr=...> per arena
        libc.fclose(stream)
        arenas = open(xml.name).read().count("<heap nr=")
    thp = [line.split()[1] for line in open("/proc/self/status") if line.startswith("THP_enabled")]
    return arenas, thp[0]


def probe(client, tune):
    client.submit(worker.analyze_some, [sys.argv[1]], None, None, 1, tune, pure=False).result()
    return client.submit(allocator_of_this_process, pure=False).result()


client, cluster, _ = engines._dask_client("local", 1)
ours = probe(client, worker.TUNE_PROCESS)
client.close(); cluster.close()
with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                              dashboard_address=None) as plain, distributed.Client(plain) as client:
    theirs = probe(client, worker.TUNE_TASK)
print(json.dumps({"ours": ours, "theirs": theirs}))
"""


def test_dask_local_workers_get_the_allocator_settings_before_their_threads(tmp_path):
    """A Dask worker analyzes on its executor thread, which allocates before any task runs: the
    settings must come from the fork server (forkserver_tuning.py), or that thread keeps a malloc
    arena of its own, whose memory is faulted in again and again."""
    pytest.importorskip("distributed")
    if "THP_enabled" not in Path("/proc/self/status").read_text() or sys.platform != "linux":
        pytest.skip("glibc and a kernel that shows THP_enabled (5.0+) only")
    found = subprocess.run([sys.executable, "-c", ARENAS_OF_DASK_WORKERS, str(FIXTURES / "known_mem_v25.sqlite")],
                           capture_output=True, text=True, cwd=ROOT, timeout=300,
                           env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert found.returncode == 0, found.stderr[-2000:]
    arenas = json.loads(found.stdout.splitlines()[-1])
    # nsysan's worker: one arena (the main heap) for every thread, no transparent huge pages.
    assert arenas["ours"] == [1, "0"]
    # The same task on a worker forked without them: its executor thread's arena besides the main
    # one (and more for Dask's other threads); huge pages as the system has them.
    assert arenas["theirs"][0] >= 2
    assert arenas["theirs"][1] == Path("/proc/self/status").read_text().split("THP_enabled:")[1].split()[0]


def test_small_reports_go_a_few_to_a_dask_task_and_large_ones_alone(tmp_path):
    from nsysan.batch.engines import SMALL_REPORT_BYTES, dask_tasks, largest_first

    small = [tmp_path / f"small{i:02d}.sqlite" for i in range(40)]
    for path in small:
        path.write_bytes(b"x" * 1000)
    large = tmp_path / "large.sqlite"
    large.write_bytes(b"x" * SMALL_REPORT_BYTES)
    ordered = largest_first([*small[:20], large, *small[20:], tmp_path / "missing.sqlite"])
    assert ordered[0] == large and ordered[-1].name == "missing.sqlite" and ordered[1:-1] == small
    # 41 small ones (the missing file fails at once: small) on 2 worker threads: at least 8 tasks
    # each, so 41 // 16 = 2 reports a task; the large one alone.
    tasks = dask_tasks(ordered, threads=2)
    assert tasks[0] == [large] and [len(t) for t in tasks[1:]] == [2] * 20 + [1]
    assert [len(t) for t in dask_tasks(ordered, threads=8)] == [1] * 42  # 41 // 64: one a task
    assert max(len(t) for t in dask_tasks(small * 10, threads=2)) == 4  # at most SMALL_PER_TASK


def test_database_holds_the_numbers_of_the_json(local_run):
    import sqlite_utils

    _, out = local_run
    db = sqlite_utils.Database(out / "nsysan.db")
    assert set(db.table_names()) >= {"reports", "groups", "steps", "never_freed", "sites", "diagnostics"}
    rows = read_csv(out / "summary.csv")
    assert db["reports"].count == len({r["report"] for r in rows})
    for report in db["reports"].rows_where("ok = 1"):
        doc = json.loads((out / report["analysis_file"]).read_text())
        key = report["report_hash"]
        assert report["peak_bytes"] == (doc["peak"]["peak_bytes"] if doc["peak"] else None)
        groups = {(g["pid"], g["device"], g["kind"]): (g["peak_bytes"], g["end_bytes"], g["never_freed_bytes"])
                  for g in db["groups"].rows_where("report_hash = ?", [key])}
        assert groups == {(g["pid"], g["device"], g["kind"]): (g["peak_bytes"], g["end_bytes"], g["never_freed_bytes"])
                          for g in doc["groups"]}
        kept = [(x["address"], x["bytes"]) for x in db["never_freed"].rows_where("report_hash = ?", [key],
                                                                                 order_by="n")]
        assert kept == [(x["address"], x["bytes"]) for x in doc["never_freed"]]
        assert db["sites"].count_where("report_hash = ?", [key]) == len(doc["sites"])
        assert [d["code"] for d in db["diagnostics"].rows_where("report_hash = ?", [key], order_by="n")] == \
            [d["code"] for d in doc["diagnostics"]]
    failed = list(db["reports"].rows_where("ok = 0"))
    assert failed and all(r["error"] for r in failed)


def test_db_appends_across_runs_keyed_by_content(tmp_path):
    history = tmp_path / "history.db"
    known = FIXTURES / "known_mem_v25.sqlite"
    copy = tmp_path / "renamed.sqlite"
    copy.write_bytes(known.read_bytes())
    first = run("batch", str(known), "-o", str(tmp_path / "a"), "--db", str(history), "--tag", "commit-1")
    second = run("batch", str(copy), str(FIXTURES / "real_oom_v25.sqlite"), "-o", str(tmp_path / "b"),
                  "--db", str(history), "--tag", "commit-2", "-j", "1")
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    import sqlite_utils

    db = sqlite_utils.Database(history)
    reports = {r["name"]: r for r in db["reports"].rows}
    # the same bytes under another name are the same report: one row, its latest tag
    assert set(reports) == {"renamed.sqlite", "real_oom_v25.sqlite"}
    assert reports["renamed.sqlite"]["tag"] == "commit-2" and reports["renamed.sqlite"]["peak_bytes"] == KNOWN_PEAK
    assert db["groups"].count_where("report_hash = ?", [reports["renamed.sqlite"]["report_hash"]]) == \
        len(json.loads(next((tmp_path / "a" / "analyses").iterdir()).read_text())["groups"])
    assert not (tmp_path / "b" / "nsysan.db").exists()


def test_fleet_view_names_the_rank_that_leaks(tmp_path):
    """Four ranks: three run the clean training, rank 3 the leaking one (analysis documents named
    rank0..rank3, read back, not re-analyzed). The leak keeps PyTorch's reserved bytes of every
    step: rank 3's never-freed bytes exceed the others' by the truth files' difference."""
    job = tmp_path / "job"
    job.mkdir()
    for rank, name in enumerate(["torch_clean_v25"] * 3 + ["torch_leak_v25"]):
        (job / f"rank{rank}.analysis.json").write_text(render_json(analysis_of(name)))
    result = run("batch", str(job), "-o", str(tmp_path / "out"), "-j", "1")
    assert result.returncode == 0, result.stderr
    leak_growth = [r for r in truth("torch_leak_v25") if "step" in r][-1]["peak_reserved"] - \
        [r for r in truth("torch_clean_v25") if "step" in r][-1]["peak_reserved"]
    rows = {Path(r["report"]).name: r for r in read_csv(tmp_path / "out" / "summary.csv")}
    assert int(rows["rank3.analysis.json"]["never_freed_bytes"]) - \
        int(rows["rank0.analysis.json"]["never_freed_bytes"]) == leak_growth
    fleet_lines = [line for line in result.stdout.splitlines() if line.startswith("  fleet")]
    outliers = [line for line in result.stdout.splitlines() if line.startswith("  outlier")]
    assert len(fleet_lines) == 1 and "4 ranks, highest peak rank 3 (rank3.analysis.json)" in fleet_lines[0]
    # rank 3 alone stands out, by its never-freed bytes and (with steps in the model) its growth per step
    assert outliers and all(line.startswith("  outlier rank 3 (rank3.analysis.json)") for line in outliers)
    assert sorted("growth per step" in line for line in outliers) == [False, True]
    assert any("never freed" in line for line in outliers)
    page = (tmp_path / "out" / "summary.html").read_text()
    assert "rank 3 (rank3.analysis.json)" in page


def test_exit_codes(tmp_path, bad_files):
    none = run("batch", str(bad_files[0]), str(bad_files[1]), "-o", str(tmp_path / "none"), "-j", "1")
    assert none.returncode == 2
    some = run("batch", str(bad_files[0]), str(FIXTURES / "known_mem_v25.sqlite"), "-o", str(tmp_path / "some"),
               "--fail-on-error", "-j", "1")
    assert some.returncode == 1
    assert read_csv(tmp_path / "some" / "summary.csv")[0]["status"] == "failed"


def test_without_dask_the_option_says_how_to_install_it(tmp_path):
    blocker = tmp_path / "no-dask"
    (blocker / "distributed").mkdir(parents=True)
    (blocker / "distributed" / "__init__.py").write_text("raise ImportError('no distributed here')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(blocker), str(ROOT)]))
    result = run("batch", str(FIXTURES / "known_mem_v25.sqlite"), "-o", str(tmp_path / "out"), "--dask", "local",
                 env=env)
    assert result.returncode == 2
    assert result.stderr.strip() == "nsysan: --dask needs Dask distributed, an optional extra: pip install 'nsysan[dask]'"


def test_ctrl_c_keeps_what_is_done(tmp_path):
    many = [str(FIXTURES / "known_mem_v25.sqlite")] + [str(FIXTURES / f"{n}.sqlite") for n in
                                                       ("torch_ops_v25", "torch_pybt_v25", "jax_prealloc_v25",
                                                        "ddp_leak_v25", "torch_smi_v25")]
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "nsysan", "batch", *many, "-o", str(out), "-j", "1"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list(out.glob("analyses/*.json")):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    done = list((out / "analyses").glob("*.json"))
    if len(done) == len(many):  # the machine was fast enough to finish first: nothing to interrupt
        pytest.skip("the batch finished before the interrupt")
    assert proc.returncode == 130, stderr
    assert "interrupted" in stdout.splitlines()[0] and "Traceback" not in stderr
    rows = read_csv(out / "summary.csv")
    assert len(rows) >= 1 and {r["report"] for r in rows} <= set(many)
    assert rows[0]["report"] == many[0] and int(rows[0]["peak_bytes"]) == KNOWN_PEAK
    import sqlite_utils

    assert sqlite_utils.Database(out / "nsysan.db")["reports"].count == len(done)


def test_inputs_from_globs_and_lists(tmp_path):
    listing = tmp_path / "reports.txt"
    listing.write_text(f"# two reports\n{FIXTURES / 'known_mem_v25.sqlite'}\n\n{FIXTURES / 'real_oom_v25.sqlite'}\n")
    assert expand_inputs([f"@{listing}"]) == [FIXTURES / "known_mem_v25.sqlite", FIXTURES / "real_oom_v25.sqlite"]
    torch = expand_inputs([str(FIXTURES / "torch_*_v25.sqlite")])
    assert [p.name for p in torch] == sorted(p.name for p in FIXTURES.glob("torch_*_v25.sqlite"))
    # every report of fixtures/ has its export beside it (one capture, one entry: the export), so a
    # folder holding a report alone stands for the reports a folder search keeps as they are
    lone = tmp_path / "lone"
    lone.mkdir()
    shutil.copy(FIXTURES / "known_mem_v22.nsys-rep", lone)
    every = expand_inputs([str(FIXTURES), str(lone), str(FIXTURES / "known_mem_v25.sqlite")])
    assert len(every) == len({p.resolve() for p in every})  # each report once
    assert {p.suffix for p in every} == {".sqlite", ".nsys-rep"}
    assert lone / "known_mem_v22.nsys-rep" in every


def test_the_queries_of_the_docs(tmp_path):
    """docs/batch.md's three queries on a history of two tags: the clean run, then the leak."""
    import re

    import sqlite_utils

    history = tmp_path / "history.db"
    for tag, name in (("clean", "torch_clean_v25"), ("leak", "torch_leak_v25")):
        (tmp_path / tag).mkdir()
        (tmp_path / tag / f"{name}.analysis.json").write_text(render_json(analysis_of(name)))
        done = run("batch", str(tmp_path / tag), "-o", str(tmp_path / f"out-{tag}"), "--db", str(history),
                   "--tag", tag, "-j", "1")
        assert done.returncode == 0, done.stderr
    (ddp := tmp_path / "ddp").mkdir()
    (ddp / "ddp.analysis.json").write_text(render_json(analysis_of("ddp_leak_v25")))
    assert run("batch", str(ddp), "-o", str(tmp_path / "out-ddp"), "--db", str(history), "-j", "1").returncode == 0
    trend, leaks, grew = re.findall(r"```sql\n(.*?)```", (ROOT / "docs" / "batch.md").read_text(), flags=re.S)[:3]
    db = sqlite_utils.Database(history)
    assert [(r["tag"], r["name"]) for r in db.query(trend) if r["name"].startswith("torch")] == \
        [("clean", "torch_clean_v25.analysis.json"), ("leak", "torch_leak_v25.analysis.json")]
    # ddp_leak_v25: rank 1 (GPU 1) leaks 64 MiB per step and keeps more than rank 0
    assert [r["process"] for r in db.query(leaks)][:2] == ["rank 1", "rank 0"]
    sites = list(db.query(grew, {"old": "clean", "new": "leak"}))
    leak_growth = [r for r in truth("torch_leak_v25") if "step" in r][-1]["peak_reserved"] - \
        [r for r in truth("torch_clean_v25") if "step" in r][-1]["peak_reserved"]
    assert sites[0]["label"] == "cudaMalloc in forward [python3]"
    assert sum(s["grew_bytes"] for s in sites if s["kind"] == "device") == leak_growth


def test_summary_page_escapes_what_reports_carry():
    from nsysan.model.batch import BatchResult, SummaryRow
    from nsysan.render.batch_summary import render_summary_html

    nasty = "<script>alert(1)</script>"
    batch = BatchResult(reports=1, failed=1, engine="this process", out_dir=Path("out"), db_path=Path("out/nsysan.db"),
                        rows=[SummaryRow(report=f"{nasty}.sqlite", report_hash=None, status="failed", error=nasty)])
    page = render_summary_html(batch)
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;.sqlite" in page
    assert page.count("<script>") == 1  # the page's own sorting script, allowed by its hash


def test_db_never_writes_into_another_database(tmp_path):
    export = tmp_path / "export.sqlite"
    export.write_bytes((FIXTURES / "known_mem_v25.sqlite").read_bytes())
    before = export.read_bytes()
    result = run("batch", str(FIXTURES / "known_mem_v25.sqlite"), "-o", str(tmp_path / "out"), "--db", str(export))
    assert result.returncode == 2 and "is not an nsysan database" in result.stderr
    assert export.read_bytes() == before and not (tmp_path / "out" / "analyses").exists()


def test_the_summary_page_does_not_import_matplotlib():
    # matplotlib's import is 1-2 s of every batch on a small machine, and the summary has no plots.
    code = ("import sys, nsysan.batch, nsysan.render.batch_summary; "
            "sys.exit('matplotlib' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0
