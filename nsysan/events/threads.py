"""Batches handed from thread to thread (stream.EventFlow's passes): each made, or worked on, on a
thread of its own while the caller takes the one before."""

from __future__ import annotations

import queue
import threading
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")


def each_done(batches: Iterator[T], work: Callable[[T], None]) -> Iterator[T]:
    """The items of `batches`, each once `work` is done with it."""
    try:
        for batch in batches:
            work(batch)
            yield batch
    finally:
        batches.close()


def made_ahead(batches: Iterator[T]) -> Iterator[T]:
    """The items of `batches`, each made on a thread of its own while the caller takes the one
    before: the first pass's reading, decoding, ordering, pairing and joining to the calls go on
    beside the analyses (numpy, the SQLite driver and Arrow let go of the GIL for most of it). The
    next batch is begun only once the caller has taken the last one made: two batches at most
    (the caller's and the next). What `batches` raises is raised here; when the caller stops
    early, the thread stops after the batch it is making."""
    handed: queue.Queue = queue.Queue()
    taken = threading.Semaphore(0)  # released as the caller takes a batch: the next may be begun
    stop = threading.Event()

    def make() -> None:
        try:
            for batch in batches:
                handed.put((batch, None))
                del batch
                while not taken.acquire(timeout=0.05):
                    if stop.is_set():
                        return
                if stop.is_set():
                    return
            handed.put((_END, None))
        except BaseException as err:  # noqa: BLE001 - raised again on the caller's thread
            handed.put((_END, err))
        finally:
            batches.close()

    thread = threading.Thread(target=make, name="nsysan-batches", daemon=True)
    thread.start()
    try:
        while True:
            item, err = handed.get()
            if err is not None:
                raise err
            if item is _END:
                return
            taken.release()
            yield item
            del item
    finally:
        stop.set()
        thread.join()


_END = object()
