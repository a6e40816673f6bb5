"""Strings from a profile are cut to a bounded length before any output sees them.

A process, GPU, thread or symbol name is whatever the profiled program (or a hostile export)
put there: a 10 MB name made the summary take minutes and the JSON 20 MB. Every string of the
`Analysis` (whatever field it is in, today's or a later one) is cut here at MAX_STRING_CHARS,
ends in a marker saying how long it was, and a diagnostic says how many were cut.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from ..model import Analysis, Diagnostic

MAX_STRING_CHARS = 4096


def cut_long_strings(analysis: Analysis) -> Analysis:
    """`analysis` with every string longer than MAX_STRING_CHARS cut, and a `long_strings`
    diagnostic when any was; the same object when none was."""
    counter = [0]
    cut = _cut(analysis, counter)
    if not counter[0]:
        return analysis
    note = Diagnostic("warning", "long_strings",
                      f"{counter[0]} strings from the profile (names of processes, GPUs, threads, NVTX ranges or "
                      f"symbols) were longer than {MAX_STRING_CHARS} characters; they are cut there and end in "
                      "'… (cut from N characters)'")
    return dataclasses.replace(cut, diagnostics=[*cut.diagnostics, note])


def cut_string(text: str, limit: int = MAX_STRING_CHARS) -> str:
    """`text`, or its first characters and a marker with its length when it is longer than `limit`."""
    if len(text) <= limit:
        return text
    marker = f"… (cut from {len(text)} characters)"
    return text[: max(limit - len(marker), 0)] + marker


_NOT_TEXT = (int, float, bool, type(None))


def _cut(value: Any, counter: list[int]) -> Any:
    """`value` with its long strings cut: the same object where nothing changed."""
    if type(value) in _NOT_TEXT:  # most values of a large model: returned before any other test
        return value
    if isinstance(value, str):
        if len(value) <= MAX_STRING_CHARS:
            return value
        counter[0] += 1
        return cut_string(value)
    if isinstance(value, list):
        if not value or isinstance(value[0], (int, float)):  # a series of numbers: nothing to cut
            return value
        items = [item if type(item) in _NOT_TEXT else _cut(item, counter) for item in value]
        return value if all(a is b for a, b in zip(items, value)) else items
    if isinstance(value, dict):
        items = {_cut(k, counter): _cut(v, counter) for k, v in value.items()}
        return value if all(a is b for a, b in zip(items.values(), value.values())) and \
            all(a is b for a, b in zip(items, value)) else items
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {}
        for name in _text_fields(type(value)):
            old = getattr(value, name)
            if type(old) in _NOT_TEXT or (type(old) is str and len(old) <= MAX_STRING_CHARS):
                continue  # most fields of most records: no call for them (24,000 calls in 8 ms, issue 31)
            new = _cut(old, counter)
            if new is not old:
                changes[name] = new
        return dataclasses.replace(value, **changes) if changes else value
    return value


@functools.lru_cache(maxsize=None)
def _text_fields(cls: type) -> tuple[str, ...]:
    """The fields of a result class that reach an output, listed once per class (1e5 records
    at 1e7 events): not the frames kept for notebooks (events, ...), never serialized."""
    return tuple(f.name for f in dataclasses.fields(cls) if not f.metadata.get("raw"))
