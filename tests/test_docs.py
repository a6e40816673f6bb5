"""The docs stay true: every command has a section in docs/cli.md, and its console examples
print what the docs say they print.

After a change that moves the output, refresh the examples with
NSYSAN_UPDATE_DOCS=1 python -m pytest tests/test_docs.py, and review the diff.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest
from conftest import ROOT

from nsysan.cli import app

CLI_DOC = ROOT / "docs" / "cli.md"
EXAMPLES = re.findall(r"```console\n\$ (.+?)\n(.*?)```", CLI_DOC.read_text(), flags=re.S)


def test_every_command_has_a_section():
    import typer.main

    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    text = CLI_DOC.read_text()
    missing = [name for name in commands if f"\n## {name}\n" not in text]
    assert not missing, f"commands without a section in docs/cli.md: {missing}"


@pytest.mark.parametrize("command,expected", EXAMPLES, ids=[c for c, _ in EXAMPLES])
def test_console_example_prints_what_the_docs_show(command, expected, tmp_path):
    (tmp_path / "fixtures").symlink_to(ROOT / "fixtures")  # outputs such as --json-dir land in tmp
    args = shlex.split(command)
    assert args[0] == "nsysan"
    env = dict(os.environ, COLUMNS="100")
    result = subprocess.run([sys.executable, "-m", "nsysan", *args[1:]], capture_output=True, text=True,
                            cwd=tmp_path, env=env, timeout=300)
    printed = "\n".join(line.rstrip() for line in (result.stdout + result.stderr).rstrip("\n").splitlines())
    if os.environ.get("NSYSAN_UPDATE_DOCS") == "1":
        old = f"```console\n$ {command}\n{expected}```"
        CLI_DOC.write_text(CLI_DOC.read_text().replace(old, f"```console\n$ {command}\n{printed}\n```"))
        return
    assert printed == expected.rstrip("\n")
