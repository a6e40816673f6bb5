"""The program's own out-of-memory error joined with the trace (`--log`), and what the trace says
when no call failed (issue 26: "An OOM the trace does not show as a failed call").

torch_oom_v25 ran `torch_train.py --oom --fraction 0.04` and died of torch.OutOfMemoryError; its
stderr is fixtures/torch_oom_v25.stderr.txt. Expected values are read from that text here with
plain string operations (not nsysan's parser) or from the truth file.
"""

from __future__ import annotations

import hashlib
import json
import re

import pytest
from conftest import FIXTURES, analysis_of, truth
from test_documents import cli

import nsysan
from nsysan.errors import NsysanError
from nsysan.sources.oom_log import read_oom_log

MiB, GiB = 1 << 20, 1 << 30
DB = FIXTURES / "torch_oom_v25.sqlite"
LOG = FIXTURES / "torch_oom_v25.stderr.txt"
PID = 1872  # the training process (PROCESSES)


def printed(size: str) -> int:
    """'1.50 GiB' as bytes, the way PyTorch's format_size wrote it (two decimals)."""
    value, unit = size.split()
    return round(float(value) * {"GiB": GiB, "MiB": MiB}[unit])


def logged_numbers() -> dict:
    """The numbers of the one error in the stderr file, cut out of its text by hand."""
    text = LOG.read_text()
    line = next(i for i, line in enumerate(text.splitlines(), 1) if "CUDA out of memory" in line)
    after = text[text.index("Tried to allocate "):]
    request = after[len("Tried to allocate "):after.index(". GPU")]
    allowed = after[:after.index(" allowed;")].rsplit(". ", 1)[1]
    allocated = after.split("Of the allocated memory ")[1].split(" is allocated")[0]
    unallocated = after.split("and ")[1].split(" is reserved by PyTorch but unallocated")[0]
    return {"line": line, "request": printed(request), "cap": printed(allowed), "allocated": printed(allocated),
            "unallocated": printed(unallocated)}


@pytest.fixture(scope="module")
def with_log():
    return nsysan.analyze(DB, log=LOG)


def test_the_logged_error_gives_the_request_the_cap_and_the_split(with_log):
    expected = logged_numbers()
    (m,) = with_log.oom.logged
    assert (m.log, m.line, m.framework, m.wording) == (LOG.name, expected["line"], "pytorch", "pytorch_2")
    assert m.request_bytes == expected["request"] == 1536 * MiB
    assert m.cap_bytes == expected["cap"]
    assert (m.allocated_bytes, m.reserved_unallocated_bytes) == (expected["allocated"], expected["unallocated"])
    # the log names no pid: the one process whose ranges were left open is the one that died
    assert (m.matched_pid, m.matched_by, m.device) == (PID, "only_death", 0)
    # 4.17 GiB + 155.95 MiB held + 1.50 GiB asked = 5.82 GiB > 5.59 GiB allowed
    held = expected["allocated"] + expected["unallocated"]
    assert held + expected["request"] > expected["cap"] and expected["unallocated"] < expected["request"]
    assert m.verdict == "over_cap"
    assert "Over the cap: 4.32 GiB held + 1.50 GiB asked = 5.82 GiB, more than the 5.59 GiB allowed" in m.message


def test_the_trace_agrees_with_the_message_on_what_was_reserved(with_log):
    """After its cache release the allocator held what the message calls allocated + reserved
    but unallocated (the trace's segments minus cuBLAS's workspaces, which stay outside it)."""
    (m,) = with_log.oom.logged
    expected = logged_numbers()
    # PyTorch prints two decimals: 4.17 GiB is within 5 MiB of the true value
    assert abs(m.trace_reserved_bytes - (expected["allocated"] + expected["unallocated"])) <= 0.005 * GiB + 0.005 * MiB
    (gave_up,) = with_log.oom.allocator_ooms
    from nsysan.base.units import fmt_time

    assert f"after it freed its cache at {fmt_time(gave_up.release.start_ns)} in step 5 > hoard" in m.message
    assert gave_up.release.pid == PID


