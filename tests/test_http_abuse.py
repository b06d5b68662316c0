"""What a client without credentials, or one
that never reads its answers, can cost the endpoint. Loopback only; every wait has a deadline."""

import base64
import os
import socket
import statistics
import threading
import time

import bcrypt
import pytest
import requests

from exporter.runner import Runner
from exporter.web.httpd import HttpServer, Limits, Response
from exporter.web.server import Server
from exporter.web.webconfig import BasicAuth, ConfigError, WebConfig, load_web_config
from tests.helpers import DEADLINE_MARGIN_S, HANG_GUARD_S, START_HANG_GUARD_S, test_pool
from tests.test_runner import Probe

PASSWORD = "s3cret-scrape"


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _wait(cond, what: str, timeout: float = START_HANG_GUARD_S) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.02)


def _head(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send `data`, read the answer until the server closes or the first response is complete."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        while b"\r\n\r\n" not in out and (chunk := s.recv(65536)):
            out += chunk
    return out


@pytest.fixture(scope="module")
def cost12_users():
    """One user with a bcrypt hash at cost 12 (the htpasswd -nBC 12 the docs suggest)."""
    return {"prometheus": bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(12))}


def _serve(users, **limits):
    runner = Runner([Probe("alpha")], deadline_s=5, pool=test_pool())
    srv = Server(runner, "127.0.0.1", 0, WebConfig(users=users), Limits(**limits) if limits else None)
    srv.start()
    return srv, runner


@pytest.mark.slow
def test_a_wrong_password_flood_leaves_scrapes_and_probes_answering(cost12_users):
    """After 300 wrong-password requests, /metrics with credentials
    and /healthz answer within 5 s of the flood's end (they answered 73 s later before)."""
    srv, runner = _serve(cost12_users)
    base = f"http://127.0.0.1:{srv.port}"
    good = ("prometheus", PASSWORD)
    try:
        _wait(lambda: requests.get(base + "/readyz", timeout=5).status_code == 200, "ready")
        assert requests.get(base + "/metrics", auth=good, timeout=10).status_code == 200  # cached now
        answers: list[bytes] = []
        during: list[int] = []

        def flood(k: int, n: int, read: bool) -> None:
            for i in range(n):  # each guess a new one: no check shared, none answered from a cache
                wrong = (f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: "
                         f"{_basic('prometheus', f'guess-{k}-{i}')}\r\n\r\n").encode()
                try:
                    if read:
                        answers.append(_head(srv.port, wrong, timeout=10))
                    else:  # send and go away: its queued check must not run
                        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
                            s.sendall(wrong)
                except OSError:
                    pass

        threads = [threading.Thread(target=flood, args=(i, 10, i % 2 == 0)) for i in range(30)]
        for t in threads:
            t.start()
        # While the flood runs, a scrape with credentials is served.
        during.append(requests.get(base + "/metrics", auth=good, timeout=10).status_code)
        for t in threads:
            t.join(60)
        flood_end = time.monotonic()
        r = requests.get(base + "/metrics", auth=good, timeout=10)
        h = requests.get(base + "/healthz", timeout=10)
        took = time.monotonic() - flood_end
    finally:
        srv.shutdown()
        runner.close()
    assert during == [200]
    assert r.status_code == 200 and "gpu_health_exporter_collector_success" in r.text
    assert h.status_code == 200
    assert took < 5, f"answered {took:.1f} s after the flood's end"
    statuses = {a.split(b" ", 2)[1] for a in answers if a}
    assert statuses <= {b"401", b"429"} and answers
    # Most wrong passwords never reached bcrypt: at most the auth threads' share ran.
    assert srv.app.auth.bcrypt_checks < 150
    assert srv.httpd.auth_rejected > 0


