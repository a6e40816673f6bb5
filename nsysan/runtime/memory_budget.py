"""How much memory an analysis may take, and whether that means streaming its events.

The whole-frame analysis holds every memory event in memory: about 240 bytes per event for the
full analysis and 180 for `--quick`, the interpreter and libraries included (measured with
benchmarks/scale.py: 2.17-2.29 GiB and 1.37-1.65 GiB at 1e7 events, docs/performance.md). The
streamed one (analyses/flow.py) keeps only the live allocations and
the sums: 0.4-0.55 GiB at 1e7, about 1 GiB at 1e8, but takes 2.3-2.8 times as long. So
the command line streams when the whole frame would not fit the budget: given (`--max-memory`),
else half of what this process may use (a container's or a Dask worker's limit, the address
space limit, the memory the machine has available), and always from pipeline's fixed line on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

# Bytes of the whole-frame analysis per memory event (see above), rounded up.
WHOLE_FRAME_BYTES_PER_EVENT = {"full": 240, "quick": 180}

# Share of the memory this process may use that the analysis takes when no budget is given:
# the rest is for what else runs (the other analyses of a batch, the page cache, the user's job).
DEFAULT_SHARE = 0.5

_NO_LIMIT = 1 << 60  # cgroup v1 writes a huge number for "no limit"


def budget_bytes(value: Union[int, str, None]) -> Optional[int]:
    """`--max-memory` / `max_memory=` as bytes: a size ("4GiB", "900MB", "0") or bytes; None
    (the default budget) stays None. NsysanError (exit 2) for what is not a size."""
    if value is None:
        return value
    from ..base.units import parse_size  # a size in range, an int of bytes too (0 to 8 EiB)

    return parse_size(value, "max-memory")


def whole_frame_bytes(rows: int, quick: bool) -> int:
    """What the whole-frame analysis of a memory table of `rows` rows takes, about."""
    return rows * WHOLE_FRAME_BYTES_PER_EVENT["quick" if quick else "full"]


def fits(rows: int, quick: bool, budget: Optional[int]) -> bool:
    """Whether the whole frame of `rows` memory events fits `budget` bytes (None: no budget)."""
    return budget is None or whole_frame_bytes(rows, quick) <= budget


def default_budget(analyses_at_once: int = 1) -> Optional[int]:
    """DEFAULT_SHARE of what this process may use, split among `analyses_at_once` (a batch's
    jobs on this machine), or None where that can't be told."""
    usable = usable_memory()
    return None if usable is None else int(usable * DEFAULT_SHARE / max(analyses_at_once, 1))


def usable_memory() -> Optional[int]:
    """The least of: the memory available on the machine, the cgroup's limit (a container, a
    Kubernetes pod, a batch job's slot) less what the cgroup uses, and the address-space limit
    (ulimit -v, which some clusters and Dask deployments set). None where none is known
    (Windows; macOS reports no available memory)."""
    found = [v for v in (_available(), _cgroup_room(), _address_space_limit()) if v is not None]
    return min(found) if found else None


def _available() -> Optional[int]:
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_room(root: Path = Path("/sys/fs/cgroup")) -> Optional[int]:
    """Room left under this process's cgroup memory limit (v2, else v1), if it has one."""
    for limit_file, usage_file in ((root / "memory.max", root / "memory.current"),
                                   (root / "memory" / "memory.limit_in_bytes", root / "memory" / "memory.usage_in_bytes")):
        try:
            limit = limit_file.read_text().strip()
        except OSError:
            continue
        if not limit.isdigit() or int(limit) >= _NO_LIMIT:
            return None  # "max": no limit
        try:
            used = int(usage_file.read_text().strip())
        except (OSError, ValueError):
            used = 0
        return max(int(limit) - used, 0)
    return None


def _address_space_limit() -> Optional[int]:
    try:
        import resource  # Unix only
    except ImportError:
        return None

    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    # The address space is far larger than what is resident (thread stacks, reserved arenas,
    # mapped libraries): the resident memory fits in about half of it.
    return soft // 2 if soft > 0 else None