def test_a_run_that_died_of_an_allocator_oom_is_fatal_from_trace_and_log(with_log):
    without = analysis_of("torch_oom_v25")
    assert [(f.pid, f.found_by) for f in without.oom.fatal] == [(PID, "trace")]
    assert [(f.pid, f.found_by) for f in with_log.oom.fatal] == [(PID, "trace and log")]
    for name in ("torch_leak_v25", "real_oom_v25", "torch_expandable_v25"):
        assert analysis_of(name).oom.fatal == []  # finished runs; real_oom_v25's failed call was retried


def test_the_cap_from_the_message_is_a_cap(with_log):
    expected = logged_numbers()
    caps = {(c.source, c.cap_bytes) for c in with_log.caps if c.pid == PID and c.device == 0}
    assert ("oom_message", expected["cap"]) in caps


def test_the_logged_verdict_is_the_first_out_of_memory_answer_and_first_screen(with_log):
    oom = [a for a in with_log.answers if a.topic == "oom"]
    assert oom[0].code == "oom_logged" and oom[0].severity == "warning"
    import io

    from rich.console import Console

    from nsysan.render.terminal import render_terminal

    console = Console(width=120, record=True, file=io.StringIO())
    render_terminal(with_log, console)
    text = console.export_text()
    first = " ".join(text[:text.index("Peak GPU memory")].split())
    assert "out of memory torch_oom_v25.stderr.txt line 8" in first.replace(":", "") and "5.59 GiB allowed" in first


def test_the_page_says_the_logged_error_first(with_log, tmp_path):
    from nsysan.render.html import render_html

    page = render_html(with_log)
    verdicts = page[page.index('id="verdicts"'):]
    assert verdicts.index("verdict-oom-logged-1") < verdicts.index("verdict-allocator-oom")
    assert "5.82 GiB, more than the 5.59 GiB allowed" in verdicts


def test_json_carries_the_logged_error_and_reads_back(with_log, tmp_path):
    from nsysan.render.json import render_json

    document = json.loads(render_json(with_log))
    (m,) = document["oom"]["logged"]
    assert (m["request_bytes"], m["verdict"], m["matched_pid"]) == (1536 * MiB, "over_cap", PID)
    assert document["oom"]["fatal"] == [{"pid": PID, "found_by": "trace and log"}]
    path = tmp_path / "analysis.json"
    path.write_text(render_json(with_log))
    assert nsysan.load_analysis(path).oom.logged == with_log.oom.logged


def test_check_joins_the_log_with_an_analysis_document(tmp_path, capsys):
    """A committed analysis.json joined with the log gives the same OOM verdict as the report."""
    from nsysan.render.json import render_json

    path = tmp_path / "run.analysis.json"
    path.write_text(render_json(analysis_of("torch_oom_v25")))
    code, out, err = cli(capsys, "check", str(path), "--log", str(LOG), "--max-peak", "100GiB")
    assert code == 0 and err == ""
    again = nsysan.load_analysis(path)
    from nsysan.pipeline.report_or_document import load_or_analyze

    joined = load_or_analyze(path, oom_logs=[LOG])
    assert [m.verdict for m in joined.oom.logged] == ["over_cap"] and again.oom.logged == []
    twice = load_or_analyze(path, oom_logs=[LOG])
    assert [d.code for d in twice.diagnostics].count("oom_logged") == 1


def test_analyze_cli_prints_the_verdict_and_never_the_logs_other_lines(capsys, tmp_path):
    log = tmp_path / "run.log"
    secret = "HF_TOKEN=hf_abcdefghijklmnop"
    log.write_text(f"export {secret}\n" + LOG.read_text() + "\nwandb: api key 1234567890abcdef\n")
    before = hashlib.sha256(log.read_bytes()).hexdigest()
    code, out, err = cli(capsys, "analyze", str(DB), "--log", str(log), "--format", "json")
    assert code == 0 and secret not in out and "api key" not in out and "Traceback" not in out
    assert json.loads(out)["oom"]["logged"][0]["line"] == logged_numbers()["line"] + 1
    assert hashlib.sha256(log.read_bytes()).hexdigest() == before  # the input is never changed


