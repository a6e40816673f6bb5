"""A `Comparison` in the terminal: the verdict line first, then processes, sites and NVTX ranges."""

from __future__ import annotations

from typing import Optional

from rich.console import Console

from ..model.comparison import Change, Comparison
from ..errors import printable
from ..base.units import fmt_bytes, fmt_percent, fmt_signed_bytes
from .layout import NAME, NUMBER, WORD, Column, Sheet, print_headline


def render_comparison_terminal(c: Comparison, console: Console, top: int = 10) -> None:
    print_headline(console, printable(f"{c.base.name} → {c.new.name}: {c.headline}"),
                   style="bold" if c.identical else "bold yellow")
    if c.identical:
        return
    console.print(_processes_table(c))
    if c.sites:
        console.print(_sites_table(c, top))
    if c.ranges:
        console.print(_ranges_table(c, top))


def _processes_table(c: Comparison) -> Sheet:
    by = {"rank": "rank", "gpu": "GPU order", "name": "process name and start order"}[c.matched_by]
    has_growth = any(d.growth_per_step for d in c.processes)
    table = Sheet(f"Per process and GPU (matched by {by})", Column("where", NAME), Column("pid", NUMBER, 2),
                  Column("peak", NUMBER, 3), Column("Δ peak"), Column("never freed", NUMBER, 1),
                  Column("Δ never freed"), *([Column("growth / step")] if has_growth else []))
    for d in c.processes:
        pids = f"{d.base_pid if d.base_pid is not None else '-'} → {d.new_pid if d.new_pid is not None else '-'}"
        row = [printable(d.role), pids, _arrow(d.peak), _delta(d.peak), _arrow(d.never_freed),
               _delta(d.never_freed, percent=False)]
        if has_growth:
            row.append(_arrow(d.growth_per_step) if d.growth_per_step else "-")
        table.add_row(*row)
    return table


def _sites_table(c: Comparison, top: int) -> Sheet:
    table = Sheet("Sites whose bytes changed (largest change first)", Column("site", NAME), Column("kind", WORD, 2),
                  Column("", WORD), Column("max live", NUMBER, 1), Column("Δ max live"), Column("Δ never freed"))
    for s in c.sites[:top]:
        table.add_row(printable(s.label), s.kind, s.status, _arrow(s.max_live),
                      _delta(s.max_live, percent=False), _delta(s.never_freed, percent=False))
    if len(c.sites) > top:
        table.caption = f"… and {len(c.sites) - top} more (see --format json)"
    return table


def _ranges_table(c: Comparison, top: int) -> Sheet:
    table = Sheet("NVTX ranges whose peak or kept bytes grew", Column("range", NAME),
                  Column("max live while open", NUMBER, 1), Column("Δ max live"), Column("Δ still live at end"))
    for r in c.ranges[:top]:
        table.add_row(printable(r.name), _arrow(r.max_live), _delta(r.max_live, percent=False),
                      _delta(r.still_live, percent=False))
    if len(c.ranges) > top:
        table.caption = f"… and {len(c.ranges) - top} more (see --format json)"
    return table


def _arrow(change: Optional[Change]) -> str:
    if change is None:
        return "-"
    if not change.changed:
        return fmt_bytes(change.after)
    return f"{fmt_bytes(change.before)} → {fmt_bytes(change.after)}"


def _delta(change: Change, percent: bool = True) -> str:
    if change.delta is None:
        return "-"
    shown = fmt_signed_bytes(change.delta)  # "0 B" without a percentage
    if percent and change.percent is not None and change.delta:
        shown += f" ({fmt_percent(change.percent / 100, signed=True)})"
    return shown
