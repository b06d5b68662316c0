"""The exporter's process_* series: what psutil reports, counted cheaply."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from exporter import process
from tests.helpers import HANG_GUARD_S, ROOT

# In a fresh process: no other test's thread holds a descriptor half-opened (a thread blocked
# opening a FIFO has its descriptor reserved: the directory's size counts it, a listing does not).
COMPARE = """
import os, sys, psutil
from exporter import process
if sys.argv[1] == "fallback":
    process._FD_DIR = os.devnull  # a file whose size is 0, as /proc/self/fd before Linux 6.2
fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(300)]
print(process.open_fds(), psutil.Process().num_fds())
for fd in fds:
    os.close(fd)
print(process.open_fds(), psutil.Process().num_fds())
"""


@pytest.mark.parametrize("how", ["size", "fallback"])
def test_open_fds_is_psutils_count_with_descriptors_opened_and_closed(how):
    out = subprocess.run([sys.executable, "-c", COMPARE, how], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=HANG_GUARD_S, check=True).stdout
    (ours_open, psutil_open), (ours_closed, psutil_closed) = (line.split() for line in out.splitlines())
    assert ours_open == psutil_open and ours_closed == psutil_closed
    assert int(ours_open) - int(ours_closed) == 300


def test_process_metrics_are_the_seven_series_in_order():
    fams = process.process_metrics()
    assert [f.name for f in fams] == ["process_cpu_seconds", "process_resident_memory_bytes",
                                      "process_virtual_memory_bytes", "process_open_fds", "process_max_fds",
                                      "process_start_time_seconds", "process_threads"]
    values = {f.name: f.samples[0].value for f in fams}
    assert values["process_start_time_seconds"] == psutil.Process().create_time()
    assert values["process_threads"] >= 1
    assert all(len(f.samples) == 1 and f.samples[0].labels == {} for f in fams)
