"""The memory nobody can see and CUDA-graph memory (issue 30, sections 1 and 2), on the real
captures made for them: fixtures/torch_libloads_v25 (cuDNN loading code step after step, with
nvidia-smi logs) and fixtures/torch_graphs_v25 (one CUDA graph per request's batch size).

What the captured programs did is in their truth files and fixtures/README.md; the bytes
captured into graphs are checked against an independent sum of the fixture's memory table over
the capture windows the API table gives."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter

import pytest
from conftest import FIXTURES, analysis_of, cli, truth
from test_bounded_memory import chunk_rowids, full_documents

import nsysan
from nsysan.analyses.hidden import kernel_family

MiB = 1 << 20
LIBLOADS = FIXTURES / "torch_libloads_v25.sqlite"
LIBLOADS_SMI = [FIXTURES / "torch_libloads_v25.smi-gpu.csv", FIXTURES / "torch_libloads_v25.smi-apps.csv"]
# fixtures/README.md: the loads (cuLibraryLoadData + cuModuleLoadData) of steps 0-9.
LOADS_PER_STEP = [26, 5, 13, 3, 8, 7, 3, 3, 5, 3]


@pytest.fixture(scope="module")
def libloads() -> nsysan.Analysis:
    return nsysan.analyze(LIBLOADS, smi=LIBLOADS_SMI)


@pytest.fixture(scope="module")
def graphs() -> nsysan.Analysis:
    return analysis_of("torch_graphs_v25")


def test_code_loads_per_step_are_the_programs(libloads):
    (p,) = libloads.hidden.processes
    assert (p.pid, p.loads, p.unloads) == (1922, 76, 99)
    assert p.apis == {"cuLibraryLoadData": 72, "cuModuleLoadData": 4, "cuLibraryUnload": 99}
    assert [s.name for s in p.steps] == [f"step {r['step']}" for r in truth("torch_libloads_v25") if "step" in r]
    assert [s.loads for s in p.steps] == LOADS_PER_STEP
    assert (p.loads_before_steps, p.loads_in_steps, p.loads_after_steps, p.steps_with_loads) == (0, 76, 0, 10)
    assert p.keeps_loading
    # The module statics the loads brought are the static memory kind's bytes, step by step.
    assert sum(s.static_bytes for s in p.steps) == p.static_bytes == 899581
    assert p.steps[0].static_bytes == 227039 and p.steps[3].static_bytes == 0


def test_loads_are_named_by_the_first_kernel_each_ran(libloads):
    """cuLibraryLoadData / cuModuleLoadData take an image in memory: no file to name, and nsys puts no
    call stack on them (known_bt_v25, captured with --cudabacktrace=all:1, has none on its load). Each
    load is named by the first kernel of its process that started after it ended (within 1 s),
    recounted here with plain SQL over the fixture's API and kernel tables, and grouped into the
    library those kernels' names tell."""
    with sqlite3.connect(f"file:{FIXTURES / 'known_bt_v25.sqlite'}?mode=ro", uri=True) as conn:
        stacks = conn.execute("SELECT count(r.callchainId) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s "
                              "ON s.id = r.nameId WHERE s.value GLOB 'cu*Load*'").fetchone()[0]
    assert stacks == 0
    (p,) = libloads.hidden.processes
    with sqlite3.connect(f"file:{LIBLOADS}?mode=ro", uri=True) as conn:
        rows = conn.execute(
            "SELECT (SELECT s2.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s2 ON s2.id = k.shortName "
            "        WHERE (k.globalPid >> 24) = (r.globalTid >> 24) AND k.start > r.\"end\" "
            "        AND k.start <= r.\"end\" + 1000000000 ORDER BY k.start LIMIT 1) "
            "FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
            "WHERE s.value IN ('cuLibraryLoadData', 'cuModuleLoadData')").fetchall()
        # no bytes per library: the module statics fall inside no load call nor name one (docs/analyses.md)
        statics = conn.execute(
            "SELECT count(*), sum(bytes), count(nullif(correlationId, 0)) FROM CUDA_GPU_MEMORY_USAGE_EVENTS m WHERE memKind = 5 "
            "AND memoryOperationType = 0 AND NOT EXISTS (SELECT 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s "
            "ON s.id = r.nameId WHERE s.value GLOB 'cu*Load*' AND m.start BETWEEN r.start AND r.\"end\")").fetchone()
    assert statics == (1424, 899581, 0)
    counts = Counter(name for (name,) in rows if name)
    assert len(rows) == p.loads_in_steps == 76 and sum(counts.values()) == 74  # 2 ran no kernel within 1 s
    top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
    assert list(p.kernels_after_loads.items()) == top
    assert top[0] == ("nchwToNhwcKernel", 36)  # cuDNN's layout kernel, before each new convolution
    # the library: 11 loads ran a kernel signed _cudnn, 36 + 11 more cuDNN's layout and conv kernels
    assert sum(n for name, n in counts.items() if name.endswith("_cudnn")) == 11
    assert p.libraries_after_loads == {"cuDNN": 58, "own": 13, "cuFFT": 2, "cuBLAS": 1}
    families = Counter()
    for name, n in counts.items():
        families[kernel_family(name)] += n
    assert dict(families) == p.libraries_after_loads
    (answer,) = [a.message for a in libloads.answers if a.code == "code_loads"]
    assert "and 99 unloads; named by the first kernel each load ran (approximate: an image loaded from memory " \
           "names no file): cuDNN 58, own kernels 13, cuFFT 2, cuBLAS 1, 2 followed by no kernel within 1 s (most: " \
           "nchwToNhwcKernel 36, vectorized_elementwise_kernel 3, Kernel 2); each load adds" in answer


