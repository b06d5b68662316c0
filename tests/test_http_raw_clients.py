"""The HTTP endpoint (auth, TLS, slow and abusive clients, collect[]) tried from outside: the exporter is
started from its command line (`python -m exporter --simulate p5.48xlarge --web.config.file F`)
and attacked with raw sockets on 127.0.0.1. Nothing here
imports the server; every wait has a deadline; each flood is bounded in count and time.

Scrapes with credentials open a new connection each time (as Prometheus does after its idle
connection was closed); floods come from 127.0.0.1 like the scraper, unless a test spreads them
over other loopback addresses (127.0.0.0/8 is all loopback on Linux).
"""

from __future__ import annotations

import base64
import os
import selectors
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import bcrypt
import pytest

from tests.helpers import HANG_GUARD_S, START_HANG_GUARD_S, served_base

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "correct horse battery staple"
SECOND_PASSWORD = "second-user-secret"


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


GOOD = _basic("prometheus", PASSWORD)


def _request(path: str, auth: str | None = None, extra: str = "", close: bool = True) -> bytes:
    lines = [f"GET {path} HTTP/1.1", "Host: 127.0.0.1"]
    if auth is not None:
        lines.append(f"Authorization: {auth}")
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n" + extra + "\r\n").encode("latin-1")


def get(port: int, path: str, auth: str | None = None, src: str = "127.0.0.1", timeout: float = 5.0,
        raw: bytes | None = None, tls: bool = False) -> tuple[int, bytes, bytes]:
    """One request on a new connection: (status, head, body). Raises OSError on a reset/timeout."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(src, 0))
    if tls:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        sock = ctx.wrap_socket(sock)
    with sock:
        sock.sendall(raw if raw is not None else _request(path, auth))
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionResetError(f"closed before a response head ({data[:80]!r})")
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = None
        for line in head.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            if k.strip().lower() == b"content-length":
                length = int(v)
        while length is not None and len(body) < length:
            chunk = sock.recv(1 << 20)
            if not chunk:
                raise ConnectionResetError("closed in the body")
            body += chunk
        return status, head, body


def _wait_for(cond, what: str, timeout: float) -> float:
    """Poll cond() (exceptions count as False) until true; the seconds it took."""
    t0 = time.monotonic()
    while True:
        try:
            if cond():
                return time.monotonic() - t0
        except OSError:
            pass
        assert time.monotonic() - t0 < timeout, f"{what}: not within {timeout} s"
        time.sleep(0.05)


class Exporter:
    """The exporter's CLI on 127.0.0.1; its output goes to a file (a pipe nobody reads can block)."""

    def __init__(self, tmp: Path, web: str, tls: bool = False) -> None:
        self.tls = tls
        (tmp / "web.yml").write_text(web)
        self.log = tmp / "exporter.log"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "exporter", "--simulate", "p5.48xlarge", "--web.config.file",
                 str(tmp / "web.yml"), "--listen", "127.0.0.1:0",
                 "--path.state-dir", str(tmp / "state")],
                env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            self.port = int(served_base(self.log, self.proc).rsplit(":", 1)[1])
            _wait_for(lambda: self.proc.poll() is None and get(self.port, "/readyz", tls=tls)[0] == 200
                      or self._died(), "exporter ready", 60)
        except BaseException:
            self.stop()
            raise

    def _died(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"exporter exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
        return False

    def get(self, path: str, auth: str | None = None, **kw) -> tuple[int, bytes, bytes]:
        return get(self.port, path, auth, tls=self.tls, **kw)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
                raise AssertionError("exporter ignored SIGTERM") from None


FRESH_USERS = [f"grafana{i}" for i in range(5)]  # each logs in for the first time after a flood


@pytest.fixture(scope="module")
def exporter(tmp_path_factory):
    """One exporter for the module (starting one costs seconds of a loaded machine's CPU): the
    tests run in file order, each flood from 127.0.0.1 after the ones before it, and each first
    login after a flood uses a user of its own."""
    users = {"prometheus": bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(12)).decode()}
    second = bcrypt.hashpw(SECOND_PASSWORD.encode(), bcrypt.gensalt(10)).decode()
    users.update({u: second for u in FRESH_USERS})
    web = "basic_auth_users:\n" + "".join(f"  {u}: '{h}'\n" for u, h in users.items())
    ex = Exporter(tmp_path_factory.mktemp("raw-clients"), web)
    try:
        yield ex
    finally:
        ex.stop()