@pytest.mark.parametrize("make, says", [
    (lambda p: p.mkdir(), "is a directory"),
    (lambda p: None, "could not be read"),
])
def test_a_bad_log_is_one_line_and_exit_2(make, says, tmp_path, capsys):
    path = tmp_path / "bad.log"
    make(path)
    code, out, err = cli(capsys, "analyze", str(DB), "--log", str(path))
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_device_or_pipe_is_refused(capsys):
    code, out, err = cli(capsys, "check", str(DB), "--log", "/dev/null")
    assert code == 2 and "not a regular file" in err


def test_a_log_without_an_error_says_so(tmp_path):
    log = tmp_path / "quiet.log"
    log.write_text("step 0 loss 2.3\nstep 1 loss 2.1\n")
    analysis = nsysan.analyze(DB, log=log)
    assert analysis.oom.logged == []
    note = next(d for d in analysis.diagnostics if d.code == "oom_log_empty")
    assert note.severity == "info" and "quiet.log" in note.message and "loss" not in note.message


# --- wordings: the parser on each form PyTorch and XLA print ------------------------------------

WORDINGS = {
    # PyTorch 2.1+, another process listed (as in a container), no fraction cap
    "pytorch_2_other": ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.25 GiB. GPU 1 has a total "
                        "capacity of 93.02 GiB of which 1.18 GiB is free. Process 2752205 has 60.00 GiB memory in "
                        "use. Including non-PyTorch memory, this process has 31.82 GiB memory in use. Of the "
                        "allocated memory 30.63 GiB is allocated by PyTorch, and 120.54 MiB is reserved by PyTorch "
                        "but unallocated. If reserved but unallocated memory is large try setting "
                        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."),
    # PyTorch 2.1+, fragmentation: more cached than asked
    "pytorch_2_fragmented": ("(VllmWorker rank=1 pid=254) torch.OutOfMemoryError: CUDA out of memory. Tried to "
                             "allocate 764.00 MiB. GPU 0 has a total capacity of 47.37 GiB of which 442.88 MiB is "
                             "free. Including non-PyTorch memory, this process has 46.92 GiB memory in use. Of the "
                             "allocated memory 42.40 GiB is allocated by PyTorch, and 3.24 GiB is reserved by "
                             "PyTorch but unallocated."),
    # PyTorch 1.x-2.0, with a fraction cap
    "pytorch_1": ("RuntimeError: CUDA out of memory. Tried to allocate 36.00 MiB (GPU 0; 7.93 GiB total capacity; "
                  "180.35 MiB already allocated; 47.06 MiB free; 200.00 MiB allowed; 188.00 MiB reserved in total by "
                  "PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid "
                  "fragmentation."),
    "xla": ("jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
            "17179869184 bytes."),
}


def test_pytorch_2_wording_with_another_process(tmp_path):
    path = tmp_path / "a.log"
    path.write_text(WORDINGS["pytorch_2_other"] + "\n")
    (m,) = read_oom_log(path)
    assert (m.wording, m.device, m.request_bytes) == ("pytorch_2", 1, printed("1.25 GiB"))
    assert m.other_processes == {2752205: printed("60.00 GiB")} and m.cap_bytes is None
    assert m.process_bytes == printed("31.82 GiB") and m.free_bytes == printed("1.18 GiB")


def test_pytorch_2_wording_with_a_pid_and_fragmentation(tmp_path):
    path = tmp_path / "a.log"
    path.write_text("loading\n" + WORDINGS["pytorch_2_fragmented"] + "\n")
    (m,) = read_oom_log(path)
    assert (m.pid, m.line, m.reserved_unallocated_bytes) == (254, 2, printed("3.24 GiB"))


