"""Run nsys-ai's memory analysis on one export (for benchmarks/run.py; needs nsys-ai installed).

    /path/to/venv/bin/python benchmarks/nsysai_memory.py EXPORT.sqlite [direct|auto|parquet]

nsys-ai (GindaChen/nsys-ai, PyPI `nsys-ai`) computes GPU memory in one place, the agent tool
`get_memory_profile_diff`: peak VRAM of the whole capture (all processes and GPUs summed), the
baseline, final and net bytes, alloc/free counts and a per-memKind count. It compares two
profiles; here both sides are the same file. Its Parquet cache (the default `auto` mode) does not
carry CUDA_GPU_MEMORY_USAGE_EVENTS, so the tool answers "not available" there; `direct` reads the
SQLite file through DuckDB's sqlite scanner, which must be installed (offline: the PyPI packages
duckdb==1.5.5, duckdb-extensions and duckdb-extension-sqlite-scanner).
"""

import json
import sys
import time

began = time.perf_counter()
import duckdb_extensions  # noqa: E402

duckdb_extensions.import_extension("sqlite_scanner")
from nsys_ai import profile  # noqa: E402
from nsys_ai.diff_tools import DiffContext, get_memory_profile_diff  # noqa: E402

opened = profile.open(sys.argv[1], cache_mode=sys.argv[2] if len(sys.argv) > 2 else "direct")
result = get_memory_profile_diff(DiffContext(before=opened, after=opened, trim=None, marker=""))
print(json.dumps({"seconds": round(time.perf_counter() - began, 3), "error": result.get("error"),
                  "reason": result.get("reason"), "profile": result.get("before")}, default=str))
sys.exit(1 if result.get("error") else 0)