class Flood(threading.Thread):
    """Opens `n` connections spread evenly over `seconds` (0: all at once), each sending
    make(i); reads each answer's status line unless `leave` (send, then close at once).
    `statuses` counts what came back ('reset', 'none' for nothing within `read_s`)."""

    def __init__(self, port: int, make, n: int, seconds: float, leave: bool = False,
                 read_s: float = 20.0, sources: int = 1) -> None:
        super().__init__(daemon=True)
        self.port, self.make, self.n, self.seconds, self.leave = port, make, n, seconds, leave
        self.read_s, self.sources = read_s, sources
        self.statuses: Counter = Counter()
        self.sent_at: float | None = None  # when the last request went out: the flood's end
        self.done = threading.Event()

    def run(self) -> None:
        sel = selectors.DefaultSelector()
        start = time.monotonic()
        pending: dict[socket.socket, bytes] = {}
        try:
            for i in range(self.n):
                due = start + (self.seconds * i / self.n if self.n else 0)
                self._pump(sel, pending, max(0.0, due - time.monotonic()))
                k = i % self.sources
                src = "127.0.0.1" if self.sources == 1 else f"127.0.{1 + k // 250}.{1 + k % 250}"
                try:
                    s = socket.create_connection(("127.0.0.1", self.port), timeout=5, source_address=(src, 0))
                    s.sendall(self.make(i))
                except OSError:
                    self.statuses["refused"] += 1
                    continue
                if self.leave:
                    s.close()
                    self.statuses["left"] += 1
                else:
                    s.setblocking(False)
                    pending[s] = b""
                    sel.register(s, selectors.EVENT_READ)
            self.sent_at = time.monotonic()
            deadline = self.sent_at + self.read_s
            while pending and time.monotonic() < deadline:
                self._pump(sel, pending, min(0.2, deadline - time.monotonic()))
            for s in list(pending):
                self.statuses["none"] += 1
                sel.unregister(s)
                s.close()
        finally:
            sel.close()
            self.done.set()

    def _pump(self, sel, pending, timeout: float) -> None:
        for key, _ in sel.select(timeout):
            s = key.fileobj
            try:
                chunk = s.recv(4096)
            except BlockingIOError:
                continue
            except OSError:
                chunk, pending[s] = b"", b"reset"
            data = pending[s] + chunk
            if b"\r\n" in data or not chunk:
                if data.startswith(b"HTTP/"):
                    self.statuses[data.split(b" ", 2)[1].decode()] += 1
                else:
                    self.statuses["reset" if data == b"reset" or not data else "garbage"] += 1
                sel.unregister(s)
                s.close()
                del pending[s]
            else:
                pending[s] = data


def _wrong(i: int) -> bytes:
    return _request("/metrics", _basic("prometheus", f"guess-{i}"))


BCRYPT_12_S = 0.25  # one bcrypt check at cost 12 on an idle core (exporter.web.webconfig)
_COST_12 = bcrypt.hashpw(b"probe", bcrypt.gensalt(12))


def host_slowness() -> float:
    """How many times slower than an idle core this host runs a bcrypt check now (at least 1).
    The 5 s bound after a flood is a backoff (2 s) and a few password checks: on a host loaded
    by other work each check takes longer, and so may the answer, in proportion, without the
    exporter doing anything wrong. Measured while the flood runs, so it sees the same load."""
    t = time.perf_counter()
    bcrypt.checkpw(b"wrong", _COST_12)
    return max(1.0, (time.perf_counter() - t) / BCRYPT_12_S)


