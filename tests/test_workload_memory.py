"""The mapping directory's memory is bounded whatever it holds: each hostile directory
is read by the slurm_mapping kind in a fresh interpreter, whose peak RSS (ru_maxrss) must stay
well within the systemd unit's MemoryMax and the DaemonSet's limit (256 MiB). The figures are in
docs/performance.md ("Hostile workload inputs"); `python -m tests.test_workload_memory DIR...`
prints them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import HANG_GUARD_S, ROOT

LIMIT_MIB = 256  # deploy/systemd/gpu-health-exporter.service MemoryMax, daemonset.yaml's limit
GROWTH_MIB = 32  # what one reading may add to the interpreter's peak, whatever the directory

# VmHWM is the peak RSS; writing 5 to clear_refs resets it to the RSS now, so the peak measured
# is the reading's own, not the imports'.
PROBE = r"""
import json, sys
from exporter.nvml.session import DeviceIdentity
from exporter.workload.source import SlurmMappingKind
def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":")) / 1024
gpus = [DeviceIdentity(i, f"GPU-{i:08d}-0000-0000-0000-000000000000", f"00000000:{i:02x}:00.0", "H100")
        for i in range(8)]
kind = SlurmMappingKind(sys.argv[1])
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = status("VmRSS")
for _ in range(3):
    out, problems = kind.read(gpus)
print(json.dumps({"before_mib": round(before, 1), "peak_mib": round(status("VmHWM"), 1),
                  "observed": len(out), "problems": len(problems)}))
"""


def mig_files_60k(d: Path) -> None:
    """1,000 MIG-named files of 60 KB of job ids (once 6 million ids and 706 MB)."""
    blob = "".join(f"{i}\n" for i in range(20_000)).encode()[:60_000]
    for i in range(1000):
        (d / f"{i % 8}.{i}").write_bytes(blob)


def hundred_mib_of_max_size_files(d: Path) -> None:
    """100 MiB: 6,400 GPU-named files of exactly the per-file limit, each of distinct short ids."""
    blob = "".join(f"{i}\n" for i in range(5000)).encode()[:16 * 1024]
    for i in range(6400):
        (d / f"{i % 64}.{i}").write_bytes(blob)


def temporary_files(d: Path) -> None:
    """70,000 leftover temporary files (over the entries looked at) and the 8 GPU files."""
    for i in range(70_000):
        (d / f".{i % 8}.{i:06d}").touch()
    for i in range(8):
        (d / str(i)).write_text("42\n")


def long_lines(d: Path) -> None:
    """Every GPU's file one 16 KiB line without a newline, and a 100 MiB sparse file."""
    for i in range(8):
        (d / str(i)).write_bytes(b"7" * (16 * 1024))
    with open(d / "GPU-00000003-0000-0000-0000-000000000000", "wb") as f:
        f.truncate(100 << 20)


CASES = [mig_files_60k, hundred_mib_of_max_size_files, temporary_files, long_lines]


def measure(d: Path) -> dict:
    r = subprocess.run([sys.executable, "-c", PROBE, str(d)], cwd=ROOT, capture_output=True, text=True,
                       timeout=HANG_GUARD_S)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_a_hostile_mapping_directory_stays_within_the_memory_limit(tmp_path, case):
    case(tmp_path)
    m = measure(tmp_path)
    assert m["peak_mib"] < LIMIT_MIB, m
    assert m["peak_mib"] - m["before_mib"] < GROWTH_MIB, m
    assert m["problems"] > 0, m  # and the reading says what it left out


if __name__ == "__main__":
    import tempfile

    for case in CASES:
        with tempfile.TemporaryDirectory() as t:
            case(Path(t))
            print(case.__name__, measure(Path(t)))
