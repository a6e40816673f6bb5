"""The analysis as its documented JSON document (docs/json.md)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the command line imports this module before its export starts, the model beside it
    from ..model import Analysis


def render_json(analysis: Analysis) -> str:
    """Sorted keys, indent 2, ASCII only, lists of numbers on one line; newline at the end."""
    return dumps(analysis.to_dict()) + "\n"


def dumps(value: Any) -> str:
    """`json.dumps(value, sort_keys=True, indent=2)`, except that a list of numbers stays on one
    line. The timeline's series are such lists: with one number per line they made 15,000 of the
    19,500 lines of an analysis of 100,000 events, and a diff of two baselines unreadable."""
    parts: list[str] = []
    _write(value, "", parts)
    return "".join(parts)


_NUMBERS = (int, float)  # exactly these types: bool is an int subclass and is not a number here
_SCALARS = (int, float, str, bool, type(None))
# What json.dumps writes for each scalar type, without its encoder made anew at every call (most
# of the time of 19,000 calls in a 770 kB document: issue 31); anything else goes to json.dumps.
# A float through one encoder made once: NaN, Infinity and -Infinity as json.dumps writes them.
_SCALAR_TEXT = {str: json.encoder.encode_basestring_ascii, int: int.__repr__, float: json.JSONEncoder().encode,
                bool: lambda v: "true" if v else "false", type(None): lambda v: "null"}
_RECORD_ENCODERS: dict[str, json.JSONEncoder] = {}  # the encoder of the records at each indent


def _write(value: Any, pad: str, parts: list[str]) -> None:
    inner = pad + "  "
    if isinstance(value, dict) and value:
        if all(type(k) is str and type(v) in _SCALARS for k, v in value.items()):
            # A record of scalars (most of a document: 1e5 values at 1e7 events): one call of the
            # C encoder writes what the loop below would, with the same key order and separators.
            encoder = _RECORD_ENCODERS.get(inner)
            if encoder is None:
                encoder = _RECORD_ENCODERS[inner] = json.JSONEncoder(sort_keys=True, separators=(",\n" + inner, ": "))
            parts.append("{\n" + inner + encoder.encode(value)[1:-1] + "\n" + pad + "}")
            return
        items = [(json.encoder.encode_basestring_ascii(str(key)) + ": ", item) for key, item in sorted(value.items())]
        brackets = "{}"
    elif isinstance(value, (list, tuple)) and value:
        if all(type(v) in _NUMBERS for v in value):
            parts.append(json.dumps(value))  # the C encoder: "[1, 2, 3]"
            return
        items = [("", item) for item in value]
        brackets = "[]"
    else:  # scalars, {} and []
        write = _SCALAR_TEXT.get(type(value))
        parts.append(write(value) if write is not None else json.dumps(value))
        return
    parts.append(brackets[0] + "\n")
    for i, (key, item) in enumerate(items):
        head = ("" if i == 0 else ",\n") + inner + key
        write = _SCALAR_TEXT.get(type(item))  # a scalar written here: no call of _write for it
        if write is None:
            parts.append(head)
            _write(item, inner, parts)
        else:
            parts.append(head + write(item))
    parts.append("\n" + pad + brackets[1])


BASELINE_SCOPE = "baseline"


def render_baseline(analysis: Analysis) -> str:
    """The run as a baseline to commit: the analysis document with only what `check` and
    `compare` read (peaks, per-kind totals, sites, NVTX ranges, steps and growth, failed calls,
    out-of-memory verdicts, diagnostics), without the timeline, the live sets, the call stacks
    and the other lists a report page draws; scope "baseline". About a tenth of the whole document
    (21 kB of the whole document for torch_clean_v25), keys sorted, indented:
    a refreshed baseline reads as a diff of the numbers that moved."""
    from ..model.hidden import CudaGraphs, HiddenMemory

    timeline = analysis.timeline
    # Each series keeps its first point: compare matches processes by name in the order they
    # started, which is all it reads of the timeline.
    series = [replace(s, ts_ns=s.ts_ns[:1], live_bytes=s.live_bytes[:1]) for s in timeline.series]
    oom = analysis.oom
    bare = replace(
        analysis, scope=BASELINE_SCOPE,
        peak=_bare_peak(analysis.peak) if analysis.peak is not None else None,
        peaks=[_bare_peak(p) for p in analysis.peaks], never_freed=[], api_calls=[], stacks=[], answers=[],
        never_freed_groups=[], never_freed_stacks=[], phases=[], spikes=[], smi=None, hidden=HiddenMemory(), graphs=CudaGraphs(),
        byte_classes=[], range_families=[],  # the page's and the terminal's: check and compare read neither
        timeline=replace(timeline, series=series, bands=[], spans=[], allocations=[]),
        oom=replace(oom, failures=[replace(f, live_at_failure=[]) for f in oom.failures],
                    allocator_ooms=[replace(o, live_at_release=[]) for o in oom.allocator_ooms]),
        steps=[replace(s, steps=[replace(step, kept=[]) for step in s.steps]) for s in analysis.steps])
    return render_json(bare)


def _bare_peak(peak: Any) -> Any:
    return replace(peak, live_at_peak=[], made_of=[], live_groups=[], live_stacks=[])
