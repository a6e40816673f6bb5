"""The tables of a result model: `frame(name)` and `frame_names()`, and the
metadata marking the frames read from the export (kept on the object, never serialized)."""

from __future__ import annotations

import dataclasses
from typing import Any

# Field metadata of the frames read from the export: kept on the object, never serialized.
RAW = {"raw": True}


class Tables:
    """`frame(name)` and `frame_names()` of a result model (an `Analysis`, a `Comparison`, a check
    `Verdict`): each list in it as a pandas DataFrame (see nsysan.model.dataframes); `to_dict()`,
    its JSON document.

    >>> import nsysan
    >>> comparison = nsysan.compare("fixtures/torch_clean_v25.sqlite", "fixtures/torch_leak_v25.sqlite")
    >>> comparison.frame_names()
    ['processes', 'sites', 'ranges', 'notes']
    >>> int(comparison.frame("processes")["peak_delta"].iloc[0])
    3800039424
    """

    def frame(self, name: str) -> Any:
        from .dataframes import table_frame

        return table_frame(self, name)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def frame_names(cls) -> list[str]:
        from .dataframes import table_names

        return table_names(cls)