def test_pytorch_1_wording_with_a_cap(tmp_path):
    path = tmp_path / "a.log"
    path.write_text(WORDINGS["pytorch_1"] + "\n")
    (m,) = read_oom_log(path)
    assert (m.wording, m.request_bytes, m.total_bytes) == ("pytorch_1", 36 * MiB, printed("7.93 GiB"))
    assert (m.cap_bytes, m.allocated_bytes, m.free_bytes) == (200 * MiB, printed("180.35 MiB"), printed("47.06 MiB"))
    assert m.reserved_unallocated_bytes == printed("188.00 MiB") - printed("180.35 MiB")


def test_xla_wordings_are_one_error_with_the_allocators_limit(tmp_path):
    path = tmp_path / "a.log"
    path.write_text(
        "W bfc_allocator.cc:291] Allocator (GPU_0_bfc) ran out of memory trying to allocate 2.2KiB with "
        "freed_by_count=0. The caller indicates that this is not a failure, but may mean that there could be "
        "performance gains if more memory were available.\n"
        "W bfc_allocator.cc:497] Allocator (GPU_0_bfc) ran out of memory trying to allocate 16.00GiB (rounded to "
        "17179869184)requested by op\nI bfc_allocator.cc:1100] Stats:\nLimit:        112654417920\n"
        "InUse:        100000000000\n" + WORDINGS["xla"] + "\n")
    (m,) = read_oom_log(path)
    assert (m.framework, m.wording, m.device, m.request_bytes) == ("xla", "xla_bfc", 0, 16 * GiB)
    assert (m.cap_bytes, m.allocated_bytes) == (112654417920, 100000000000)


@pytest.mark.parametrize("name, verdict", [("pytorch_2_other", "other_process"),
                                           ("pytorch_2_fragmented", "fragmentation"),
                                           ("pytorch_1", "over_cap")])
def test_each_verdict_from_its_numbers(name, verdict, tmp_path):
    """Joined with a one-process capture, the verdict follows the message's numbers: 60 GiB held
    by another process with 1.18 GiB free; 3.24 GiB cached > 764 MiB asked; 188 MiB reserved +
    36 MiB asked > 200 MiB allowed."""
    path = tmp_path / f"{name}.log"
    path.write_text(WORDINGS[name] + "\n")
    analysis = nsysan.analyze(FIXTURES / "torch_leak_v25.sqlite", log=path)
    (m,) = analysis.oom.logged
    assert m.verdict == verdict and m.matched_by == "only_process"
    assert {"other_process": "Another process", "fragmentation": "Fragmentation",
            "over_cap": "Over the cap"}[verdict] in m.message


def test_a_long_log_is_read_line_by_line_and_the_same_error_once(tmp_path):
    path = tmp_path / "long.log"
    noise = ("\r".join(f"{i}%|####| {i}/100" for i in range(100)) + "\n") * 2000
    path.write_text(noise + LOG.read_text() + noise + LOG.read_text())
    found = read_oom_log(path)
    assert len(found) == 2  # read_oom_log keeps both; read_oom_logs says the same error once
    from nsysan.sources.oom_log import read_oom_logs

    assert len(read_oom_logs([path])) == 1
    assert re.search(r"\d", str(found[0].line))


