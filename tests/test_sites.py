"""Allocation sites that name the user's code: Python stacks, PyTorch operators, native frames.

Fixture truths come from fixtures/README.md, the captured programs in fixtures/workloads/ and
an independent reading of the exports' tables (plain SQL and struct, not nsysan's code).
"""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import struct
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from builders import make_export
from conftest import FIXTURES, analysis_of, truth

import nsysan
from nsysan.events import load_events
from nsysan.events.normalize import join_on_call
from nsysan.events.read import read_calls
from nsysan.events.site_labels import SiteLabeller
from nsysan.sources.schema import open_readonly, probe

MiB = 1 << 20
PYBT = FIXTURES / "torch_pybt_v25.sqlite"
OPS = FIXTURES / "torch_ops_v25.sqlite"


def loaded(path: Path):
    with contextlib.closing(open_readonly(path)) as conn:
        return load_events(conn, probe(conn))


# --- Python stacks: torch_pybt_v25 -----------------------------------------------------------

def python_lines_by_hand(path: Path) -> dict[tuple[str, int], list[int]]:
    """(user function, line) -> sizes of the cudaMalloc blocks allocated there, read without nsysan.

    Each mark of the "Python Backtrace on CUDA" domain holds, after a 32-byte header, u64 thread
    state id, u32 state, u32 frame count, then 24-byte frames (u64 function id, u64 file id, i32
    line; docs: ../shared/docs/nsys-schema.md 3.9.1). The mark lies inside the backtrace row
    (eventClass 67) of its call, which has the call's correlationId; the memory event has it too.
    The user's frame is the innermost one outside site-packages.
    """
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        strings = dict(conn.execute("SELECT id, value FROM StringIds"))
        marks = conn.execute("""SELECT n.binaryData, r.correlationId FROM NVTX_EVENTS AS n
            JOIN CUPTI_ACTIVITY_KIND_RUNTIME AS r ON r.globalTid = n.globalTid AND r.eventClass = 67
                 AND n.start BETWEEN r.start AND r.end
            WHERE n.eventType = 34 AND n.domainId = 1""").fetchall()
        sizes = dict(conn.execute("""SELECT m.correlationId, m.bytes FROM CUDA_GPU_MEMORY_USAGE_EVENTS AS m
            JOIN CUPTI_ACTIVITY_KIND_RUNTIME AS r ON r.correlationId = m.correlationId AND r.eventClass = 0
            JOIN StringIds AS s ON s.id = r.nameId WHERE s.value LIKE 'cudaMalloc_v%' AND m.memoryOperationType = 0"""))
    found: dict[tuple[str, int], list[int]] = defaultdict(list)
    for blob, correlation in marks:
        (count,) = struct.unpack_from("<I", blob, 32 + 12)
        for i in range(count):
            function, file, line = struct.unpack_from("<QQi", blob, 32 + 16 + 24 * i)
            if "site-packages" not in strings[file]:
                if correlation in sizes:
                    found[(strings[function], line)].append(sizes[correlation])
                break
    return found


def test_python_sites_by_hand_agree_with_the_readme():
    by_hand = python_lines_by_hand(PYBT)
    # README: 90 of the 111 cudaMalloc calls carry a Python stack.
    assert sum(len(sizes) for sizes in by_hand.values()) == 90
    ranked = sorted(by_hand.items(), key=lambda item: -sum(item[1]))
    # torch_train.py line 43 is `out = model(x)` in main, line 19 `return model.to(dev)` in build.
    # Line 44 is the loss: log_softmax of a (16*256, 8000) float32 tensor, 4096 * 8000 * 4 bytes =
    # 125.0 MiB, which the caching allocator rounds up to a multiple of 2 MiB: one 126 MiB block.
    assert [(key, len(sizes), round(sum(sizes) / MiB, 1)) for key, sizes in ranked[:3]] == [
        (("main", 43), 74, 2450.1), (("main", 44), 1, 126.0), (("build", 19), 8, 98.0)]


def test_largest_python_sites_of_torch_pybt(torch_pybt_v25):
    python = [s for s in torch_pybt_v25.sites if s.site.source == "python"]
    by_hand = python_lines_by_hand(PYBT)
    assert [(s.site.function, s.site.line, s.allocations, s.allocated_bytes) for s in python[:3]] == [
        (function, line, len(by_hand[(function, line)]), sum(by_hand[(function, line)]))
        for function, line in (("main", 43), ("main", 44), ("build", 19))]
    top, weights = python[0], python[2]
    assert top.site.label == "main (torch_train.py:43)" and top.pid == 476
    assert top.site.file == "/home/user/workloads/torch_train.py"
    # The framework frame the user's line called is kept as context: model(x) is nn.Sequential's
    # forward, past the module call wrappers; model.to(dev) is nn.Module.to.
    assert top.site.context == "forward (torch/nn/modules/container.py:253)"
    assert weights.site.label == "build (torch_train.py:19)"
    assert weights.site.context == "to (torch/nn/modules/module.py:1384)"


