"""The call stacks an analysis keeps: only those its sites and listed allocations refer to."""

from __future__ import annotations

from ..model import Allocation, Peak, Site, Stack


def referenced_stacks(stacks: list[Stack], sites: list[Site], never_freed: list[Allocation],
                      peaks: list[Peak]) -> list[Stack]:
    """The stacks that `stack_id`s of the sites, the never-freed allocations and the allocations
    live at the peaks point to, in id order; each once, however many refer to it."""
    wanted = {s.site.stack_id for s in sites}
    for allocation in [*never_freed, *(a for p in peaks for a in p.live_at_peak)]:
        wanted.update((allocation.stack_id, allocation.site.stack_id))
    return [stack for stack in stacks if stack.id in wanted]
