"""The exporter's process_* series: what psutil reports, counted cheaply."""

from __future__ import annotations

import os
import time

import psutil
import pytest

from exporter import process


def same_as_psutil(count) -> bool:
    """`count()` equals psutil's num_fds() taken right after it, on one of the tries within 5 s
    (other tests' threads in this process may open or close a descriptor in between)."""
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        if count() == psutil.Process().num_fds():
            return True
    return False


def test_open_fds_is_psutils_count_with_descriptors_opened_and_closed():
    fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(300)]
    try:
        assert same_as_psutil(process.open_fds)
    finally:
        for fd in fds:
            os.close(fd)
    assert same_as_psutil(process.open_fds)


def test_open_fds_falls_back_to_psutil_where_the_directory_has_no_size(monkeypatch: pytest.MonkeyPatch):
    """Kernels before 6.2 report /proc/self/fd's size as 0."""
    monkeypatch.setattr(process, "_FD_DIR", os.devnull)  # a file whose size is 0
    assert same_as_psutil(process.open_fds)


def test_process_metrics_are_the_seven_series_in_order():
    fams = process.process_metrics()
    assert [f.name for f in fams] == ["process_cpu_seconds", "process_resident_memory_bytes",
                                      "process_virtual_memory_bytes", "process_open_fds", "process_max_fds",
                                      "process_start_time_seconds", "process_threads"]
    values = {f.name: f.samples[0].value for f in fams}
    assert values["process_threads"] == psutil.Process().num_threads()
    assert values["process_start_time_seconds"] == psutil.Process().create_time()
    assert all(len(f.samples) == 1 and f.samples[0].labels == {} for f in fams)