def test_python_stacks_are_in_the_json_once(torch_pybt_v25):
    stacks = {s.id: s for s in torch_pybt_v25.stacks}
    weights = next(s for s in torch_pybt_v25.sites if s.site.label == "build (torch_train.py:19)")
    frames = stacks[weights.site.stack_id].frames
    assert stacks[weights.site.stack_id].source == "python"
    # README: convert (module.py:1370) <- ... <- build (torch_train.py:19) <- main (torch_train.py:34) <- <module>
    assert (frames[0].function, frames[0].line) == ("convert", 1370)
    assert [(f.function, f.line) for f in frames[-3:]] == [("build", 19), ("main", 34), ("<module>", 72)]
    # "Line" is 4 bytes in an 8-byte slot whose upper bytes are garbage: read whole, line 43
    # would be 7598228017743134763. Every line is a real line of a source file.
    assert all(0 < f.line < 10_000 for s in torch_pybt_v25.stacks if s.source == "python" for f in s.frames)
    # Each stack once, referred to by id from the sites and the allocations.
    assert len(stacks) == len(torch_pybt_v25.stacks)
    leaked = [a for a in torch_pybt_v25.never_freed if a.site.label == "build (torch_train.py:19)"]
    assert leaked and all(stacks[a.stack_id].source == "python" for a in leaked)


def _referred_stack_ids(document) -> set[int]:
    """Every `stack_id` anywhere in a JSON document (read from the dicts, not the model)."""
    if isinstance(document, dict):
        found = {document["stack_id"]} if document.get("stack_id") is not None else set()
        return found.union(*(_referred_stack_ids(v) for k, v in document.items() if k != "stack_id"))
    if isinstance(document, list):
        return set().union(*(_referred_stack_ids(v) for v in document))
    return set()


@pytest.mark.parametrize("name", ["known_bt_v25", "torch_pybt_v25"])
def test_every_stack_id_in_the_document_is_one_of_its_stacks(name):
    # The timeline's largest allocations, the never-freed groups and the OOM lists refer to stacks
    # too, not only the sites and the listed allocations: each id must resolve, and no stack is
    # kept that nothing refers to.
    document = analysis_of(name).to_dict()
    kept = [s["id"] for s in document["stacks"]]
    referred = _referred_stack_ids({k: v for k, v in document.items() if k != "stacks"})
    assert referred and set(kept) == referred and len(kept) == len(set(kept))
    timeline_ids = {a["stack_id"] for a in document["timeline"]["allocations"] if a["stack_id"] is not None}
    assert timeline_ids and timeline_ids <= set(kept)


def test_autograd_thread_allocations_keep_their_native_site():
    # The 21 cudaMalloc calls on pt_autograd_0 run no Python: no Python stack, and their native
    # stacks are machinery all the way, so the label names the ATen function and the operator.
    events = loaded(PYBT)
    frame, stacks = events.events, events.stacks
    mallocs = frame[(frame["api"] == "cudaMalloc") & (frame["op"] == "alloc")]
    source = mallocs["stack"].map(lambda i: stacks[i].source if i >= 0 else "")
    assert (source == "python").sum() == 90 and (source == "native").sum() == 21
    autograd = mallocs[mallocs["tid"] != mallocs["pid"]]
    assert len(autograd) == 21 and set(source[autograd.index]) == {"native"}
    assert "at::detail::empty_generic ← at::_ops::nll_loss_backward::call" in set(autograd["site"])


def test_no_site_is_named_by_the_interpreter_or_libc():
    for name in ("known_bt_v25", "torch_pybt_v25", "torch_ops_v25", "torch_leak_v25", "ddp_leak_v25"):
        for site in analysis_of(name).sites:
            assert not site.site.label.startswith(("Py_", "_Py", "PyObject_", "pymain", "__libc_start", "_start ")), \
                (name, site.site.label)


def test_known_bt_sites_are_unchanged():
    labels = [s.site.label for s in analysis_of("known_bt_v25").sites]
    assert {"alloc_weights (known)", "alloc_cache_entry (known)", "alloc_workspace (known)"} <= set(labels)