@pytest.mark.parametrize("name, family", [
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "NCCL"), ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_cublasLt", "cuBLAS"),
    ("ampere_sgemm_128x64_tn", "cuBLAS"), ("triton_poi_fused_add_0", "Triton"), ("nhwcToNchwKernel", "cuDNN"),
    ("sm80_xmma_fprop_implicit_gemm_f32f32_cudnn", "cuDNN"), ("vectorized_elementwise_kernel", "own")])
def test_kernel_names_tell_their_library(name, family):
    assert kernel_family(name) == family


def test_the_gap_against_nvidia_smi_is_the_truths(libloads):
    """nvidia-smi was 667-675 MiB above PyTorch's reserved bytes at every step (the truth); the
    process's own log row (apps) leaves out the few MiB the GPU holds in no process."""
    (p,) = libloads.hidden.processes
    gpu_gap = next(n for n in libloads.smi.not_in_trace if n.pid is None).median_bytes
    assert 667 * MiB <= gpu_gap <= 675 * MiB
    assert p.smi_gap_bytes == p.unexplained_bytes == next(n for n in libloads.smi.not_in_trace if n.pid == 1922).median_bytes
    assert 655 * MiB <= p.smi_gap_bytes <= 675 * MiB
    gaps = sorted(s.smi_gap_bytes for s in p.steps)
    assert len(gaps) == 10 and 650 * MiB <= gaps[5] <= 675 * MiB
    assert 0 <= p.smi_gap_growth_bytes <= 16 * MiB  # 46 loads after step 0 add little: contexts are most of it
    # The library workspaces would be named from stacks, which this capture lacks: the flag says so
    # only when there is something (>= 1 MiB) outside PyTorch's allocator to name.
    assert p.outside_allocator_bytes == 50696 and p.capture_flags == ""


def test_without_smi_logs_the_capture_advice_is_to_log_them():
    analysis = nsysan.analyze(LIBLOADS)
    (p,) = analysis.hidden.processes
    assert p.smi_gap_bytes is None and p.unexplained_bytes is None
    assert p.capture_flags.startswith("nvidia-smi --query-compute-apps=")
    assert [a.code for a in analysis.answers if a.topic == "unseen"] == ["code_loads"]  # it keeps loading


def test_library_workspaces_are_named_from_native_stacks(torch_pybt_v25):
    """torch_pybt_v25 has native stacks: cuBLAS's own workspace allocations are found through them."""
    (p,) = torch_pybt_v25.hidden.processes
    (lib,) = p.libraries
    assert (lib.library, lib.allocations, lib.allocated_bytes) == ("cuBLAS", 3, 67240960)
    assert not p.keeps_loading and [s.loads for s in p.steps] == [27, 0, 0, 0, 0]  # all at the first step


def capture_windows_bytes() -> list[int]:
    """Device bytes allocated minus freed between each cudaStreamBeginCapture's start and the
    end of the cudaStreamEndCapture after it, straight from the export."""
    with sqlite3.connect(f"file:{FIXTURES / 'torch_graphs_v25.sqlite'}?mode=ro", uri=True) as conn:
        def times(like: str, column: str) -> list[int]:
            return [t for (t,) in conn.execute(
                f'SELECT r."{column}" FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId '
                f"WHERE s.value LIKE ? ORDER BY r.start", (like,))]
        begins, ends = times("cudaStreamBeginCapture%", "start"), times("cudaStreamEndCapture%", "end")
        assert len(begins) == len(ends) == 8
        return [conn.execute("SELECT COALESCE(SUM(CASE memoryOperationType WHEN 0 THEN bytes ELSE -bytes END), 0) "
                             "FROM CUDA_GPU_MEMORY_USAGE_EVENTS WHERE memKind = 2 AND start BETWEEN ? AND ?",
                             (b, e)).fetchone()[0] for b, e in zip(begins, ends)]