def _after_flood_all_answer(ex: Exporter, flood: Flood, fresh_user: str | None = None) -> dict[str, float]:
    """Seconds after the flood's end at which each endpoint answered 200 (at most 5 s on an idle
    host, scaled by host_slowness on a loaded one)."""
    within = 5 * host_slowness()
    _wait_for(lambda: flood.sent_at is not None, "the flood to be sent", 60)
    end = flood.sent_at
    took = {}
    checks = [("healthz", lambda: ex.get("/healthz")[0] == 200),
              ("readyz", lambda: ex.get("/readyz")[0] == 200),
              ("metrics", lambda: ex.get("/metrics", GOOD)[0] == 200)]
    if fresh_user:  # credentials never verified before: the password check must get a turn
        checks.append(("metrics-new-user", lambda: ex.get("/metrics", _basic(fresh_user, SECOND_PASSWORD))[0]
                       == 200))
    for name, check in checks:
        left = max(0.01, within - (time.monotonic() - end))
        _wait_for(check, f"{name} after the flood (statuses {dict(flood.statuses)})", left)
        took[name] = round(time.monotonic() - end, 2)
    return took


def test_a_wrong_password_takes_as_long_for_an_unknown_user(exporter):
    """Median answer time of a wrong password for an unknown user and for a
    known one are the same order of magnitude (each try from its own address and after the
    previous answered, so nothing queues)."""
    assert exporter.get("/healthz")[0] == 200
    known, unknown = [], []
    for i in range(4):
        for user, into in (("prometheus", known), (f"nobody{i}", unknown)):
            t = time.monotonic()
            src = f"127.0.9.{10 + 2 * len(into) + (user == 'prometheus')}"
            status = exporter.get("/metrics", _basic(user, f"wrong-{i}"), src=src, timeout=20)[0]
            into.append(time.monotonic() - t)
            assert status == 401
    k, u = statistics.median(known), statistics.median(unknown)
    print(f"wrong password: known user {k * 1000:.1f} ms, unknown user {u * 1000:.1f} ms (medians)")
    assert 0.2 < u / k < 5, (known, unknown)


def test_every_malformed_or_over_long_credential_is_a_401_not_a_reset(exporter):
    """Neighbours of the wrong-password flood, one at a time from an address of their own: each gets 401 (with
    WWW-Authenticate), never a dropped connection; a password over bcrypt's 72 bytes included
    (the bcrypt library raises on it), also one that starts with the right password."""
    b64 = base64.b64encode
    headers = ["Basic !!!not-base64!!!", "Basic " + b64(b"no-colon-here").decode(), "Bearer abc.def",
               "Basic", "Basic " + "QUFB" * 2000, "basic " + b64(b"prometheus:\xff\xfe").decode(),
               "Basic " + b64(b"prometheus:" + b"x" * 100).decode(),
               "Basic " + b64(f"prometheus:{PASSWORD}".encode() + b"y" * 80).decode(),
               "Basic " + b64(("prometheus:" + "\u00e9" * 40).encode()).decode(),
               "Basic " + b64(b"nobody:" + b"z" * 300).decode(), "Basic " + b64(b":").decode(), ""]
    for i, h in enumerate(headers):
        raw = _request("/metrics", h) if h else _request("/metrics")
        status, head, _ = exporter.get("/metrics", raw=raw, src=f"127.0.8.{i + 1}", timeout=20)
        assert status == 401 and b"www-authenticate: basic" in head.lower(), (h[:40], status)
    assert exporter.get("/metrics", GOOD)[0] == 200


@pytest.mark.slow
@pytest.mark.parametrize("n, seconds, same, user",
                         [(300, 0.0, False, 0), (512, 3.0, False, 1), (300, 0.0, True, 2)],
                         ids=["300-at-once", "512-in-3s", "300-same-password"])
