"""The terminal summary, drawn with rich from the `Analysis` alone."""

from __future__ import annotations

from typing import Any, Callable, Union

from rich import box
from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.cells import cell_len
from rich.text import Text

from ..errors import printable
from ..model import LIVE_AT_START, Analysis, Peak, RangeFamily, StepSeries
from .layout import NAME, WORD, Column, Lines, Parts, Sheet
from .oom import DRAWN_CODES, oom_and_reserved
from ..base.units import fmt_bytes, fmt_duration, fmt_durations, fmt_frame, fmt_share, fmt_signed_bytes, fmt_time, \
    fmt_times

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def render_terminal(analysis: Analysis, console: Console, top: int = 10, stacks: bool = False) -> None:
    """Print the whole summary: capture, answers, peaks, live at peak, groups, never freed, sites, calls,
    diagnostics. Every table and line fits the console's width (render/layout.py).

    `stacks`: after the sites, the whole call stack of each top site that has one.
    """
    for part in summary_parts(analysis, top, stacks):
        console.print(part)


def summary_parts(analysis: Analysis, top: int = 10, stacks: bool = False) -> list[RenderableType]:
    """What `render_terminal` prints, in order; tables are `Sheet`s, fitted when printed."""
    parts: list[RenderableType] = [_capture_panel(analysis)]
    # The answers first, then the tables they come from: peak and growth, out of memory and
    # reserved memory (with what was live), nvidia-smi, then the warnings that weaken the numbers.
    parts += answers_section(analysis)
    quick = analysis.scope == "quick"
    tables: list[Union[Sheet, Group, Text]] = []
    if analysis.capture.memory_usage_collected and analysis.groups:
        tables.append(_peaks_table(analysis, top))
        tables += [_live_at_peak_table(peak, top) for peak in analysis.process_peaks()]
        tables += [_steps_table(series, top) for series in analysis.steps[:STEP_TABLES]]
        if len(analysis.steps) > STEP_TABLES:
            tables.append(Text(f"… and {len(analysis.steps) - STEP_TABLES} more step tables (see --format json)"))
        tables += [_phases_table(analysis, top), _spikes_table(analysis, top)]
        tables.append(_groups_table(analysis, top))
        tables.append(_never_freed_table(analysis, top))
        if not quick:
            tables.append(_sites_table(analysis, top))
            if stacks:
                tables.append(_site_stacks(analysis, top))
        if analysis.ranges:
            tables.append(_ranges_table(analysis, top))
            if any(r.operator for r in analysis.ranges):
                tables.append(_ranges_table(analysis, top, operators=True))
    if analysis.api_calls and (not analysis.capture.memory_usage_collected or not analysis.groups):
        tables.append(_calls_table(analysis, top))
    if analysis.failed_calls:
        tables.append(_failed_table(analysis, top))
    for table in tables:
        if not isinstance(table, Sheet):
            parts.append(table)
        elif table.rows:  # a table without rows says nothing
            # A quick analysis (the memory-usage table alone) has no values for some columns.
            parts.append(table.without(_UNREAD_IN_QUICK) if quick else table)
    if analysis.smi is not None:
        from .smi_terminal import smi_section

        parts.append(smi_section(analysis.smi))
    parts.append(_diagnostics(analysis))
    return parts


# What a quick analysis (the memory-usage table alone) does not know.
_UNREAD_IN_QUICK = {"NVTX range", "range", "reached by", "API", "site"}


# A name from the profile is cut to this many characters on the terminal (the JSON keeps more).
DISPLAY_CHARS = 200
# Lists whose length the profile decides (GPUs, processes, peaks, groups): at most this many
# rows, or --top when larger; the largest first, then "… and N more".
LIST_ROWS = 20
STEP_TABLES = 4  # step tables (one per process and device) shown


def _t(value: object) -> str:
    """Text from a profile, never shown as terminal escapes (a Sheet never reads markup), and cut to
    DISPLAY_CHARS (cut before the escaping: a 4 KB name is escaped in no time, a 10 MB one not)."""
    return printable(_short(str(value)))