def test_batch_joins_each_log_with_the_report_it_is_named_after(tmp_path, capsys):
    import glob
    import shutil

    folder = tmp_path / "runs"
    folder.mkdir()
    shutil.copy(DB, folder / DB.name)
    shutil.copy(LOG, folder / LOG.name)  # torch_oom_v25.stderr.txt goes with torch_oom_v25.sqlite
    code, out, err = cli(capsys, "batch", str(folder / DB.name), "-o", str(tmp_path / "out"), "-j", "1",
                         "--no-progress", "--log", str(folder / LOG.name))
    assert code == 0, err
    (document,) = glob.glob(str(tmp_path / "out" / "analyses" / "*.json"))
    oom = json.loads(open(document).read())["oom"]
    assert [m["verdict"] for m in oom["logged"]] == ["over_cap"]
    assert oom["fatal"] == [{"pid": PID, "found_by": "trace and log"}]
    stray = tmp_path / "other.log"
    stray.write_text("x\n")
    code, out, err = cli(capsys, "batch", str(folder / DB.name), "-o", str(tmp_path / "out2"), "-j", "1",
                         "--no-progress", "--log", str(stray))
    assert code == 2 and "named after none of the reports" in err


def _died_inside(tmp_path):
    """A Python process whose caching allocator holds 2, 20, 64, 256 and 256 MiB segments, made in
    steps 0-2 (+ 84, + 256, + 256 MiB); it then enters 'big request' in step 3 and its trace stops
    there, 990 ms before the capture ends: no call failed and nothing was released."""
    import sqlite3

    from builders import make_export

    sizes = [(2 * MiB, 0), (20 * MiB, 0), (64 * MiB, 0), (256 * MiB, 1), (256 * MiB, 2)]
    memory = [(1_000_000 * (step + 1) + 100 * i, 0x10000000 * (i + 1), size, 0, i + 1)
              for i, (size, step) in enumerate(sizes)]
    calls = [(t, t + 50, "cudaMalloc_v3020", c) for t, _, _, _, c in memory]
    nvtx = [(1_000_000 * s + 500_000, 1_000_000 * s + 900_000 if s < 2 else 1_000_000 * s + 1_900_000, f"step {s}")
            for s in range(3)]
    nvtx[2] = (3_000_000 + 0, 3_900_000, "step 2")
    nvtx += [(4_000_000, None, "step 3"), (4_100_000, None, "big request")]
    path = make_export(tmp_path / "died.sqlite", memory=memory, calls=calls, nvtx=nvtx)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE PROCESSES SET name = 'python3'")
        conn.execute("UPDATE ANALYSIS_DETAILS SET duration = 1000000000, stopTime = 1000000000")
    return path


def test_a_process_that_ends_inside_an_open_range_is_said_in_full(tmp_path):
    analysis = nsysan.analyze(_died_inside(tmp_path))
    assert analysis.oom.allocator_ooms == [] and analysis.oom.failures == []
    (ended,) = analysis.oom.ended_inside
    assert ended.open_ranges == ["step 3", "big request"] and ended.process_ended
    assert ended.live_bytes == (2 + 20 + 64 + 256 + 256) * MiB and ended.blocks == 5
    assert [(s.bytes, s.count) for s in ended.block_sizes] == [(256 * MiB, 2), (64 * MiB, 1), (20 * MiB, 1),
                                                               (2 * MiB, 1)]
    assert "ended inside 'big request' (step 3 > big request) without closing it" in ended.message
    assert "if this was an out-of-memory error, its message gives the request and the cap" in ended.message
    assert "in 5 blocks (2 × 256.0 MiB, 64.0 MiB, 20.0 MiB, 2.0 MiB)" in ended.message
    codes = [a.code for a in analysis.answers if a.topic == "oom"]
    assert "ended_inside" in codes and "run_cut_short" not in codes  # said once, in full
    assert analysis.oom.fatal == []  # the trace alone can't tell an OOM from a kill


def test_the_log_of_a_process_that_ended_inside_makes_it_fatal(tmp_path):
    log = tmp_path / "died.stderr.txt"
    log.write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total "
                   "capacity of 139.80 GiB of which 137.00 GiB is free. Including non-PyTorch memory, this process "
                   "has 1.10 GiB memory in use. 1.20 GiB allowed; Of the allocated memory 512.00 MiB is allocated "
                   "by PyTorch, and 86.00 MiB is reserved by PyTorch but unallocated.\n")
    analysis = nsysan.analyze(_died_inside(tmp_path), log=log)
    (m,) = analysis.oom.logged
    assert (m.matched_by, m.verdict, m.trace_reserved_bytes) == ("only_death", "over_cap", 598 * MiB)
    assert "when it ended inside 'big request'" in m.message
    assert [f.found_by for f in analysis.oom.fatal] == ["log"]


