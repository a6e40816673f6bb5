"""summary.html of a batch: one sortable row per report x process/GPU, failed reports with their
error, and the fleet view below. Self-contained and escaped like the report page."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .html import _environment, _sha256

if TYPE_CHECKING:
    from ..batch.run import BatchResult


def render_summary_html(batch: "BatchResult") -> str:
    env = _environment()
    # what the page's <style> holds (both includes), for its hash in the CSP
    style = env.get_template("compare.css.j2").render() + env.get_template("batch.css.j2").render()
    script = env.get_template("batch.js.j2").render()
    csp = "; ".join(["default-src 'none'", f"style-src '{_sha256(style)}'", f"script-src '{_sha256(script)}'",
                     "base-uri 'none'", "form-action 'none'"])
    return env.get_template("batch.html.j2").render(b=batch, csp=csp)