def test_marks_without_payloads_say_how_to_export_them(tmp_path):
    # `nsys export` without --include-blobs=true leaves binaryData NULL: the stacks are lost.
    copy = Path(shutil.copy(PYBT, tmp_path / "no_blobs.sqlite"))
    with contextlib.closing(sqlite3.connect(copy)) as conn:
        conn.execute("UPDATE NVTX_EVENTS SET binaryData = NULL")
        conn.commit()
    analysis = nsysan.analyze(copy)
    (diagnostic,) = [d for d in analysis.diagnostics if d.code == "python_stacks_not_exported"]
    assert "142 Python call stacks" in diagnostic.message
    assert "nsys export --type sqlite --include-blobs=true" in diagnostic.message
    assert not [s for s in analysis.sites if s.site.source == "python"]


# --- PyTorch operator ranges: torch_ops_v25 --------------------------------------------------

def test_operator_ranges_are_grouped_by_name(torch_ops_v25):
    with contextlib.closing(sqlite3.connect(f"file:{OPS}?mode=ro", uri=True)) as conn:
        # The operators' text starts with their name and a comma: "aten::empty, op_id = 1, sizes = ..."
        texts = [t for (t,) in conn.execute(
            "SELECT coalesce(text, (SELECT value FROM StringIds WHERE id = textId)) FROM NVTX_EVENTS "
            "WHERE eventType = 59")]
    # 13,638 push/pop ranges in the default domain (README: ~13,639) and 15 of CUB's (domain CCCL);
    # all but the program's 21 (setup, and step/forward/backward/optimizer x 5) and CUB's are operators.
    operators = [t.split(",")[0] for t in texts if ", op_id = " in t or ", seq = " in t]
    assert (len(texts), len(operators)) == (13_653, 13_653 - 21 - 15)
    operator_rows = {r.name: r for r in torch_ops_v25.ranges if r.operator}
    # one row per operator name, never one per instance, counting every instance
    assert set(operator_rows) == set(operators)
    assert sum(r.instances for r in operator_rows.values()) == len(operators)
    assert operator_rows["aten::empty"].instances == operators.count("aten::empty")
    assert all("op_id" not in r.name for r in torch_ops_v25.ranges)
    # The user's ranges keep their rows: every step's forward and backward
    user = {r.name: r for r in torch_ops_v25.ranges if not r.operator}
    assert user["forward"].instances == 5 and user["backward"].instances == 5


def test_allocations_are_attributed_to_operators(torch_ops_v25):
    events = loaded(OPS).events
    allocs = events[(events["op"] == "alloc") & (events["kind"] == "device")]
    # every cudaMalloc of the training loop runs inside some ATen operator
    assert (allocs["operator"].astype(str) != "").all()
    assert set(allocs["operator"].astype(str)) >= {"aten::addmm", "aten::empty"}
    # and its user range stays the innermost range the program pushed
    assert set(allocs["nvtx_range"].astype(str)) <= {"setup", "forward", "backward", "optimizer", "step 0"}
    top = torch_ops_v25.sites[0]
    assert top.site.source == "operator" and top.site.label == "aten::addmm in forward [python3]"
    assert any(a.operator.startswith("aten::") for a in torch_ops_v25.never_freed)


def test_operator_ranges_leave_the_steps_alone(torch_ops_v25):
    # The steps are the program's own ranges: 13,617 operator ranges add no band.
    assert sorted(b.name for b in torch_ops_v25.timeline.bands) == ["setup"] + [f"step {i}" for i in range(5)]
    # Growth per step matches the truth file as in torch_leak_v25: the device bytes live at the end of
    # each step are PyTorch's `reserved` after it plus the six library workspace blocks (134,481,920
    # bytes, test_expandable_segments_are_counted_through_the_vmm_api).
    device = torch_ops_v25.events[torch_ops_v25.events["kind"] == "device"]
    steps = [b for b in torch_ops_v25.timeline.bands if b.name.startswith("step")]
    live_at_step_end = [int(device[device["ts_ns"] <= b.end_ns]["delta_bytes"].sum()) for b in steps]
    reserved = [r["reserved"] for r in truth("torch_ops_v25") if "step" in r]
    assert live_at_step_end == [r + 134_481_920 for r in reserved]


@pytest.mark.parametrize("path, source", [(FIXTURES / "known_bt_v25.sqlite", "native"), (PYBT, "python"),
                                          (OPS, "operator")])
