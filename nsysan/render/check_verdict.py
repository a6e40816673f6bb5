"""A check `Verdict` for people and for CI: terminal lines, JSON, JUnit XML, Markdown.

The JUnit file follows the common (Ant/windyroad `JUnit.xsd`) structure that GitLab, Jenkins and
the GitHub test-report actions read: `<testsuites>` around one `<testsuite>` with its required
attributes, `<properties>`, one `<testcase>` per limit and place (a `<failure>` in it when the
limit broke), then `<system-out>` and `<system-err>`.
"""

from __future__ import annotations

import datetime
import re
import xml.etree.ElementTree as ET
from typing import TYPE_CHECKING

from ..errors import printable
from ..model.check import Verdict
from .json import dumps

if TYPE_CHECKING:
    from rich.console import Console


def verdict_line(verdict: Verdict) -> str:
    """ "FAIL: 2 of 3 limit checks broken (torch_leak_v25.sqlite against torch_clean_v25.sqlite)"."""
    against = f" against {verdict.baseline}" if verdict.baseline else ""
    total, broken, unmeasured = len(verdict.outcomes), len(verdict.broken), len(verdict.unmeasured)
    if verdict.status == "error":
        return printable(f"ERROR: the check could not run ({verdict.report}{against}): {verdict.error}")
    if verdict.status == "not_measured":
        return printable(f"NOT MEASURED: {unmeasured} of {total} limit checks could not be measured "
                         f"({verdict.report}{against}); --allow-unmeasured lets the others decide")
    if verdict.status == "fail":
        also = f", {unmeasured} not measured" if unmeasured else ""
        return printable(f"FAIL: {broken} of {total} limit checks broken{also} ({verdict.report}{against})")
    if unmeasured:
        return printable(f"PASS: {total - unmeasured} of {total} limit checks hold, {unmeasured} not measured "
                         f"(allowed by --allow-unmeasured) ({verdict.report}{against})")
    return printable(f"PASS: all {total} limit checks hold ({verdict.report}{against})")


_LABELS = {"broken": "broken  ", "not_measured": "not measured  ", "held": "ok      "}


def render_verdict_terminal(verdict: Verdict, console: "Console") -> None:
    """The verdict first, then one line per broken limit and per limit not measured, then the
    comparison and the limits that held.

    On a terminal each is wrapped at words under its label; elsewhere (a CI log, a file) each stays
    one line, whatever its length, for grep."""
    from rich.text import Text

    from .layout import Lines, print_headline

    rows: list[tuple[str, str, str, str]] = []  # label (padded), label style, text, line style
    rows += [(_LABELS[o.status], "bold red" if o.status == "broken" else "yellow", f"{o.limit}: {o.message}", "")
             for o in [*verdict.broken, *verdict.unmeasured]]
    if verdict.comparison:
        rows.append(("", "", f"compared: {verdict.comparison}", ""))
    rows += [(_LABELS["held"], "", f"{o.limit}: {o.message}", "dim") for o in verdict.outcomes if o.ok]
    print_headline(console, verdict_line(verdict),
                   style={"pass": "bold green", "fail": "bold red"}.get(verdict.status, "bold yellow"))
    for label, label_style, text, style in rows:
        if not console.is_terminal:
            line = Text(f"  {label}", style=label_style)
            line.append(printable(text))
            console.print(line, style=style, soft_wrap=True)
        else:
            console.print(Lines([(Text(label.rstrip(), style=label_style), printable(text))], indent=2, gap=2,
                                style=style, label_width=max(len(label) - 2, 0), hanging=2))


def render_verdict_json(verdict: Verdict) -> str:
    return dumps(verdict.to_dict()) + "\n"


