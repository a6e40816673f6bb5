"""The call stacks an analysis keeps: exactly those its `stack_id`s refer to."""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

from ..model import Analysis, Stack


def referenced_stacks(stacks: list[Stack], analysis: Analysis) -> list[Stack]:
    """The stacks that any `stack_id` in `analysis` points to (a site's, an allocation's, wherever
    it is listed: sites, never-freed rows and groups, live at a peak or at an out-of-memory
    failure, the timeline's largest allocations), in id order, each once. Walking the whole model
    rather than naming its lists keeps the document consistent when a section is added."""
    if not stacks:  # a capture without call stacks (most): nothing to walk for
        return []
    wanted = set(_stack_ids(analysis))
    return [stack for stack in stacks if stack.id in wanted]


def _stack_ids(value: Any) -> Iterator[int]:
    if dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            if f.metadata.get("raw"):  # the events frames: not part of the document
                continue
            item = getattr(value, f.name)
            if f.name == "stack_id":
                if item is not None:
                    yield item
            else:
                yield from _stack_ids(item)
    elif isinstance(value, (list, tuple)):
        # Lists of numbers (a series' times and bytes) hold no stack: skip them whole.
        if value and (dataclasses.is_dataclass(value[0]) or isinstance(value[0], (list, tuple))):
            for item in value:
                yield from _stack_ids(item)