def test_sites_labelled_3_allocations_at_a_time_are_those_of_one_batch(path, source):
    """The one labeller of both paths (the whole frame at once, a streamed flow a batch at a
    time) gives each allocation the same site, and the sites the same order, however the
    allocations are cut; and at once, the whole frame's sites."""
    with contextlib.closing(open_readonly(path)) as conn:
        schema = probe(conn)
        found = load_events(conn, schema)
        calls, chains = read_calls(conn, schema)
        events = found.events
        allocs = np.flatnonzero((events["op"] == "alloc").to_numpy())
        pid, correlation = (events[c].to_numpy()[allocs] for c in ("pid", "correlation_id"))
        row = join_on_call(pid, correlation, chains["pid"].to_numpy(), chains["correlation_id"].to_numpy())
        chain = np.append(chains["callchain_id"].to_numpy(), -1)[row]  # row -1 (no stack): the -1 last
        columns = [pid, events["tid"].to_numpy()[allocs], correlation, chain] + \
            [events[c].cat.codes.to_numpy()[allocs] for c in ("api", "nvtx_range", "operator")]

        def labelled(size: int) -> tuple[list[str], list[int], dict]:
            labeller = SiteLabeller(conn, schema, np.unique(chain[chain >= 0]), lambda: (calls, chains),
                                    *(events[c].cat.categories for c in ("api", "nvtx_range", "operator")),
                                    found.thread_names, [])
            sites, stacks = zip(*(labeller.label(*(c[at:at + size] for c in columns))
                                  for at in range(0, len(allocs), size)))
            names = list(labeller.labels)
            return [names[code] for code in np.concatenate(sites)], np.concatenate(stacks).tolist(), \
                labeller.order()[0]

        whole, pieces = labelled(len(allocs)), labelled(3)
    assert pieces == whole
    assert whole[0] == events["site"].to_numpy()[allocs].tolist()
    assert list(whole[2]) == list(events["site"].cat.categories)
    assert whole[1] == events["stack"].to_numpy()[allocs].tolist()
    sites = found.sites
    assert source in set(sites.loc[sites["label"].isin(whole[0]), "source"])  # not the API fallback alone


# --- native frame rules, on hand-built exports -----------------------------------------------

CUDA = [("0x7f0000001000", "/opt/nsys/libcupti.so.13"), ("0x7f0000002000", "/usr/lib/libcuda.so.580"),
        ("cudaMalloc", "/usr/lib/libcudart.so.13")]
USER = [("train_step(int)", "/home/user/app")]
START = [("__libc_start_main", "/lib/x86_64-linux-gnu/libc.so.6"), ("_start", "/home/user/app")]


def site_of(tmp_path: Path, frames: list[tuple[str, str]], python: list[tuple[str, str, int]] | None = None,
            nvtx: list[tuple] | None = None) -> str:
    """The site nsysan gives one 1 MiB cudaMalloc whose stack is `frames` (innermost first)."""
    path = make_export(tmp_path / "one.sqlite", memory=[(1_000, 0x7000, MiB, 0, 1)],
                       calls=[(900, 1_100, "cudaMalloc_v3020", 1)], stacks={1: frames} if frames else None,
                       python_stacks={1: python} if python else None, nvtx=nvtx)
    (site,) = nsysan.analyze(path).sites
    return site.site.label


@pytest.mark.parametrize("machinery", [
    [("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(unsigned long)", "/x/libc10_cuda.so")],
    [("at::native::empty_cuda(c10::ArrayRef<long>)", "/x/libtorch_cuda.so")],
    [("torch::autograd::THPVariable_to(_object*)", "/x/libtorch_python.so")],
    [("caffe2::TypeMeta::fromScalarType()", "/x/libother.so")],
    [("c10d::ProcessGroupNCCL::allreduce()", "/x/libother.so")],
    [("ncclGroupEnd", "/x/libother.so"), ("cublasLtMatmul", "/x/libother.so"), ("cudnnConvolutionForward", "/x/o.so")],
    [("0x7f0000003000", "/x/libcublas.so.12"), ("0x7f0000004000", "/x/libcudnn.so.9"), ("0x7f5", "/x/libnccl.so.2")],
    [("_PyEval_EvalFrameDefault", "/usr/bin/python3.12"), ("_PyObject_MakeTpCall", "/usr/bin/python3.12")],
    [("PyObject_Vectorcall", "/x/libother.so"), ("Py_RunMain", "/x/libother.so"), ("pymain_run_python", "/x/o.so")],
    [("run_module", "/usr/bin/python3.12"), ("helper", "/usr/lib/libpython3.11.so.1.0")],
    [("std::function<void ()>::operator()() const", "/x/libother.so")],
], ids=["c10", "at", "torch", "caffe2", "c10d", "nccl-cublas-cudnn-symbols", "cuda-library-modules",
        "cpython-private", "cpython-api", "interpreter-modules", "std"])
