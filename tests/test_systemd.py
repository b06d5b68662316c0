"""The systemd unit: the real `systemd-analyze verify` accepts it without a warning, `systemd-analyze
security --offline` rates its exposure at 3.0 or lower, and it keeps what each source needs (the
privileges table in docs/deploy.md) and nothing more."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.helpers import HANG_GUARD_S, ROOT

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
    r = subprocess.run([systemd_analyze(), "verify", str(unit)], capture_output=True, text=True,
                       timeout=HANG_GUARD_S)
    assert r.returncode == 0 and not r.stderr.strip() and not r.stdout.strip(), r.stdout + r.stderr


def test_verify_would_flag_a_typo(tmp_path):
    unit = tmp_path / "typo.service"
    unit.write_text(UNIT.read_text().replace("RestartPreventExitStatus=2", "RestartPreventExitStatus=two"))
    r = subprocess.run([systemd_analyze(), "verify", str(unit)], capture_output=True, text=True,
                       timeout=HANG_GUARD_S)
    assert "RestartPreventExitStatus" in r.stderr or "Failed to parse" in r.stderr


def test_security_exposure_at_most_3():
    # --threshold is in tenths: exit non-zero when the exposure is above 3.0.
    threshold = f"--threshold={int(MAX_EXPOSURE * 10)}"
    r = subprocess.run([systemd_analyze(), "security", "--offline=true", threshold, str(UNIT)],
                       capture_output=True, text=True, timeout=HANG_GUARD_S)
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d)", r.stdout)
    assert m, r.stdout + r.stderr
    print(f"systemd-analyze security --offline: exposure {m.group(1)}")
    assert float(m.group(1)) <= MAX_EXPOSURE and r.returncode == 0, r.stdout


def test_security_threshold_fails_a_weaker_unit(tmp_path):
    weak = tmp_path / UNIT.name
    weak.write_text("[Service]\nExecStart=/bin/true\n")
    r = subprocess.run([systemd_analyze(), "security", "--offline=true", "--threshold=30", str(weak)],
                       capture_output=True, text=True, timeout=HANG_GUARD_S)
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
    r = subprocess.run([str(exe), "--config", str(bad)], capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert r.returncode == 2, r.stderr


def _as_unit_user(code: str, caps: list[str]) -> subprocess.CompletedProcess:
    """Run python code as an unprivileged uid holding only `caps` as ambient capabilities: what the
    unit's DynamicUser process gets from AmbientCapabilities=."""
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv is missing (util-linux)"
    spec = ",".join("+" + c.removeprefix("CAP_").lower() for c in caps)
    cmd = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
    if spec:
        cmd += [f"--inh-caps={spec}", f"--ambient-caps={spec}"]
    return subprocess.run([*cmd, "/usr/bin/python3", "-c", code], capture_output=True, text=True,
                          timeout=HANG_GUARD_S)


KMSG = """
import os
fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
n = 0
while True:
    try:
        os.read(fd, 8192)
        n += 1
    except BlockingIOError:
        break
print(n)
"""


def test_unit_capabilities_open_the_kernel_log():
    """On this machine's kernel: /dev/kmsg as a non-root user needs CAP_SYSLOG exactly when
    kernel.dmesg_restrict=1, and the unit's capability set opens it and reads records."""
    import os

    assert os.geteuid() == 0, "needs root to drop to another uid (CI runs as root)"
    caps = service()["AmbientCapabilities"][0].split()
    with_caps = _as_unit_user(KMSG, caps)
    assert with_caps.returncode == 0 and int(with_caps.stdout) > 0, with_caps.stderr
    if Path("/proc/sys/kernel/dmesg_restrict").read_text().strip() == "1":
        without = _as_unit_user(KMSG, [])
        assert without.returncode != 0 and "Operation not permitted" in without.stderr


def test_unit_capabilities_pass_a_root_only_directory():
    """The debugfs gate (a 0700 root directory holding 0444 files, as Lustre's stats are): the unit's
    CAP_DAC_READ_SEARCH reads through it, a user without it cannot. debugfs itself cannot be mounted
    here, so a directory with the same modes stands in for it."""
    base = Path(tempfile.mkdtemp(prefix="ghe-debugfs-", dir="/tmp"))  # /tmp: every parent traversable
    try:
        base.chmod(0o755)
        d = base / "debug"
        (d / "lustre").mkdir(parents=True)
        stats = d / "lustre" / "stats"
        stats.write_text("snapshot_time 1.0 secs.nsecs\n")
        stats.chmod(0o444)
        code = f"print(open({str(stats)!r}).read().split()[0])"
        caps = service()["AmbientCapabilities"][0].split()
        without = [c for c in caps if c != "CAP_DAC_READ_SEARCH"]
        d.chmod(0o755)  # control: an open directory needs no capability
        assert _as_unit_user(code, without).stdout.strip() == "snapshot_time"
        d.chmod(0o700)  # debugfs's root
        assert _as_unit_user(code, caps).stdout.strip() == "snapshot_time"
        assert "Permission denied" in _as_unit_user(code, without).stderr
    finally:
        shutil.rmtree(base)