# --- the wave-3 captures of issue 26 ----------------------------------------------------------------

def test_fraction_oom_with_nothing_cached_ended_inside_big_request():
    """torch_fraction_oom_v25: a 2 GiB request inside 'big request' refused under a 2.80 GiB cap
    with nothing cached: no call failed, nothing was released (its empty_cache() came before the
    range and is a flush), and the trace just stops inside the range."""
    analysis = analysis_of("torch_fraction_oom_v25")
    before = next(r for r in truth("torch_fraction_oom_v25") if r.get("event") == "before_big_request")
    assert analysis.oom.failures == [] and analysis.oom.allocator_ooms == [] and len(analysis.oom.cache_flushes) == 1
    (ended,) = analysis.oom.ended_inside
    assert ended.open_ranges == ["big request"] and ended.process_ended
    # what the caching allocator held then is PyTorch's reserved (num_device_alloc segments)
    assert ended.reserved_bytes == before["reserved"]
    assert sum(s.bytes * s.count for s in ended.block_sizes) <= ended.live_bytes
    assert [(s.bytes, s.count) for s in ended.block_sizes][0] == (400 * MiB, 3)  # the three steps' 400 MiB
    assert ended.message.startswith(f"process {ended.pid} ended inside 'big request' without closing it")
    # the growth before it: steps 0-2, each keeping 400 MiB; after step 2 the caching allocator
    # held the truth's reserved (the rest is cuBLAS's workspace, outside it)
    steps = [r for r in truth("torch_fraction_oom_v25") if "step" in r]
    (series,) = analysis.steps
    (use,) = analysis.reserved.allocators
    assert series.steps[-1].end_live_bytes - use.outside_end_bytes == steps[-1]["reserved"]
    assert "before it, steps 0-2 took it from" in ended.message
    assert "if this was an out-of-memory error, its message gives the request and the cap" in ended.message
    assert [a.code for a in analysis.answers if a.topic == "oom"] == ["ended_inside"]
    assert analysis.oom.fatal == [] and all(c.source == "gpu_total" for c in analysis.caps)


def test_fraction_oom_joined_with_its_stderr():
    analysis = nsysan.analyze(FIXTURES / "torch_fraction_oom_v25.sqlite",
                              log=FIXTURES / "torch_fraction_oom_v25.stderr.txt")
    before = next(r for r in truth("torch_fraction_oom_v25") if r.get("event") == "before_big_request")
    (m,) = analysis.oom.logged
    assert m.request_bytes == before["request_bytes"] == 2 * GiB
    assert abs(m.cap_bytes - before["cap_bytes"]) < 0.005 * GiB  # "2.80 GiB allowed", two decimals
    assert abs(m.allocated_bytes - before["allocated"]) < 0.005 * GiB
    assert (m.verdict, m.matched_by, m.trace_reserved_bytes) == ("over_cap", "only_death", before["reserved"])
    assert "when it ended inside 'big request'" in m.message
    (ended,) = analysis.oom.ended_inside
    assert "Its logged error says what it asked for and the cap" in ended.message
    assert [(f.pid, f.found_by) for f in analysis.oom.fatal] == [(ended.pid, "log")]


def test_empty_cache_without_nvtx_goes_on_and_is_no_oom():
    """torch_emptycache_v25: no NVTX, empty_cache() after step 3 (36 segments released), then on."""
    analysis = analysis_of("torch_emptycache_v25")
    oom = analysis.oom
    assert oom.allocator_ooms == [] and oom.ended_inside == [] and oom.fatal == [] and oom.failures == []
    assert len(oom.cache_flushes) == 1 and oom.cache_flushes[0].followed_by_allocation
    assert {c.source for c in analysis.caps} == {"gpu_total"}  # no cap invented from its live bytes
    assert not any(a.topic == "oom" for a in analysis.answers)


