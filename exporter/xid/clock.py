"""The kernel-log clock (microseconds since boot in /dev/kmsg records) versus ours.

printk stamps records with the kernel's local clock; CLOCK_MONOTONIC (time.monotonic) starts at
boot too but is NTP-slewed, so the two drift apart by up to tens of ppm (seconds over weeks of
uptime). NVML events carry no timestamp, so to put them on the kernel clock we estimate the
offset from records read live (as soon as they are logged): offset = max(kernel_s - monotonic),
which is the true offset minus our read delay. It relaxes slowly so drift is followed.
"""

from __future__ import annotations

import time

MAX_OFFSET_S = 3600.0  # drift is ppm: an offset beyond an hour means the record is not live


class KernelClock:
    def __init__(self, offset_s: float = 0.0) -> None:
        self.offset_s = offset_s
        self.samples = 0

    def observe_live(self, kernel_s: float, mono: float | None = None) -> None:
        """A record with kernel time `kernel_s` was read right after it was logged."""
        sample = kernel_s - (time.monotonic() if mono is None else mono)
        if abs(sample) > MAX_OFFSET_S:  # not the running kernel's clock (a log of another boot)
            return
        if self.samples == 0 or sample > self.offset_s:
            self.offset_s = sample
        else:
            self.offset_s -= min(self.offset_s - sample, 0.001)
        self.samples += 1

    def now(self) -> float:
        """Current time on the kernel clock (seconds since boot)."""
        return time.monotonic() + self.offset_s

    def wall(self, kernel_s: float) -> float:
        """Wall-clock time of a kernel-clock instant."""
        return time.time() - (self.now() - kernel_s)
