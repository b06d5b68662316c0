"""Soak and abuse of the HTTP endpoint (issue 12): the exporter on a simulated p5.48xlarge, all
collectors, as a subprocess on 127.0.0.1 under an open-file limit of 1,024 (the usual default).

    PYTHONPATH=. python3 bench/soak.py [--duration 60] [--scrapers 50] [--idle 1000]
                                      [--scrapes 20000] [--json OUT.json]

Phases, each bounded in time and count, loopback only:
1. load: `--idle` idle connections held open (re-opened as the server drops them after its
   header timeout or evicts them at its connection limit), one slow-header client sending a
   request head a byte a second, and `--scrapers` threads scraping /metrics back to back (keep-alive,
   gzip, OpenMetrics, as Prometheus asks) for `--duration` seconds;
2. leak: `--scrapes` more scrapes from 4 threads; RSS and threads sampled every second;
3. shutdown: a second exporter with the gpu-nvml-hang scenario (every NVML call on GPU 3 blocks
   for 600 s), SIGTERM once the hang shows in a scrape; time to exit (capped at 30 s).

Reports failed scrapes, p50/p99 scrape latency, scrapes served while the idle connections were
held, when the slow-header client was dropped, the exporter's RSS slope over the leak phase
(KiB per 1,000 scrapes, fitted after the first quarter), its threads and open fds, and the
SIGTERM-to-exit time.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers import free_port, value, wait_until_serving  # noqa: E402

HOST = "127.0.0.1"
HEADERS = {"Accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
           "Accept-Encoding": "gzip"}


def start(port: int, nofile: int, *extra: str) -> subprocess.Popen:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, max(nofile, resource.getrlimit(
            resource.RLIMIT_NOFILE)[1])))

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "--simulate", "p5.48xlarge", *extra,
                             "--listen", f"{HOST}:{port}", "--log-level", "warning"],
                            env=env, preexec_fn=limit, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    wait_until_serving(f"http://{HOST}:{port}/readyz", proc, 60, "exporter")
    return proc


class Scraper(threading.Thread):
    """Scrapes /metrics on one kept-alive connection until `stop` is set or `budget` runs out."""

    def __init__(self, port: int, stop: threading.Event, budget: list[int] | None = None,
                 lock: threading.Lock | None = None) -> None:
        super().__init__(daemon=True)
        self.port, self.stop, self.budget, self.lock = port, stop, budget, lock
        self.latencies: list[float] = []
        self.failures = 0
        self.retried = 0
        self.errors: dict[str, int] = {}

    def _take(self) -> bool:
        if self.budget is None:
            return not self.stop.is_set()
        with self.lock:
            if self.budget[0] <= 0:
                return False
            self.budget[0] -= 1
            return True

    def _get(self, conn: http.client.HTTPConnection) -> None:
        conn.request("GET", "/metrics", headers=HEADERS)
        r = conn.getresponse()
        body = r.read()
        if r.status != 200 or not body:
            raise OSError(f"status {r.status}")

    def run(self) -> None:
        conn = None
        while self._take():
            t = time.perf_counter()
            try:
                if conn is not None:
                    try:
                        self._get(conn)
                    except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                        # The server closed the kept-alive connection before answering (idle
                        # eviction): retry once on a new one, as Go's HTTP client (Prometheus) does.
                        self.retried += 1
                        conn.close()
                        conn = None
                if conn is None:
                    conn = http.client.HTTPConnection(HOST, self.port, timeout=15)
                    self._get(conn)
                self.latencies.append(time.perf_counter() - t)
            except (OSError, http.client.HTTPException) as e:
                self.failures += 1
                key = type(e).__name__
                self.errors[key] = self.errors.get(key, 0) + 1
                if conn is not None:
                    conn.close()
                conn = None
        if conn is not None:
            conn.close()


class Sampler(threading.Thread):
    """RSS, threads and open fds of the exporter every second."""

    def __init__(self, pid: int, count: callable) -> None:  # noqa: ANN001
        super().__init__(daemon=True)
        self.proc = psutil.Process(pid)
        self.count = count
        self.stop = threading.Event()
        self.rows: list[tuple[int, float, int, int]] = []  # (scrapes so far, RSS MiB, threads, fds)

    def run(self) -> None:
        while not self.stop.wait(1.0):
            with self.proc.oneshot():
                self.rows.append((self.count(), self.proc.memory_info().rss / 2**20, self.proc.num_threads(),
                                  self.proc.num_fds()))


def slope_kib_per_1000(rows: list[tuple[int, float, int, int]]) -> float | None:
    rows = rows[len(rows) // 4:]  # after the warm-up
    if len(rows) < 3 or rows[-1][0] == rows[0][0]:
        return None
    xs = [r[0] for r in rows]
    ys = [r[1] for r in rows]
    return round(statistics.linear_regression(xs, ys).slope * 1024 * 1000, 2)


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(len(xs) * p))] * 1e3, 2) if xs else float("nan")


def slow_header_client(port: int, out: dict) -> None:
    """Send a request head a byte a second; record when the server closes the connection."""
    s = socket.create_connection((HOST, port), timeout=1)
    t0 = time.monotonic()
    try:
        for b in b"GET /metrics HTTP/1.1\r\nHost: soak\r\nX-Slow: " + b"a" * 200:
            s.send(bytes([b]))
            try:
                if s.recv(1) == b"":
                    break
            except TimeoutError:
                pass
            except OSError:
                break
            if time.monotonic() - t0 > 120:
                break
    except OSError:
        pass
    out["slow_header_dropped_after_s"] = round(time.monotonic() - t0, 1)
    s.close()


class IdleHolder(threading.Thread):
    """Keeps `n` idle connections open: the server drops them after its header timeout or evicts
    them at its connection limit, so every half second the closed ones are opened again."""

    def __init__(self, port: int, n: int) -> None:
        super().__init__(daemon=True)
        self.port, self.n = port, n
        self.stop = threading.Event()
        self.socks: list[socket.socket] = []
        self.reopened = 0
        self.open_failures = 0

    def _open(self) -> socket.socket | None:
        try:
            s = socket.create_connection((HOST, self.port), timeout=5)
            s.setblocking(False)
            return s
        except OSError:
            self.open_failures += 1
            return None

    def run(self) -> None:
        self.socks = [s for s in (self._open() for _ in range(self.n)) if s is not None]
        while not self.stop.wait(0.5):
            for i, s in enumerate(self.socks):
                try:
                    alive = s.recv(1) != b""
                except BlockingIOError:
                    alive = True
                except OSError:
                    alive = False
                if not alive:
                    s.close()
                    new = self._open()
                    if new is not None:
                        self.socks[i] = new
                        self.reopened += 1
        for s in self.socks:
            s.close()


def load_phase(port: int, proc: subprocess.Popen, args: argparse.Namespace) -> dict:
    idle = IdleHolder(port, args.idle)
    idle.start()
    time.sleep(2)  # let it open them all
    slow: dict = {}
    slow_thread = threading.Thread(target=slow_header_client, args=(port, slow), daemon=True)
    slow_thread.start()
    stop = threading.Event()
    scrapers = [Scraper(port, stop) for _ in range(args.scrapers)]
    sampler = Sampler(proc.pid, lambda: sum(len(s.latencies) for s in scrapers))
    sampler.start()
    t0 = time.monotonic()
    for s in scrapers:
        s.start()
    time.sleep(args.duration)
    stop.set()
    for s in scrapers:
        s.join(30)
    wall = time.monotonic() - t0
    sampler.stop.set()
    idle.stop.set()
    idle.join(10)
    slow_thread.join(5)
    lat = [x for s in scrapers for x in s.latencies]
    errors: dict[str, int] = {}
    for s in scrapers:
        for k, v in s.errors.items():
            errors[k] = errors.get(k, 0) + v
    fds = [r[3] for r in sampler.rows]
    return {"scrapers": args.scrapers, "duration_s": round(wall, 1), "idle_held_by_client": len(idle.socks),
            "idle_reopened": idle.reopened, "idle_open_failures": idle.open_failures,
            "scrapes": len(lat), "failed": sum(s.failures for s in scrapers), "errors": errors,
            "retried_on_new_connection": sum(s.retried for s in scrapers),
            "scrapes_per_s": round(len(lat) / wall, 1), "p50_ms": pct(lat, 0.5), "p99_ms": pct(lat, 0.99),
            "max_ms": pct(lat, 1.0), **slow,
            "threads_max": max((r[2] for r in sampler.rows), default=None),
            "open_fds_min": min(fds, default=None), "open_fds_max": max(fds, default=None),
            "rss_mib_end": round(sampler.rows[-1][1], 1) if sampler.rows else None}


def leak_phase(port: int, proc: subprocess.Popen, n: int) -> dict:
    budget, lock, stop = [n], threading.Lock(), threading.Event()
    scrapers = [Scraper(port, stop, budget, lock) for _ in range(4)]
    sampler = Sampler(proc.pid, lambda: sum(len(s.latencies) + s.failures for s in scrapers))
    sampler.start()
    t0 = time.monotonic()
    for s in scrapers:
        s.start()
    deadline = t0 + 1800  # bounded even on a very slow machine
    for s in scrapers:
        s.join(max(0.0, deadline - time.monotonic()))
    stop.set()
    budget[0] = 0
    sampler.stop.set()
    sampler.join(5)
    lat = [x for s in scrapers for x in s.latencies]
    rows = sampler.rows
    return {"scrapes": len(lat), "failed": sum(s.failures for s in scrapers),
            "duration_s": round(time.monotonic() - t0, 1), "p50_ms": pct(lat, 0.5), "p99_ms": pct(lat, 0.99),
            "rss_mib_start": round(rows[0][1], 1) if rows else None,
            "rss_mib_end": round(rows[-1][1], 1) if rows else None,
            "rss_slope_kib_per_1000_scrapes": slope_kib_per_1000(rows),
            "threads_start": rows[0][2] if rows else None, "threads_end": rows[-1][2] if rows else None,
            "open_fds_end": rows[-1][3] if rows else None}


def shutdown_phase(nofile: int) -> dict:
    port = free_port()
    proc = start(port, nofile, "--scenario", "gpu-nvml-hang")
    url = f"http://{HOST}:{port}/metrics"
    import requests

    deadline = time.monotonic() + 60
    hung = False
    while time.monotonic() < deadline and not hung:
        try:
            text = requests.get(url, timeout=15).text
            hung = value(text, "gpu_read_success", gpu="3") == 0
        except (requests.RequestException, AssertionError):
            pass
        time.sleep(0.5)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(30)
        took = round(time.monotonic() - t0, 2)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        rc, took = None, "> 30 (killed)"
    return {"hang_seen_in_scrape": hung, "sigterm_to_exit_s": took, "exit_status": rc}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=60.0, help="load phase seconds (default 60)")
    p.add_argument("--scrapers", type=int, default=50, help="concurrent scrapers (default 50)")
    p.add_argument("--idle", type=int, default=1000, help="idle connections held (default 1000)")
    p.add_argument("--scrapes", type=int, default=20000, help="leak-phase scrapes (default 20000)")
    p.add_argument("--nofile", type=int, default=1024, help="the exporter's open-file limit (default 1024)")
    p.add_argument("--skip-shutdown", action="store_true", help="skip the SIGTERM-with-hung-NVML phase")
    p.add_argument("--json", metavar="FILE", help="also write the results here")
    args = p.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = args.idle + args.scrapers + 200
    if soft < need:  # this client holds the idle connections
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, need), hard))
    port = free_port()
    proc = start(port, args.nofile)
    out: dict = {"python": sys.version.split()[0], "cpus": psutil.cpu_count(), "nofile": args.nofile}
    try:
        out["load"] = load_phase(port, proc, args)
        print(json.dumps({"load": out["load"]}), flush=True)
        out["leak"] = leak_phase(port, proc, args.scrapes)
        print(json.dumps({"leak": out["leak"]}), flush=True)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    if not args.skip_shutdown:
        out["shutdown"] = shutdown_phase(args.nofile)
        print(json.dumps({"shutdown": out["shutdown"]}), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
