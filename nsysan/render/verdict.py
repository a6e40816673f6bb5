"""A check `Verdict` for people and for CI: terminal lines, JSON, JUnit XML, Markdown.

The JUnit file follows the common (Ant/windyroad `JUnit.xsd`) structure that GitLab, Jenkins and
the GitHub test-report actions read: `<testsuites>` around one `<testsuite>` with its required
attributes, `<properties>`, one `<testcase>` per limit and place (a `<failure>` in it when the
limit broke), then `<system-out>` and `<system-err>`.
"""

from __future__ import annotations

import datetime
import html
import xml.etree.ElementTree as ET
from typing import TYPE_CHECKING

from ..errors import printable
from ..limits import Verdict
from .json import dumps

if TYPE_CHECKING:
    from rich.console import Console


def verdict_line(verdict: Verdict) -> str:
    """ "FAIL: 2 of 3 limits broken (torch_leak_v25.sqlite against torch_clean_v25.sqlite)"."""
    against = f" against {verdict.baseline}" if verdict.baseline else ""
    total, broken = len(verdict.outcomes), len(verdict.broken)
    if verdict.ok:
        return printable(f"PASS: all {total} limit checks hold ({verdict.report}{against})")
    return printable(f"FAIL: {broken} of {total} limit checks broken ({verdict.report}{against})")


def render_verdict_terminal(verdict: Verdict, console: "Console") -> None:
    """The verdict first, then one line per broken limit, then the comparison and the limits that held."""
    from rich.text import Text

    # soft_wrap: one line per limit, never cut into two by the console's width (grep, CI logs)
    console.print(Text(verdict_line(verdict), style="bold green" if verdict.ok else "bold red"), soft_wrap=True)
    for outcome in verdict.broken:
        console.print(Text(printable(f"  broken  {outcome.limit}: {outcome.message}")), soft_wrap=True)
    if verdict.comparison:
        console.print(Text(printable(f"  compared: {verdict.comparison}")), soft_wrap=True)
    for outcome in verdict.outcomes:
        if outcome.ok:
            console.print(Text(printable(f"  ok      {outcome.limit}: {outcome.message}")), style="dim",
                          soft_wrap=True)


def render_verdict_json(verdict: Verdict) -> str:
    return dumps(verdict.to_dict()) + "\n"


def render_junit(verdict: Verdict, time: datetime.datetime | None = None) -> str:
    """The verdict as JUnit XML: one test case per limit and place."""
    stamp = (time or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y-%m-%dT%H:%M:%S")
    failures = len(verdict.broken)
    # The common JUnit schema (Ant's, as windyroad's JUnit.xsd writes it down) allows no attributes
    # on <testsuites>; reporters (GitLab, Jenkins, GitHub actions) count the suites' own.
    suites = ET.Element("testsuites")
    suite = ET.SubElement(suites, "testsuite", name=_x(f"nsysan check {verdict.report}"), package="nsysan.check",
                          id="0", timestamp=stamp, hostname="localhost", tests=str(len(verdict.outcomes)),
                          failures=str(failures), errors="0", skipped="0", time="0")
    properties = ET.SubElement(suite, "properties")
    for name, value in (("report", verdict.report), ("baseline", verdict.baseline or ""), ("per", verdict.per)):
        ET.SubElement(properties, "property", name=name, value=_x(value))
    for outcome in verdict.outcomes:
        case = ET.SubElement(suite, "testcase", name=_x(f"{outcome.limit} · {outcome.where}"),
                             classname=f"nsysan.check.{outcome.limit}", time="0")
        if not outcome.ok:
            failure = ET.SubElement(case, "failure", message=_x(outcome.message), type=outcome.limit)
            failure.text = _x(outcome.message)
    ET.SubElement(suite, "system-out").text = _x(verdict_line(verdict))
    ET.SubElement(suite, "system-err")
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def render_markdown(verdict: Verdict) -> str:
    """A Markdown summary (a GitHub job summary, a merge-request note). Profile strings are
    HTML-escaped, since GitHub renders HTML inside Markdown."""
    icon = "✅" if verdict.ok else "❌"
    lines = [f"### {icon} nsysan check: {_md(verdict_line(verdict))}", ""]
    if verdict.comparison:
        lines += [f"Compared with the baseline: {_md(verdict.comparison)}", ""]
    lines += ["| | limit | where | measured |", "|---|---|---|---|"]
    for o in sorted(verdict.outcomes, key=lambda o: o.ok):
        lines.append(f"| {'✅' if o.ok else '❌'} | `{o.limit}` {_md(o.threshold)} | {_md(o.where)} | {_md(o.message)} |")
    return "\n".join(lines) + "\n"


def _x(text: str) -> str:
    """Text for XML 1.0, which has no way to carry control characters: shown as escapes."""
    return printable(str(text))


def _md(text: str) -> str:
    return html.escape(printable(str(text)), quote=False).replace("|", "\\|").replace("`", "\\`") \
        .replace("*", "\\*").replace("_", "\\_").replace("[", "\\[")
