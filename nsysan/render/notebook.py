"""The report page inside a notebook cell (Jupyter, VS Code): `Analysis._repr_html_`.

The page of `nsysan analyze -o` is a whole document with its own styles, script and
Content-Security-Policy. Pasted into a notebook, its styles would restyle the notebook and its
policy would be ignored; inside an `<iframe srcdoc>` it keeps all three to itself. The frame is
sandboxed (scripts run, for the table sorting, but in an origin of their own: they can't reach
the notebook) and as wide as the cell, with a height that can be dragged.
"""

from __future__ import annotations

import html

from ..model import Analysis
from .html import render_html

FRAME_HEIGHT_PX = 720


def report_frame(analysis: Analysis) -> str:
    """An `<iframe>` element holding the report page of `analysis` (a string of HTML)."""
    page = render_html(analysis)
    return (f'<iframe title="nsysan report: {html.escape(analysis.source.name)}" sandbox="allow-scripts" '
            f'style="box-sizing:border-box;width:100%;height:{FRAME_HEIGHT_PX}px;border:1px solid #ccc;resize:vertical" '
            f'srcdoc="{html.escape(page, quote=True)}"></iframe>')