def test_jax_oom_joined_with_its_resource_exhausted_error():
    """jax_oom_v25: XLA refused 20 GiB inside its 7,505,707,008-byte limit; the capture lost its
    memory table (nsys importer errors), so the log says what the trace cannot."""
    records = truth("jax_oom_v25")
    request = next(r["request_bytes"] for r in records if r.get("event") == "before_big_array")
    limit = next(r["bytes_limit"] for r in records if "bytes_limit" in r)
    analysis = nsysan.analyze(FIXTURES / "jax_oom_v25.sqlite", log=FIXTURES / "jax_oom_v25.stderr.txt")
    (m,) = analysis.oom.logged  # the BFC warning and the RESOURCE_EXHAUSTED exception are one error
    assert (m.framework, m.request_bytes, m.cap_bytes, m.device) == ("xla", request, limit, 0)
    # glog's thread id on the BFC line is the main thread's: the process's pid
    assert m.verdict == "over_cap" and (m.matched_pid, m.matched_by) == (analysis.oom.cut_short[0].pid, "pid")
    assert "XLA's allocator" in m.message and "PyTorch" not in m.message
    (ended,) = analysis.oom.ended_inside
    assert "the capture has no sizes" in ended.message and "0 B live" not in ended.message
    text = " ".join(a.message for a in analysis.answers) + " ".join(d.message for d in analysis.diagnostics)
    assert "PyTorch's caching allocator" not in text and "(PyTorch) process" not in text


def test_a_ranks_error_joins_that_rank(tmp_path):
    """torchrun prefixes each line of a rank with [rankN]: on ddp_leak_v25 rank 1 is process 2147."""
    log = tmp_path / "train.log"
    log.write_text("[rank0]: step 7 done\n[rank1]: " + WORDINGS["pytorch_2_other"] + "\n")
    analysis = nsysan.analyze(FIXTURES / "ddp_leak_v25.sqlite", log=log)
    (m,) = analysis.oom.logged
    rank1 = next(p.pid for p in analysis.capture.processes if p.rank == 1)
    assert (m.matched_pid, m.matched_by) == (rank1, "rank") == (2147, "rank")
    assert m.message.startswith("train.log line 2: PyTorch's caching allocator of rank 1")


def test_a_log_without_newlines_is_read_in_pieces(tmp_path):
    """20 MiB without a newline, then the error: read MAX_LINE bytes at a time, the error found."""
    path = tmp_path / "one-line.log"
    with open(path, "wb") as handle:
        handle.write(b"x" * (20 << 20) + b"\n")
        handle.write(LOG.read_bytes())
    (m,) = read_oom_log(path)
    assert m.request_bytes == 1536 * MiB and m.line == 1 + logged_numbers()["line"]


def test_a_document_joined_later_is_the_report_joined_now(tmp_path):
    """check and batch join a committed analysis.json with the log: the same document as
    analyzing the report with the log (the verdict line and every other answer kept in place)."""
    from nsysan.pipeline.report_or_document import load_or_analyze
    from nsysan.render.json import render_json

    path = tmp_path / "run.analysis.json"
    path.write_text(render_json(analysis_of("torch_fraction_oom_v25")))
    stderr = FIXTURES / "torch_fraction_oom_v25.stderr.txt"
    later = load_or_analyze(path, oom_logs=[stderr])
    now = nsysan.analyze(FIXTURES / "torch_fraction_oom_v25.sqlite", log=stderr)
    assert render_json(later) == render_json(now)
    assert [a.code for a in now.answers if a.topic == "oom"] == ["oom_logged", "ended_inside"]
