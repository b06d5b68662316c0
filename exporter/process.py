"""The exporter's own process metrics, under the names every Prometheus client library uses
(process_cpu_seconds_total, process_resident_memory_bytes, ...), read through psutil in one
`oneshot` per scrape (~0.1 ms). process_threads counts OS threads (the Rust and Java clients' name).
psutil rather than prometheus_client's ProcessCollector: it reads /proc/self once per scrape and
names the same series; `ProcessCollector` here is a prometheus_client custom collector."""

from __future__ import annotations

import resource

import psutil

from exporter.catalog import define
from exporter.metric import Metric, Sample

CPU = define("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.",
             unit="seconds", collector="exporter")
RSS = define("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", unit="bytes",
             collector="exporter")
VMS = define("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", unit="bytes",
             collector="exporter")
OPEN_FDS = define("process_open_fds", "gauge", "Number of open file descriptors.", collector="exporter")
MAX_FDS = define("process_max_fds", "gauge", "Maximum number of open file descriptors (the soft limit).",
                 collector="exporter")
START = define("process_start_time_seconds", "gauge",
               "Start time of the process since unix epoch in seconds.", unit="seconds", collector="exporter")
THREADS = define("process_threads", "gauge", "Number of OS threads in the process.", collector="exporter")

_proc = psutil.Process()
_SPECS = (CPU, RSS, VMS, OPEN_FDS, MAX_FDS, START, THREADS)


class ProcessCollector:
    """prometheus_client custom collector of the process_* series (exporter.registry)."""

    def collect(self) -> list[Metric]:
        return process_metrics()


def process_metrics() -> list[Metric]:
    with _proc.oneshot():  # one read of each /proc/self file
        t = _proc.cpu_times()
        mem = _proc.memory_info()
        values = (t.user + t.system, mem.rss, mem.vms, _proc.num_fds(),
                  resource.getrlimit(resource.RLIMIT_NOFILE)[0], _proc.create_time(), _proc.num_threads())
    out = []
    for spec, v in zip(_SPECS, values, strict=True):  # what Families.add makes, without its checks
        fam = spec.family()
        fam.samples.append(Sample(spec.name, {}, float(v)))
        out.append(fam)
    return out
