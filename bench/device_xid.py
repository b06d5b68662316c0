"""Real-GPU check of the XID path: run as root on a node with an NVIDIA GPU and driver.

Reads /dev/kmsg (the real character device: one record per read, EAGAIN at the end), starts the
XID service with the real NVML backend (event thread) and the kernel-log follower, makes a
child process fault on the GPU (an illegal write with CuPy: XID 31, as in the H200 capture),
and reports how each source saw it, whether it was counted once, how long until it was
counted, that a restart within the boot does not count it again, and what `check --json` says.
Writes device_xid.json and metrics.txt to $OUT (or a temporary directory).

    python3 bench/device_xid.py
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FAULT = r"""
import cupy as cp
k = cp.RawKernel(r'extern "C" __global__ void bad(int* p) { *p = 42; }', 'bad')
k((1,), (1,), (cp.uint64(0xdead000000),))
cp.cuda.runtime.deviceSynchronize()
"""


def main() -> int:
    out = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="device-xid-"))
    rep: dict = {"python": platform.python_version(), "kernel": platform.release()}

    def save() -> None:
        (out / "device_xid.json").write_text(json.dumps(rep, indent=2, default=str))

    try:
        rep["dmesg_restrict"] = Path("/proc/sys/kernel/dmesg_restrict").read_text().strip()
    except OSError as e:
        rep["dmesg_restrict"] = str(e)

    from exporter import collectors
    from exporter.compose import compose
    from exporter.config import load
    from exporter.runner import Runner
    from exporter.xid.kmsg import KmsgReader
    from exporter.xid.service import one_shot
    from tests.helpers import scrape

    collectors.discover()  # the collectors' config sections, as the composition root does

    # 1. the device itself
    r = KmsgReader("/dev/kmsg")
    t = time.perf_counter()
    try:
        recs = list(r.read_available())
        rep["kmsg"] = {"device": r.device, "records": len(recs), "seconds": time.perf_counter() - t,
                       "first_seq": r.stats.first_seq, "last_seq": r.stats.last_seq,
                       "missed": r.stats.missed, "overwrites": r.stats.overwrites,
                       "nvrm_tail": [f"{x.prio},{x.seq},{x.usec};{x.message}"
                                     for x in recs if "NVRM" in x.message][-12:],
                       "again_returns_nothing": list(r.read_available()) == []}
    except OSError as e:
        rep["kmsg"] = {"error": str(e)}
    r.close()
    print("kmsg:", json.dumps({k: v for k, v in rep["kmsg"].items() if k != "nvrm_tail"}), flush=True)

    # 2. the service with real NVML, then a fault
    collectors.collector_classes()
    state = out / "state"
    ctx = compose(load(None, {"paths.state_dir": str(state), "xid.follow_poll_seconds": 0.2}))
    from exporter.collectors.xid import XidCollector

    c = XidCollector(ctx)
    c.start()
    w = c.service.watcher
    deadline = time.monotonic() + 15
    while w.status.state != "watching" and time.monotonic() < deadline:
        time.sleep(0.05)
    s = c.service.session()
    rep["nvml"] = {"watcher": vars(w.status).copy(), "session_error": getattr(s, "error", "no session"),
                   "devices": [vars(d) for d in s.devices] if s else []}
    if s:
        try:
            rep["nvml"]["supported_event_types"] = hex(s.backend.call(0, "nvmlDeviceGetSupportedEventTypes"))
        except Exception as e:  # noqa: BLE001
            rep["nvml"]["supported_event_types"] = str(e)
    time.sleep(1.5)  # let the follower finish the backlog
    before = {f"{p}/{k}": v.count for p, ks in c.service.store.snapshot().items() for k, v in ks.items()}
    rep["counts_before"] = before
    rep["reports_before"] = dict(c.service.store.reports)
    print("watcher:", rep["nvml"]["watcher"], flush=True)
    save()
    t0 = time.monotonic()
    f = subprocess.run([sys.executable, "-c", FAULT], capture_output=True, text=True, timeout=120)
    t_fault = time.monotonic()
    rep["fault"] = {"rc": f.returncode, "stderr_tail": f.stderr[-300:], "seconds": t_fault - t0}
    first_count = None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        now = {f"{p}/{k}": v.count for p, ks in c.service.store.snapshot().items() for k, v in ks.items()}
        grew = {k: n - before.get(k, 0) for k, n in now.items() if n != before.get(k, 0)}
        if grew and first_count is None:
            first_count = time.monotonic() - t_fault
        rb = c.service.store.reports
        if grew and rb.get("nvml", 0) > rep["reports_before"].get("nvml", 0) and \
                rb.get("kmsg", 0) > rep["reports_before"].get("kmsg", 0):
            break
        time.sleep(0.05)
    time.sleep(1.0)
    now = {f"{p}/{k}": v.count for p, ks in c.service.store.snapshot().items() for k, v in ks.items()}
    rep["after"] = {"counts": now, "new_events": {k: n - before.get(k, 0) for k, n in now.items()
                                                  if n != before.get(k, 0)},
                    "reports": dict(c.service.store.reports), "merged": dict(c.service.store.merged),
                    "nvml_events": {f"{p}/{t}": n for (p, t), n in c.service.nvml_events.items()},
                    "seconds_fault_end_to_counted": first_count, "clock_offset_s": c.service.clock.offset_s,
                    "clock_samples": c.service.clock.samples}
    text = scrape(Runner([c], deadline_s=10, pool=ctx.pool))
    (out / "metrics.txt").write_text(text)
    c.close()
    print("after:", json.dumps(rep["after"]), flush=True)
    save()

    # 3. restart within the boot: nothing counted again
    ctx2 = compose(load(None, {"paths.state_dir": str(state)}))
    svc2 = one_shot(ctx2)
    again = {f"{p}/{k}": v.count for p, ks in svc2.store.snapshot().items() for k, v in ks.items()}
    rep["restart"] = {"counts": again, "same_as_before_restart": again == now,
                      "state_found": svc2.snapshot().state.found, "last_seq": svc2.last_seq}
    svc2.follower.close()
    print("restart:", rep["restart"], flush=True)
    save()

    # 4. check --json against the real node (state read only)
    from tests.helpers import no_imds

    check = [sys.executable, "-m", "exporter", "check", "--json", "--path.state-dir", str(state)]
    ch = subprocess.run(no_imds(check),  # the lent host is no EC2 instance: IMDS off
                        capture_output=True, text=True, timeout=120, cwd=ROOT,
                        env={**os.environ, "PYTHONPATH": str(ROOT)})
    rep["check"] = {"rc": ch.returncode, "stderr_tail": ch.stderr[-500:]}
    try:
        rep["check"]["json"] = json.loads(ch.stdout)
    except ValueError:
        rep["check"]["stdout"] = ch.stdout[-2000:]
    print("check rc:", ch.returncode, flush=True)
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