def test_wrong_password_flood_then_everything_answers_within_5s(exporter, n, seconds, same, user):
    """300 concurrent / 512 in 3 s wrong passwords (each different), then
    /healthz, /readyz, /metrics with credentials (cached before, and a user never seen) answer
    within 5 s of the flood's end."""
    assert exporter.get("/metrics", GOOD)[0] == 200
    flood = Flood(exporter.port, (lambda i: _wrong(0)) if same else _wrong, n, seconds, read_s=15)
    flood.start()
    took = _after_flood_all_answer(exporter, flood, FRESH_USERS[user])
    flood.join(START_HANG_GUARD_S)
    assert set(flood.statuses) <= {"401", "429", "reset", "none"}, flood.statuses
    print(f"flood {n} in {seconds}s: {dict(flood.statuses)}; answered after {took}")


@pytest.mark.slow
def test_unknown_users_garbage_headers_and_leavers_then_everything_answers(exporter):
    """Neighbours of the wrong-password flood: unknown users, Authorization headers that are not credentials
    (not base64, no colon, other schemes, huge, over-long passwords), clients that send and
    leave at once; from many source addresses. Then all answers within 5 s."""
    assert exporter.get("/metrics", GOOD)[0] == 200
    b64 = base64.b64encode
    garbage = ["Basic !!!not-base64!!!", "Basic " + b64(b"no-colon-here").decode(), "Bearer abc.def.ghi",
               "Basic", "Basic " + "QUFB" * 1000, "basic " + b64(b"prometheus:" + b"\xff\xfe").decode(),
               "Basic " + b64(b"prometheus:" + b"x" * 200).decode(), "Basic " + b64(b":").decode(),
               "Basic " + b64(":".join(["a"] * 50).encode()).decode(), "Basic =" * 10, ""]

    def make(i: int) -> bytes:
        kind = i % 3
        if kind == 0:
            return _request("/metrics", _basic(f"user-{i}", "guess"))
        if kind == 1:
            return _request("/metrics", garbage[i % len(garbage)])
        return _wrong(i)

    leavers = Flood(exporter.port, _wrong, 200, 1.0, leave=True)
    flood = Flood(exporter.port, make, 300, 2.0, read_s=15, sources=300)
    leavers.start()
    flood.start()
    leavers.join(START_HANG_GUARD_S)
    took = _after_flood_all_answer(exporter, flood, FRESH_USERS[3])
    flood.join(START_HANG_GUARD_S)
    assert set(flood.statuses) <= {"401", "429"}, flood.statuses  # never a reset or silence
    print(f"garbage/unknown flood: {dict(flood.statuses)}; answered after {took}")


