"""Activity counters from GPM interval averages: the arithmetic alone, no NVML.

NVML's GPM gives, for two samples, each metric's average over the interval between them: a ratio
in percent (SM active, tensor active, ...) or a rate in MiB/s (NVLink, PCIe). Exported as
counters, a ratio becomes seconds of activity (the fraction times the interval's length) and a
rate becomes bytes, so `rate()` gives the ratio (or the throughput) back over any window, two
Prometheus servers see the same numbers and a missed scrape loses nothing.

The rules, for the cases the hardware can produce:
- the first sample (and the first after `forget`) is a baseline: it adds nothing, the counters
  keep their totals (0 at the first collection);
- an interval that does not move forward (the clock did not advance, or went back) adds nothing
  and the later sample becomes the baseline;
- a ratio outside 0-100 % (beyond rounding) or a negative or non-finite value means the counters
  under the samples were reset (a GPU reset, a driver reload): the whole interval is dropped,
  since none of its values can be trusted, and the later sample becomes the baseline;
- a metric NVML could not compute (its own return code) adds nothing for that metric only;
- a long interval counts whole: the value is the average over exactly that interval;
- the counters never decrease; a GPU lost and back keeps its totals and starts from a new
  baseline (the caller calls `forget` when it loses the GPU).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

MIB = 1024 * 1024
RATIO_SLACK = 1.0  # percent: NVML's ratios can round past 100 %; past this the interval is bad


class ActivityCounters:
    """One GPU's totals by metric id: seconds for the `ratios` (percent), bytes for the `rates`
    (MiB/s)."""

    def __init__(self, ratios: Iterable[int], rates: Iterable[int] = ()) -> None:
        self.ratios = frozenset(ratios)
        self.rates = frozenset(rates)
        self.totals: dict[int, float] = dict.fromkeys(sorted(self.ratios | self.rates), 0.0)
        self.baseline: float | None = None  # when the sample the next interval starts from was taken
        self.dropped = 0  # intervals dropped as resets

    def start(self, t: float) -> None:
        """A new baseline taken at `t`: the next interval starts here; the totals stay."""
        self.baseline = t

    def forget(self) -> None:
        """No baseline (the GPU was lost): the next sample starts a new one."""
        self.baseline = None

    def add(self, t: float, values: Mapping[int, float | None]) -> bool:
        """The interval from the baseline to `t` with each metric's average over it (None: NVML
        could not compute it); `t` becomes the baseline. False when the interval was dropped."""
        start, self.baseline = self.baseline, t
        if start is None:
            return False
        seconds = t - start
        if seconds <= 0:
            return False
        add: dict[int, float] = {}
        for mid, v in values.items():
            if v is None or mid not in self.totals:
                continue
            if mid in self.ratios:
                if not (math.isfinite(v) and -RATIO_SLACK <= v <= 100 + RATIO_SLACK):
                    self.dropped += 1
                    return False
                add[mid] = min(max(v, 0.0), 100.0) / 100 * seconds
            else:
                if not (math.isfinite(v) and v >= 0):
                    self.dropped += 1
                    return False
                add[mid] = v * MIB * seconds
        for mid, amount in add.items():
            self.totals[mid] += amount
        return True
