"""The freed-memory hand-back (exporter.lifecycle.MallocTrim): after the first collection, then at most
once an interval, from the main thread's signal wait."""

from __future__ import annotations

import os
import signal
import threading

from exporter.lifecycle import MallocTrim, Signals, _malloc_trim


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_trims_once_the_first_collection_is_done_then_once_an_interval():
    ready, clock, calls = threading.Event(), Clock(), []
    trim = MallocTrim(ready, every_s=60.0, trim=lambda: calls.append(clock.now), clock=clock)
    trim.tick()
    assert calls == []  # the start-up peak is not over before the first collection
    ready.set()
    trim.tick()
    clock.now += 59.0
    trim.tick()
    assert calls == [100.0]
    clock.now += 1.0
    trim.tick()
    trim.tick()
    assert calls == [100.0, 160.0]


def test_the_real_trim_calls_the_c_library():
    # glibc's malloc_trim answers 1 when it gave memory back, 0 when there was none to give
    assert _malloc_trim()() in (0, 1)


def test_the_signal_wait_runs_the_tick_until_a_signal_comes():
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    signals = Signals().install()  # (handles SIGTERM and SIGINT, holds SIGHUP: all undone below)
    ticks = []

    def tick() -> None:
        ticks.append(1)
        if len(ticks) == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    try:
        assert signals.wait(tick=tick) == signal.SIGTERM
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})  # children inherit the mask
    assert len(ticks) == 3
