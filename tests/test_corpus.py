"""Every profile of the public corpus (nsys 2020.3 to 2025.6) gives an analysis or one clear error.

The corpus lives in ../shared/corpus and is read in place; these tests skip when it is absent.
Reports need nsys to export them (skipped without it, a failure under NSYSAN_REQUIRE_NSYS=1).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CORPUS, ROOT

CORPUS_FILES = sorted(p.relative_to(CORPUS).as_posix() for p in CORPUS.glob("*/*")
                      if p.suffix in (".sqlite", ".nsys-rep", ".qdrep")) if CORPUS.is_dir() else []


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("nsysan-cache")


@pytest.mark.parametrize("relative", CORPUS_FILES or ["(corpus absent)"])
def test_corpus_file_gives_analysis_or_one_clear_error(relative, cache_dir, corpus, request):
    path = corpus / relative
    if path.suffix != ".sqlite":
        request.getfixturevalue("nsys_path")
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    result = subprocess.run([sys.executable, "-m", "nsysan", "analyze", str(path), "--format", "json",
                             "--cache-dir", str(cache_dir)], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, result.stderr
    if result.returncode == 0:
        assert '"schema": "nsysan/analysis@1"' in result.stdout
    else:
        assert result.returncode == 2
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("nsysan: "), result.stderr
        # only reports newer than the local nsys 2022.4 may fail, and they must say so
        assert "comes from Nsight Systems 202" in lines[0], lines[0]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


def test_memory_table_of_the_a100_gemm_run(corpus):
    """ntua gemm (nsys 2024.2.3, --cuda-memory-usage): 6 cudaMalloc + 3 Device Static events."""
    import nsysan

    analysis = nsysan.analyze(corpus / "ntua-el20062__gemm_spmm_a100" / "nsys_report_gemm_tiled_20000.sqlite")
    kinds = {g.kind: g for g in analysis.groups}
    # INDEX.md: 7 cudaFree calls against 6 device deallocations; the 3 statics (144 bytes) never freed
    assert kinds["device"].allocations == 6 and kinds["device"].frees == 6
    assert kinds["static"].allocations == 3 and kinds["static"].allocated_bytes == 144
    assert analysis.never_freed_total == 0  # statics are not leaks
    assert {c.api: c.calls for c in analysis.api_calls}["cudaFree"] == 7


@pytest.mark.slow
def test_the_a100_gemm_run_streamed_is_the_whole_frame_document(corpus):
    """Streamed (--max-memory 0), a batch that frees only blocks of kinds the allocator split does
    not count (none counted yet) found no allocation to take its free from, and the analysis ended
    in an internal error; it is the whole frame's document."""
    from nsysan.pipeline import stages as pipeline
    from nsysan.render.json import render_json

    path = corpus / "ntua-el20062__gemm_spmm_a100" / "nsys_report_gemm_tiled_20000.sqlite"
    whole = pipeline.analyze_report(path, keep_events=False)
    assert render_json(pipeline.analyze_report(path, keep_events=False, max_memory=0)) == render_json(whole)
    assert {g.kind: g.allocations for g in whole.groups}["device"] == 6