def test_graphs_per_request_are_the_programs(graphs):
    (p,) = graphs.graphs.processes
    assert (p.pid, p.captures, p.instantiated, p.launches, p.mem_nodes) == (1698, 8, 8, 8, 0)
    # PyTorch destroys each template graph inside its request; the executable graphs only at exit.
    assert (p.templates_destroyed, p.exec_destroyed, p.exec_destroyed_at_exit) == (8, 8, 8)
    requests = [r for r in truth("torch_graphs_v25") if r.get("request", -1) >= 0]
    assert [s.name for s in p.steps] == [f"request {r['request']}" for r in requests]
    assert all((s.captured, s.instantiated, s.launches, s.destroyed) == (1, 1, 1, 0) for s in p.steps)
    assert p.per == "request N" and not p.approximate


def test_memory_captured_into_graphs_is_the_exports(graphs):
    (p,) = graphs.graphs.processes
    captured = capture_windows_bytes()
    assert [s.captured_bytes for s in p.steps] == captured
    assert p.captured_bytes == sum(captured) == 1258291200
    assert (p.captured_min_bytes, p.captured_max_bytes) == (66 * MiB, 258 * MiB)
    # What each request kept is the growth of PyTorch's reserved bytes (the truth) after the
    # first; the graph pools are part of it, never more.
    requests = [r for r in truth("torch_graphs_v25") if "reserved" in r]
    reserved_growth = [b["reserved"] - a["reserved"] for a, b in zip(requests, requests[1:])]
    assert [s.delta_bytes for s in p.steps][1:] == reserved_growth[1:]
    assert all(0 < s.captured_bytes <= g for s, g in zip(p.steps, reserved_growth))


def test_the_verdict_says_how_much_of_the_growth_is_in_graphs(graphs):
    (p,) = graphs.graphs.processes
    assert round(100 * p.captured_bytes / p.steps_kept_bytes) == 70
    (verdict,) = [a for a in graphs.answers if a.topic == "verdict"]
    assert verdict.code == "growing"
    assert verdict.message.endswith("; 70% of it captured into 8 CUDA graphs, none destroyed")


def test_the_graph_answer_is_on_the_first_screen_and_page(graphs, capsys, tmp_path):
    (answer,) = [a for a in graphs.answers if a.topic == "graphs"]
    assert (answer.severity, answer.code) == ("warning", "cuda_graphs")
    assert answer.message == ("process 1698: 8 CUDA graphs instantiated, none destroyed before exit: +66.0 MiB to "
                              "+258.0 MiB per request captured into them, 1.2 GiB in all (70% of what those requests "
                              "kept)")
    code, out, _ = cli(capsys, "analyze", str(FIXTURES / "torch_graphs_v25.sqlite"), "-o", str(tmp_path))
    answers = out[out.index("Answers"):out.index("Peak GPU memory")]
    assert code == 0 and "CUDA graphs" in answers and "8 CUDA graphs instantiated" in answers
    page = (tmp_path / "report.html").read_text()
    assert 'id="verdict-graphs-1"' in page and 'id="cuda-graphs"' in page
    # the page's table of requests: request 7 captured 258.0 MiB and kept 328.0 MiB
    assert '<td class="text">request 7</td><td class="num">1</td><td class="num">1</td><td class="num">0</td>' \
           '<td class="num">1</td><td class="num" data-sort="270532608">258.0 MiB</td>' in page
    document = json.loads((tmp_path / "analysis.json").read_text())
    assert document["graphs"]["processes"][0]["captured_bytes"] == 1258291200


def test_the_unseen_answer_with_smi_logs(libloads, capsys, tmp_path):
    (answer,) = [a for a in libloads.answers if a.topic == "unseen"]
    assert answer.severity == "warning" and "keeps loading CUDA code step after step" in answer.message
    assert "(26, 5, 13, 3, 8, 7, 3, 3, 5, 3)" in answer.message
    code, out, _ = cli(capsys, "analyze", str(LIBLOADS), *[a for log in LIBLOADS_SMI for a in ("--smi", str(log))],
                       "-o", str(tmp_path))
    assert code == 0 and "not traced" in out[out.index("Answers"):out.index("Peak GPU memory")]
    # the page's table of the loads by library, then by first kernel (the model's counts)
    page = (tmp_path / "report.html").read_text()
    assert '<tr><td class="text">cuDNN</td><td class="num">58</td></tr>' in page
    assert '<tr><td class="text">own kernels</td><td class="num">13</td></tr>' in page
    assert '<tr><td class="text sub">first kernel nchwToNhwcKernel</td><td class="num">36</td></tr>' in page