@pytest.mark.slow
@pytest.mark.parametrize("same", [False, True], ids=["distinct-passwords", "one-wrong-password"])
def test_scrapes_succeed_during_a_100_per_second_wrong_password_stream(exporter, same):
    """At 100 wrong passwords a second (once 1 scrape in 21 succeeded),
    scrapes with credentials and probes keep succeeding. With one wrong password repeated, the
    scraper logs in for the first time during the stream (its check must get a turn); with
    distinct ones (a brute force from the scraper's own address) it logged in before."""
    if same:
        auth = _basic(FRESH_USERS[4], SECOND_PASSWORD)
        flood = Flood(exporter.port, lambda i: _wrong(-1), 600, 6.0, read_s=10)
    else:
        auth = GOOD
        assert exporter.get("/metrics", GOOD)[0] == 200
        flood = Flood(exporter.port, _wrong, 600, 6.0, read_s=10)
    flood.start()
    ok = failed = probes_ok = 0
    errors = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < 5.5:
        try:
            status = exporter.get("/metrics", auth, timeout=5)[0]
            ok += status == 200
            failed += status != 200
            if status != 200:
                errors.append(status)
        except OSError as e:
            failed += 1
            errors.append(repr(e))
        try:
            probes_ok += exporter.get("/healthz", timeout=2)[0] == 200
        except OSError:
            pass
        time.sleep(0.2)
    flood.join(START_HANG_GUARD_S)
    print(f"during the stream: {ok} scrapes ok, {failed} failed {errors[:5]}, {probes_ok} probes ok; "
          f"flood {dict(flood.statuses)}")
    assert failed <= max(1, (ok + failed) // 10), errors
    assert probes_ok >= ok + failed - 1


@pytest.mark.slow
def test_pipelining_non_readers_slowloris_and_idle_clients_do_not_lock_out_scrapes(exporter):
    """600 connections pipelining 20 GETs each with a 4 KiB
    receive buffer and never reading, 200 slowloris clients, 600 idle connections: scrapes with
    credentials keep succeeding (goal 0 failures; the bound allows a loaded 2-core machine)."""
    assert exporter.get("/metrics", GOOD)[0] == 200
    held: list[socket.socket] = []
    pipelined = _request("/metrics", GOOD, close=False) * 20
    failures, errors, oks = 0, [], 0

    def scrape() -> None:
        nonlocal failures, oks
        try:
            status = exporter.get("/metrics", GOOD, timeout=10)[0]
            oks += status == 200
            if status != 200:
                failures += 1
                errors.append(status)
        except OSError as e:
            failures += 1
            errors.append(repr(e))

    def connect(rcvbuf: int | None = None) -> socket.socket | None:
        s = socket.socket()
        if rcvbuf:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.settimeout(5)
        try:
            s.connect(("127.0.0.1", exporter.port))
        except OSError:
            s.close()
            return None
        held.append(s)
        return s

    try:
        for i in range(600):
            s = connect(4096)
            if s is not None:
                try:
                    s.sendall(pipelined)
                except OSError:
                    pass
            if i % 100 == 99:
                scrape()
        slow = [s for s in (connect() for _ in range(200)) if s is not None]
        for s in slow:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        scrape()
        for _ in range(600):
            connect()
        for round_ in range(8):
            for s in slow:
                try:
                    s.sendall(f"X-Slow-{round_}: a\r\n".encode())
                except OSError:
                    pass
            scrape()
            scrape()
            time.sleep(0.2)
        assert exporter.get("/healthz", timeout=5)[0] == 200
    finally:
        for s in held:
            s.close()
    total = failures + oks
    print(f"pipelining/slowloris/idle: {failures} of {total} scrapes failed {errors[:5]}")
    assert failures <= 1, errors
    # and it recovers at once
    assert exporter.get("/metrics", GOOD, timeout=10)[0] == 200


def test_bad_header_lines_are_400(exporter):
    """Minor: a header name containing a space (and its neighbours) gets 400."""
    for extra in ("Bad Header: x\r\n", "X-Trailing : x\r\n", " X-Leading: x\r\n", "\tFolded: x\r\n",
                  ": no-name\r\n", "NoColon\r\n", "X-Ctl\x01: x\r\n"):
        status, _, body = exporter.get("/healthz", raw=_request("/healthz", extra=extra))
        assert status == 400, (extra, status, body)
    assert exporter.get("/healthz")[0] == 200


def test_collect_filter_on_the_metrics_path(exporter):
    """?collect[]=gpu returns GPU series and no EFA (nor Lustre) series, with
    the exporter's own; exclude[] the opposite; an unknown name is a 400 naming it."""
    status, _, body = exporter.get("/metrics", GOOD)
    assert status == 200
    full = {ln.split("{")[0].split(" ")[0] for ln in body.decode().splitlines() if ln and ln[0] != "#"}
    assert any(n.startswith("efa_") for n in full) and any(n.startswith("lustre_") for n in full)
    status, _, body = exporter.get("/metrics?collect[]=gpu", GOOD)
    assert status == 200
    text = body.decode()
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and line[0] != "#"}
    assert "gpu_temperature_celsius" in names or any(
        n.startswith("gpu_") and not n.startswith(("gpu_health_exporter", "gpu_xid")) for n in names)
    assert not [n for n in names if n.startswith(("efa_", "lustre_"))]
    assert "gpu_health_exporter_build_info" in names and "process_resident_memory_bytes" in names
    assert 'collector="efa"' not in text
    # URL-encoded brackets, as a Prometheus `params:` block sends them
    status, _, body = exporter.get("/metrics?collect%5B%5D=efa", GOOD)
    assert status == 200 and b"efa_" in body and b"\nlustre_" not in body
    status, _, body = exporter.get("/metrics?exclude[]=efa", GOOD)
    assert status == 200 and b"\nefa_" not in body and b"\nlustre_" in body
    status, _, body = exporter.get("/metrics?collect[]=nosuchthing", GOOD)
    assert status == 400 and b"nosuchthing" in body
    # without credentials the filter tells nothing
    assert exporter.get("/metrics?collect[]=nosuchthing")[0] == 401


