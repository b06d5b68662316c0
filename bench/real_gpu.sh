#!/usr/bin/env bash
# One prepared run on a real GPU node (H100/H200): the real-GPU tests, the exporter against the
# real GPU(s) for ~10 s, a /metrics scrape, the GPU bench in real mode (and the simulated bench
# on the same quiet host), and an nvidia-smi summary. Everything lands in $OUT; every step goes
# on when an earlier one fails; the whole run stays under 5 minutes.
#
# Needs: python3 with nvidia-ml-py, prometheus-client, psutil, pyyaml, requests, pytest (no
# network). Run from anywhere:  OUT=/tmp/out bash bench/real_gpu.sh
set -x
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
export PYTHONPATH=.
export OUT
# No packet beyond loopback, the instance metadata address included: the lent GPU host is not EC2,
# so every exporter here runs with IMDS off in its config (the benches add it themselves).
NO_IMDS=tests/fixtures/config/no-imds.yaml
START=$(date +%s)
step() { echo "=== $* ($(($(date +%s) - START))s)"; }

step environment
{ date -u; uname -a; python3 --version; python3 -c 'import pynvml, prometheus_client; print("nvidia-ml-py", getattr(pynvml, "__version__", "?"))';
  nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,driver_version,memory.total,power.limit --format=csv;
  command -v promtool; git log --oneline -1; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

step "real-GPU tests"
timeout 120 python3 -m pytest -q -m real_gpu -rA -p no:cacheprovider tests/test_real_gpu.py > "$OUT/pytest_real_gpu.txt" 2>&1
echo "pytest rc=$?" | tee -a "$OUT/pytest_real_gpu.txt"
tail -25 "$OUT/pytest_real_gpu.txt"

step "GPM under a known load: idle, bf16 matmul, d2d copy (issue 27)"
if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  timeout 90 python3 bench/gpm_under_load.py --phase-s 6 > "$OUT/gpm_under_load.txt" 2>&1
  echo "gpm rc=$?" | tee -a "$OUT/gpm_under_load.txt"
  head -8 "$OUT/gpm_under_load.txt"
fi

serve() {  # serve NAME SECONDS ARGS...: run the exporter, save a scrape, its log and timings
  local name=$1 secs=$2; shift 2
  # Port 0: the exporter takes a free port and logs it ("serving http://127.0.0.1:PORT/metrics").
  timeout $((secs + 20)) python3 -m exporter --listen 127.0.0.1:0 --log-level info --config "$NO_IMDS" "$@" \
    > "$OUT/exporter_$name.log" 2>&1 &
  local pid=$!
  timeout $((secs + 15)) python3 - "$pid" "$OUT/exporter_$name.log" "$secs" "$OUT/metrics_$name.txt" <<'EOF' > "$OUT/scrape_$name.txt" 2>&1
import http.client, sys, time, statistics, psutil, requests
from pathlib import Path
from tests.helpers import served_base
pid, log, secs, path = int(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
t0 = time.monotonic()
base = served_base(log, timeout=30)
port = base.rsplit(":", 1)[1]
while True:
    try:  # /readyz turns 200 after the first collection, which the first scrape triggers
        requests.get(base + "/metrics", timeout=10)
        if requests.get(base + "/readyz", timeout=10).status_code == 200:
            break
    except requests.ConnectionError:
        pass
    if time.monotonic() - t0 > 30:
        sys.exit("exporter not ready after 30 s")
    time.sleep(0.2)
ready = time.monotonic()
print(f"ready after {ready - t0:.2f}s")
proc = psutil.Process(pid).children()[0]  # the python under `timeout`
def cpu():
    t = proc.cpu_times()
    return t.user + t.system
def report(how, walls, c0, c1):
    walls.sort()
    print(f"{len(walls)} scrapes over HTTP ({how}): median {statistics.median(walls)*1e3:.2f} ms, "
          f"max {walls[-1]*1e3:.2f} ms; exporter CPU {(c1 - c0) / len(walls) * 1e3:.2f} ms per scrape")
# 1. as earlier runs measured it: `requests`, a new connection per scrape, 50 ms apart
half = ready + (secs - (ready - t0)) / 2
walls, c0 = [], cpu()
while time.monotonic() < half:
    t = time.perf_counter()
    text = requests.get(base + "/metrics", timeout=10).text
    walls.append(time.perf_counter() - t)
    time.sleep(0.05)
report("requests, new connection each", walls, c0, cpu())
open(path, "w").write(text)
# 2. as Prometheus scrapes: one keep-alive connection, gzip, OpenMetrics preferred, 50 ms apart
accept = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
          "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
conn = http.client.HTTPConnection("127.0.0.1", int(port), timeout=10)
walls, c0 = [], cpu()
while time.monotonic() - t0 < secs:
    t = time.perf_counter()
    conn.request("GET", "/metrics", headers={"Accept": accept, "Accept-Encoding": "gzip"})
    resp = conn.getresponse()
    resp.read()
    walls.append(time.perf_counter() - t)
    assert resp.status == 200, resp.status
    time.sleep(0.05)
report("keep-alive, gzip, OpenMetrics: as Prometheus scrapes", walls, c0, cpu())
mem = proc.memory_full_info()
print(f"exporter rss {mem.rss / 2**20:.1f} MiB, uss {mem.uss / 2**20:.1f} MiB")
sys.path.insert(0, "bench")
from bench_malloc import largest_mappings  # where the RSS is
for where, mib in largest_mappings(proc.pid, 12).items():
    print(f"rss {mib:6.1f} MiB {where}")
for line in text.splitlines():
    if line.startswith(("gpu_health_exporter_collector_", "gpu_devices", "gpu_read_success", "gpu_lost", "gpu_info")):
        print(line)
EOF
  echo "scrape rc=$?" >> "$OUT/scrape_$name.txt"
  # The serving process's memory after the scrapes (the python child of `timeout`).
  local child
  child=$(pgrep -P "$pid" | head -1)
  grep -E '^(VmRSS|VmHWM|Threads)' "/proc/${child:-$pid}/status" | tr -s ' \t' ' ' | sed 's/^/exporter /' \
    >> "$OUT/scrape_$name.txt"
  kill -TERM "$pid" 2>/dev/null
  wait "$pid"
  echo "exporter exit=$?" >> "$OUT/scrape_$name.txt"
  if command -v promtool >/dev/null; then
    promtool check metrics < "$OUT/metrics_$name.txt" > "$OUT/promtool_$name.txt" 2>&1
    echo "promtool rc=$?" >> "$OUT/promtool_$name.txt"
  else
    python3 -c 'from prometheus_client.parser import text_string_to_metric_families as p; import sys; n=sum(len(f.samples) for f in p(open(sys.argv[1]).read())); print("parsed", n, "samples (no promtool here)")' \
      "$OUT/metrics_$name.txt" > "$OUT/promtool_$name.txt" 2>&1
  fi
  cat "$OUT/scrape_$name.txt" | head -40
  cat "$OUT/promtool_$name.txt"
}

step "exporter, GPU collector only, real NVML (10 s)"
serve gpu 10 --collectors gpu
step "exporter, all collectors enabled by default (8 s)"
serve all 8
step "RSS with and without the malloc trim, and the floor (python3, pynvml, nvmlInit)"
timeout 90 python3 bench/bench_malloc.py > "$OUT/bench_malloc.txt" 2>&1
echo "bench rc=$?" | tee -a "$OUT/bench_malloc.txt"
cat "$OUT/bench_malloc.txt"

step "nvidia-smi --query-gpu, the ad-hoc health script's way (20 runs)"
python3 - > "$OUT/nvidia_smi_timing.txt" 2>&1 <<'EOF2'
import statistics, subprocess, time
q = ("index,uuid,pci.bus_id,temperature.gpu,temperature.memory,power.draw,clocks.sm,clocks.mem,"
     "utilization.gpu,memory.used,ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total,"
     "ecc.errors.corrected.aggregate.total,ecc.errors.uncorrected.aggregate.total,pcie.link.gen.current,"
     "pcie.link.width.current,clocks_event_reasons.active")
walls = []
for _ in range(20):
    t = time.perf_counter()
    subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True, check=False)
    walls.append(time.perf_counter() - t)
print(f"nvidia-smi --query-gpu ({q.count(',') + 1} fields): median {statistics.median(walls)*1e3:.1f} ms, "
      f"min {min(walls)*1e3:.1f} ms over {len(walls)} runs")
EOF2
cat "$OUT/nvidia_smi_timing.txt"

step "GPU bench, real NVML"
timeout 90 python3 bench/bench_gpu.py --real --scrapes 300 --naive-scrapes 30 --whole-scrapes 60 --json "$OUT/bench_real.json" \
  > "$OUT/bench_real.txt" 2>&1
echo "bench rc=$?" | tee -a "$OUT/bench_real.txt"
tail -60 "$OUT/bench_real.txt"

if [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" = "1" ]; then
  step "GPU bench, real NVML, GPU 0 presented as 8 GPUs (all calls serialised on one GPU: worst case)"
  timeout 40 python3 bench/bench_gpu.py --real --replicate 8 --scrapes 1000 --naive-scrapes 5 --skip-whole \
    --json "$OUT/bench_real_x8.json" > "$OUT/bench_real_x8.txt" 2>&1
  echo "bench rc=$?" | tee -a "$OUT/bench_real_x8.txt"
  grep -A6 '"gpu_collector_' "$OUT/bench_real_x8.txt"
fi

step "GPU bench, simulated p5.48xlarge with captured latencies (same host)"
timeout 100 python3 bench/bench_gpu.py --scrapes 1000 --all-scrapes 200 --naive-scrapes 20 --whole-scrapes 60 --json "$OUT/bench_sim.json" \
  > "$OUT/bench_sim.txt" 2>&1
echo "bench rc=$?" | tee -a "$OUT/bench_sim.txt"
grep -E '"(median_ms|cpu_ms_per_scrape|exporter_cpu_ms_per_scrape|peak_rss_mib|after_1000)"|^ "' "$OUT/bench_sim.txt" | head -40

step "nvidia-smi -q summary"
nvidia-smi -q > "$OUT/nvidia_smi_q.txt" 2>&1
grep -E "Product Name|Driver Version|CUDA Version|Bus Id|Serial Number|VBIOS|GPU Current Temp|Power Draw|Current Power Limit|Volatile|Aggregate|Remapped|Pending|Retired|Link Width|PCIe Generation|Replays" \
  "$OUT/nvidia_smi_q.txt" | head -60
step done
ls -la "$OUT"
# one file with everything, for callers that fetch only a few files
tar -C "$OUT" -czf /tmp/real_gpu_all.tgz . && mv /tmp/real_gpu_all.tgz "$OUT/all.tgz"
