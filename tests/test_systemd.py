"""The systemd unit: the real `systemd-analyze verify` accepts it without a warning, `systemd-analyze
security --offline` rates its exposure at 3.0 or lower, and it keeps what each source needs (the
privileges table in docs/deploy.md) and nothing more."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT

UNIT = ROOT / "deploy" / "systemd" / "gpu-health-exporter.service"
MAX_EXPOSURE = 3.0


def systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    assert path, "systemd-analyze is missing: install Debian's systemd package (.ci/run does)"
    return path


def service() -> dict[str, list[str]]:
    """[Service] keys -> every value given (DeviceAllow= and friends repeat)."""
    out: dict[str, list[str]] = {}
    section = None
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            out.setdefault(k, []).append(v)
    return out


def test_verify_accepts_the_unit_without_warnings(tmp_path):
    # verify checks that ExecStart is executable: point it at this checkout's exporter, nothing else changes.
    exe = Path(sys.executable).parent / "gpu-health-exporter"
    assert exe.exists()
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("/opt/gpu-health-exporter/bin/gpu-health-exporter", str(exe)))
    r = subprocess.run([systemd_analyze(), "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not r.stderr.strip() and not r.stdout.strip(), r.stdout + r.stderr


def test_verify_would_flag_a_typo(tmp_path):
    unit = tmp_path / "typo.service"
    unit.write_text(UNIT.read_text().replace("RestartPreventExitStatus=2", "RestartPreventExitStatus=two"))
    r = subprocess.run([systemd_analyze(), "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert "RestartPreventExitStatus" in r.stderr or "Failed to parse" in r.stderr


def test_security_exposure_at_most_3():
    # --threshold is in tenths: exit non-zero when the exposure is above 3.0.
    threshold = f"--threshold={int(MAX_EXPOSURE * 10)}"
    r = subprocess.run([systemd_analyze(), "security", "--offline=true", threshold, str(UNIT)],
                       capture_output=True, text=True, timeout=60)
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d)", r.stdout)
    assert m, r.stdout + r.stderr
    print(f"systemd-analyze security --offline: exposure {m.group(1)}")
    assert float(m.group(1)) <= MAX_EXPOSURE and r.returncode == 0, r.stdout


def test_security_threshold_fails_a_weaker_unit(tmp_path):
    weak = tmp_path / UNIT.name
    weak.write_text("[Service]\nExecStart=/bin/true\n")
    r = subprocess.run([systemd_analyze(), "security", "--offline=true", "--threshold=30", str(weak)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0


def test_each_source_keeps_what_it_needs_and_nothing_more():
    s = service()
    caps = {"CAP_SYSLOG", "CAP_DAC_READ_SEARCH"}  # /dev/kmsg; the 0700 debugfs root (Lustre stats)
    assert set(s["AmbientCapabilities"][0].split()) == caps
    assert set(s["CapabilityBoundingSet"][0].split()) == caps
    assert s["DevicePolicy"] == ["closed"]
    assert set(s["DeviceAllow"]) == {"char-nvidia-frontend rw", "/dev/kmsg r"}  # NVML; the kernel log
    assert s["StateDirectory"] == ["gpu-health-exporter"]  # XID counts across restarts
    assert s.get("ProtectKernelLogs", ["no"]) == ["no"]  # yes would hide /dev/kmsg
    assert s.get("PrivateDevices", ["no"]) == ["no"]  # yes would hide /dev/nvidia*
    assert s["ProtectHome"] == ["read-only"]  # an FSx mount under /home stays visible to statvfs
    assert s.get("ProcSubset", ["all"]) == ["all"]  # /proc/fs/lustre and boot_id are not per-process
    assert s["NoNewPrivileges"] == ["yes"] and s["DynamicUser"] == ["yes"]


def test_restart_policy(tmp_path):
    s = service()
    assert s["RestartPreventExitStatus"] == ["2"]
    assert int(s["TimeoutStopSec"][0]) <= 60
    assert int(s["LimitNOFILE"][0]) >= 1024
    # Exit status 2 is what a bad configuration gives, so the unit stops instead of looping.
    bad = tmp_path / "config.yaml"
    bad.write_text("listen: [not, an, address]\n")
    exe = Path(sys.executable).parent / "gpu-health-exporter"
    r = subprocess.run([str(exe), "--config", str(bad)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
