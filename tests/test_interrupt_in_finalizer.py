"""Ctrl-C that lands while Python runs a finalizer or a weakref callback during a batch (Dask's
and the pool's objects are collected as it stops) is delivered again where it can stop the batch,
not printed as 'Exception ignored ... Traceback' and lost (a real-signal test of test_batchsafe
met it once in three whole-suite runs)."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from nsysan.batch.orchestrate import _HeldInterrupts


class SendsSigintWhenCollected:
    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the handler runs here, inside the finalizer
            pass


def test_an_interrupt_raised_inside_a_finalizer_stops_the_batch_after_it(capfd):
    with pytest.raises(KeyboardInterrupt):
        with _HeldInterrupts():
            SendsSigintWhenCollected()  # collected at once: the signal arrives inside __del__
            time.sleep(2)  # the interrupt sent again ends this wait
    assert "Exception ignored" not in capfd.readouterr().err


def test_other_unraisable_errors_still_reach_pythons_hook(monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: seen.append(unraisable.exc_value))

    class Fails:
        def __del__(self) -> None:
            raise ValueError("a finalizer's own bug")

    with _HeldInterrupts():
        Fails()
    assert [str(e) for e in seen] == ["a finalizer's own bug"]
    assert sys.unraisablehook is not None and not seen[1:]
