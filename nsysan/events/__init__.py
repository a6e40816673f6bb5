"""Load one normalized frame of every GPU-memory allocation and free from an nsys export.

One module per job: `read` runs every SQL query, `read_pools` those of the memory pools (with
`schema.py`, the only code that names nsys tables), `normalize` builds the events frame, `nvtx` attributes events to NVTX ranges, `stacks`
names call sites, `load` puts them together, `columns` lists the frames' columns. Everything
after this package works on the frames `load_events` returns.
"""

from .load import QUICK_API, LoadedEvents, load_events

__all__ = ["QUICK_API", "LoadedEvents", "load_events"]
