"""Load one normalized frame of every GPU-memory allocation and free from an nsys export.

One module per job: `read` runs every SQL query, `read_pools` those of the memory pools (with
`schema.py`, the only code that names nsys tables), `normalize` builds the events frame, `nvtx` attributes events to NVTX ranges, `stacks`
names call sites, `load` puts them together, `columns` lists the frames' columns. Everything
after this package works on the frames `load_events` returns.
"""

from .columns import CALL_COLUMNS, EVENT_COLUMNS, SITE_COLUMNS, categorical_lookup
from .load import QUICK_API, LoadedEvents, Progress, load_events
from .nvtx import attribute_ranges
from .read import TRACE_GOES_ON
from .frames import short_function
from .arrays import factorize_in_parts, group_order, previous_in_group

__all__ = ["CALL_COLUMNS", "EVENT_COLUMNS", "SITE_COLUMNS", "QUICK_API", "TRACE_GOES_ON", "LoadedEvents", "Progress",
           "attribute_ranges", "categorical_lookup", "factorize_in_parts", "group_order", "load_events",
           "previous_in_group", "short_function"]
