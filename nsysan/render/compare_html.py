"""compare.html (one self-contained page), compare.png and compare.json of a `Comparison`.

The page follows the report page's rules: no network, inline CSS allowed by its hash in a
Content-Security-Policy, the plot as a data URI, every profile string autoescaped.
"""

from __future__ import annotations

import base64
from pathlib import Path

from ..compare import Comparison
from ..model import Analysis
from .compare_plot import comparison_png
from .files import check_output_dir, write_all_or_none
from .html import _environment, _sha256
from .json import dumps

# Written in this order, the page last: a folder with compare.html is complete.
COMPARE_FILES = ("compare.png", "compare.json", "compare.html")


def render_comparison_html(c: Comparison, png: bytes) -> str:
    env = _environment()
    style = env.get_template("compare.css.j2").render()
    csp = "; ".join(["default-src 'none'", "img-src data:", f"style-src '{_sha256(style)}'", "base-uri 'none'",
                     "form-action 'none'"])
    return env.get_template("compare.html.j2").render(
        c=c, csp=csp, image="data:image/png;base64," + base64.b64encode(png).decode("ascii"),
        has_growth=any(d.growth_per_step for d in c.processes))


def write_comparison(c: Comparison, base: Analysis, new: Analysis, out_dir: Path) -> Path:
    """Write compare.png, compare.json and compare.html into `out_dir` (all or none); the page's path."""
    out_dir = Path(out_dir)
    check_output_dir(out_dir)
    png = comparison_png(c, base, new)
    files: dict[str, str | bytes] = {"compare.png": png, "compare.json": dumps(c.to_dict()) + "\n",
                                     "compare.html": render_comparison_html(c, png)}
    write_all_or_none({out_dir / name: files[name] for name in COMPARE_FILES})
    return out_dir / "compare.html"
