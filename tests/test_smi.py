"""nvidia-smi logs laid over the exact timeline (`nsysan analyze --smi`), on torch_smi_v25.

The capture ran `torch_train.py --leak --steps 6` with three nvidia-smi logs beside it, written
in UTC on the capture machine (fixtures/README): `.smi-gpu.csv` (--query-gpu, every 100 ms),
`.smi-gpu-1s.csv` (the same every second) and `.smi-apps.csv` (--query-compute-apps, 100 ms).
Expected values are computed here from the CSV text (the csv module, datetime) and the export
(sqlite3), never by nsysan's own code.
"""

from __future__ import annotations

import csv
import datetime as dt
import sqlite3
import statistics
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import FIXTURES

import nsysan
from nsysan.analyses.live_steps import LiveSteps
from nsysan.analyses.smi import overlay_smi, trace_facts
from nsysan.errors import NsysanError
from nsysan.model import Analysis, Gpu
from nsysan.render.json import render_json
from nsysan.sources.smi_log import read_smi_log

MiB = 1 << 20
SECOND = 1_000_000_000
DB = FIXTURES / "torch_smi_v25.sqlite"
GPU_LOG = FIXTURES / "torch_smi_v25.smi-gpu.csv"
GPU_1S_LOG = FIXTURES / "torch_smi_v25.smi-gpu-1s.csv"
APPS_LOG = FIXTURES / "torch_smi_v25.smi-apps.csv"
PID = 481  # the training process (PROCESSES, and the apps log's pid column)


@pytest.fixture(scope="module")
def overlay() -> Analysis:
    return nsysan.analyze(DB, smi=[GPU_LOG, GPU_1S_LOG, APPS_LOG])


# --- what the test knows independently ------------------------------------------------------------


def query(sql: str, *args) -> list[tuple]:
    with sqlite3.connect(f"file:{DB}?mode=ro", uri=True) as conn:
        return conn.execute(sql, args).fetchall()


def session_start() -> int:
    return query("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")[0][0]


