"""The analysis as its documented JSON document (docs/json.md)."""

from __future__ import annotations

import json

from ..model import Analysis


def render_json(analysis: Analysis) -> str:
    """Sorted keys, indent 2, ASCII only; newline at the end."""
    return json.dumps(analysis.to_dict(), sort_keys=True, indent=2) + "\n"


def render_json_many(analyses: list[Analysis]) -> str:
    """Several analyses as one JSON array (one document per input)."""
    return json.dumps([a.to_dict() for a in analyses], sort_keys=True, indent=2) + "\n"
