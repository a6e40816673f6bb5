"""What the bytes are (issue 30, section 3): live device memory split into weights, activations,
gradients, optimizer state, library workspaces and the allocator's cache, from the lifetimes of
the allocations across each step's forward, backward and optimizer phases (analyses/byte_classes.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

# The classes in the order they stack (the page draws them bottom up); every live byte is in one.
BYTE_CLASSES = ("weights", "activations", "gradients", "optimizer_state", "workspaces", "cache", "other")
# The classes a step makes (weights are made before the steps; the cache is no allocation)
MADE = ("activations", "gradients", "optimizer_state", "workspaces", "other")


@dataclass(frozen=True)
class BytesAt:
    """Live device + array bytes of one (process, device) right after one event, by class; the
    classes add up to live_bytes."""

    label: str  # "peak", or the step's name ("step 3")
    time_ns: int  # when: the event's time (a step with no event: its start)
    live_bytes: int
    weights_bytes: int
    activations_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int
    workspaces_bytes: int
    cache_bytes: int  # reserved by a caching allocator and holding no tensor (segment-level only; 0 when exact)
    other_bytes: int  # temporaries of one phase, and blocks no rule names (kept from a later step: growth)
    # a step's only: the bytes of every allocation it made, by the class of each, freed or not
    # (0 for the peak); at segment level, the segments it made
    made_activations_bytes: int = 0
    made_gradients_bytes: int = 0
    made_optimizer_state_bytes: int = 0
    made_workspaces_bytes: int = 0
    made_other_bytes: int = 0


@dataclass(frozen=True)
class ByteClasses:
    """One (process, device)'s bytes by what they are, at its peak and at each step's highest point."""

    pid: int
    device: int
    gpu: Optional[int]
    # exact: every allocation is one tensor (no caching allocator: PYTORCH_NO_CUDA_MEMORY_CACHING=1,
    # or none recognized); segment-level: the caching allocator's segments, classed by the phase
    # that made them
    level: str
    label: str  # how outputs say the level: "exact: no caching allocator" / "segment-level: ..."
    peak: BytesAt  # at the highest device + array bytes (the step table's series), its first moment
    steps: list[BytesAt] = field(default_factory=list)  # at each step's highest point (first and last 50 of many)
    step_count: int = 0  # steps with phases classed (steps may be cut as in StepSeries)
    rules: list[str] = field(default_factory=list)  # each class's rule, as applied at this level
    message: str = ""  # the answer's sentence
