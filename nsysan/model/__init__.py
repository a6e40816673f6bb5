"""The result model: plain frozen dataclasses, serialized to the JSON schema "nsysan/analysis@1".

Everything a user sees (terminal, JSON, HTML, PNG) is drawn from an `Analysis`; `compare`,
`check` and `batch` can start from its JSON, so `to_dict()` / `from_dict()` round-trip exactly.
Field names carry their units: `*_bytes`, `*_ns`. Times are ns from the capture's time origin
(the nsys session start), as in the export.

`docs/json.md` documents every field. Within `@1` fields may be added; a rename or removal
means `@2`.
"""

from __future__ import annotations

import importlib

# The model is split by subject; every name stays importable from nsysan.model.
from .analysis import Analysis
from .capture import DIAGNOSTIC_CODES, GPU_RESIDENT_KINDS, KINDS, LIVE_AT_START, SCHEMA_ID, SEVERITIES, TRUST_BREAKING, Capture, Diagnostic, Gpu, Process, Source
from .memory import (Allocation, AllocationGroup, ApiCallStat, Band, CallSite, FailedCall, Frame, GroupSummary, Holder,
                     NvtxSpan, Peak, RangeFamily, RangeStat, Series, Site, Stack, StackBytes, Timeline, TraceEnd)
from .oom import AllocatorUse, OutOfMemory, Preallocation, PoolUse, ReservedMemory
from .steps import Answer, Growth, MemoryCap, Phase, Spike, Step, StepSeries
from .tables import RAW, Tables

# `check`'s and `compare`'s documents, the nvidia-smi section and what an out-of-memory search
# found are made on first use of one of their names (PEP 562): every command imports the model
# before its work can start, and `nsysan analyze` builds none of them on a run without --smi that
# did not run out of memory (issue 31). plain.type_hints finds them for documents read back.
_CHECK_NAMES = ("CHECK_SCHEMA_ID", "EXIT_CODES", "Outcome", "Verdict")
_COMPARE_NAMES = ("COMPARE_SCHEMA_ID", "CaptureNote", "Change", "Comparison", "ProcessDelta", "ProcessRow",
                  "RangeDelta", "RunRef", "SiteDelta")
_LATER = {**dict.fromkeys(_CHECK_NAMES, "check"), **dict.fromkeys(_COMPARE_NAMES, "comparison"),
          "SmiOverlay": "smi",
          **dict.fromkeys(("AllocatorOom", "CacheRelease", "CutShort", "EndedInside", "FatalOom", "LoggedOom",
                           "OomFailure", "Probe", "SizeCount"), "oom_found")}


def __getattr__(name: str) -> object:
    if name not in _LATER:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_LATER[name]}", __name__), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_LATER})
