"""A `History` in the terminal (the change points first, then the runs) and as one self-contained
HTML page with a trend chart per metric (inline SVG: no script, nothing loaded)."""

from __future__ import annotations

from typing import Optional

from markupsafe import Markup

from rich.console import Console

from ..errors import printable
from ..model.history import METRICS, History, HistoryRun
from ..base.units import fmt_bytes
from .layout import NAME, Column, Sheet, print_headline

RUNS_SHOWN = 30  # the newest runs in the terminal; the JSON and the page hold every run


def render_history_terminal(h: History, console: Console) -> None:
    order = "when each report was analyzed" if h.ordered_by == "analyzed_at" else h.ordered_by.replace("tag:", "tag ")
    series = f", {h.series}" if h.series else ""
    print_headline(console, printable(f"History of {len(h.runs)} run{'s' if len(h.runs) != 1 else ''} in "
                                      f"{h.database} (ordered by {order}{series})"), style="bold")
    if not h.runs:
        console.print("no analyzed report matches; see `nsysan batch --db` and --where", markup=False)
        return
    if h.changes:
        for change in h.changes:
            print_headline(console, printable("change: " + change.message), style="yellow")
    else:
        console.print("no change point: every run is within the noise of the runs before it", markup=False,
                      soft_wrap=True)
    console.print(_runs_table(h))


def _runs_table(h: History) -> Sheet:
    table = Sheet("Runs (oldest first; * marks a change point)", Column("run"), Column("tags / report", NAME),
                  *(Column(name) for _, name in METRICS))
    changed = {(c.run, c.metric) for c in h.changes}
    runs = h.runs[-RUNS_SHOWN:]
    for run in runs:
        table.add_row(str(run.index), printable(run.label),
                      *(_cell(run, metric, (run.index, metric) in changed) for metric, _ in METRICS))
    if len(h.runs) > len(runs):
        table.caption = f"the newest {len(runs)} of {len(h.runs)} runs (every run: --format json)"
    return table


def _cell(run: HistoryRun, metric: str, changed: bool) -> str:
    value: Optional[int] = getattr(run, metric)
    text = "-" if value is None else fmt_bytes(value)
    return text + (" *" if changed else "  ")


def render_history_html(h: History) -> str:
    from .html import _environment, content_security_policy

    env = _environment()
    style = env.get_template("history.css.j2").render()
    csp = content_security_policy(style, images=False)
    charts = [_chart(h, metric, name) for metric, name in METRICS if any(getattr(r, metric) is not None for r in h.runs)]
    return env.get_template("history.html.j2").render(h=h, csp=csp, style=Markup(style), charts=charts, metrics=METRICS,
                                                      fmt_bytes=fmt_bytes)


CHART_W, CHART_H, PAD = 720, 160, 40


def _chart(h: History, metric: str, name: str) -> dict:
    """One metric's trend as SVG coordinates: a point per run that has the value, change points marked."""
    points = [(r.index, getattr(r, metric)) for r in h.runs if getattr(r, metric) is not None]
    top = max(max(v for _, v in points), 1)
    low = min(min(v for _, v in points), 0)
    span_x = max(len(h.runs) - 1, 1)

    def xy(index: int, value: int) -> tuple[float, float]:
        x = PAD + (index - 1) / span_x * (CHART_W - 2 * PAD)
        y = CHART_H - PAD / 2 - (value - low) / (top - low or 1) * (CHART_H - PAD)
        return round(x, 1), round(y, 1)

    changed = {c.run for c in h.changes if c.metric == metric}
    dots = [{"x": xy(i, v)[0], "y": xy(i, v)[1], "run": i, "value": fmt_bytes(v), "change": i in changed}
            for i, v in points]
    return {"name": name, "width": CHART_W, "height": CHART_H, "top": fmt_bytes(top), "low": fmt_bytes(low),
            "line": " ".join(f"{d['x']},{d['y']}" for d in dots), "dots": dots}
