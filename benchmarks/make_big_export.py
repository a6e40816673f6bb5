"""Write a realistic nsys export of any size by expanding a real fixture.

    python benchmarks/make_big_export.py --events 1000000 -o benchmarks/data/big_1e6.sqlite

The result keeps the fixture's schema, tables, string ids, GPUs and capture metadata
(fixtures/ddp_leak_v25.sqlite: nsys 2025.3, 2 ranks, NCCL) and replaces its trace with a
synthetic training job:

- `--ranks` processes (default 4), one per GPU (GPU rows are copied to have as many), each with a
  main thread and an autograd thread, registered in PROCESSES, ThreadNames, TARGET_INFO_CUDA_DEVICE;
- `--events` memory events (CUDA_GPU_MEMORY_USAGE_EVENTS) as alloc/free pairs whose sizes are drawn
  from the fixture's own device allocations, on reused addresses (a pool of address slots, each slot
  reused back to back, as caching allocators do), a few cudaMallocAsync/cuMemSetAccess ones and a
  small share of blocks never freed;
- one CUPTI_ACTIVITY_KIND_RUNTIME row per memory event with the matching correlationId and API
  (cudaMalloc_v3020, cudaFree_v3020, ...), plus `--api-ratio` x events other API calls
  (cudaLaunchKernel, cudaMemcpyAsync, ...): real captures have far more API calls than allocations;
- NVTX push/pop ranges: one "step N" per training step and per rank, with forward/backward/optimizer
  inside;
- with `--operator-ranges N`, N PyTorch operator ranges as `nsys profile --pytorch=autograd-shapes-nvtx`
  writes them (`aten::linear, seq = 3, op_id = 17, sizes = [...], input_op_ids = [...]`), nested three
  deep (aten::linear > aten::matmul > aten::mm, beside aten::empty), over each rank's time on its main
  and autograd threads. They come from a random generator of their own: the rest of the export is the
  same file as without them.

Rows are written in time order, like nsys up to 2025.3. Everything is random with a fixed seed, so a
given --events always gives the same file.
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "fixtures" / "ddp_leak_v25.sqlite"
CHUNK = 500_000
START_NS = 3_000_000_000  # first event, ns after the session start
EVENT_SPACING_NS = 2_000  # mean time between memory events of one rank
LEAKING_SLOTS = 0.1  # share of address slots whose last block is never freed
OTHER_APIS = ["cudaLaunchKernel_v7000", "cudaMemcpyAsync_v3020", "cudaStreamSynchronize_v3020",
              "cudaEventRecord_v3020", "cudaStreamIsCapturing_v10000"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=float, required=True, help="memory events to write (e.g. 1e6)")
    parser.add_argument("--ranks", type=int, default=4, help="processes, one per GPU")
    parser.add_argument("--api-ratio", type=float, default=1.0, help="other API calls per memory event")
    parser.add_argument("--steps", type=int, default=0, help="training steps (default: events / 2000)")
    parser.add_argument("--operator-ranges", type=float, default=0,
                        help="PyTorch operator NVTX ranges to add (e.g. 1e6; default none)")
    parser.add_argument("-o", "--output", type=Path, help="output .sqlite (default benchmarks/data/big_<N>.sqlite, "
                        "big_<N>_ops<M>.sqlite with operator ranges)")
    args = parser.parse_args()
    events, operators = int(args.events), int(args.operator_ranges)
    suffix = f"_ops{operators}" if operators else ""
    out = args.output or ROOT / "benchmarks" / "data" / f"big_{events}{suffix}.sqlite"
    began = time.perf_counter()
    make_big_export(out, events, ranks=args.ranks, api_ratio=args.api_ratio, steps=args.steps or None,
                    operator_ranges=operators)
    size = out.stat().st_size / 2**20
    print(f"wrote {out} ({events} memory events, {size:.0f} MiB) in {time.perf_counter() - began:.1f} s")


def make_big_export(out: Path, events: int, ranks: int = 4, api_ratio: float = 1.0,
                    steps: int | None = None, seed: int = 7, operator_ranges: int = 0) -> Path:
    """Write the export and return its path."""
    rng = np.random.default_rng(seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    shutil.copyfile(BASE, tmp)
    conn = sqlite3.connect(tmp)
    conn.execute("PRAGMA journal_mode=OFF")
    conn.execute("PRAGMA synchronous=OFF")
    sizes = np.array([b for (b,) in conn.execute(
        "SELECT bytes FROM CUDA_GPU_MEMORY_USAGE_EVENTS WHERE memKind = 2 AND memoryOperationType = 0")])
    vm_id = conn.execute("SELECT vmId FROM TARGET_INFO_GPU LIMIT 1").fetchone()[0]
    for table in ("CUDA_GPU_MEMORY_USAGE_EVENTS", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS",
                  "CUDA_GPU_MEMORY_POOL_EVENTS", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
                  "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "CUPTI_ACTIVITY_KIND_CUDA_EVENT"):
        conn.execute(f"DELETE FROM {table}")

    pids = [5000 + 100 * r for r in range(ranks)]
    _register_ranks(conn, pids, vm_id)
    names = _string_ids(conn, ["cudaMalloc_v3020", "cudaFree_v3020", "cudaMallocAsync_v11020",
                               "cudaFreeAsync_v11020", "cuMemSetAccess", "cuMemUnmap", *OTHER_APIS])
    per_rank = events // ranks
    steps = steps or max(1, events // 2000)
    end_ns = START_NS
    operator_rng = np.random.default_rng(seed + 1)
    for rank, pid in enumerate(pids):
        n = per_rank + (events - per_rank * ranks if rank == ranks - 1 else 0)
        rank_end = _write_rank(conn, rng, pid, rank, n, sizes, names, api_ratio, steps)
        if operator_ranges:
            _write_operator_ranges(conn, operator_rng, pid, operator_ranges // ranks, START_NS + rank * 1000, rank_end)
        end_ns = max(end_ns, rank_end)
    conn.execute("UPDATE ANALYSIS_DETAILS SET duration = ?, stopTime = startTime + ?", (end_ns, end_ns))
    conn.commit()
    conn.close()
    tmp.replace(out)
    return out


def _register_ranks(conn: sqlite3.Connection, pids: list[int], vm_id: int) -> None:
    gpu_columns = [r[1] for r in conn.execute("PRAGMA table_info(TARGET_INFO_GPU)")]
    template = conn.execute("SELECT * FROM TARGET_INFO_GPU ORDER BY id LIMIT 1").fetchone()
    conn.execute("DELETE FROM TARGET_INFO_GPU")
    conn.execute("DELETE FROM TARGET_INFO_CUDA_DEVICE")
    conn.execute("DELETE FROM PROCESSES")
    conn.execute("DELETE FROM ThreadNames")
    main_name, grad_name = _string_ids(conn, ["python", "pt_autograd_0"]).values()
    for gpu, pid in enumerate(pids):
        row = dict(zip(gpu_columns, template))
        row.update(id=gpu, cuDevice=gpu, pwGpuId=gpu, busLocation=f"0000:00:{6 + gpu:02x}.0")
        conn.execute(f"INSERT INTO TARGET_INFO_GPU ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                     list(row.values()))
        conn.execute("INSERT INTO TARGET_INFO_CUDA_DEVICE (gpuId, cudaId, pid) VALUES (?, ?, ?)", (gpu, gpu, pid))
        global_pid = vm_id | (pid << 24)
        conn.execute("INSERT INTO PROCESSES (globalPid, pid, name) VALUES (?, ?, 'python')", (global_pid, pid))
        conn.execute("INSERT INTO ThreadNames (nameId, priority, globalTid) VALUES (?, 20, ?)",
                     (main_name, global_pid | pid))
        conn.execute("INSERT INTO ThreadNames (nameId, priority, globalTid) VALUES (?, 20, ?)",
                     (grad_name, global_pid | (pid + 1)))


def _string_ids(conn: sqlite3.Connection, values: list[str]) -> dict[str, int]:
    ids = {}
    for value in values:
        row = conn.execute("SELECT id FROM StringIds WHERE value = ?", (value,)).fetchone()
        if row is None:
            new_id = conn.execute("SELECT coalesce(max(id), 0) + 1 FROM StringIds").fetchone()[0]
            conn.execute("INSERT INTO StringIds (id, value) VALUES (?, ?)", (new_id, value))
            row = (new_id,)
        ids[value] = row[0]
    return ids


def _write_rank(conn: sqlite3.Connection, rng: np.random.Generator, pid: int, rank: int, n: int,
                sizes: np.ndarray, names: dict[str, int], api_ratio: float, steps: int) -> int:
    """Write one rank's memory events, API calls and NVTX ranges; return its last timestamp."""
    pairs = n // 2
    vm_id = conn.execute("SELECT vmId FROM TARGET_INFO_GPU LIMIT 1").fetchone()[0]
    global_pid = vm_id | (pid << 24)
    # Address slots reused back to back: slot s holds pairs s, s+S, s+2S, ... in time order.
    slots = max(64, pairs // 200)
    slot = np.arange(pairs) % slots
    gaps = rng.exponential(EVENT_SPACING_NS * 2 * slots / 4, pairs).astype("int64") + 1
    order = np.argsort(slot, kind="stable")
    start_in_slot = np.empty(pairs, "int64")
    # cumulative time within each slot: alloc, live for a while, free, gap, next alloc ...
    life = rng.exponential(EVENT_SPACING_NS * slots / 4, pairs).astype("int64") + 1
    step = gaps + life
    cum = np.cumsum(step[order])
    first = np.searchsorted(slot[order], np.arange(slots))
    cum -= np.repeat(cum[first] - step[order][first], np.diff(np.append(first, pairs)))
    start_in_slot[order] = cum - life[order]
    alloc_ts = START_NS + rank * 1000 + start_in_slot
    free_ts = alloc_ts + life
    address = 0x7F0000000000 + rank * 0x1000000000 + slot.astype("int64") * 0x4000000
    size = rng.choice(sizes, pairs)
    api_kind = rng.choice(3, pairs, p=[0.9, 0.06, 0.04])  # cudaMalloc, cudaMallocAsync, cuMemSetAccess
    # Never freed: the last pair of a few slots (a leaked block's address is not reused).
    last_of_slot = np.zeros(pairs, bool)
    last_of_slot[order[np.append(first[1:], pairs) - 1]] = True
    leaked = last_of_slot & (rng.random(pairs) < LEAKING_SLOTS)

    alloc_names = np.array([names["cudaMalloc_v3020"], names["cudaMallocAsync_v11020"], names["cuMemSetAccess"]])
    free_names = np.array([names["cudaFree_v3020"], names["cudaFreeAsync_v11020"], names["cuMemUnmap"]])
    ts = np.concatenate([alloc_ts, free_ts[~leaked]])
    op = np.concatenate([np.zeros(pairs, "int64"), np.ones(int((~leaked).sum()), "int64")])
    addr = np.concatenate([address, address[~leaked]])
    nbytes = np.concatenate([size, size[~leaked]])
    name_id = np.concatenate([alloc_names[api_kind], free_names[api_kind[~leaked]]])
    pool = np.concatenate([api_kind == 1, (api_kind == 1)[~leaked]])
    by_time = np.argsort(ts, kind="stable")
    ts, op, addr, nbytes, name_id, pool = (a[by_time] for a in (ts, op, addr, nbytes, name_id, pool))
    count = len(ts)

    # Other API calls interleaved in time; correlation ids follow time order, unique per process.
    others = int(count * api_ratio)
    other_ts = np.sort(rng.integers(int(ts[0]), int(ts[-1]) + 1, others)) if others else np.zeros(0, "int64")
    other_names = rng.choice([names[a] for a in OTHER_APIS], others)
    all_ts = np.concatenate([ts, other_ts])
    call_order = np.argsort(all_ts, kind="stable")
    correlation = np.empty(count + others, "int64")
    correlation[call_order] = np.arange(1, count + others + 1)
    mem_corr = correlation[:count]
    # Backward runs on the autograd thread (tid pid+1), like PyTorch.
    tid = np.where(rng.random(count + others) < 0.3, pid + 1, pid)
    call_names = np.concatenate([name_id, other_names])
    call_start = all_ts - 400
    call_end = all_ts + rng.integers(800, 20_000, count + others)

    mem_rows = _rows(count, ts, global_pid, rank, 1, addr, 0, nbytes, 2, op, mem_corr,
                     np.where(pool, 13, None), np.where(pool, address[0], None))
    _insert(conn, "INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS (start, globalPid, deviceId, contextId, address, pc, "
            "bytes, memKind, memoryOperationType, correlationId, streamId, localMemoryPoolAddress) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", mem_rows)
    runtime = _rows(count + others, call_start[call_order], call_end[call_order],
                    0,  # eventClass 0: CUDA runtime
                    global_pid | tid[call_order], correlation[call_order], call_names[call_order], 0)
    _insert(conn, "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, correlationId, "
            "nameId, returnValue) VALUES (?, ?, ?, ?, ?, ?, ?)", runtime)

    # NVTX: "step k" over equal slices of the rank's time, with three phases inside each.
    first_ts, last_ts = int(all_ts.min()), int(all_ts.max()) + 1
    edges = np.linspace(first_ts, last_ts, steps + 1).astype("int64")
    rows = []
    for k in range(steps):  # a few thousand ranges at most, not per event
        s, e = int(edges[k]), int(edges[k + 1]) - 1
        rows.append((s, e, 59, f"step {k}", global_pid | pid))
        cut1, cut2 = s + (e - s) * 2 // 5, s + (e - s) * 4 // 5
        rows += [(s + 1, cut1, 59, "forward", global_pid | pid), (cut1 + 1, cut2, 59, "backward", global_pid | pid),
                 (cut2 + 1, e - 1, 59, "optimizer", global_pid | pid)]
    _insert(conn, "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES (?, ?, ?, ?, ?)", rows)
    return last_ts


# (outer, middle, innermost, beside) operators of one group: a layer's matmul and its output
OPERATOR_GROUPS = [("aten::linear", "aten::matmul", "aten::mm", "aten::empty"),
                   ("aten::layer_norm", "aten::native_layer_norm", "aten::empty_like", "aten::empty"),
                   ("aten::add", "aten::to", "aten::_to_copy", "aten::empty_strided"),
                   ("aten::softmax", "aten::_softmax", "aten::empty_like", "aten::empty")]


def _write_operator_ranges(conn: sqlite3.Connection, rng: np.random.Generator, pid: int, n: int,
                           first_ts: int, last_ts: int) -> None:
    """`n` operator ranges over [first_ts, last_ts], in groups of four: an outer operator holding a
    middle one holding the innermost, and a fourth beside the middle one; 30% on the autograd thread."""
    vm_id = conn.execute("SELECT vmId FROM TARGET_INFO_GPU LIMIT 1").fetchone()[0]
    global_pid = vm_id | (pid << 24)
    groups = max(1, n // 4)
    span = (last_ts - first_ts) / groups
    start = (first_ts + np.arange(groups) * span).astype("int64")
    width = max(int(span * 0.9), 8)
    kind = rng.integers(0, len(OPERATOR_GROUPS), groups)
    tid = np.where(rng.random(groups) < 0.3, pid + 1, pid)
    # (offset, end) of each range of a group, as fractions of the group's width
    layout = [(0.0, 1.0), (0.05, 0.6), (0.1, 0.5), (0.65, 0.95)]
    rows = []
    op_id = 0
    for g in range(groups):  # n / 4 groups; the texts are what makes this export big
        names = OPERATOR_GROUPS[kind[g]]
        for level, (lo, hi) in enumerate(layout):
            op_id += 1
            text = (f"{names[level]}, seq = {g}, op_id = {op_id}, sizes = [[4096, 512], [512, 512], []], "
                    f"input_op_ids = [({op_id - 1},0), (0,-1)]")
            rows.append((int(start[g] + lo * width), int(start[g] + hi * width), 59, text, global_pid | int(tid[g])))
    _insert(conn, "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES (?, ?, ?, ?, ?)", rows)


def _rows(count: int, *columns):
    """Rows of `columns` (arrays of `count` values, or one value for every row), CHUNK at a time:
    Python objects for a chunk only (for all rows at once, 1e8 events took 19 GB)."""
    for low in range(0, count, CHUNK):
        high = min(count, low + CHUNK)
        yield from zip(*(c[low:high].tolist() if isinstance(c, np.ndarray) else [c] * (high - low) for c in columns))


def _insert(conn: sqlite3.Connection, sql: str, rows) -> None:
    batch = []
    for row in rows:
        batch.append(row)
        if len(batch) >= CHUNK:
            conn.executemany(sql, batch)
            batch.clear()
    if batch:
        conn.executemany(sql, batch)


if __name__ == "__main__":
    main()
