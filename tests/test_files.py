"""A report's files are replaced all together or not at all."""

from __future__ import annotations

import errno
import os

import pytest
from conftest import analysis_of

from nsysan.errors import NsysanError
from nsysan.commands import outputs as files
from nsysan.commands.outputs import write_report
from nsysan.render.html import REPORT_FILES


def test_a_full_disk_half_way_leaves_the_last_report_whole(tmp_path, monkeypatch):
    out = tmp_path / "report"
    write_report(analysis_of("known_mem_v25"), out)
    before = {name: (out / name).read_bytes() for name in REPORT_FILES}

    real_fsync, calls = os.fsync, []

    def fsync_until_the_disk_is_full(fd):  # the third file of the next report does not fit
        calls.append(fd)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(files.os, "fsync", fsync_until_the_disk_is_full)
    with pytest.raises(NsysanError, match="No space left on device"):
        write_report(analysis_of("ddp_leak_v25"), out)
    # every file is the previous run's, and no temporary file is left behind
    assert {name: (out / name).read_bytes() for name in REPORT_FILES} == before
    assert sorted(p.name for p in out.iterdir()) == sorted(REPORT_FILES)


def test_all_files_are_replaced_when_all_fit(tmp_path):
    out = tmp_path / "report"
    write_report(analysis_of("known_mem_v25"), out)
    write_report(analysis_of("ddp_leak_v25"), out)
    assert b"ddp_leak_v25.sqlite" in (out / "report.html").read_bytes()
    assert b'"name": "ddp_leak_v25.sqlite"' in (out / "analysis.json").read_bytes()
    assert sorted(p.name for p in out.iterdir()) == sorted(REPORT_FILES)