def test_scrapers_sharing_uncached_credentials_share_one_check(cost12_users):
    """Eight scrapers with the same right password at once, before it is cached (an exporter
    restart under several Prometheus servers, bench/soak.py's start): every one is served and
    bcrypt runs once. Before, all but the running and the one queued check got 429."""
    srv, runner = _serve(cost12_users)
    base = f"http://127.0.0.1:{srv.port}"
    try:
        _wait(lambda: requests.get(base + "/readyz", timeout=5).status_code == 200, "ready")
        statuses: list[int] = []
        go = threading.Barrier(8)

        def scrape() -> None:
            go.wait(10)
            r = requests.get(base + "/metrics", auth=("prometheus", PASSWORD), timeout=30)
            statuses.append(r.status_code)

        threads = [threading.Thread(target=scrape) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        wrong = [requests.get(base + "/metrics", auth=("prometheus", "guess"), timeout=30).status_code
                 for _ in range(2)]
    finally:
        srv.shutdown()
        runner.close()
    assert statuses == [200] * 8
    assert srv.app.auth.bcrypt_checks == 2  # the right password once, the wrong one once
    assert wrong == [401, 401]


def test_a_wrong_password_takes_as_long_for_an_unknown_user():
    """The dummy hash has the configured hashes' cost, so an unknown user is
    not answered 150 times faster than a known one (CPU time of the checking thread)."""
    auth = BasicAuth({"prometheus": bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10))})

    def cpu(user: str) -> float:
        times = []
        for i in range(3):
            t = time.thread_time()
            assert auth.check(_basic(user, f"wrong-{i}")) is False
            times.append(time.thread_time() - t)
        return statistics.median(times)

    known, unknown = cpu("prometheus"), cpu("nobody")
    assert 0.5 < unknown / known < 2, (known, unknown)


def test_password_checks_queued_for_clients_that_left_are_dropped(cost12_users):
    """Checks still queued when their client disconnects never run bcrypt."""
    srv, runner = _serve(cost12_users, auth_queue=4)

    def wrong(guess: str) -> bytes:  # a new guess each: a check of its own, not a shared one
        return (f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: {_basic('prometheus', guess)}\r\n"
                "\r\n").encode()

    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as stays:
            stays.sendall(wrong("guess"))  # its check takes the one auth thread for ~0.25 s
            _wait(lambda: srv.app.auth.bcrypt_checks >= 1, "the first check")
            for i in range(4):  # queued behind it (the queue holds 4), then gone
                with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
                    s.sendall(wrong(f"guess-{i}"))
            assert stays.recv(100).startswith(b"HTTP/1.1 401 ")
        _wait(lambda: srv.httpd.auth_pending == 0, "the queue to empty")
    finally:
        srv.shutdown()
        runner.close()
    assert srv.app.auth.bcrypt_checks <= 2
    assert srv.httpd.auth_dropped >= 3


def test_an_address_flooding_wrong_passwords_is_made_to_wait():
    """After 32 wrong passwords in a row from one address, its uncached checks get 429 without
    a password check (backing off up to 2 s), so one flooding address costs almost nothing."""
    from exporter.web import httpd

    class Counting:
        realm = "test"
        verified = 0

        def cached(self, header):
            return None

        def verify(self, header):
            self.verified += 1
            return False

    auth = Counting()
    srv = HttpServer(lambda req: Response(200, b"ok\n"), "127.0.0.1", 0, auth=auth)
    srv.start()
    try:
        statuses = [_head(srv.port, b"GET / HTTP/1.1\r\nHost: x\r\nAuthorization: Basic eDp5\r\n"
                                    b"Connection: close\r\n\r\n").split(b" ")[1] for _ in range(60)]
    finally:
        srv.shutdown()
    free = httpd.AUTH_FREE_FAILURES
    assert statuses[:free] == [b"401"] * free
    # The rest wait (a slow machine may pass the first 1 s and 2 s waits: a check each).
    assert statuses[free:].count(b"429") >= 60 - free - 2
    assert auth.verified <= free + 2


def test_probes_do_not_wait_behind_busy_workers():
    """/healthz and /readyz are answered while every worker is taken."""
    hung = Probe("hung", "hang")
    # The worker is held until the test releases the collector (or a guard-sized deadline ends it):
    # a probe that waited behind it would not be answered within DEADLINE_MARGIN_S.
    runner = Runner([hung], deadline_s=START_HANG_GUARD_S, pool=test_pool())
    srv = Server(runner, "127.0.0.1", 0, limits=Limits(workers=1))
    srv.start()
    base = f"http://127.0.0.1:{srv.port}"
    scrape = threading.Thread(target=lambda: requests.get(base + "/metrics", timeout=HANG_GUARD_S),
                              daemon=True)
    try:
        scrape.start()
        _wait(lambda: hung.calls >= 1, "the collection to start")
        assert requests.get(base + "/healthz", timeout=DEADLINE_MARGIN_S).status_code == 200
        ready = requests.get(base + "/readyz", timeout=DEADLINE_MARGIN_S)
        assert ready.status_code == 503  # not collected yet
        assert scrape.is_alive()  # the one worker is still busy
    finally:
        hung.release.set()
        scrape.join(START_HANG_GUARD_S)
        srv.shutdown()
        runner.close()