def _short(text: str, limit: int = DISPLAY_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _largest(items: list, size: Callable[[Any], int], limit: int) -> tuple[list, int]:
    """At most `limit` of `items`, the largest by `size`, in their own order; and how many more."""
    if len(items) <= limit:
        return items, 0
    keep = set(sorted(range(len(items)), key=lambda i: -size(items[i]))[:limit])
    return [item for i, item in enumerate(items) if i in keep], len(items) - limit


def _capture_panel(analysis: Analysis) -> Panel:
    cap, src = analysis.capture, analysis.source
    lines: list[Union[str, list[str]]] = []
    version = f"Nsight Systems {cap.nsys_version}" if cap.nsys_version else "Nsight Systems (version not recorded)"
    if cap.schema_version:
        version += f" (export schema {cap.schema_version})"
    if cap.report_version and cap.report_version != cap.nsys_version:
        version += f", captured with {cap.report_version}"
    lines.append(version)
    facts = [f"duration {fmt_duration(cap.duration_ns)}" if cap.duration_ns else None,
             f"CUDA driver {cap.cuda_driver_version}" if cap.cuda_driver_version else None,
             "memory usage: " + ("collected" if cap.memory_usage_collected else "NOT collected"),
             "backtraces: " + ("yes" if cap.backtraces else "no"), "NVTX: " + ("yes" if cap.nvtx else "no")]
    lines.append([printable(f) for f in facts if f])  # wrapped between the facts, not inside one
    peak_of = analysis.peak_bytes_by_process()
    gpus, more_gpus = _largest(cap.gpus, lambda g: g.total_memory_bytes or 0, LIST_ROWS)
    for gpu in gpus:
        lines.append(f"GPU {gpu.id}: {_short(gpu.name)}, {fmt_bytes(gpu.total_memory_bytes)}")
    if more_gpus:
        lines.append(f"… and {more_gpus} more GPUs (see --format json)")
    processes, more_processes = _largest(cap.processes, lambda p: peak_of.get(p.pid, 0), LIST_ROWS)
    for proc in processes:
        devices = ", ".join(str(d) for d in proc.devices) or "-"
        threads = "" if analysis.scope == "quick" else f", {proc.threads} threads calling memory APIs"
        rank = ""
        if proc.rank is not None:
            how = "from its environment" if proc.rank_source == "environment" else "by GPU order"
            rank = f" ({proc.label}, {how})"
        lines.append(f"process {proc.pid} {_short(proc.name)}{rank}: CUDA devices {_short(devices)}{threads}")
    if more_processes:
        lines.append(f"… and {more_processes} more processes, with smaller peaks (see --format json)")
    exported = ""
    if src.exported_with:
        exported = f" (exported with nsys {src.exported_with}{', from cache' if src.from_cache else ''})"
    # Each line's names are cut already; a line is cut too (versions come from the export).
    body = Group(*(Parts(line, hanging=0) if isinstance(line, list)
                   else Lines.prose(printable(_short(line, 2 * DISPLAY_CHARS))) for line in lines))
    # Text, not str: rich reads a str title as markup and :emoji: codes
    return Panel(body, title=Text(_t(f"nsysan · {src.name}{exported}")), title_align="left", box=box.ROUNDED)


def _peaks_table(analysis: Analysis, top: int) -> Sheet:
    table = Sheet("Peak GPU memory (device + array + static) per process and GPU",
                  Column("process"), Column("device"), Column("peak"), Column("at"), Column("NVTX range", NAME, 3),
                  Column("reached by", WORD, 2), Column("of GPU", drop=1), Column("live allocs", drop=4))
    peaks, more = _largest(analysis.peaks, lambda p: p.peak_bytes, max(top, LIST_ROWS))
    if more:
        table.caption = f"… and {more} more, with smaller peaks (see --format json)"
    times = fmt_times([peak.peak_time_ns for peak in peaks])
    for peak, at in zip(peaks, times):
        who = "all" if peak.pid is None else str(peak.pid)
        where = f"GPU {peak.gpu}" if peak.pid is None else str(peak.device)
        share = fmt_share(peak.peak_bytes, peak.total_memory_bytes)
        table.add_row(who, where, fmt_bytes(peak.peak_bytes), at, _t(peak.nvtx_range or "-"),
                      _t(peak.api), share, str(peak.live_count))
    return table


def _live_at_peak_table(peak: Peak, top: int) -> Sheet:
    shown = peak.live_at_peak[:top]
    more = peak.live_count - len(shown)
    title = (f"Live at the peak of process {peak.pid} on device {peak.device} "
             f"({fmt_bytes(peak.peak_bytes)} at {fmt_time(peak.peak_time_ns)})")
    table = Sheet(title, Column("size"), Column("kind", WORD, 2), Column("API", WORD, 1), Column("site", NAME),
                  Column("NVTX range", NAME, 3), Column("age"))
    for alloc, age in zip(shown, fmt_durations([peak.peak_time_ns - alloc.alloc_time_ns for alloc in shown])):
        # a block live when the capture began is older than the capture: its age is not known
        table.add_row(fmt_bytes(alloc.bytes), alloc.kind, _t(alloc.api), _t(alloc.site.label),
                      _t(alloc.nvtx_range or "-"), "unknown" if alloc.api == LIVE_AT_START else age)
    if more > 0:
        table.caption = f"… and {more} smaller allocations"
    return table


def _groups_table(analysis: Analysis, top: int) -> Sheet:
    table = Sheet("Memory by process, device and kind", Column("process"), Column("dev"), Column("kind", WORD),
                  Column("peak"), Column("at end"), Column("allocs", drop=2), Column("frees", drop=1),
                  Column("allocated", drop=3), Column("never freed"))
    groups, more = _largest(analysis.groups, lambda g: g.peak_bytes, max(top, LIST_ROWS))
    if more:
        table.caption = f"… and {more} more, with smaller peaks (see --format json)"
    for g in groups:
        never = f"{fmt_bytes(g.never_freed_bytes)} ({g.never_freed_count})" if g.never_freed_count else "-"
        if g.kind in ("static", "managed_static"):
            never = "not a leak"
        table.add_row(str(g.pid), str(g.device), g.kind, fmt_bytes(g.peak_bytes), fmt_bytes(g.end_bytes),
                      str(g.allocations), str(g.frees), fmt_bytes(g.allocated_bytes), never)
    return table


def _never_freed_table(analysis: Analysis, top: int) -> Sheet:
    total = analysis.never_freed_bytes
    count = analysis.never_freed_total
    title = f"Never freed during the capture: {count} allocations, {fmt_bytes(total)}"
    table = Sheet(title, Column("size"), Column("kind", WORD, 3), Column("API", WORD, 1), Column("site", NAME),
                  Column("NVTX range", NAME, 4), Column("process", drop=2), Column("allocated at"))
    listed = analysis.never_freed[:top]
    for a, at in zip(listed, fmt_times([a.alloc_time_ns for a in listed])):
        at = "before capture" if a.api == LIVE_AT_START else at  # not "0.00 ms": it predates the capture
        table.add_row(fmt_bytes(a.bytes), a.kind, _t(a.api), _t(a.site.label), _t(a.nvtx_range or "-"),
                      str(a.pid), at)
    if count > top:
        table.caption = f"… and {count - min(top, len(analysis.never_freed))} more (see --format json)"
    return table


def _sites_table(analysis: Analysis, top: int) -> Sheet:
    # Sites are per process; the column is shown when there is more than one to tell apart.
    several = len({s.pid for s in analysis.sites}) > 1
    table = Sheet("Top allocation sites", Column("site", NAME), *([Column("process")] if several else []),
                  Column("kind", WORD, 2), Column("allocs", drop=1), Column("allocated", drop=3), Column("never freed"),
                  Column("max live"))
    for s in analysis.sites[:top]:
        never = fmt_bytes(s.never_freed_bytes) + f" ({s.never_freed_count})" if s.never_freed_count else "-"
        process = [str(s.pid) if s.pid is not None else "-"] if several else []
        # The site's label, and under it (dim) the one line of context it has (the frame the user's line called).
        site = _t(s.site.label) + ("\n  ↳ " + _t(s.site.context) if s.site.context else "")
        table.add_row(site, *process, s.kind, str(s.allocations), fmt_bytes(s.allocated_bytes), never,
                      fmt_bytes(s.max_live_bytes))
    return table


def _site_stacks(analysis: Analysis, top: int) -> Group:
    """The whole stack of each top site that has one, innermost frame first."""
    by_id = {s.id: s for s in analysis.stacks}
    parts: list = [Text("Call stacks of the top sites (innermost frame first)", style="bold")]
    shown = 0
    for s in analysis.sites[:top]:
        stack = by_id.get(s.site.stack_id) if s.site.stack_id is not None else None
        if stack is None:
            continue
        shown += 1
        parts.append(Parts([_t(s.site.label), f"process {s.pid}", f"{stack.source} stack"], indent=2, style="bold"))
        for frame in stack.frames:
            parts.append(Text(_t(f"    {fmt_frame(frame.function, frame.file, frame.line, frame.module)}")))
    if not shown:
        # how to get them, as the no_backtraces diagnostic says (it knows which flags the capture used)
        advice = next((d.message.split("; ", 1)[-1] for d in analysis.diagnostics if d.code == "no_backtraces"), "")
        parts.append(Text("  none: the capture recorded no call stacks" + (f" ({printable(advice)})" if advice else "")))
    return Group(*parts)


def _ranges_table(analysis: Analysis, top: int, operators: bool = False) -> Sheet:
    """The user's NVTX ranges, or (`operators`) PyTorch's operator ranges (`--pytorch=autograd-nvtx`),
    a level of their own: an allocation inside `forward > aten::addmm` counts in each table once,
    never twice in one."""
    title = ("PyTorch operator ranges (innermost operator of each allocation)" if operators
             else "NVTX ranges (innermost range of each allocation)")
    table = Sheet(title, Column("operator" if operators else "range", NAME), Column("instances", drop=1),
                  Column("allocated"), Column("freed", drop=2), Column("still live at end"),
                  Column("max live while open"))
    # the user's ranges of one family ("step 0" ... "step 9") are its one row, as on the page
    rows = [r for r in analysis.ranges if r.operator] if operators else \
        sorted(analysis.range_rows(), key=lambda r: (-r.allocated_bytes, -r.max_live_bytes, -r.instances))
    for r in rows[:top]:
        name = f"{r.label} ({r.names} ranges)" if isinstance(r, RangeFamily) else r.name or "(none)"
        table.add_row(_t(name), str(r.instances), fmt_bytes(r.allocated_bytes), fmt_bytes(r.freed_bytes),
                      fmt_bytes(r.still_live_bytes), fmt_bytes(r.max_live_bytes))
    return table


def _calls_table(analysis: Analysis, top: int) -> Sheet:
    table = Sheet("Memory API calls (sizes unknown without --cuda-memory-usage)", Column("API", NAME),
                  Column("family", WORD, 1), Column("calls"), Column("failed"), Column("total time", drop=2),
                  Column("longest", drop=3))
    shown = analysis.api_calls[: max(top, 15)]
    totals = fmt_durations([c.total_time_ns for c in shown])
    longest = fmt_durations([c.max_time_ns for c in shown])
    for c, total, longest_call in zip(shown, totals, longest):
        table.add_row(_t(c.api), c.family, str(c.calls), str(c.failed) if c.failed else "-", total, longest_call)
    return table


def _failed_table(analysis: Analysis, top: int) -> Sheet:
    table = Sheet("Failed memory calls", Column("at"), Column("process", drop=2), Column("API", WORD),
                  Column("error", WORD), Column("NVTX range", NAME), Column("live then", drop=1))
    shown = analysis.failed_calls[:top]
    for f, at in zip(shown, fmt_times([f.time_ns for f in shown])):
        table.add_row(at, str(f.pid), _t(f.api), f.error, _t(f.nvtx_range or "-"),
                      fmt_bytes(f.live_bytes))
    return table


_TOPIC_LABEL = {"verdict": "verdict", "peak": "peak", "growth": "growth", "bytes": "bytes", "what-if": "what if", "oom": "out of memory",
                "reserved": "warning", "trust": "warning", "graphs": "CUDA graphs",
                "unseen": "not traced"}
AnswerRow = tuple[str, str, str]  # label, severity, text


def answers_section(analysis: Analysis) -> list[Union[Lines, Sheet]]:
    """"Answers" and its lines, all labels in one column: peak and growth, out of memory and reserved
    memory with what was live then (render/oom.py), nvidia-smi, then the warnings."""
    items: list[Union[AnswerRow, Sheet]] = []
    items += _answer_rows(analysis, ("verdict", "peak", "growth", "bytes", "what-if", "graphs"))
    items += oom_and_reserved(analysis)
    if analysis.smi is not None:
        from .smi_terminal import smi_answer

        items += smi_answer(analysis.smi)
    items += _answer_rows(analysis, ("unseen",))
    # Every warning on the first screen: the out-of-memory and reserved-memory answers the lines
    # above do not draw (near capacity, memory never given access), then the others.
    items += _answer_rows(analysis, ("oom", "reserved", "trust"), skip=DRAWN_CODES)
    if not items:
        return []
    rows = [item for item in items if not isinstance(item, Sheet)]
    width = max(cell_len(label) for label, _, _ in rows) if rows else 0
    parts: list[Union[Lines, Sheet]] = [Lines.prose("Answers", style="bold")]
    for item in items:
        if isinstance(item, Sheet):
            parts.append(item)
            continue
        if not parts or not isinstance(parts[-1], Lines) or parts[-1].label_width != width:
            parts.append(Lines(label_width=width))
        label, severity, text = item
        parts[-1].add(Text(label, style=ANSWER_STYLE.get(severity, "")), text)  # type: ignore[union-attr]
    return parts


# An answer's label: bold when it informs, coloured when it warns.
ANSWER_STYLE = {"error": "bold red", "warning": "yellow", "info": "bold"}


def _answer_rows(analysis: Analysis, topics: tuple[str, ...], skip: frozenset = frozenset()) -> list[AnswerRow]:
    """The answers of these topics, one row each, but those whose codes are in `skip` (drawn in
    detail by render/oom.py)."""
    rows: list[AnswerRow] = []
    shown: dict[str, int] = {}
    for v in analysis.answers:
        if v.topic in topics and v.code not in skip:
            shown[v.topic] = shown.get(v.topic, 0) + 1
            if shown[v.topic] > LIST_ROWS:  # one per process and GPU: thousands in a large capture
                continue
            rows.append((_TOPIC_LABEL.get(v.topic, v.topic), v.severity,
                         printable(_short(v.message, 10 * DISPLAY_CHARS))))  # ours: longer than a name
    for topic, count in shown.items():
        if count > LIST_ROWS:
            rows.append((_TOPIC_LABEL.get(topic, topic), "info", f"… and {count - LIST_ROWS} more (see --format json)"))
    return rows


def _steps_table(series: StepSeries, top: int) -> Sheet:
    """Each step's live bytes; a long run shows its first and last steps."""
    title = f"Steps of process {series.pid} on device {series.device}: live device + array memory"
    if series.found_by == "kernels":
        title += " (no NVTX steps: found from the kernel sequence)"
    table = Sheet(title, Column("step", NAME), Column("start", drop=3), Column("length", drop=2), Column("at end"),
                  Column("change"), Column("peak"), Column("allocated", drop=1), Column("kept"))
    table.caption = "kept: allocated in the step and still live at the end of the capture"
    steps = series.steps
    head = max(1, top // 3)
    shown = steps if len(steps) <= top + 2 else steps[:head] + steps[len(steps) - (top - head):]
    found = series.step_count or len(steps)
    starts = fmt_times([s.start_ns for s in shown])
    lengths = fmt_durations([s.end_ns - s.start_ns for s in shown])
    for i, (step, start, length) in enumerate(zip(shown, starts, lengths)):
        if len(shown) < found and i == head:
            table.add_row(f"… {found - len(shown)} more", *[""] * 7)
        note = "" if step.closed else " (open)"
        table.add_row(_t(step.name + note), start, length, fmt_bytes(step.end_live_bytes),
                      fmt_signed_bytes(step.delta_bytes), fmt_bytes(step.peak_live_bytes),
                      fmt_bytes(step.allocated_bytes), fmt_bytes(step.kept_bytes) if step.kept_bytes else "-")
    return table


def _phases_table(analysis: Analysis, top: int) -> Sheet:
    """Per NVTX range path, what its instances cost (device + array bytes), the largest rises first."""
    table = Sheet("What each phase costs (live device + array memory; median over its instances)",
                  Column("process", drop=2), Column("range", NAME), Column("instances", drop=3), Column("at start"),
                  Column("rise"), Column("max rise", drop=4), Column("change"), Column("change from … to", drop=1))
    for p in analysis.phases[:top]:
        low, high = fmt_signed_bytes(p.net_min_bytes), fmt_signed_bytes(p.net_max_bytes)
        spread = f"{low} … {high}" if p.net_min_bytes != p.net_max_bytes else low
        table.add_row(str(p.pid), _t(p.path), str(p.instances), fmt_bytes(p.start_live_median_bytes),
                      fmt_bytes(p.rise_median_bytes), fmt_bytes(p.rise_max_bytes), fmt_signed_bytes(p.net_median_bytes),
                      spread)
    table.caption = "rise: of the peak inside above the start; change: at the end"
    return table


def _spikes_table(analysis: Analysis, top: int) -> Sheet:
    """The largest sudden rises of live memory, with what made them and how much came back."""
    table = Sheet("Spikes: the largest sudden rises of live device + array memory", Column("process", drop=1),
                  Column("peak at"), Column("rise"), Column("range", NAME), Column("site", NAME), Column("freed after"))
    shown = sorted(analysis.spikes, key=lambda s: -s.rise_bytes)[:top]
    for spike, at in zip(shown, fmt_times([s.peak_ns for s in shown])):
        made = spike.sites[0].site if spike.sites else ", ".join(spike.apis)
        table.add_row(str(spike.pid), at, fmt_signed_bytes(spike.rise_bytes), _t(spike.nvtx_path or "-"),
                      _t(made or "-"), fmt_bytes(spike.freed_after_bytes) if spike.freed_after_bytes else "-")
    return table


def _diagnostics(analysis: Analysis) -> Group:
    heading = Lines.prose("Diagnostics", style="bold")
    if not analysis.diagnostics:
        return Group(heading, Lines.prose("none: the capture has everything nsysan needs", indent=2))
    # What the answers above already said is not said twice.
    answered = {(v.code, v.message) for v in analysis.answers}
    diagnostics = [d for d in analysis.diagnostics_by_severity() if (d.code, d.message) not in answered]
    if not diagnostics:
        return Group(heading, Lines.prose("none beyond the answers above", indent=2))
    lines = Lines()
    width = max(len(d.severity) for d in diagnostics)
    for d in diagnostics:
        label = Text(d.severity.ljust(width + 1), style=SEVERITY_STYLE.get(d.severity, ""))
        label.append(d.code, style="dim")
        lines.add(label, printable(_short(d.message, 10 * DISPLAY_CHARS)))  # ours: longer than a name
    return Group(heading, lines)
