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

from collections.abc import Iterable

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


class NodeTotals:
    """The running per-node totals of one collector (see the module's doc)."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], float] = {}  # (device, per-device metric) -> its last value
        self._totals: dict[str, float] = {}  # per-device metric -> the node's running total
        self._samples: dict[str, tuple[float, Sample]] = {}  # the node's last Sample per metric, reused

    def update(self, readings: Iterable[DeviceReading]) -> None:
        """Add what each successfully read device's summed counters rose since its last reading."""
        last, totals = self._last, self._totals
        for reading in readings:
            if reading.error:
                continue
            dev = reading.device.name
            samples = reading.samples
            for spec, a, b in reading.runs:
                if spec.name not in NODE_TOTALS:
                    continue
                value = samples[a].value if b == a + 1 else sum(s.value for s in samples[a:b])
                key = (dev, spec.name)
                prev = last.get(key)
                rise = value if prev is None or value < prev else value - prev
                last[key] = value
                totals[spec.name] = totals.get(spec.name, 0.0) + rise

    def forget_except(self, devices: set[str]) -> None:
        """Forget the devices no longer listed (a device that comes back counts from its new value)."""
        for key in [k for k in self._last if k[0] not in devices]:
            del self._last[key]

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