def test_clients_that_pipeline_and_never_read_cannot_lock_out_scrapes():
    """Connections waiting for a client to read its answers are evictable, so
    20 pipelining non-readers at the connection limit cannot make scrapes fail."""
    body = os.urandom(256 * 1024)
    calls = [0]

    def handler(req):
        calls[0] += 1
        return Response(200, body)

    srv = HttpServer(handler, "127.0.0.1", 0, Limits(max_connections=20, write_timeout=60))
    srv.start()
    socks = []
    try:
        for _ in range(20):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", srv.port))
            s.sendall(b"GET /x HTTP/1.1\r\nHost: p\r\n\r\n" * 20)
            socks.append(s)
        _wait(lambda: calls[0] >= 20, "every pipelining connection served once")
        ok = 0
        for _ in range(10):
            r = requests.get(f"http://127.0.0.1:{srv.port}/x", timeout=10)
            ok += r.status_code == 200 and r.content == body
        assert ok == 10
        assert srv.evicted >= 1  # a non-reader made room (a scraper that closed frees its own)
    finally:
        for s in socks:
            s.close()
        srv.shutdown()


def test_a_client_that_never_reads_is_reset_after_the_write_timeout():
    """Its unsent answer does not stay in the kernel behind a zero window: the server resets
    the connection, and the client sees it (a plain close stayed queued behind the data)."""
    import select

    body = os.urandom(512 * 1024)
    srv = HttpServer(lambda req: Response(200, body), "127.0.0.1", 0, Limits(write_timeout=0.5))
    srv.start()
    s = socket.socket()
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", srv.port))
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 20)
        p = select.poll()
        p.register(s, select.POLLERR | select.POLLHUP)
        _wait(lambda: p.poll(0), "the reset", timeout=10)
    finally:
        s.close()
        srv.shutdown()


def test_a_header_name_with_a_space_is_refused():
    srv = HttpServer(lambda req: Response(200, b"ok\n"), "127.0.0.1", 0)
    srv.start()
    try:
        bad = _head(srv.port, b"GET / HTTP/1.1\r\nHost: x\r\nX Forwarded: 1\r\n\r\n")
        good = _head(srv.port, b"GET / HTTP/1.1\r\nHost: x\r\nX-Forwarded: 1\r\nConnection: close\r\n\r\n")
    finally:
        srv.shutdown()
    assert bad.startswith(b"HTTP/1.1 400 ")
    assert good.startswith(b"HTTP/1.1 200 ")


def _load_within(path, seconds: float = 5.0):
    """load_web_config in a thread; the exception it raised, or a failure if it hangs."""
    out: list[BaseException] = []

    def run() -> None:
        try:
            load_web_config(path)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    hung = t.is_alive()
    if hung:  # unblock the reader of the FIFO so the thread ends
        with open(path, "w"):
            pass
    assert not hung, "load_web_config hung on a FIFO"
    return out[0] if out else None


def test_a_fifo_as_the_web_config_file_is_refused_without_hanging(tmp_path):
    fifo = tmp_path / "web.yml"
    os.mkfifo(fifo)
    err = _load_within(fifo)
    assert isinstance(err, ConfigError) and str(fifo) in str(err) and "not a regular file" in str(err)


def test_a_fifo_as_the_certificate_is_refused_without_hanging(tmp_path):
    os.mkfifo(tmp_path / "server.crt")
    (tmp_path / "server.key").write_text("x")
    web = tmp_path / "web.yml"
    web.write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n")
    err = _load_within(web)
    assert isinstance(err, ConfigError) and "cert_file" in str(err) and "not a regular file" in str(err)


def test_a_long_wrong_value_is_truncated_in_the_message(tmp_path):
    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users:\n  prometheus: [" + ", ".join(["aaaaaaaaaa"] * 10000) + "]\n")
    with pytest.raises(ConfigError) as e:
        load_web_config(web)
    assert "basic_auth_users.prometheus" in str(e.value) and len(str(e.value)) < 500


def test_a_repeated_wrong_password_is_checked_once():
    """A client repeating the same wrong user:password (known user or not) gets 401 from the
    cache after the first check: no bcrypt, no place in the password-check queue."""
    auth = BasicAuth({"prometheus": bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4))})
    for user in ("prometheus", "nobody"):
        header = _basic(user, "guess")
        assert auth.cached(header) is None
        assert auth.verify(header) is False
        assert all(auth.cached(header) is False for _ in range(100))
    assert auth.bcrypt_checks == 2
    assert auth.check(_basic("prometheus", PASSWORD)) is True  # the right one still passes


