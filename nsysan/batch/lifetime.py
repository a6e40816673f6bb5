"""The processes a batch starts end with it, on any signal.

Ctrl-C in a terminal reaches the whole process group, a cancelled CI job's SIGTERM often the batch
alone, and a SIGKILL lets nothing run. Three layers, so that `nsysan batch ... | cat` always ends:

- nsysan's fork servers (the local pool's and `--dask local`'s) ignore SIGINT from their first
  import on, so a Ctrl-C during start-up prints no traceback from them, and every worker forked
  from them inherits that: the batch alone decides what a Ctrl-C stops;
- on Linux each fork server, and each worker forked from one, is killed by the kernel when its
  parent ends (PR_SET_PDEATHSIG), whatever ended it;
- the batch itself stops its pool's workers when it is interrupted or fails (`stop_processes`),
  rather than leaving them to finish the report in hand with its stdout open.

Imports nothing heavy: the fork server imports this before anything else.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import Any, Iterable

_PR_SET_PDEATHSIG = 1  # linux/prctl.h
GRACE_S = 1.0  # a stopped worker's time to kill its nsys export and go, before SIGKILL


def end_with_parent() -> None:
    """Linux: this process gets SIGKILL when the thread that started it ends; elsewhere nothing."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        parent = os.getppid()
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # no prctl here: the batch's own stop_processes remains
        return
    if os.getppid() != parent:  # the parent ended before prctl took effect
        os._exit(1)


def prepare_fork_server() -> None:
    """In a fork server nsysan starts, before it imports anything else (see module docstring)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    end_with_parent()
    os.register_at_fork(after_in_child=_forked_worker)


def _forked_worker() -> None:
    end_with_parent()
    sys.excepthook = _quiet_when_the_batch_is_gone


def _quiet_when_the_batch_is_gone(kind: type, value: BaseException, tb: Any) -> None:
    """A worker forked while the batch stops finds the pool's semaphores unlinked or its pipe
    closed before it has started; its traceback would follow `nsysan: interrupted`. Only those
    errors are silenced, and only here (before the worker runs anything of nsysan's)."""
    if issubclass(kind, (FileNotFoundError, EOFError, ConnectionError)):
        return
    sys.__excepthook__(kind, value, tb)


def worker_initializer() -> None:
    """A pool worker: SIGTERM raises SystemExit once, so the `finally` of an nsys export in hand
    kills nsys's process group before the worker goes (the default would leave nsys running)."""
    def stop(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def stop_processes(processes: Iterable[Any]) -> None:
    """SIGTERM to each (multiprocessing) process still alive, then SIGKILL to any left after
    GRACE_S; returns when all have ended."""
    import time

    alive = [p for p in processes if p.is_alive()]
    for process in alive:
        with contextlib.suppress(OSError, ValueError):  # ended meanwhile, or already closed
            process.terminate()
    deadline = time.monotonic() + GRACE_S
    for process in alive:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join(5)


def quiet_resource_tracker() -> None:
    """Start multiprocessing's resource tracker (one per batch, shared by the fork servers and
    their workers) with its stderr on /dev/null. When a Ctrl-C ends Dask's workers half-way
    through their start, the tracker cleans up their semaphores and warns about "leaked semaphore
    objects" on the batch's stderr: lines that say nothing to a user after `nsysan: interrupted`."""
    from multiprocessing import resource_tracker

    if getattr(resource_tracker._resource_tracker, "_fd", None) is not None:
        return  # already running (a batch earlier in this process): leave it be
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        resource_tracker.ensure_running()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
