"""Shared test fixtures: real captures from fixtures/, each analyzed once per session."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import nsysan

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
GOLDEN = Path(__file__).resolve().parent / "golden"
# Other people's public profiles: read in place, never copied into the project.
CORPUS = ROOT.parent / "shared" / "corpus"
# Fixtures whose .sqlite export ships with the project.
CAPTURES = ["known_mem_v25", "known_bt_v25", "known_plain_v25", "known_mem_v22", "torch_leak_v25",
            "torch_clean_v25", "torch_oom_v25", "torch_expandable_v25", "ddp_leak_v25", "real_oom_v25"]

_cache: dict[str, nsysan.Analysis] = {}


@pytest.fixture(autouse=True)
def own_cache_dir(tmp_path_factory, monkeypatch) -> Path:
    """Every test its own empty cache (exports and analyses): nothing read from, or left in, the
    user's ~/.cache/nsysan, and no test reuses what another one analyzed."""
    cache = tmp_path_factory.mktemp("nsysan-cache")
    monkeypatch.setenv("NSYSAN_CACHE_DIR", str(cache))
    return cache


def analysis_of(name: str) -> nsysan.Analysis:
    """The Analysis of fixtures/<name>.sqlite, computed once per session."""
    if name not in _cache:
        _cache[name] = nsysan.analyze(FIXTURES / f"{name}.sqlite")
    return _cache[name]


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """`nsysan ARGS` in this process (a subprocess per case would take minutes);
    a traceback would leave main() as an exception other than SystemExit and fail the test."""
    from nsysan.cli import main

    try:
        main(list(args))
        code = 0
    except SystemExit as done:
        code = done.code
    out, err = capsys.readouterr()
    return code, out, err


def truth(name: str) -> list[dict]:
    """The records of fixtures/<name>.truth.jsonl (what the captured program did)."""
    lines = (FIXTURES / f"{name}.truth.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


@pytest.fixture(scope="session")
def known_mem_v25() -> nsysan.Analysis:
    return analysis_of("known_mem_v25")


@pytest.fixture(scope="session")
def known_bt_v25() -> nsysan.Analysis:
    return analysis_of("known_bt_v25")


@pytest.fixture(scope="session")
def ddp_leak_v25() -> nsysan.Analysis:
    return analysis_of("ddp_leak_v25")


@pytest.fixture(scope="session")
def torch_leak_v25() -> nsysan.Analysis:
    return analysis_of("torch_leak_v25")


@pytest.fixture(scope="session")
def torch_expandable_v25() -> nsysan.Analysis:
    return analysis_of("torch_expandable_v25")


@pytest.fixture(scope="session")
def known_plain_v25() -> nsysan.Analysis:
    return analysis_of("known_plain_v25")


@pytest.fixture(scope="session")
def real_oom_v25() -> nsysan.Analysis:
    return analysis_of("real_oom_v25")


@pytest.fixture(scope="session")
def known_mem_v22() -> nsysan.Analysis:
    return analysis_of("known_mem_v22")


@pytest.fixture(scope="session")
def torch_pybt_v25() -> nsysan.Analysis:
    return analysis_of("torch_pybt_v25")


@pytest.fixture(scope="session")
def torch_ops_v25() -> nsysan.Analysis:
    return analysis_of("torch_ops_v25")


def nsys_required() -> bool:
    return os.environ.get("NSYSAN_REQUIRE_NSYS") == "1"


@pytest.fixture(scope="session")
def nsys_path() -> Path:
    """The installed nsys; tests needing it skip without it, but fail in CI (NSYSAN_REQUIRE_NSYS=1)."""
    from nsysan.errors import NsysanError
    from nsysan.export import find_nsys

    try:
        return find_nsys()
    except NsysanError as err:
        if nsys_required():
            pytest.fail(f"NSYSAN_REQUIRE_NSYS=1 but nsys is not usable: {err.message}")
        pytest.skip("Nsight Systems (nsys) is not installed")


@pytest.fixture(scope="session")
def corpus() -> Path:
    if not CORPUS.is_dir():
        pytest.skip("../shared/corpus is not present")
    return CORPUS


def has_tool(name: str) -> bool:
    return shutil.which(name) is not None
