"""compare.html (one self-contained page), compare.png and compare.json of a `Comparison`.

The page is built from the report page's parts: its components (timeline, step chart), its CSS
and its script (uPlot inlined), under the same Content-Security-Policy (one hashed style, one
hashed script, nothing fetched). Both runs' timelines share one time axis per matched process and
GPU (compare_data.py). Every profile string is autoescaped; the page names the runs by file name.
"""

from __future__ import annotations

from ..model.comparison import Comparison
from ..model import Analysis
from .compare_data import compare_page_data
from .compare_plot import plot_comparison
from .html import _environment, content_security_policy, page_script, page_style
from .json import dumps
from .png import figure_png

# Written in this order, the page last: a folder with compare.html is complete.
COMPARE_FILES = ("compare.png", "compare.json", "compare.html")


def render_comparison_html(c: Comparison, base: Analysis, new: Analysis) -> str:
    """The comparison page as one string (UTF-8 HTML)."""
    style, script = page_style(), page_script()
    return _environment().get_template("compare.html.j2").render(
        c=c, csp=content_security_policy(style, script), style=style, script=script,
        data=compare_page_data(c, base, new), has_growth=any(d.growth_per_step for d in c.processes))


def comparison_files(c: Comparison, base: Analysis, new: Analysis) -> dict[str, str | bytes]:
    """compare.png, compare.json and compare.html, by name, in COMPARE_FILES' order (the command
    writes them, all or none: commands/outputs.py)."""
    files: dict[str, str | bytes] = {"compare.png": figure_png(plot_comparison(c, base, new)),
                                     "compare.json": dumps(c.to_dict()) + "\n",
                                     "compare.html": render_comparison_html(c, base, new)}
    return {name: files[name] for name in COMPARE_FILES}
