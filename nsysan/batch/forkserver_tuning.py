"""Imported first by the fork servers of the workers nsysan starts (the local pool's and
`--dask local`'s), never by anything else: the server ignores SIGINT and ends with the batch
(lifetime.py), then takes the `nsysan` command's allocator settings before it imports anything
else, so every worker forked from it starts with all three.

Why in the server and not in the worker's first task: glibc gives each thread that allocates
before M_ARENA_MAX=1 is set a malloc arena of its own, made of 64 MiB heaps that are unmapped as
soon as they are empty, so memory an analysis frees and takes again is faulted in and zeroed
again. A Dask worker runs its tasks on an executor thread that has its arena before the task can
tune anything. Measured per 1e6-event analysis, three in each of two worker processes: 54,000 to
101,000 minor faults and 0.22 to 0.46 s of system CPU with the task's own tuning, 28,000 to
35,000 faults and 0.12 to 0.20 s with the server's (2.20 against 2.36 CPU s in all, -7%).
"""

from .lifetime import prepare_fork_server

prepare_fork_server()

from ..runtime.malloc_tuning import tune_allocator  # noqa: E402

tune_allocator()