@pytest.mark.parametrize("name", ["torch_graphs_v25", "torch_libloads_v25"])
def test_streamed_analysis_gives_the_same_sections(name, monkeypatch):
    path = FIXTURES / f"{name}.sqlite"
    whole, streamed = full_documents(path, chunk_rowids(path), monkeypatch)
    assert whole["graphs"] == streamed["graphs"] and whole["hidden"] == streamed["hidden"]
    assert whole["graphs"]["processes"] or whole["hidden"]["processes"]


def test_quick_and_old_exports_have_empty_sections(known_mem_v22):
    quick = nsysan.analyze(FIXTURES / "torch_graphs_v25.sqlite", quick=True)
    assert quick.graphs.processes == [] and quick.hidden.processes == []
    # nsys 2022.4: no library loads nor graphs in its API table; the sections are empty, not an error.
    assert known_mem_v22.graphs.processes == [] and known_mem_v22.hidden.processes == []


def test_notebook_tables(graphs, libloads):
    steps = graphs.frame("graph_steps")
    assert steps["captured_bytes"].tolist() == capture_windows_bytes()
    assert steps["process_graphs_pid"].unique().tolist() == [1698]
    assert libloads.frame("hidden_steps")["loads"].tolist() == LOADS_PER_STEP
    assert libloads.frame("hidden")["unloads"].tolist() == [99]


def test_damaged_graph_calls_are_left_out_not_a_traceback(tmp_path, capsys):
    """Text where nsys writes a start or an end (a damaged export): those calls are left out, or
    end where they start; the rest of the section stands."""
    import shutil

    damaged = tmp_path / "damaged.sqlite"
    shutil.copy(FIXTURES / "torch_graphs_v25.sqlite", damaged)
    with sqlite3.connect(damaged) as conn:
        conn.execute("UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET start = 'x' WHERE nameId IN "
                     "(SELECT id FROM StringIds WHERE value LIKE 'cudaGraphInstantiate%')")
        conn.execute("UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET \"end\" = 'y' WHERE nameId IN "
                     "(SELECT id FROM StringIds WHERE value LIKE 'cudaStreamEndCapture%')")
    code, out, err = cli(capsys, "analyze", str(damaged), "--format", "json")
    assert code == 0, err
    (p,) = json.loads(out)["graphs"]["processes"]
    assert (p["captures"], p["instantiated"], p["launches"]) == (8, 0, 8)


def test_a_context_on_a_device_without_allocations_is_named(tmp_path):
    """ddp_leak_v25's ranks each hold one context, on their own GPU; a copy in which rank 1 (pid
    2147) also holds one on device 0, where it allocates nothing (a stray call on the default
    device), gets the warning."""
    import shutil

    plain = analysis_of("ddp_leak_v25")
    assert [(p.pid, [(c.device, c.gpu, c.allocates) for c in p.contexts]) for p in plain.hidden.processes] == \
        [(2146, [(0, 0, True)]), (2147, [(1, 1, True)])]
    assert [a for a in plain.answers if a.topic == "unseen"] == []
    stray = tmp_path / "stray.sqlite"
    shutil.copy(FIXTURES / "ddp_leak_v25.sqlite", stray)
    with sqlite3.connect(stray) as conn:
        conn.execute("INSERT INTO TARGET_INFO_CUDA_CONTEXT_INFO (nullStreamId, hwId, vmId, processId, deviceId, "
                     "contextId, parentContextId, isGreenContext) VALUES (7, 0, 1, 2147, 0, 2, 0, 0)")
    analysis = nsysan.analyze(stray)
    rank1 = next(p for p in analysis.hidden.processes if p.pid == 2147)
    assert [(c.device, c.allocates) for c in rank1.contexts] == [(0, False), (1, True)]
    (answer,) = [a for a in analysis.answers if a.topic == "unseen"]
    assert answer.severity == "warning" and answer.message.startswith(
        "rank 1: has a CUDA context on device 0 without allocating there")


def test_old_exports_have_no_context_table(known_mem_v22):
    assert known_mem_v22.hidden.processes == []


def test_without_sizes_a_context_is_not_judged(known_plain_v25):
    """known_plain_v25 was captured without --cuda-memory-usage: no memory event says where it
    allocated, so its context is neither idle nor used, and no answer is made of it."""
    (p,) = known_plain_v25.hidden.processes
    assert [(c.device, c.allocates) for c in p.contexts] == [(0, None)]
    assert [a for a in known_plain_v25.answers if a.topic == "unseen"] == []
