"""Soak and abuse of the HTTP endpoint (issues 12 and 18): the exporter on a simulated
p5.48xlarge, all collectors, as a subprocess on 127.0.0.1 under an open-file limit of 1,024 (the
usual default), reading a kernel-log file this script writes.

    PYTHONPATH=. python3 bench/soak.py [--duration 60] [--scrapers 50] [--idle 1000]
                                      [--scrapes 20000] [--abuse 120] [--json OUT.json]
    # the abuse phase alone (issue 18's faults), short:
    PYTHONPATH=. python3 bench/soak.py --abuse 60 --skip-load --skip-leak --skip-shutdown

Phases, each bounded in time and count, loopback only:
0. abuse (issue 18; `--abuse` seconds, 0 skips it): the exporter serves with basic auth (a
   bcrypt hash at cost 12). At once: a flood of wrong passwords (`--flood-rate` requests a second
   on new connections, half of them closed without reading the answer), `--pipeliners` clients
   that send 20 GETs with the right password on a 4 KiB receive buffer and never read (re-opened
   when the server closes them), the simulated node's kernel-log file rewritten every
   `--rewrite-every` seconds (copy, append one XID record per GPU, rename over it: what
   logrotate-like tools and a reopening reader meet), 4 scrapers with the right password and a
   /healthz prober. Records the scrapes with credentials that failed (goal 0), the slowest
   /healthz, the XIDs counted (sum of gpu_xid_errors_total) against the XID events written
   (goal: equal), and the RSS slope over the phase.
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
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.thread_cpu import thread_cpu  # noqa: E402
from tests.helpers import port_of, samples, value, wait_until_serving  # noqa: E402

HOST = "127.0.0.1"
HEADERS = {"Accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
           "Accept-Encoding": "gzip"}


def start(nofile: int, *extra: str, log: Path | None = None,
          names: Path | None = None) -> tuple[subprocess.Popen, int]:
    """The exporter on 127.0.0.1:0, once ready: the process and the port it took. `names`: run
    under bench/thread_cpu.py's wrapper, which writes the threads' names there."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, max(nofile, resource.getrlimit(
            resource.RLIMIT_NOFILE)[1])))

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # The log goes to a file: a pipe nobody reads would block the exporter once full (it logs
    # every XID it counts).
    err = open(log, "w") if log is not None else subprocess.DEVNULL  # noqa: SIM115 - the child keeps it
    from bench.thread_cpu import WRAPPER
    head = [sys.executable, "-c", WRAPPER, str(names)] if names else [sys.executable, "-m", "exporter"]
    proc = subprocess.Popen([*head, "--simulate", "p5.48xlarge", *extra,
                             "--listen", f"{HOST}:0", "--log-level", "warning"],
                            env=env, preexec_fn=limit, stdout=subprocess.DEVNULL, stderr=err, text=True)
    try:
        port = port_of(proc)  # it logs nothing at warning
        wait_until_serving(f"http://{HOST}:{port}/readyz", proc, 60, "exporter")
    except (AssertionError, RuntimeError) as e:
        raise RuntimeError(f"{e}\n{log.read_text()[-4000:] if log else ''}") from None
    return proc, port


