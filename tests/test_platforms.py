"""nsysan on Windows and macOS, as far as Linux can tell.

CI cannot run Windows here, so the first test makes this interpreter look like one where it
matters: a `sitecustomize` refuses the POSIX-only modules (fcntl, termios, pwd, grp, resource)
and deletes signal.SIGHUP, then every nsysan module is imported and a report is analyzed through
the command's own main() and through an export by a (fake) nsys, which takes the cache lock.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import FIXTURES, ROOT, truth

from nsysan.sources import export

WINDOWS_LIKE = textwrap.dedent('''
    """Test only: this interpreter has no POSIX-only modules and no SIGHUP, as on Windows."""
    import signal
    import sys

    POSIX_ONLY = {"fcntl", "termios", "tty", "pty", "pwd", "grp", "resource"}


    class RefusePosixOnly:
        def find_spec(self, name, path=None, target=None):
            if name in POSIX_ONLY:
                raise ModuleNotFoundError(f"No module named {name!r} (test: as on Windows)", name=name)
            return None


    for loaded in POSIX_ONLY:
        sys.modules.pop(loaded, None)
    sys.meta_path.insert(0, RefusePosixOnly())
    del signal.SIGHUP
''')

CHILD = textwrap.dedent('''
    import importlib, json, pkgutil, signal, sys
    from pathlib import Path

    assert not hasattr(signal, "SIGHUP")
    try:
        import fcntl
    except ImportError:
        pass
    else:
        raise AssertionError("fcntl was importable")

    import nsysan
    # __main__ is left out: importing it runs the command
    modules = sorted(m.name for m in pkgutil.walk_packages(nsysan.__path__, "nsysan.") if m.name != "nsysan.__main__")
    for name in modules:
        importlib.import_module(name)

    from nsysan.cli import main
    from nsysan.sources.export import ensure_sqlite
    # The command, as `nsysan analyze` runs it (signal handlers included).
    main(["analyze", "fixtures/known_mem_v25.sqlite", "--format", "json", "--json", "out/analysis.json"])
    # An export into the cache: the lock, the output reader, the cache entry.
    exported = ensure_sqlite(Path(sys.argv[1]), nsys=sys.argv[2], cache_dir=Path("out/cache").absolute())
    print(json.dumps({"modules": modules, "exported": str(exported.sqlite_path),
                      "posix_only_loaded": sorted({"fcntl", "termios", "pwd", "grp", "resource"} & set(sys.modules))}))
''')


def test_imports_and_analyzes_without_fcntl_and_sighup(tmp_path: Path):
    from test_export import V22, copy_alone, copying_nsys

    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(WINDOWS_LIKE)
    (tmp_path / "fixtures").symlink_to(FIXTURES)
    report = copy_alone(V22, tmp_path / "in")
    nsys = copying_nsys(tmp_path / "bin", tmp_path / "exports.log")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(hooks), str(ROOT)]))
    result = subprocess.run([sys.executable, "-c", CHILD, str(report), str(nsys)], capture_output=True,
                            text=True, cwd=tmp_path, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    said = json.loads(result.stdout.splitlines()[-1])
    # Every module of the package, the command modules included, was imported.
    assert {"nsysan.cli", "nsysan.sources.export", "nsysan.commands.analyze",
            "nsysan.render.html"} <= set(said["modules"])
    assert said["posix_only_loaded"] == []
    # The analysis is the real one: the six blocks the program never freed (its truth file).
    doc = json.loads((tmp_path / "out" / "analysis.json").read_text())
    never_freed = {r["ptr"] for r in truth("known_mem_v25") if r.get("freed") == 0}
    assert {a["address"] for a in doc["never_freed"]} == never_freed
    assert Path(said["exported"]).parent == tmp_path / "out" / "cache" and Path(said["exported"]).is_file()
    assert (tmp_path / "exports.log").read_text().splitlines() == ["export"]


def test_nsys_in_the_windows_and_macos_install_folders_is_found():
    windows = "C:/Program Files/NVIDIA Corporation/Nsight Systems 2025.3.2/target-windows-x64/nsys.exe"
    macos = "/Applications/NVIDIA Nsight Systems.app/Contents/MacOS/nsys"
    assert any(fnmatch.fnmatch(windows, pattern) for pattern in export.INSTALL_GLOBS)
    assert any(fnmatch.fnmatch(macos, pattern) for pattern in export.INSTALL_GLOBS)


@pytest.mark.parametrize("inside", ["target-windows-x64/nsys.exe", "Contents/MacOS/nsys", "bin/nsys"])
def test_nsys_option_takes_an_install_folder_of_any_platform(tmp_path: Path, inside: str):
    binary = tmp_path / "Nsight Systems 2025.3.2" / inside
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    assert export.find_nsys(binary.parents[len(Path(inside).parts) - 1]) == binary


def test_linux_keeps_its_cache_folder_and_other_systems_get_theirs(monkeypatch: pytest.MonkeyPatch):
    assert export.default_cache_dir("linux") == Path.home() / ".cache" / "nsysan"
    # Off Linux the folder is platformdirs' (on this Linux machine it answers with its XDG rule,
    # so only the name can be checked here: nsysan, without an author folder).
    assert export.default_cache_dir("darwin").parts[-1] == "nsysan"


def test_code_parses_as_python_3_10():
    """The lowest supported Python (README) is 3.10; no interpreter of it is on this machine, so
    every module is parsed with the 3.10 grammar (no `except*`, no PEP 695 generics)."""
    sources = sorted((ROOT / "nsysan").rglob("*.py"))
    assert len(sources) > 20
    for source in sources:
        ast.parse(source.read_text(encoding="utf-8"), filename=str(source), feature_version=(3, 10))


def test_outputs_are_written_in_binary_mode_where_that_is_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """On Windows a descriptor from os.open is in text mode unless O_BINARY is given: every \\n
    written would become \\r\\n, PNGs included. Linux has no O_BINARY, so a stand-in flag is set
    on `os` and taken off again before the real os.open."""
    from nsysan.commands import outputs as files

    fake_binary = 1 << 30
    seen: list[int] = []
    real_open = os.open

    def recording_open(path, flags, mode=0o777, **kwargs):
        seen.append(flags)
        return real_open(path, flags & ~fake_binary, mode, **kwargs)

    monkeypatch.setattr(os, "O_BINARY", fake_binary, raising=False)
    monkeypatch.setattr(os, "open", recording_open)
    payload = b"\x89PNG\r\n\x1a\n" + bytes(range(256))
    files.write_atomic(tmp_path / "plot.png", payload)
    assert seen and all(flags & fake_binary for flags in seen)
    assert (tmp_path / "plot.png").read_bytes() == payload


def test_text_output_in_a_narrow_code_page_escapes_what_it_cannot_encode(tmp_path: Path):
    """On Windows, output redirected to a file is in the ANSI code page (cp1252): an NVTX range
    named in Chinese must not end the run with an internal error."""
    from builders import make_export

    export_path = make_export(tmp_path / "cjk.sqlite", memory=[(2_000_000, 0xA000, 64 << 20, 0, 1)],
                              calls=[(2_000_000, 2_000_100, "cudaMalloc_v3020", 1)],
                              nvtx=[(1_000_000, 5_000_000, "步骤 1")])
    env = dict(os.environ, PYTHONIOENCODING="cp1252", PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-m", "nsysan", "analyze", str(export_path), "--no-progress"],
                            capture_output=True, cwd=tmp_path, env=env, timeout=300)
    assert result.returncode == 0, result.stderr.decode("cp1252")
    text = result.stdout.decode("cp1252")
    assert "\\u6b65\\u9aa4 1" in text and "64.0 MiB" in text