def render_junit(verdict: Verdict) -> str:
    """The verdict as JUnit XML: one test case per limit and place, a `<failure>` in it when the
    limit broke and an `<error>` when it could not be measured; a check that could not run is one
    test case with an `<error>` that says why."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    cases = [(f"{o.limit} · {o.where}", f"nsysan.check.{o.limit}",
              {"broken": "failure", "not_measured": "error"}.get(o.status), o.status if o.status != "broken"
              else o.limit, o.message) for o in verdict.outcomes]
    if verdict.status == "error":
        cases = [("nsysan check", "nsysan.check", "error", "input", verdict.error or "")]
    # The common JUnit schema (Ant's, as windyroad's JUnit.xsd writes it down) allows no attributes
    # on <testsuites>; reporters (GitLab, Jenkins, GitHub actions) count the suites' own.
    suites = ET.Element("testsuites")
    suite = ET.SubElement(suites, "testsuite", name=_x(f"nsysan check {verdict.report}"), package="nsysan.check",
                          id="0", timestamp=stamp, hostname="localhost", tests=str(len(cases)),
                          failures=str(sum(1 for c in cases if c[2] == "failure")),
                          errors=str(sum(1 for c in cases if c[2] == "error")), skipped="0", time="0")
    properties = ET.SubElement(suite, "properties")
    for name, value in (("report", verdict.report), ("baseline", verdict.baseline or ""), ("per", verdict.per),
                        ("status", verdict.status)):
        ET.SubElement(properties, "property", name=name, value=_x(value))
    for name, classname, result, kind, message in cases:
        case = ET.SubElement(suite, "testcase", name=_x(name), classname=_x(classname), time="0")
        if result is not None:
            element = ET.SubElement(case, result, message=_x(message), type=kind)
            element.text = _x(message)
    ET.SubElement(suite, "system-out").text = _x(verdict_line(verdict))
    ET.SubElement(suite, "system-err")
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def render_markdown(verdict: Verdict) -> str:
    """A Markdown summary (a GitHub job summary, a merge-request note). Every string that holds
    a profile's words (the verdict line with the report's name, a process name, the comparison)
    is an inline code span: there Markdown makes no link, no autolink (`https://...`, `www.`,
    `a@b.c`), no image and no HTML, whatever the string holds."""
    icon = {"pass": "✅", "fail": "❌"}.get(verdict.status, "⚠️")
    state, _, rest = verdict_line(verdict).partition(": ")  # PASS, FAIL, ...: our words; the rest names files
    lines = [f"### {icon} nsysan check: {state}: {_code(rest)}", ""]
    if verdict.status == "error":
        return "\n".join(lines)
    if verdict.comparison:
        lines += [f"Compared with the baseline: {_code(verdict.comparison)}", ""]
    lines += ["| | limit | where | measured |", "|---|---|---|---|"]
    order = {"broken": 0, "not_measured": 1, "held": 2}
    marks = {"broken": "❌", "not_measured": "⚠️", "held": "✅"}
    for o in sorted(verdict.outcomes, key=lambda o: order[o.status]):
        lines.append(f"| {marks[o.status]} | {_cell(o.limit)} {_cell(o.threshold)} | {_cell(o.where)} | "
                     f"{_cell(o.message)} |")
    return "\n".join(lines) + "\n"


# Characters XML 1.0 cannot carry at all, even as character references: what printable()
# leaves of them (U+FFFE, U+FFFF; surrogates and controls it escapes already) is escaped too.
_XML_INVALID = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _x(text: str) -> str:
    """Text for XML 1.0, which has no way to carry control characters: shown as escapes."""
    return _XML_INVALID.sub(lambda m: f"\\u{ord(m.group()):04x}", printable(str(text)))


def _code(text: str) -> str:
    """`text` as one inline code span: fenced by one backtick more than its longest run of
    backticks, padded where it starts or ends with one (CommonMark 6.1)."""
    text = printable(str(text))
    longest = max((len(run) for run in re.findall("`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith(("`", " ")) or text.endswith(("`", " ")) or not text else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _cell(text: str) -> str:
    """A code span in a table cell: a `|` would end the cell even there, so it is escaped
    (GitHub's table rule, which applies inside code spans too)."""
    return _code(text).replace("|", "\\|")