class Scraper(threading.Thread):
    """Scrapes /metrics on one kept-alive connection until `stop` is set or `budget` runs out."""

    def __init__(self, port: int, stop: threading.Event, budget: list[int] | None = None,
                 lock: threading.Lock | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(daemon=True)
        self.port, self.stop, self.budget, self.lock = port, stop, budget, lock
        self.headers = headers or HEADERS
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
        conn.request("GET", "/metrics", headers=self.headers)
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
                key = str(e) if type(e) is OSError else type(e).__name__  # "status 503": which answer
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
    proc, port = start(nofile, "--scenario", "gpu-nvml-hang")
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


USER, PASSWORD = "prometheus", "soak-password"
# Cycled per rewrite: one (GPU, XID) pair recurs len(XIDS) rewrites apart, well beyond the XID
# counter's 10 s merge window at the default --rewrite-every, so every record written is an event.
XIDS = (13, 31, 43, 45, 62, 64, 68, 94)


def basic(user: str, password: str) -> str:
    import base64

    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


class KmsgRewriter(threading.Thread):
    """Every `every` seconds: copy the kernel-log file, append one XID record per GPU to the
    copy, rename the copy over the file. Counts the XID events written."""

    def __init__(self, path: Path, every: float, gpus: int = 8) -> None:
        super().__init__(daemon=True)
        self.path, self.every, self.gpus = path, every, gpus
        self.stop = threading.Event()
        self.seq = 0
        self.written = 0
        self.rewrites = 0
        path.write_text(self._record(6, "Linux version 6.8.0-1021-aws (soak)"))

    def _record(self, prio: int, message: str) -> str:
        rec = f"{prio},{self.seq},{int(time.monotonic() * 1e6)},-;{message}\n"
        self.seq += 1
        return rec

    def run(self) -> None:
        from exporter.tools.simulate.kmsg import xid_line

        while not self.stop.wait(self.every):
            xid = XIDS[self.rewrites % len(XIDS)]
            tmp = self.path.with_name(self.path.name + ".new")
            shutil.copyfile(self.path, tmp)
            with open(tmp, "a") as f:
                f.write("".join(self._record(3, xid_line(g, xid, f"soak event {self.rewrites}", pid=4242,
                                                         name="soak")) for g in range(self.gpus)))
            os.replace(tmp, self.path)
            self.written += self.gpus
            self.rewrites += 1


class WrongPasswords(threading.Thread):
    """`rate` requests a second with a wrong password, each on a new connection; every other one
    is closed at once without reading the answer."""

    def __init__(self, port: int, rate: float) -> None:
        super().__init__(daemon=True)
        self.port, self.rate = port, rate
        self.stop = threading.Event()
        self.sent = 0
        self.answers: dict[str, int] = {}
        self.request = (f"GET /metrics HTTP/1.1\r\nHost: soak\r\nAuthorization: {basic(USER, 'guess')}\r\n"
                        "\r\n").encode()

    def _one(self, read: bool) -> None:
        try:
            with socket.create_connection((HOST, self.port), timeout=5) as s:
                s.sendall(self.request)
                self.sent += 1
                if read:
                    status = s.recv(64).split(b" ")[1:2]
                    key = status[0].decode() if status else "closed"
                    self.answers[key] = self.answers.get(key, 0) + 1
        except OSError as e:
            key = type(e).__name__
            self.answers[key] = self.answers.get(key, 0) + 1

    def run(self) -> None:
        t0, n = time.monotonic(), 0
        readers: list[threading.Thread] = []
        while not self.stop.is_set():
            delay = t0 + n / self.rate - time.monotonic()
            if delay > 0 and self.stop.wait(delay):
                break
            if n % 2:
                self._one(False)
            else:  # a reader waits for its answer without holding up the flood
                t = threading.Thread(target=self._one, args=(True,), daemon=True)
                t.start()
                readers.append(t)
                readers = [r for r in readers if r.is_alive()]
            n += 1
        for r in readers:
            r.join(10)


class Pipeliners(threading.Thread):
    """`n` connections that send 20 GETs (with the right password) on a 4 KiB receive buffer and
    never read; one the server closes is opened again."""

    def __init__(self, port: int, n: int) -> None:
        super().__init__(daemon=True)
        self.port, self.n = port, n
        self.stop = threading.Event()
        self.opened = 0
        self.request = (f"GET /metrics HTTP/1.1\r\nHost: soak\r\nAccept-Encoding: identity\r\n"
                        f"Authorization: {basic(USER, PASSWORD)}\r\n\r\n").encode() * 20

    def _open(self) -> socket.socket | None:
        s = socket.socket()
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.settimeout(5)
            s.connect((HOST, self.port))
            s.sendall(self.request)
            self.opened += 1
            return s
        except OSError:
            s.close()
            return None

    def run(self) -> None:
        import select

        socks = [self._open() for _ in range(self.n)]
        while not self.stop.wait(0.5):
            for i, s in enumerate(socks):
                gone = s is None
                if s is not None:
                    p = select.poll()
                    p.register(s, select.POLLRDHUP | select.POLLERR | select.POLLHUP)
                    gone = bool(p.poll(0))
                if gone:
                    if s is not None:
                        s.close()
                    socks[i] = self._open()
        for s in socks:
            if s is not None:
                s.close()


def healthz_prober(port: int, stop: threading.Event, out: dict) -> None:
    worst, failed, n = 0.0, 0, 0
    while not stop.wait(0.5):
        t = time.perf_counter()
        try:
            conn = http.client.HTTPConnection(HOST, port, timeout=10)
            conn.request("GET", "/healthz")
            ok = conn.getresponse().status == 200
            conn.close()
        except (OSError, http.client.HTTPException):
            ok = False
        worst = max(worst, time.perf_counter() - t)
        failed += not ok
        n += 1
    out.update(healthz_probes=n, healthz_failed=failed, healthz_max_ms=round(worst * 1e3, 1))


def xids_counted(port: int, auth: str) -> float:
    conn = http.client.HTTPConnection(HOST, port, timeout=15)
    conn.request("GET", "/metrics", headers={"Authorization": auth})
    text = conn.getresponse().read().decode()
    conn.close()
    return sum(v for (name, _), v in samples(text).items() if name == "gpu_xid_errors_total")


def rss_slope_kib_per_min(rows: list[tuple[int, float, int, int]]) -> float | None:
    rows = rows[len(rows) // 4:]  # after the warm-up; one row a second
    if len(rows) < 3:
        return None
    return round(statistics.linear_regression(range(len(rows)), [r[1] for r in rows]).slope * 1024 * 60, 1)


def abuse_phase(args: argparse.Namespace, tmp: Path) -> dict:
    import bcrypt

    web = tmp / "web.yml"
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(12)).decode()
    web.write_text(f"basic_auth_users:\n  {USER}: '{hashed}'\n")
    kmsg = tmp / "kmsg"
    writer = KmsgRewriter(kmsg, args.rewrite_every)
    names = tmp / "threads.json"
    proc, port = start(args.nofile, "--web.config.file", str(web), "--kmsg-file", str(kmsg),
                       log=tmp / "exporter-abuse.log", names=names)
    auth = basic(USER, PASSWORD)
    try:
        stop = threading.Event()
        scrapers = [Scraper(port, stop, headers={**HEADERS, "Authorization": auth}) for _ in range(4)]
        flood = WrongPasswords(port, args.flood_rate)
        pipes = Pipeliners(port, args.pipeliners)
        health: dict = {}
        prober = threading.Thread(target=healthz_prober, args=(port, stop, health), daemon=True)
        sampler = Sampler(proc.pid, lambda: sum(len(s.latencies) for s in scrapers))
        exporter = psutil.Process(proc.pid)
        cpu0, own0 = exporter.cpu_times(), resource.getrusage(resource.RUSAGE_SELF)
        threads0 = thread_cpu(proc.pid)
        t0 = time.monotonic()
        for t in (sampler, writer, *scrapers, prober):
            t.start()
        time.sleep(2)  # the scrapers' credentials are cached before the flood starts
        flood.start()
        pipes.start()
        time.sleep(max(0.0, args.abuse - 2))
        for t in (flood, pipes, writer):
            t.stop.set()
        flood.join(30)
        pipes.join(10)
        writer.join(10)
        flood_end = time.monotonic()
        cpu1, own1 = exporter.cpu_times(), resource.getrusage(resource.RUSAGE_SELF)
        by_name: dict[str, float] = {}
        named = {int(k): v for k, v in json.loads(names.read_text()).items()} if names.exists() else {}
        for tid, t in thread_cpu(proc.pid).items():
            name = named.get(tid, "other").rstrip("0123456789_")
            by_name[name] = round(by_name.get(name, 0.0) + t - threads0.get(tid, 0.0), 2)
        cpu = {"exporter_cpu_s": round(cpu1.user + cpu1.system - cpu0.user - cpu0.system, 1),
               "soak_client_cpu_s": round(own1.ru_utime + own1.ru_stime - own0.ru_utime - own0.ru_stime, 1),
               "load_average_1m": round(os.getloadavg()[0], 1),
               "exporter_cpu_s_by_thread": dict(sorted(by_name.items(), key=lambda x: -x[1]))}
        # The first scrape with credentials after the flood: how long it takes.
        t = time.monotonic()
        try:
            xids_counted(port, auth)
            after_flood_s = round(time.monotonic() - t, 2)
        except (OSError, http.client.HTTPException) as e:
            after_flood_s = f"failed: {type(e).__name__}"
        stop.set()
        for s in scrapers:
            s.join(30)
        prober.join(15)
        sampler.stop.set()
        sampler.join(5)
        # Wait until the exporter has read the last records (the count reaches what was written
        # and stays, or stops moving), bounded.
        counted, deadline, last = 0.0, time.monotonic() + 30, None
        while time.monotonic() < deadline:
            counted = xids_counted(port, auth)
            if counted == last and counted >= writer.written:
                break
            last = counted
            time.sleep(1)
        lat = [x for s in scrapers for x in s.latencies]
        errors: dict[str, int] = {}
        for s in scrapers:
            for k, v in s.errors.items():
                errors[k] = errors.get(k, 0) + v
        rows = sampler.rows
        return {"duration_s": round(flood_end - t0, 1), **cpu, "flood_rate_per_s": args.flood_rate,
                "wrong_password_requests": flood.sent, "wrong_password_answers": flood.answers,
                "pipelining_connections_opened": pipes.opened,
                "scrapes_with_credentials": len(lat),
                "scrapes_with_credentials_failed": sum(s.failures for s in scrapers), "errors": errors,
                "p50_ms": pct(lat, 0.5), "p99_ms": pct(lat, 0.99), "max_ms": pct(lat, 1.0),
                "scrape_after_flood_s": after_flood_s, **health,
                "kmsg_rewrites": writer.rewrites, "xid_events_written": writer.written,
                "xids_counted": counted, "xids_exact": counted == writer.written,
                "rss_mib_start": round(rows[0][1], 1) if rows else None,
                "rss_mib_end": round(rows[-1][1], 1) if rows else None,
                "rss_mib_max": round(max(r[1] for r in rows), 1) if rows else None,
                "rss_mib_last_half_max": round(max(r[1] for r in rows[len(rows) // 2:]), 1) if rows else None,
                "rss_slope_kib_per_min": rss_slope_kib_per_min(rows),
                "threads_max": max((r[2] for r in rows), default=None)}
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=60.0, help="load phase seconds (default 60)")
    p.add_argument("--scrapers", type=int, default=50, help="concurrent scrapers (default 50)")
    p.add_argument("--idle", type=int, default=1000, help="idle connections held (default 1000)")
    p.add_argument("--scrapes", type=int, default=20000, help="leak-phase scrapes (default 20000)")
    p.add_argument("--nofile", type=int, default=1024, help="the exporter's open-file limit (default 1024)")
    p.add_argument("--skip-shutdown", action="store_true", help="skip the SIGTERM-with-hung-NVML phase")
    p.add_argument("--skip-load", action="store_true", help="skip the load phase")
    p.add_argument("--skip-leak", action="store_true", help="skip the leak phase")
    p.add_argument("--abuse", type=float, default=120.0,
                   help="abuse phase seconds: wrong passwords, pipeliners, kernel log rewritten (0 skips it)")
    p.add_argument("--flood-rate", type=float, default=100.0, help="wrong passwords a second (default 100)")
    p.add_argument("--pipeliners", type=int, default=600,
                   help="clients that pipeline 20 GETs and never read (default 600)")
    p.add_argument("--rewrite-every", type=float, default=3.0,
                   help="seconds between rewrites of the kernel-log file (default 3)")
    p.add_argument("--json", metavar="FILE", help="also write the results here")
    args = p.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = max(args.idle, args.pipeliners) + args.scrapers + 200
    if soft < need:  # this client holds the idle connections
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, need), hard))
    out: dict = {"python": sys.version.split()[0], "cpus": psutil.cpu_count(), "nofile": args.nofile}
    tmp = Path(tempfile.mkdtemp(prefix="ghe-soak-"))
    try:
        if args.abuse > 0:
            out["abuse"] = abuse_phase(args, tmp)
            print(json.dumps({"abuse": out["abuse"]}), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not (args.skip_load and args.skip_leak):
        proc, port = start(args.nofile)
        try:
            if not args.skip_load:
                out["load"] = load_phase(port, proc, args)
                print(json.dumps({"load": out["load"]}), flush=True)
            if not args.skip_leak:
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
