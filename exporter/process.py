"""The exporter's own process metrics, under the names every Prometheus client library uses
(process_cpu_seconds_total, process_resident_memory_bytes, ...), read through psutil in one
`oneshot` per scrape (~0.1 ms; open descriptors counted without listing them, see open_fds).
process_threads counts OS threads (the Rust and Java clients' name).
psutil rather than prometheus_client's ProcessCollector: it reads /proc/self once per scrape and
names the same series. /metrics renders them after the collection (exporter.web.server.families)."""

from __future__ import annotations

import functools
import os
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

_FD_DIR = "/proc/self/fd"
_SPECS = (CPU, RSS, VMS, OPEN_FDS, MAX_FDS, START, THREADS)


@functools.cache
def _process() -> psutil.Process:
    """This process, built on first use rather than on import."""
    return psutil.Process()


def open_fds() -> int:
    """psutil's num_fds(), which lists /proc/self/fd: 0.2-0.4 ms with the ~400 descriptors the
    EFA and Lustre readers keep open. Linux 6.2+ gives the count as the directory's size (no
    listing); the listing's own descriptor, which psutil and every client library count, is
    added so the series keeps its meaning. One difference: the size also counts a descriptor a
    thread has reserved but not yet installed (an open() blocked on a FIFO), which a listing
    skips; it counts against the open-file limit all the same. Older kernels report size 0:
    psutil then."""
    try:
        n = os.stat(_FD_DIR).st_size
    except OSError:
        n = 0
    return n + 1 if n > 0 else _process().num_fds()


def process_metrics() -> list[Metric]:
    proc = _process()
    with proc.oneshot():  # one read of each /proc/self file
        t = proc.cpu_times()
        mem = proc.memory_info()
        values = (t.user + t.system, mem.rss, mem.vms, open_fds(),
                  resource.getrlimit(resource.RLIMIT_NOFILE)[0], proc.create_time(), proc.num_threads())
    out = []
    for spec, v in zip(_SPECS, values, strict=True):  # what Families.add makes, without its checks
        fam = spec.family()
        fam.samples.append(Sample(spec.name, {}, float(v)))
        out.append(fam)
    return out