@pytest.mark.slow
def test_over_tls_plain_http_gets_a_400_saying_https_and_floods_leave_it_serving(tmp_path):
    """Minor: plain HTTP on the TLS port is answered 400 naming https (also when written in
    pieces). Item 2 over TLS: truncated handshakes and a wrong-password flood (handshakes cost
    the server too), then probes and a first login answer within 5 s."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "2", "-subj",
                    "/CN=127.0.0.1", "-keyout", str(tmp_path / "k.pem"), "-out", str(tmp_path / "c.pem")],
                   check=True, capture_output=True, timeout=HANG_GUARD_S)
    h = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10)).decode()
    ex = Exporter(tmp_path, "tls_server_config:\n  cert_file: c.pem\n  key_file: k.pem\n"
                  f"basic_auth_users:\n  prometheus: '{h}'\n", tls=True)
    try:
        status, _, body = get(ex.port, "/metrics")
        assert status == 400 and b"https" in body.lower()
        status, _, body = get(ex.port, "/healthz", raw=b"HEAD /healthz HTTP/1.0\r\n\r\n")
        assert status == 400
        with socket.create_connection(("127.0.0.1", ex.port), timeout=5) as s:  # sent in two parts
            s.sendall(b"GE")
            time.sleep(0.2)  # a client that is slow to write, not a wait for the server
            s.sendall(b"T /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            assert s.recv(200).startswith(b"HTTP/1.0 400 ")
        assert ex.get("/healthz")[0] == 200
        # truncated handshakes and garbage cost only their own connections
        held = []
        for i in range(150):
            s = socket.create_connection(("127.0.0.1", ex.port), timeout=5)
            s.sendall((b"\x16\x03\x01\x00", b"\x00" * 10, b"XYZ\r\n\r\n")[i % 3])
            held.append(s)
        statuses: Counter = Counter()

        def wrong(k: int) -> None:
            for i in range(3):
                try:
                    statuses[ex.get("/metrics", _basic("prometheus", f"w{k}-{i}"), timeout=30)[0]] += 1
                except OSError:
                    statuses["error"] += 1

        threads = [threading.Thread(target=wrong, args=(k,)) for k in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        end = time.monotonic()
        _wait_for(lambda: ex.get("/healthz")[0] == 200, "healthz after the TLS flood", START_HANG_GUARD_S)
        _wait_for(lambda: ex.get("/metrics", GOOD)[0] == 200, "a first login after the TLS flood",
                  max(0.01, 5 - (time.monotonic() - end)))
        print(f"TLS flood {dict(statuses)}; first login {time.monotonic() - end:.2f} s after")
        assert set(statuses) <= {401, 429}, statuses
        for s in held:
            s.close()
    finally:
        ex.stop()
