"""A `Comparison` in the terminal: the verdict line first, then processes, sites and NVTX ranges."""

from __future__ import annotations

from typing import Optional

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..compare import Change, Comparison
from ..errors import printable
from ..units import fmt_bytes


def render_comparison_terminal(c: Comparison, console: Console, top: int = 10) -> None:
    console.print(Text(printable(f"{c.base.name} → {c.new.name}: {c.headline}"),
                       style="bold" if c.identical else "bold yellow"), soft_wrap=True)
    if c.identical:
        return
    console.print(_processes_table(c))
    if c.sites:
        console.print(_sites_table(c, top))
    if c.ranges:
        console.print(_ranges_table(c, top))


def _table(title: str) -> Table:
    return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, title_style="bold")


def _processes_table(c: Comparison) -> Table:
    by = {"rank": "rank", "gpu": "GPU order", "name": "process name and start order"}[c.matched_by]
    table = _table(f"Per process and GPU (matched by {by})")
    has_growth = any(d.growth_per_step for d in c.processes)
    for header in ("where", "pid", "peak", "Δ peak", "never freed", "Δ never freed"):
        _column(table, header, text=header == "where")
    if has_growth:
        _column(table, "growth / step")
    for d in c.processes:
        pids = f"{d.base_pid if d.base_pid is not None else '-'} → {d.new_pid if d.new_pid is not None else '-'}"
        row = [Text(printable(d.role)), pids, _arrow(d.peak), _delta(d.peak), _arrow(d.never_freed),
               _delta(d.never_freed, percent=False)]
        if has_growth:
            row.append(_arrow(d.growth_per_step) if d.growth_per_step else "-")
        table.add_row(*row)
    return table


def _sites_table(c: Comparison, top: int) -> Table:
    table = _table("Sites whose bytes changed (largest change first)")
    for header in ("site", "kind", "", "max live", "Δ max live", "Δ never freed"):
        _column(table, header, text=header == "site")
    for s in c.sites[:top]:
        table.add_row(Text(printable(s.label)), s.kind, s.status, _arrow(s.max_live),
                      _delta(s.max_live, percent=False), _delta(s.never_freed, percent=False))
    if len(c.sites) > top:
        table.caption = f"… and {len(c.sites) - top} more (see --format json)"
    return table


def _ranges_table(c: Comparison, top: int) -> Table:
    table = _table("NVTX ranges whose peak or kept bytes grew")
    for header in ("range", "max live while open", "Δ max live", "Δ still live at end"):
        _column(table, header, text=header == "range")
    for r in c.ranges[:top]:
        table.add_row(Text(printable(r.name)), _arrow(r.max_live), _delta(r.max_live, percent=False),
                      _delta(r.still_live, percent=False))
    if len(c.ranges) > top:
        table.caption = f"… and {len(c.ranges) - top} more (see --format json)"
    return table


def _column(table: Table, header: str, text: bool = False) -> None:
    """Numbers never wrap; a long name (the one text column) folds instead."""
    if text:
        table.add_column(header, justify="left", overflow="fold", min_width=24 if header in ("site", "range") else 8)
    else:
        table.add_column(header, justify="left" if header in ("kind", "") else "right", no_wrap=True)


def _arrow(change: Optional[Change]) -> str:
    if change is None:
        return "-"
    if not change.changed:
        return fmt_bytes(change.after)
    return f"{fmt_bytes(change.before)} → {fmt_bytes(change.after)}"


def _delta(change: Change, percent: bool = True) -> str:
    if change.delta is None:
        return "-"
    if change.delta == 0:
        return "0"
    sign = "+" if change.delta > 0 else "-"
    text = f"{sign}{fmt_bytes(abs(change.delta))}"
    return text + (f" ({change.percent:+.0f}%)" if percent and change.percent is not None else "")
