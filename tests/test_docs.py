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
# Every Markdown page whose console blocks run `nsysan` on the shipped fixtures. docs/ci.md's run in
# its example repository, in tests/test_ci_doc.py.
DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "ci.md")]
BLOCK = re.compile(r"```console\n\$ (nsysan .+?)\n(.*?)```", flags=re.S)
EXAMPLES = [(doc, command, shown) for doc in DOCS for command, shown in BLOCK.findall(doc.read_text())]
# A line of "..." in a block stands for lines left out: the block is an excerpt, whose pieces are
# the output's, in order. `| head -n N` keeps the first N lines, as the shell would.
ELIDED = "..."
HEAD = re.compile(r"\s*\|\s*head\s+(?:-n\s*)?-?(\d+)\s*$")


def test_every_command_has_a_section():
    import typer.main

    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    text = CLI_DOC.read_text()
    missing = [name for name in commands if f"\n## {name}\n" not in text]
    assert not missing, f"commands without a section in docs/cli.md: {missing}"


def printed_by(command: str, cwd) -> str:
    """What `command` prints (stdout, then stderr) at 100 columns, run from a folder whose
    fixtures/ is the project's."""
    (cwd / "fixtures").symlink_to(ROOT / "fixtures")  # outputs such as --json-dir land in tmp
    head = HEAD.search(command)
    args = shlex.split(command[:head.start()] if head else command)
    assert args[0] == "nsysan"
    env = dict(os.environ, COLUMNS="100")
    result = subprocess.run([sys.executable, "-m", "nsysan", *args[1:]], capture_output=True, text=True,
                            cwd=cwd, env=env, timeout=300)
    lines = [line.rstrip() for line in (result.stdout + result.stderr).rstrip("\n").splitlines()]
    return "\n".join(lines[:int(head.group(1))] if head else lines)


def pieces(shown: str) -> list[list[str]]:
    """The runs of lines of an excerpt between its "..." lines."""
    runs: list[list[str]] = [[]]
    for line in shown.rstrip("\n").split("\n"):
        if line.strip() == ELIDED:
            runs.append([])
        else:
            runs[-1].append(line)
    return [run for run in runs if run]


def find_in_order(runs: list[list[str]], lines: list[str]) -> list[int]:
    """Where each run of lines starts in `lines`, each after the one before; -1 from the first not found."""
    found, at = [], 0
    for run in runs:
        start = next((i for i in range(at, len(lines) - len(run) + 1) if lines[i:i + len(run)] == run), -1)
        found.append(start)
        if start < 0:
            return found + [-1] * (len(runs) - len(found))
        at = start + len(run)
    return found


def refreshed_excerpt(shown: str, printed: str) -> str:
    """The excerpt with each piece taken again from the output: from the line that begins as its
    first line did (its first three words), as many lines as it had and the rest of a sentence
    that now wraps onto more; review the diff."""
    lines = printed.split("\n")
    out, at = [], 0
    elided_first = shown.lstrip("\n").startswith(ELIDED)
    for n, run in enumerate(pieces(shown)):
        key = " ".join(run[0].split()[:3])
        start = next((i for i in range(at, len(lines)) if " ".join(lines[i].split()[:3]) == key), at)
        if n or elided_first:
            out.append(ELIDED)
        end = start + len(run)
        indent = len(lines[start]) - len(lines[start].lstrip()) if start < len(lines) else 0
        while end < len(lines) and lines[end].strip() and len(lines[end]) - len(lines[end].lstrip()) > indent:
            end += 1  # the rest of a sentence that now wraps onto more lines
        out += lines[start:end]
        at = end
    if shown.rstrip("\n").endswith(ELIDED):
        out.append(ELIDED)
    return "\n".join(out)


@pytest.mark.parametrize("doc,command,expected", EXAMPLES,
                         ids=[f"{d.relative_to(ROOT)}: {c}" for d, c, _ in EXAMPLES])