def csv_samples(path: Path, used_column: str) -> list[tuple[int, int]]:
    """(trace-clock ns, bytes) of every row: nvidia-smi's UTC wall time minus the session start."""
    start = session_start()
    rows = []
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle, skipinitialspace=True)
        for row in reader:
            moment = dt.datetime.strptime(row["timestamp"], "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=dt.timezone.utc)
            utc_ns = int(moment.timestamp()) * SECOND + moment.microsecond * 1000
            value = int(row[used_column].removesuffix(" MiB")) * MiB
            rows.append((utc_ns - start, value))
    return rows


def live_at(t_ns: int) -> int:
    """GPU-resident bytes (device 2, array 3, static 5) of the process live at t: every alloc
    (operation 0) and free (1) at or before t, straight from the memory table."""
    return query("SELECT coalesce(sum(CASE memoryOperationType WHEN 0 THEN bytes ELSE -bytes END), 0) "
                 "FROM CUDA_GPU_MEMORY_USAGE_EVENTS WHERE memKind IN (2, 3, 5) AND start <= ?", t_ns)[0][0]


def process_run() -> tuple[int, int]:
    """The first CUDA call's start and the last one's end (one process in this capture)."""
    return query("SELECT min(start), max(\"end\") FROM CUPTI_ACTIVITY_KIND_RUNTIME")[0]


def running_differences(samples: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(sample time, nvidia-smi - traced) while the process ran: from its first CUDA call, and
    after its last one until nvidia-smi shows less than the trace holds (it exited: an exit
    frees memory without events)."""
    first, last = process_run()
    out = []
    for t, used in samples:
        traced = live_at(t)
        if t < first:
            continue
        if t > last and used < traced:
            break
        out.append((t, used - traced))
    return out


# --- torch_smi_v25 with its three logs ----------------------------------------------------------


def test_logs_are_on_the_trace_clock_without_options(overlay):
    smi = overlay.smi
    assert smi.tz == "UTC" and smi.session_start_utc_ns == session_start() == 1796037560069036475
    assert [(log.name, log.kind, log.samples) for log in smi.logs] == [
        (GPU_LOG.name, "gpu", 183), (GPU_1S_LOG.name, "gpu", 19), (APPS_LOG.name, "apps", 66)]  # rows in each file
    assert all(log.overlaps and log.aligned and log.gpus == [0] for log in smi.logs)
    assert not [d for d in overlay.diagnostics if d.code.startswith("smi")]
    # The 100 ms logs follow the trace best within a sampling interval of no shift at all.
    for log in (smi.logs[0], smi.logs[2]):
        assert abs(log.best_offset_ns) < 100_000_000 and log.fit > 0.9
    # The first rise of the 100 ms GPU log: 653 MiB at 11:19:25.451, after the first cudaMalloc
    first_alloc = query("SELECT min(start) FROM CUDA_GPU_MEMORY_USAGE_EVENTS")[0][0]
    assert smi.logs[0].first_alloc_ns == first_alloc
    assert 0 <= smi.logs[0].rise_ns - first_alloc < 100_000_000


@pytest.mark.parametrize("path,column,pid", [(GPU_LOG, "memory.used [MiB]", None),
                                              (GPU_1S_LOG, "memory.used [MiB]", None),
                                              (APPS_LOG, "used_gpu_memory [MiB]", PID)])
def test_not_in_the_trace_per_sample(overlay, path, column, pid):
    samples = csv_samples(path, column)
    series = next(s for s in overlay.smi.series if s.log == path.name)
    assert (series.gpu, series.pid) == (0, pid)
    # Every sample is kept (the logs are short) with the trace's live bytes at its instant.
    assert series.ts_ns == [t for t, _ in samples]
    assert series.used_bytes == [v for _, v in samples]
    assert series.traced_bytes == [live_at(t) for t, _ in samples]
    expected = running_differences(samples)
    assert [t for t, r in zip(series.ts_ns, series.running) if r] == [t for t, _ in expected]
    figures = next(n for n in overlay.smi.not_in_trace if n.log == path.name)
    differences = [d for _, d in expected]
    assert figures.samples == len(differences)
    assert figures.median_bytes == round(statistics.median(differences))
    assert figures.max_bytes == max(differences) and figures.min_bytes == min(differences)
    # "nvidia-smi peaks at 6071 MiB where the trace's live device bytes peak at 5418 MiB"
    # (fixtures/README): 5418.25 MiB of device memory plus 0.85 MiB of module statics.
    assert figures.smi_peak_bytes == (6062 if pid else 6071) * MiB
    device_total = query("SELECT sum(bytes) FROM CUDA_GPU_MEMORY_USAGE_EVENTS WHERE memKind = 2 "
                         "AND memoryOperationType = 0")[0][0]
    assert device_total == 5681448960 and round(device_total / MiB) == 5418  # never freed: the leak run
    assert figures.traced_peak_bytes == max(live_at(t) for t in (process_run()[1],))
    # About 555 MiB on the GPU and 546 MiB in the process's own line are in no CUDA memory event.
    assert 500 * MiB < figures.median_bytes < 600 * MiB


def test_sampling_against_the_exact_peak(overlay):
    exact_peak = live_at(process_run()[1])  # the leak run only grows: its peak is its end
    missed = {m.log: m for m in overlay.smi.missed}
    fast, slow = missed[GPU_LOG.name], missed[GPU_1S_LOG.name]
    for m in (fast, slow):
        assert m.exact_peak_bytes == exact_peak
        assert m.highest_sample_bytes == 6071 * MiB
        # This run holds its peak for a second before exiting: both logs see it.
        assert m.sampled_peak_bytes == exact_peak and m.missed_bytes == 0 and m.time_above_ns == 0
    # The exact peak is reached by the last allocation, 10.824 s into the capture.
    assert fast.exact_peak_ns == query("SELECT max(start) FROM CUDA_GPU_MEMORY_USAGE_EVENTS "
                                       "WHERE memKind = 2")[0][0]
    # A spike is sure to be caught only when it outlasts the longest gap between samples:
    # 101 ms in the 100 ms log, 1.001 s in the 1 s log (the gaps in the CSVs' timestamps).
    gaps = lambda path: np.diff([t for t, _ in running_differences(csv_samples(path, "memory.used [MiB]"))])
    assert fast.max_gap_ns == gaps(GPU_LOG).max() == 101_000_000
    assert slow.max_gap_ns == gaps(GPU_1S_LOG).max() == 1_001_000_000
    assert (fast.interval_ns, slow.interval_ns) == (100_000_000, 1_000_000_000)


def test_someone_else(overlay):
    by_log = {o.log: o for o in overlay.smi.someone_else}
    fast = by_log[GPU_LOG.name]
    # 4 MiB were in use on the GPU before the training process started (11:19:25.050: "4 MiB").
    assert fast.before_bytes == 4 * MiB
    # While it ran, memory.used exceeded the apps log's one process by 9 MiB (6071 - 6062).
    assert fast.apps_log == APPS_LOG.name
    assert fast.unattributed_median_bytes == fast.unattributed_max_bytes == 9 * MiB
    assert fast.processes == []  # the apps log lists the traced process only


def test_terminal_json_and_round_trip(overlay):
    text = render_json(overlay)
    again = Analysis.from_dict(__import__("json").loads(text))
    assert again.smi == overlay.smi
    assert '"smi"' not in render_json(nsysan.analyze(DB))  # no --smi, no section: old documents unchanged
    from rich.console import Console

    from nsysan.render.terminal import render_terminal

    console = Console(width=200, record=True, file=open("/dev/null", "w"))
    render_terminal(overlay, console)
    out = console.export_text()
    assert "nvidia-smi against the trace (log times read as UTC; --smi-tz to change)" in out
    assert "peaks: nvidia-smi 6071 MiB, trace 5419 MiB" in out
    assert "4 MiB in use before the traced process started" in out


# --- clock alignment ----------------------------------------------------------------------------


def shifted_copy(source: Path, target: Path, seconds: float) -> Path:
    """The log with every timestamp moved by `seconds` (a clock or zone that was off)."""
    lines = source.read_text().splitlines()
    out = [lines[0]]
    for line in lines[1:]:
        stamp, rest = line.split(", ", 1)
        moment = dt.datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f") + dt.timedelta(seconds=seconds)
        out.append(moment.strftime("%Y/%m/%d %H:%M:%S.%f")[:-3] + ", " + rest)
    target.write_text("\n".join(out) + "\n")
    return target


def test_a_log_three_seconds_late_is_found_and_measured(tmp_path):
    late = shifted_copy(GPU_LOG, tmp_path / "late.csv", 3.0)
    analysis = nsysan.analyze(DB, smi=[late])
    log = analysis.smi.logs[0]
    assert log.aligned is False
    assert abs(log.best_offset_ns + 3 * SECOND) < 50_000_000  # shift it back by 3 s
    warning = next(d for d in analysis.diagnostics if d.code == "smi_clock_offset")
    assert "late.csv looks off the trace's clock" in warning.message
    assert "the offset that fits the trace best is -3.0" in warning.message


def test_a_log_in_another_zone(tmp_path):
    # Read as Paris time (UTC+1 on 30 Nov), the UTC log lands an hour early, beside the capture.
    analysis = nsysan.analyze(DB, smi=[GPU_LOG], smi_tz="Europe/Paris")
    assert analysis.smi.tz == "Europe/Paris" and analysis.smi.series == []
    warning = next(d for d in analysis.diagnostics if d.code == "smi_no_overlap")
    assert "10:19:17.278 UTC" in warning.message and "--smi-tz UTC" in warning.message
    # Written an hour ahead (a UTC+1 machine) and read as +01:00: on the clock again.
    ahead = shifted_copy(GPU_LOG, tmp_path / "paris.csv", 3600)
    assert nsysan.analyze(DB, smi=[ahead], smi_tz="+01:00").smi.logs[0].aligned is True


# --- the reader: columns people log ---------------------------------------------------------------


def test_noheader_nounits_and_reordered_columns_read_the_same(tmp_path):
    reference = read_smi_log(GPU_LOG).samples
    rows = GPU_LOG.read_text().splitlines()[1:]
    fields = [r.split(", ") for r in rows]
    # noheader,nounits with --smi-columns; and a header in another order, units in the header only
    bare = tmp_path / "bare.csv"
    bare.write_text("\n".join(f"{f[0]}, {f[1]}, {f[2]}, {f[3].removesuffix(' MiB')}, {f[4][:-4]}" for f in fields))
    reordered = tmp_path / "reordered.csv"
    reordered.write_text("memory.used [MiB], uuid, timestamp\n"
                         + "\n".join(f"{f[3][:-4]}, {f[2]}, {f[0]}" for f in fields))
    for log in (read_smi_log(bare, ["timestamp", "index", "uuid", "memory.used", "memory.total"]),
                read_smi_log(reordered)):
        assert log.samples["utc_ns"].tolist() == reference["utc_ns"].tolist()
        assert log.samples["used_bytes"].tolist() == reference["used_bytes"].tolist()
        assert set(log.samples["gpu_uuid"]) == {"783f4d28-9b42-1ba8-7576-2ae4657ee43b"}
    assert read_smi_log(APPS_LOG).samples["pid"].unique().tolist() == [PID]


# --- the rules on hand-typed timelines ----------------------------------------------------------


def test_live_steps_queries():
    steps = LiveSteps(np.array([10, 20, 20, 30, 50]), np.array([100, 300, 200, 500, 0]))
    assert steps.at(np.array([5, 10, 20, 29, 30, 60])).tolist() == [0, 100, 200, 200, 500, 0]
    assert steps.peak_in(0, 100) == (500, 30)
    assert steps.peak_in(35, 100) == (500, 35)  # carried in from before the window
    # above 250: the instant at 20 (zero length, 300) and 30..50 (500): 20 ns in two excursions
    assert steps.time_above(250, 0, 100) == (20, 2, 20)


def test_a_spike_between_samples_is_missed(tmp_path):
    # One process: 1 GiB from t=0; a 2 GiB spike from 1.06 s to 1.11 s; all freed at 3 s. A
    # 100 ms sampler at 0.05, 0.15, ... never lands inside the 50 ms spike.
    GiB = 1 << 30
    events = pd.DataFrame({
        "ts_ns": np.array([0, 1_060_000_000, 1_110_000_000, 3_000_000_000], dtype="int64"),
        "pid": np.array([7] * 4, dtype="int32"), "device": np.array([0] * 4, dtype="int16"),
        "kind": pd.Categorical(["device"] * 4), "delta_bytes": np.array([GiB, 2 * GiB, -2 * GiB, -GiB])})
    times = np.arange(50_000_000, 2_960_000_000, 100_000_000)
    start = 1_800_000_000 * SECOND
    zero = dt.datetime.fromtimestamp(1_800_000_000, dt.timezone.utc)
    log_csv = "timestamp, index, memory.used [MiB]\n" + "\n".join(
        (zero + dt.timedelta(microseconds=int(t) // 1000)).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
        + ", 0, 1324 MiB" for t in times)
    path = tmp_path / "spiky.csv"
    path.write_text(log_csv)
    facts = trace_facts(events, [Gpu(0, "test", None)], lambda pid, device: device, {7: (0, 2_990_000_000)},
                        start, 0, 3_000_000_000)
    overlay, diagnostics = overlay_smi([read_smi_log(path)], events, facts, "UTC")
    (missed,) = overlay.missed
    assert missed.exact_peak_bytes == 3 * GiB and missed.exact_peak_ns == 1_060_000_000
    assert missed.sampled_peak_bytes == GiB and missed.missed_bytes == 2 * GiB
    assert (missed.time_above_ns, missed.spikes_missed, missed.longest_missed_ns) == (50_000_000, 1, 50_000_000)
    assert missed.highest_sample_bytes == 1324 * MiB
    (figures,) = overlay.not_in_trace
    assert figures.median_bytes == figures.max_bytes == 300 * MiB  # 1324 MiB shown, 1 GiB traced


# --- hostile logs -------------------------------------------------------------------------------


def test_reader_errors_are_one_clear_line(tmp_path):
    def error(content, columns=None) -> str:
        path = tmp_path / "log.csv"
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        with pytest.raises(NsysanError) as caught:
            read_smi_log(path, columns)
        return caught.value.message

    assert "has no header line" in error("2026/11/30 11:19:17.278, 0, 0 MiB\n")
    assert "has no timestamp column" in error("index, memory.used [MiB]\n0, 5 MiB\n")
    assert "neither memory.used" in error("timestamp, utilization.gpu [%]\n2026/11/30 11:19:17.278, 5 %\n")
    assert "is empty" in error("")
    assert "none of its 3 rows could be read" in error(b"timestamp, memory.used\n\x00\xff\x13garbage\n1, 2\n,,\n")
    assert "names the same column twice" in error("timestamp, uuid, gpu_uuid, memory.used\n")
    with pytest.raises(NsysanError, match="is not a time zone"):
        read_smi_log(GPU_LOG, tz="Mars/Olympus")


def test_truncated_and_na_rows_are_skipped_and_counted(tmp_path):
    text = GPU_LOG.read_text()
    cut = tmp_path / "cut.csv"
    cut.write_text(text[: len(text) - 30] + "\n2026/11/30 11:19:36.000, 0, GPU-x, [N/A], [N/A]\n")
    log = read_smi_log(cut)
    # the last full row is cut (it loses its memory.total), the [N/A] row is unreadable
    assert len(log.samples) == 183 - 1 and log.skipped_rows == 2


def hostile_logs(tmp: Path) -> dict[str, tuple[list[str], int, str]]:
    """name -> (extra arguments, exit code, what the output says)."""
    text = GPU_LOG.read_text()
    (tmp / "garbage.csv").write_bytes(bytes(range(256)) * 40)
    (tmp / "wrong.csv").write_text("timestamp, temperature.gpu\n2026/11/30 11:19:17.278, 40\n")
    (tmp / "noheader.csv").write_text("\n".join(text.splitlines()[1:]) + "\n")
    (tmp / "truncated.csv").write_text(text[: len(text) // 2 + 7])
    (tmp / "other_gpu.csv").write_text(text.replace("GPU-783f4d28", "GPU-0badc0de"))
    (tmp / "next_day.csv").write_text(text.replace("2026/11/30", "2026/12/01"))
    (tmp / "a_dir.csv").mkdir()
    db = str(DB)
    return {
        "missing": ([db, "--smi", str(tmp / "nope.csv")], 2, "--smi nope.csv: no such file"),
        "directory": ([db, "--smi", str(tmp / "a_dir.csv")], 2, "is a directory"),
        "garbage": ([db, "--smi", str(tmp / "garbage.csv")], 2, "has no header line"),
        "wrong columns": ([db, "--smi", str(tmp / "wrong.csv")], 2, "has neither memory.used"),
        "no header": ([db, "--smi", str(tmp / "noheader.csv")], 2, "give its columns in order with --smi-columns"),
        "bad zone": ([db, "--smi", str(GPU_LOG), "--smi-tz", "Moon/Base"], 2, "is not a time zone"),
        "two reports": ([db, db, "--smi", str(GPU_LOG)], 2, "--smi takes one report"),
        "columns twice": ([db, "--smi", str(GPU_LOG), "--smi-columns", "timestamp,memory.used",
                           "--smi-columns", "timestamp,memory.used"], 2, "--smi-columns was given 2 times"),
        "truncated": ([db, "--smi", str(tmp / "truncated.csv")], 0, "smi_rows_skipped"),
        "another GPU": ([db, "--smi", str(tmp / "other_gpu.csv")], 0, "smi_other_gpu"),
        "no overlap": ([db, "--smi", str(tmp / "next_day.csv")], 0, "smi_no_overlap"),
    }


HOSTILE = ["missing", "directory", "garbage", "wrong columns", "no header", "bad zone", "two reports",
           "columns twice", "truncated", "another GPU", "no overlap"]


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_logs_through_the_command(tmp_path, case):
    from test_hostile import run_cli

    args, code, said = hostile_logs(tmp_path)[case]
    result = run_cli("analyze", *args, "--format", "json" if code == 0 else "text")
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    assert result.returncode == code, result.stderr
    if code == 2:
        assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("nsysan: ")
        assert said in result.stderr
    else:
        document = __import__("json").loads(result.stdout)
        assert said in [d["code"] for d in document["diagnostics"]]


def test_notebook_tables(overlay):
    series = overlay.frame("smi_series")  # one row per sample (model/dataframes.py: lists of numbers -> points)
    assert len(series[series["log"] == GPU_LOG.name]) == 183
    not_in_trace = overlay.frame("smi_not_in_trace")
    assert not_in_trace["pid"].tolist()[-1] == PID and len(not_in_trace) == 3


# --- the pictures: PNG timeline and HTML page ---------------------------------------------------


def test_png_timeline_draws_the_samples_over_the_trace(overlay):
    from nsysan.render.png import plot_timeline

    fig = plot_timeline(overlay)
    lines = {line.get_gid(): line for line in fig.findobj() if str(line.get_gid() or "").startswith("smi:")}
    assert set(lines) == {f"smi:{GPU_LOG.name}:0:all", f"smi:{GPU_1S_LOG.name}:0:all", f"smi:{APPS_LOG.name}:0:{PID}"}
    # one point per sample, in the panel's unit (GiB: the trace reaches 5.3 GiB), at the sample's time
    fast = lines[f"smi:{GPU_LOG.name}:0:all"]
    samples = csv_samples(GPU_LOG, "memory.used [MiB]")
    assert len(fast.get_xdata()) == 183
    assert fast.get_ydata()[-60] == pytest.approx(samples[-60][1] / (1 << 30))
    # x in the axis's unit (ms when the span drawn, where memory moves, is under a second)
    per_unit = 1e6 if fast.axes.figure.axes[-1].get_xlabel().endswith("(ms)") else 1e9
    assert fast.get_xdata()[0] == pytest.approx(samples[0][0] / per_unit)
    # the y axis holds nvidia-smi's 6071 MiB peak, above the trace's 5419 MiB
    ax = fast.axes
    assert ax.get_ylim()[1] > 6071 / 1024


def test_html_page_has_the_section_and_escapes_log_names(overlay, tmp_path):
    import dataclasses

    from nsysan.render.html import render_html

    page = render_html(overlay, images={"timeline.png": b"", "sites.png": b""})
    assert '<section id="smi">' in page and "Log times read as UTC" in page
    assert "6071 MiB" in page and "5419 MiB" in page
    hostile_name = "<script>alert(1)</script>.csv"
    logs = [dataclasses.replace(log, name=hostile_name) for log in overlay.smi.logs]
    renamed = dataclasses.replace(overlay, smi=dataclasses.replace(overlay.smi, logs=logs))
    page = render_html(renamed, images={"timeline.png": b"", "sites.png": b""})
    assert hostile_name not in page and "&lt;script&gt;alert(1)&lt;/script&gt;.csv" in page


# --- two processes on two GPUs, logs matched by index and by PCI bus ---------------------------


def test_two_gpus_by_index_and_bus_with_an_untraced_process(tmp_path):
    """ddp_leak_v25 has no nvidia-smi logs: these are written here from its own events, with
    arithmetic the test states. Every process shows its live bytes (rounded up to whole MiB) plus
    500 MiB of context while it runs; an untraced job holds 1000 MiB on GPU 1; memory.used is the
    processes' sum plus 7 MiB nobody owns. The gpu log names GPUs by index, the apps log by bus."""
    db = FIXTURES / "ddp_leak_v25.sqlite"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        start = conn.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()[0]
        bus = dict(conn.execute("SELECT id, busLocation FROM TARGET_INFO_GPU"))  # 0 -> 0000:00:06.0
        rows = conn.execute("SELECT start, (globalPid >> 24) & 16777215, deviceId, CASE memoryOperationType "
                            "WHEN 0 THEN bytes ELSE -bytes END FROM CUDA_GPU_MEMORY_USAGE_EVENTS "
                            "WHERE memKind IN (2, 3, 5) ORDER BY start").fetchall()
        runs = {pid: (first, last) for pid, first, last in conn.execute(
            "SELECT (globalTid >> 24) & 16777215, min(start), max(\"end\") FROM CUPTI_ACTIVITY_KIND_RUNTIME GROUP BY 1")}
    ranks = {2146: 0, 2147: 1}  # pid -> the GPU it trains on (TARGET_INFO_CUDA_DEVICE: ordinal = GPU id)

    def live(pid: int, gpu: int, t: int) -> int:
        return sum(d for ts, p, g, d in rows if p == pid and g == gpu and ts <= t)

    zero = dt.datetime.fromtimestamp(start // SECOND, dt.timezone.utc) + dt.timedelta(microseconds=start % SECOND // 1000)
    stamp = lambda t: (zero + dt.timedelta(microseconds=t // 1000)).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
    gpu_lines, apps_lines = ["timestamp, index, memory.used [MiB]"], ["timestamp, gpu_bus_id, pid, process_name, used_gpu_memory [MiB]"]
    expected_not_in_trace = {2146: [], 2147: []}
    for t in range(0, 15 * SECOND, 100_000_000):
        for gpu in (0, 1):
            used = 7
            for pid in ranks:
                if runs[pid][0] <= t <= runs[pid][1] and (gpu == ranks[pid] or live(pid, gpu, t)):
                    mine = -(-live(pid, gpu, t) // MiB) + (500 if gpu == ranks[pid] else 0)
                    apps_lines.append(f"{stamp(t)}, 00000000:{bus[gpu][5:]}, {pid}, python3, {mine} MiB")
                    used += mine
                    if gpu == ranks[pid]:
                        expected_not_in_trace[pid].append(mine * MiB - live(pid, gpu, t))
            if gpu == 1:
                apps_lines.append(f"{stamp(t)}, 00000000:{bus[1][5:]}, 31337, other_job, 1000 MiB")
                used += 1000
            gpu_lines.append(f"{stamp(t)}, {gpu}, {used} MiB")
    (tmp_path / "gpus.csv").write_text("\n".join(gpu_lines) + "\n")
    (tmp_path / "apps.csv").write_text("\n".join(apps_lines) + "\n")
    analysis = nsysan.analyze(db, smi=[tmp_path / "gpus.csv", tmp_path / "apps.csv"])
    smi = analysis.smi
    assert [log.gpus for log in smi.logs] == [[0, 1], [0, 1]] and all(log.aligned for log in smi.logs)
    assert not [d for d in analysis.diagnostics if d.code.startswith("smi")]
    for pid, gpu in ranks.items():
        figures = next(n for n in smi.not_in_trace if n.log == "apps.csv" and n.pid == pid and n.gpu == gpu)
        assert figures.median_bytes == round(statistics.median(expected_not_in_trace[pid]))
        assert 500 * MiB <= figures.median_bytes < 501 * MiB  # the context, plus less than a MiB of rounding
    other = {o.gpu: o for o in smi.someone_else}
    assert other[1].processes[0].pid == 31337 and other[1].processes[0].name == "other_job"
    assert other[1].processes[0].max_used_bytes == 1000 * MiB and other[0].processes == []
    assert other[0].unattributed_median_bytes == other[1].unattributed_max_bytes == 7 * MiB
    assert other[1].before_bytes == 1007 * MiB  # the other job and the 7 MiB, before rank 1 started


def test_large_api_tables_read_only_their_ends(overlay, monkeypatch):
    """Past ACTIVITY_SCAN_ROWS rows, the run's ends come from the table's first and last rows and
    the memory calls: on this capture (rows in time order) the same samples count."""
    import nsysan.events.read as read

    rows = query("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME")[0][0]
    monkeypatch.setattr(read, "ACTIVITY_SCAN_ROWS", 10)
    monkeypatch.setattr(read, "TAIL_ROWS", rows // 4)
    again = nsysan.analyze(DB, smi=[GPU_LOG])
    assert again.smi.not_in_trace[0] == overlay.smi.not_in_trace[0]
