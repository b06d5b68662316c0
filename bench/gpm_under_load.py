"""GPM under a known load, on a lent GPU: the exporter's activity counters against what
the GPU was made to do. Phases of a few seconds each on GPU 0: idle, a bf16 matrix-product loop
(tensor cores busy), a device-to-device copy loop (DRAM busy, no tensor work). The exporter (GPU
collector only, port 0) is scraped at each phase's edges; the rate of each counter over the phase
is printed next to the phase. Needs PyTorch with CUDA (the lent machine's python3 has it).

    PYTHONPATH=. python3 bench/gpm_under_load.py [--phase-s 6]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.helpers import no_imds, served_base  # noqa: E402

COUNTERS = ("gpu_sm_active_seconds_total", "gpu_sm_occupancy_seconds_total",
            "gpu_tensor_active_seconds_total", "gpu_dram_active_seconds_total")


def scrape(base: str) -> tuple[float, dict[str, float]]:
    text = requests.get(base + "/metrics", timeout=10).text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in COUNTERS and s.labels.get("gpu") == "0":
                out[s.name] = s.value
            if s.name == "gpu_activity_measured" and s.labels.get("gpu") == "0":
                out[f"measured{{reason={s.labels.get('reason')}}}"] = s.value
    return time.monotonic(), out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--phase-s", type=float, default=6.0)
    args = ap.parse_args()
    import torch

    log = Path(tempfile.mkdtemp()) / "exporter.log"
    cmd = no_imds([sys.executable, "-m", "exporter", "--listen", "127.0.0.1:0", "--collectors", "gpu",
                   "--log-level", "info"])  # the lent host is no EC2 instance: IMDS off
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        base = served_base(log, proc, timeout=60)
        scrape(base)  # the first collection starts the interval
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        src = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        torch.cuda.synchronize()

        def idle() -> None:
            time.sleep(0.05)

        def matmul() -> None:
            for _ in range(20):
                a @ b
            torch.cuda.synchronize()

        def copy() -> None:
            dst.copy_(src)
            torch.cuda.synchronize()

        phases = (("idle", idle), ("bf16 matmul 8192^3", matmul), ("d2d copy 2 GiB", copy), ("idle", idle))
        for name, work in phases:
            t0, c0 = scrape(base)
            end = time.monotonic() + args.phase_s
            n = 0
            while time.monotonic() < end:
                work()
                n += 1
            t1, c1 = scrape(base)
            rates = {k.removeprefix("gpu_").removesuffix("_seconds_total"): (c1[k] - c0.get(k, 0)) / (t1 - t0)
                     for k in COUNTERS if k in c1}
            flags = {k: v for k, v in c1.items() if k.startswith("measured")}
            print(f"{name:22s} {t1 - t0:5.2f}s {n:5d} iterations  "
                  + "  ".join(f"{k} {v:.3f}" for k, v in rates.items()) + f"  {flags}", flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    print(log.read_text()[-1500:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