def test_console_example_prints_what_the_docs_show(doc, command, expected, tmp_path):
    printed = printed_by(command, tmp_path)
    excerpt = any(line.strip() == ELIDED for line in expected.split("\n"))
    if os.environ.get("NSYSAN_UPDATE_DOCS") == "1":
        new = refreshed_excerpt(expected, printed) if excerpt else printed
        old = f"```console\n$ {command}\n{expected}```"
        doc.write_text(doc.read_text().replace(old, f"```console\n$ {command}\n{new}\n```"))
        return
    if not excerpt:
        assert printed == expected.rstrip("\n")
        return
    runs = pieces(expected)
    found = find_in_order(runs, printed.split("\n"))
    assert -1 not in found, f"not printed (in this order): {runs[found.index(-1)]}"


def test_an_excerpt_must_be_printed_in_order():
    # the check above can fail: a piece that is not in the output, or out of order
    lines = ["a", "b", "c", "d"]
    assert find_in_order([["b", "c"], ["d"]], lines) == [1, 3]
    assert find_in_order([["c"], ["b"]], lines) == [2, -1]
    assert find_in_order([["b", "d"]], lines) == [-1]
    assert refreshed_excerpt("...\nb x y\nzz\n...\n", "a\nb x y 2\nc\nd") == "...\nb x y 2\nc\n..."
    assert refreshed_excerpt(" b x y\n", " b x y\n   more\n c") == " b x y\n   more"


def test_the_readme_opens_with_the_two_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert lines[0] == "# nsysan" and lines[1] == ""
    assert lines[2].split("#")[0].split() == ["pip", "install", "-e", ".", "&&", "nsysan", "analyze",
                                              "fixtures/known_mem_v25.sqlite"]
    assert lines[3].split("#")[0].split() == ["pip", "install", "-e", "'.[test]'", "&&", "python", "-m", "pytest"]


MARKDOWN = [ROOT / "README.md", ROOT / "fixtures" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]*?)(?:#([^)\s]+))?\)")


def anchors(path) -> set[str]:
    """The anchors GitHub makes of a page's headings: lower case, punctuation dropped, blanks as
    hyphens, and -1, -2 after a heading met again."""
    seen: dict[str, int] = {}
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # a "# comment" in a code block is no heading
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        if n:
            seen.setdefault(f"{slug}-{n}", 1)
    return set(seen)


def test_every_link_between_the_docs_resolves():
    dead = []
    for page in MARKDOWN:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target, anchor in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue  # a web address
            linked = (page.parent / target).resolve() if target else page
            if not linked.exists():
                dead.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                dead.append(f"{page.relative_to(ROOT)}: {target}#{anchor}")
    assert dead == []


def test_the_anchor_rule_is_githubs():
    page = ROOT / "docs" / "cli.md"
    found = anchors(page)
    assert "nvidia-smi-logs-against-the-trace---smi" in found  # the README links it so
    assert "analyze" in found and "no-such-section" not in found


def test_every_module_the_docs_name_exists():
    # `analyses/sites.py`, `nsysan/events/columns.py`: from the project or the package; a bare
    # `read.py` (under a heading that names its folder): somewhere in the package, tests or benchmarks
    source = re.compile(r"`((?:nsysan/)?(?:[a-z_]+/)*[a-z_0-9]+\.py)`")
    known = {p.name for folder in ("nsysan", "tests", "benchmarks", "fixtures") for p in (ROOT / folder).rglob("*.py")}
    missing = []
    for page in MARKDOWN:
        for path in source.findall(page.read_text()):
            if "/" in path and not any((base / path).exists() for base in (ROOT, ROOT / "nsysan")):
                missing.append(f"{page.relative_to(ROOT)}: {path}")
            elif "/" not in path and path not in known:
                missing.append(f"{page.relative_to(ROOT)}: {path}")
    assert missing == []