def test_a_password_over_72_bytes_is_a_401_not_a_dropped_connection():
    """The bcrypt library raises on a password over 72 bytes: that is a wrong password (as in
    Go's bcrypt), answered 401, also when its first 72 bytes are the right password."""
    auth = BasicAuth({"prometheus": bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4))})
    srv = HttpServer(lambda req: Response(200, b"ok\n"), "127.0.0.1", 0, auth=auth)
    srv.start()
    try:
        for password in (PASSWORD + "x" * 80, "\u00e9" * 40, "y" * 300):
            answer = _head(srv.port, f"GET / HTTP/1.1\r\nHost: x\r\nAuthorization: "
                                     f"{_basic('prometheus', password)}\r\n\r\n".encode())
            assert answer.startswith(b"HTTP/1.1 401 "), answer[:60]
    finally:
        srv.shutdown()
    assert auth.bcrypt_checks == 3  # each paid the same bcrypt as a short wrong password


def test_responses_held_for_stalled_clients_are_capped_overall(monkeypatch):
    """Each stalled connection holds at most one response, but a few hundred of them with large
    responses added up without bound: past MAX_BUFFERED_BYTES the longest-stalled are reset,
    and a client that reads still gets its whole answer."""
    from exporter.web import httpd

    monkeypatch.setattr(httpd, "MAX_BUFFERED_BYTES", 8 << 20)
    body = os.urandom(2 << 20)
    srv = HttpServer(lambda req: Response(200, body), "127.0.0.1", 0, Limits(write_timeout=60))
    srv.start()
    socks = []
    try:
        for _ in range(12):  # the kernel takes each one's first answer; the second waits here
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", srv.port))
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 3)
            socks.append(s)
        _wait(lambda: srv.shed >= 3, "stalled connections reset")
        assert srv.buffered <= (8 << 20) + len(body)
        r = requests.get(f"http://127.0.0.1:{srv.port}/", timeout=20)
        assert r.status_code == 200 and r.content == body
    finally:
        for s in socks:
            s.close()
        srv.shutdown()


def test_requests_queued_for_a_worker_are_dropped_when_their_client_has_gone():
    """A request waiting for a handler worker whose client sent it and left is never handled
    (a burst of such clients cost a handler call each); the one that stays is answered."""
    release = threading.Event()
    paths: list[str] = []

    def handler(req):
        paths.append(req.path)
        if req.path == "/block":
            release.wait(20)
        return Response(200, b"ok\n")

    srv = HttpServer(handler, "127.0.0.1", 0, Limits(workers=1))
    srv.start()
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as blocker:
            blocker.sendall(b"GET /block HTTP/1.1\r\nHost: x\r\n\r\n")
            _wait(lambda: paths == ["/block"], "the worker taken")
            for i in range(5):  # each waits for the one worker, then its client leaves
                with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
                    s.sendall(f"GET /left{i} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as stays:
                stays.sendall(b"GET /stays HTTP/1.1\r\nHost: x\r\n\r\n")
                _wait(lambda: srv.connections == 7, "every connection accepted")
                release.set()
                assert stays.recv(100).startswith(b"HTTP/1.1 200 ")
            assert blocker.recv(100).startswith(b"HTTP/1.1 200 ")
    finally:
        release.set()
        srv.shutdown()
    assert paths == ["/block", "/stays"]
    assert srv.work_dropped == 5


def test_a_connection_whose_request_waits_for_a_worker_makes_room_for_a_new_one():
    """At the connection limit with every connection's request queued for a busy worker (what
    pipelining non-readers look like on a loaded machine), a new connection replaces the
    longest-queued one instead of being closed: the scraper is served once a worker frees."""
    release = threading.Event()

    def handler(req):
        if req.path == "/block":
            release.wait(20)
        return Response(200, b"ok\n")

    srv = HttpServer(handler, "127.0.0.1", 0, Limits(max_connections=3, workers=1))
    srv.start()
    socks = []
    try:
        for path in ("/block", "/q1", "/q2"):  # one served (blocked), two queued
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            socks.append(s)
            _wait(lambda: srv.connections == len(socks), "accepted")
        _wait(lambda: srv._work_slots is not None and srv._work_slots.locked(), "the worker taken")
        got: list[bytes] = []
        t = threading.Thread(target=lambda: got.append(_head(srv.port, b"GET /new HTTP/1.1\r\nHost: x\r\n"
                                                                       b"Connection: close\r\n\r\n")))
        t.start()
        _wait(lambda: srv.evicted >= 1 or srv.refused >= 1, "the new connection admitted or refused")
        release.set()
        t.join(START_HANG_GUARD_S)
        assert srv.refused == 0 and srv.evicted == 1
        assert got and got[0].startswith(b"HTTP/1.1 200 "), got
    finally:
        release.set()
        for s in socks:
            s.close()
        srv.shutdown()
