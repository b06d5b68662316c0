"""Per-node totals of the EFA counters the shipped rules and dashboards read (issue 36).

A p5.48xlarge has 32 EFA devices, so every per-device family is 64,000 series on a 2,000-node
fleet, and a rule that reads one reads them all at every evaluation. The alerts and the fleet
dashboards want the node's figure (a node is drained, not a device), so the exporter sums each
such family over the node's devices and ports and exports it as one series per node,
`efa_node_<name>_total`; the per-device series stay, to locate the device.

The total must stay a counter, or `rate()` and `increase()` would read every dip as a reset and
count the whole total again (millions of bytes, or a burst of retransmit timeouts that never
happened). So it is not the sum of the devices' current values but a running total:
- it starts at the sum of each device's value at its first reading (its count since the driver
  loaded, as its own series; a node that booted with a fault shows it at once);
- then each reading adds what each device's counter rose since its last reading; a device whose
  counter fell (reset: the device or driver was reset) adds its new value, as `rate()` would;
- a device that fails a read adds nothing until it is read again, and then what it rose meanwhile;
- a device that goes away is forgotten: if it comes back, its value since it came back is added.
An exporter restart starts over at the sum of the devices' current values, which is the running
total it left unless a device was reset during its previous run (then Prometheus sees one reset).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from operator import itemgetter

from exporter.catalog import MetricSpec, define
from exporter.efa import naming
from exporter.efa.reader import DeviceReading
from exporter.metric import Sample

# The per-device families summed (the default counter set, every one the shipped rules or
# dashboards read), with the help of the node's series.
_SUMMED = {
    "efa_tx_bytes_total": "Bytes transmitted",
    "efa_rx_bytes_total": "Bytes received",
    "efa_tx_packets_total": "Packets transmitted",
    "efa_rx_drops_total": "Received packets dropped",
    "efa_retrans_packets_total": "SRD packets retransmitted",
    "efa_retrans_timeout_events_total": "SRD traffic timeouts that changed the network path",
    "efa_unresponsive_remote_events_total": "SRD remote connections found unresponsive",
    "efa_impaired_remote_conn_events_total": "SRD remote connections that entered an impaired state",
    "efa_rdma_read_errors_total": "RDMA read work requests completed with an error",
    "efa_rdma_write_errors_total": "RDMA write work requests completed with an error",
    "efa_admin_commands_no_completion_total": "Admin commands that timed out without completion",
}


def _node_spec(device_name: str, what: str) -> MetricSpec:
    name = "efa_node_" + device_name.removeprefix("efa_")
    unit = "bytes" if name.endswith("_bytes_total") else "packets" if name.endswith("_packets_total") else ""
    return define(
        name, "counter",
        f"{what}, summed over the node's EFA devices and ports ({device_name} per device): a running "
        "total that stays monotonic when a device is reset, fails a read or goes away (docs/efa.md, "
        "\"Node totals\"). Exported when that counter is read.",
        unit=unit, collector=naming.C)


# per-device metric name -> the node's metric
NODE_TOTALS: dict[str, MetricSpec] = {dev: _node_spec(dev, what) for dev, what in _SUMMED.items()}

DEVICES_UNREADABLE = define(
    "efa_devices_unreadable", "gauge",
    "EFA devices whose counters could not be read in this scrape (efa_device_up 0): one series per "
    "node for the alert, where efa_device_up names the devices.",
    collector=naming.C)


Picked = tuple[Sample | list[Sample], ...]  # a summed metric's Sample (one port) or Samples (several)


class _Plan:
    """What of one device's reading is summed: per summed metric its Sample (one port) or its
    slice of Samples (several ports), picked from `DeviceReading.samples` in one call."""

    def __init__(self, runs: list[tuple[MetricSpec, int, int]]) -> None:
        self.runs = runs
        summed = [(spec.name, a, b) for spec, a, b in runs if spec.name in NODE_TOTALS]
        self.names = [name for name, _, _ in summed]
        picks = [a if b == a + 1 else slice(a, b) for _, a, b in summed]
        if len(picks) == 1:
            only = picks[0]
            self.pick: Callable[[list[Sample]], Picked] = lambda samples: (samples[only],)
        else:
            self.pick = itemgetter(*picks) if picks else (lambda samples: ())
        self.seen: Picked | None = None  # what `pick` gave last time


class NodeTotals:
    """The running per-node totals of one collector (see the module's doc)."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], float] = {}  # (device, per-device metric) -> its last value
        self._totals: dict[str, float] = {}  # per-device metric -> the node's running total
        self._samples: dict[str, tuple[float, Sample]] = {}  # the node's last Sample per metric, reused
        # device -> its reading's `runs` (the reader keeps one list while the device's files stay
        # open) and what is summed of it; and the summed Samples it gave last time
        self._plans: dict[str, _Plan] = {}

    def update(self, readings: Iterable[DeviceReading]) -> None:
        """Add what each successfully read device's summed counters rose since its last reading."""
        plans = self._plans
        for reading in readings:
            if reading.error:
                continue
            dev = reading.device.name
            plan = plans.get(dev)
            if plan is None or plan.runs is not reading.runs:  # first reading, or its files reopened
                plan = plans[dev] = _Plan(reading.runs)
            # Every scrape (issue 36's figures): the reader hands back the same (immutable) Sample
            # for a file whose bytes did not change, so a device none of whose summed counters
            # moved costs one tuple comparison (identity first) and a moved one only its own work.
            current = plan.pick(reading.samples)
            if current == plan.seen:
                continue
            for name, now, before in zip(plan.names, current, plan.seen or (None,) * len(current),
                                         strict=True):
                if now is not before:
                    self._add(dev, name, now.value if isinstance(now, Sample) else sum(s.value for s in now))
            plan.seen = current

    def _add(self, dev: str, name: str, value: float) -> None:
        key = (dev, name)
        prev = self._last.get(key)
        rise = value if prev is None or value < prev else value - prev
        self._last[key] = value
        self._totals[name] = self._totals.get(name, 0.0) + rise

    def forget_except(self, devices: set[str]) -> None:
        """Forget the devices no longer listed (a device that comes back counts from its new value)."""
        for key in [k for k in self._last if k[0] not in devices]:
            del self._last[key]
        for dev in self._plans.keys() - devices:
            del self._plans[dev]

    def samples(self) -> list[tuple[MetricSpec, Sample]]:
        """The node's series, one per summed family read so far, in catalog order."""
        out = []
        for name, spec in NODE_TOTALS.items():
            total = self._totals.get(name)
            if total is None:
                continue
            cached = self._samples.get(name)
            if cached is None or cached[0] != total:
                cached = self._samples[name] = (total, Sample(spec.name, {}, total))
            out.append((spec, cached[1]))
        return out