def test_each_kind_of_machinery_is_skipped(tmp_path, machinery):
    assert site_of(tmp_path, CUDA + machinery + USER + START) == "train_step (app)"


def test_a_stack_of_machinery_names_the_operator(tmp_path):
    frames = CUDA + [("c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long)",
                      "/x/libc10_cuda.so"),
                     ("at::native::empty_cuda(c10::ArrayRef<long>)", "/x/libtorch_cuda.so"),
                     ("at::_ops::empty_memory_format::call(c10::ArrayRef<c10::SymInt>)", "/x/libtorch_cpu.so"),
                     ("at::native::addmm_out_cuda_impl(at::Tensor&)", "/x/libtorch_cuda.so"),
                     ("at::_ops::addmm::call(at::Tensor const&)", "/x/libtorch_cpu.so"),
                     ("_PyEval_EvalFrameDefault", "/usr/bin/python3.12"), ("Py_RunMain", "/usr/bin/python3.12"),
                     ("Py_BytesMain", "/usr/bin/python3.12")] + START
    # the ATen function that allocated, and the outermost operator that asked
    assert site_of(tmp_path, frames) == "at::native::empty_cuda ← at::_ops::addmm::call"


def test_a_stack_of_interpreter_and_libc_is_never_the_site(tmp_path):
    frames = CUDA + [("Py_RunMain", "/usr/bin/python3.12"), ("Py_BytesMain", "/usr/bin/python3.12")] + START
    # nothing to name: the API, the NVTX range and the thread, never Py_RunMain or _start
    assert site_of(tmp_path, frames, nvtx=[(0, 10_000, "step 0")]) == "cudaMalloc in step 0"


def test_an_operator_range_names_what_a_machinery_stack_cannot(tmp_path):
    frames = CUDA + [("Py_RunMain", "/usr/bin/python3.12")]
    nvtx = [(0, 10_000, "forward"), (500, 2_000, "aten::linear, seq = 3, op_id = 7, sizes = [[16, 512]]"),
            (800, 1_500, "aten::empty, op_id = 8, sizes = [[], []]")]
    assert site_of(tmp_path, frames, nvtx=nvtx) == "aten::empty in forward"


# --- Python frame rules, on hand-built exports -----------------------------------------------

TORCH = "/venv/lib/python3.12/site-packages/torch/nn/modules/module.py"


@pytest.mark.parametrize("skipped", [
    [("convert", TORCH, 1370)],
    [("apply", "/usr/lib/python3/dist-packages/numpy/core.py", 10)],
    [("run", "/usr/lib/python3.12/threading.py", 1012)],
    [("_run_code", "<frozen runpy>", 88)],
], ids=["site-packages", "dist-packages", "stdlib", "frozen"])
def test_python_site_is_the_users_innermost_frame(tmp_path, skipped):
    python = skipped + [("build", "/home/user/train.py", 19), ("main", "/home/user/train.py", 34),
                        ("&lt;module&gt;", "/home/user/train.py", 72)]
    # a Python stack beats the native one, whose user frame is train_step
    assert site_of(tmp_path, CUDA + USER, python=python) == "build (train.py:19)"


def test_python_stack_without_user_code_names_the_package_frame(tmp_path):
    python = [("convert", TORCH, 1370), ("_bootstrap", "/usr/lib/python3.12/threading.py", 1030)]
    assert site_of(tmp_path, CUDA, python=python) == "convert (torch/nn/modules/module.py:1370)"


def test_python_line_is_read_as_4_bytes(tmp_path):
    # The builder writes garbage after each 4-byte line, as nsys does.
    python = [("main", "/home/user/train.py", 43), ("&lt;module&gt;", "/home/user/train.py", 72)]
    analysis = nsysan.analyze(make_export(tmp_path / "one.sqlite", memory=[(1_000, 0x7000, MiB, 0, 1)],
                                          calls=[(900, 1_100, "cudaMalloc_v3020", 1)], python_stacks={1: python}))
    (stack,) = analysis.stacks
    assert [(f.function, f.file, f.line) for f in stack.frames] == [
        ("main", "/home/user/train.py", 43), ("<module>", "/home/user/train.py", 72)]
    assert analysis.sites[0].site.stack_id == stack.id == analysis.never_freed[0].stack_id
