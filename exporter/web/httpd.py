"""A small HTTP/1.1 server with hard limits, for an endpoint that must stay up for its scraper.

Connections are held by one asyncio event loop (an idle or slow connection costs a file
descriptor and a few KiB, never a thread); only complete requests reach the bounded worker pool
that runs the handler. The limits:

- `max_connections`: connections held at once, counted from accept (TLS handshakes included).
  At the limit a new connection replaces the longest-idle one (one not being served), so a pile
  of idle or slow clients can never lock a scraper out (then one waiting for its client to read,
  then one whose request waits for a handler worker); when every connection is being served the
  new one is closed. The limit is also kept below the process's open-file limit.
- `read_header_timeout`: a new connection must deliver its TLS handshake and first request head
  within it (a slow-header client is dropped after it).
- `idle_timeout`: a kept-alive connection must deliver its next request head within it.
- `write_timeout`: a client must take the response within it. A connection waiting for its
  client to read is evictable too (after the idle ones), so clients that pipeline requests and
  never read the answers cannot hold the connection slots. At most one response per connection
  is held in the process (beyond the kernel's buffers), and a client that leaves
  `MAX_STALLED_RESPONSES` answers in a row unread for `STALL_S` is closed after the last.
- `workers`: threads running the handler; requests beyond them wait in the loop, not in threads.

`quick` (optional) answers cheap requests (health probes) on the event loop itself, so they never
wait behind the worker pool or a password check. `auth` (optional) guards everything else: a
cached credential is checked on the loop (one HMAC); an uncached one goes to at most
`auth_workers` threads of its own, with at most `auth_queue` more waiting (beyond that, 429; a
request whose credentials are already being checked waits for that answer instead), and
a check whose client has gone by its turn is dropped (so is a request that waited for a
handler worker); after AUTH_FREE_FAILURES wrong passwords in a row, the address's next
uncached check waits AUTH_BACKOFF_S, doubling with each further failure up to
AUTH_BACKOFF_MAX_S (429 until then); a wrong user:password already checked is answered 401
from the authenticator's cache, with no check at all.
Without valid credentials, a client can cost the process at most that: never a worker of the
handler pool.

Only GET and HEAD requests without a body are served; anything else gets 405 (with Allow) or
400 and the connection is closed. Header names must be HTTP tokens. Plain HTTP sent to a TLS
port is answered 400 with a hint to use https, as Go's net/http does. No HTTP/2, no chunked
request bodies; pipelined requests are served one after another.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import re
import resource
import socket
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Protocol

from exporter.web import aio
from exporter.web.aio import asyncio  # without ssl unless TLS is on (exporter/web/aio.py)

if TYPE_CHECKING:
    import ssl  # the caller imports it when TLS is configured (exporter.web.webconfig)

log = logging.getLogger("exporter.web.httpd")

MAX_HEAD_BYTES = 16 * 1024  # request line and headers; larger heads get 431
ALLOWED_METHODS = ("GET", "HEAD")
FD_RESERVE = 64  # descriptors kept free of connections: state file, sysfs reads, NVML, logs
MAX_STALLED_RESPONSES = 4  # answers in a row the client left unread before the connection is closed
# Bytes of responses held in the process, over all connections, for clients that have not taken
# them yet; beyond it the connection that has waited longest for its client is reset. With one
# response per connection this bounds memory when the responses are large (a high detail level).
MAX_BUFFERED_BYTES = 32 << 20
# After AUTH_FREE_FAILURES wrong passwords in a row, an address's next uncached password check
# waits (429 until then), doubling with each further failure up to 2 s: one address flooding
# wrong passwords costs a bcrypt every 2 s (~12% of a core at cost 12), not one per request, a
# user mistyping a few times is never slowed, and a scraper sharing the address (behind the same
# NAT, or on loopback) gets its first check within 2 s of the flood's end. Addresses remembered
# at once (the oldest forgotten first).
AUTH_FREE_FAILURES = 32
AUTH_BACKOFF_S = 1.0
AUTH_BACKOFF_MAX_S = 2.0
AUTH_BACKOFF_ADDRESSES = 4096
# Connections the kernel queues before accept (capped by net.core.somaxconn, 4096 by default): a
# flood of new connections must not overflow it, or a scraper's SYN waits 1, 3, 7 s for a retry.
BACKLOG = 4096
STALL_S = 1.0  # a response its client has not taken within this is "left unread"
# RFC 9110 5.1: a field name is a token.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HTTP_METHODS = (b"GET ", b"HEAD ", b"POST ", b"PUT ", b"OPTIO", b"DELET", b"PATCH")  # first 5 bytes
# Go's net/http (server.go) answers a plain HTTP request on a TLS port with these bytes.
_REASONS = {s.value: s.phrase for s in HTTPStatus}  # status -> reason phrase
_PLAIN_ON_TLS = (b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
                 b"Connection: close\r\n\r\nClient sent an HTTP request to an HTTPS server; use https://\n")


@dataclass(frozen=True)
class Limits:
    max_connections: int = 512
    read_header_timeout: float = 10.0
    idle_timeout: float = 60.0
    write_timeout: float = 10.0
    workers: int = 4
    auth_workers: int = 1  # threads checking uncached passwords (bcrypt: ~0.25 s of CPU each)
    # Checks waiting for one of them; more get 429. Short: once a flood of wrong passwords stops,
    # a first login waits at most this many checks (plus the running one) for its turn.
    auth_queue: int = 1


@dataclass
class Request:
    method: str
    path: str  # without the query string
    query: str
    headers: dict[str, str]  # names in lower case; repeated headers joined with ", "
    peer: str
    version: str = "HTTP/1.1"
    received: float = field(default_factory=time.monotonic)  # when its head was read
    peer_cert: dict[str, Any] | None = None  # the verified TLS client certificate, when one was given


@dataclass
class Response:
    status: int
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)


Handler = Callable[[Request], Response]
Quick = Callable[[Request], "Response | None"]


class Authenticator(Protocol):
    """Checks an Authorization header (exporter.web.webconfig.BasicAuth)."""

    realm: str

    def cached(self, authorization: str) -> bool | None:
        """True or False when known without the expensive check, None when it is needed."""

    def verify(self, authorization: str) -> bool:
        """The expensive check (thread-safe; runs in the server's auth threads)."""


@dataclass
class _Conn:
    """One accepted connection, tracked from accept to close."""

    close: Callable[[], object]  # cancels its task, which closes the socket
    busy: bool = False  # a request of it is being served (not evictable)
    since: float = field(default_factory=time.monotonic)
    writing: float | None = None  # since when it waits for its client to take a response
    buffered: int = 0  # bytes of that response held in the process when it started waiting
    queued: float | None = None  # since when its request waits for a handler worker


def connection_limit(wanted: int) -> int:
    """`wanted`, lowered to fit the process's open-file limit (less a reserve for everything else)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft - FD_RESERVE))


class HttpServer:
    """Serves `handler` on host:port from a background thread; `shutdown` stops it."""

    def __init__(self, handler: Handler, host: str, port: int, limits: Limits = Limits(),
                 ssl_context: ssl.SSLContext | None = None,
                 extra_headers: list[tuple[str, str]] | None = None, quick: Quick | None = None,
                 auth: Authenticator | None = None) -> None:
        self.handler = handler
        self.quick = quick
        self.auth = auth
        self.limits = limits
        self.max_connections = connection_limit(limits.max_connections)
        if self.max_connections < limits.max_connections:
            log.warning("max_connections lowered from %d to %d to fit the open-file limit",
                        limits.max_connections, self.max_connections)
        self.ssl_context = ssl_context
        if ssl_context is not None:
            aio.with_ssl()
        self.extra_headers = list(extra_headers or [])
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.create_server((host, port), family=family, backlog=BACKLOG, reuse_port=False)
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self._pool = ThreadPoolExecutor(max_workers=limits.workers, thread_name_prefix="http-worker")
        # Threads start on first use: none without basic auth.
        self._auth_pool = ThreadPoolExecutor(max_workers=max(1, limits.auth_workers),
                                             thread_name_prefix="http-auth")
        self._auth_slots: asyncio.Semaphore | None = None  # made on the loop
        self._work_slots: asyncio.Semaphore | None = None  # requests in the handler pool
        self._auth_waiting = 0
        self._auth_backoff: dict[str, tuple[int, float, float]] = {}  # address -> (failures, until, wait)
        # Checks running or queued, by Authorization header: a request with the same credentials
        # waits for that answer (scrapers sharing a password at start-up cost one bcrypt, and none
        # is refused for a full queue). At most auth_workers + auth_queue entries.
        self._auth_checking: dict[str, asyncio.Future[bool | None]] = {}
        self._conns: dict[int, _Conn] = {}
        self._ids = itertools.count()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="http", daemon=True)
        self._stopped = asyncio.Event()
        self.evicted = 0  # idle connections closed to admit new ones
        self.refused = 0  # new connections closed because every held one was busy
        self.auth_rejected = 0  # password checks refused (429) because the queue was full
        self.auth_dropped = 0  # queued password checks dropped because the client had gone
        self.work_dropped = 0  # requests dropped before the handler because the client had gone
        self.buffered = 0  # response bytes held for clients that have not taken them (at most)
        self.shed = 0  # connections reset to keep `buffered` under MAX_BUFFERED_BYTES

    @property
    def connections(self) -> int:
        return len(self._conns)

    @property
    def auth_pending(self) -> int:
        """Password checks running or waiting for an auth thread."""
        return self._auth_waiting

    def start(self) -> None:
        self._thread.start()

    def shutdown(self, timeout: float = 2.0) -> None:
        """Stop accepting, close every connection, and return within about `timeout` seconds."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stopped.set)
            self._thread.join(timeout)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._auth_pool.shutdown(wait=False, cancel_futures=True)
        self.sock.close()

    # -- event loop -------------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._main())
        finally:
            self._loop.close()

    async def _main(self) -> None:
        self._auth_slots = asyncio.Semaphore(max(1, self.limits.auth_workers))
        self._work_slots = asyncio.Semaphore(max(1, self.limits.workers))
        acceptor = asyncio.ensure_future(self._accept_loop())
        await self._stopped.wait()
        acceptor.cancel()
        for conn in list(self._conns.values()):
            conn.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, addr = await loop.sock_accept(self.sock)
            except OSError as e:  # EMFILE and friends: free an idle slot, back off, go on
                log.warning("accept failed: %s", e)
                self._evict_idle()
                await asyncio.sleep(0.1)
                continue
            if len(self._conns) >= self.max_connections and not self._evict_idle():
                self.refused += 1
                sock.close()
                continue
            # asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP, and accepted
            # ones say 0: without it a response sent after the previous one's data is unacked
            # waits for the client's delayed ACK (40 ms on Linux) on a keep-alive connection.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            cid = next(self._ids)
            peer = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else str(addr)
            task = asyncio.ensure_future(self._connection(cid, sock, peer))
            self._conns[cid] = _Conn(close=task.cancel)
            # sock_accept does not yield while connections are waiting: let evicted connections'
            # tasks close their sockets before the next accept, so descriptors stay near the limit.
            await asyncio.sleep(0)

    def _evict_idle(self) -> bool:
        """Close the longest-idle connection, else the one waiting longest for its client to read
        a response, else the one whose request has waited longest for a handler worker (its
        client may be piling up requests it never reads; a queued scrape costs nothing yet);
        False when every connection is being served."""
        idle = [(c.since, cid) for cid, c in self._conns.items() if not c.busy and c.writing is None]
        if not idle:
            idle = [(c.writing, cid) for cid, c in self._conns.items() if c.writing is not None]
        if not idle:
            idle = [(c.queued, cid) for cid, c in self._conns.items() if c.queued is not None]
        if not idle:
            return False
        _, cid = min(idle)
        self._conns.pop(cid).close()
        self.evicted += 1
        return True

    async def _connection(self, cid: int, sock: socket.socket, peer: str) -> None:
        loop = asyncio.get_running_loop()
        writer = None
        clean = False
        try:
            conn = self._conns[cid]
            if self.ssl_context is not None and await self._plain_http_on_tls(sock):
                return
            reader = asyncio.StreamReader(limit=MAX_HEAD_BYTES, loop=loop)
            protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
            transport, _ = await asyncio.wait_for(loop.connect_accepted_socket(
                lambda: protocol, sock, ssl=self.ssl_context,
                ssl_handshake_timeout=self.limits.read_header_timeout if self.ssl_context else None),
                self.limits.read_header_timeout)
            writer = asyncio.StreamWriter(transport, protocol, reader, loop)
            # drain() then waits until the response is with the kernel: at most one response per
            # connection is held in this process while its client does not read.
            transport.set_write_buffer_limits(high=0)
            cert = transport.get_extra_info("peercert") if self.ssl_context else None
            timeout = self.limits.read_header_timeout
            stalled = [0]
            while await self._one_request(reader, writer, conn, peer, cert, timeout, stalled):
                conn.busy, conn.since = False, time.monotonic()
                timeout = self.limits.idle_timeout
            clean = True
        # OSError covers ssl.SSLError (its subclass) without importing ssl.
        except (asyncio.TimeoutError, ConnectionError, OSError, asyncio.IncompleteReadError,
                asyncio.CancelledError, KeyError):
            pass  # a client that is slow, gone, evicted or speaks no TLS costs only its own connection
        finally:
            self._conns.pop(cid, None)
            if writer is None:
                sock.close()
            elif clean:  # flush what is buffered (a response), then close
                writer.close()
                try:
                    await asyncio.wait_for(writer.wait_closed(), self.limits.write_timeout)
                except (asyncio.TimeoutError, ConnectionError, OSError, asyncio.CancelledError):
                    _reset(writer)
            else:
                _reset(writer)

    async def _plain_http_on_tls(self, sock: socket.socket) -> bool:
        """Peek at the first bytes on a TLS port; a plain HTTP request is answered 400 (True)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.read_header_timeout
        readable: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            if not readable.done():
                readable.set_result(None)

        loop.add_reader(sock.fileno(), wake)
        try:
            await asyncio.wait_for(readable, self.limits.read_header_timeout)
        finally:
            loop.remove_reader(sock.fileno())
        first = sock.recv(5, socket.MSG_PEEK)
        # A client that wrote its request in pieces ("GE", then the rest): wait for 5 bytes.
        while 0 < len(first) < 5 and any(m.startswith(first) for m in _HTTP_METHODS) \
                and loop.time() < deadline:
            await asyncio.sleep(0.05)
            first = sock.recv(5, socket.MSG_PEEK)
        # A TLS record starts with 0x16 (handshake); Go looks for the same method prefixes.
        if not first.startswith(_HTTP_METHODS):
            return False
        with contextlib.suppress(asyncio.TimeoutError, OSError):
            # Read the request first and let the client close: closing with unread data sends a
            # reset, which can destroy the answer before the client reads it.
            with contextlib.suppress(BlockingIOError):
                sock.recv(MAX_HEAD_BYTES)
            await asyncio.wait_for(loop.sock_sendall(sock, _PLAIN_ON_TLS), self.limits.write_timeout)
            sock.shutdown(socket.SHUT_WR)
            deadline = loop.time() + 1.0
            while loop.time() < deadline:
                if not await asyncio.wait_for(loop.sock_recv(sock, MAX_HEAD_BYTES), deadline - loop.time()):
                    break
        return True

    async def _authorized(self, req: Request, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter, conn: _Conn) -> Response | None:
        """None when the request may go to the handler, else the answer (401 or 429)."""
        assert self.auth is not None and self._auth_slots is not None
        header = req.headers.get("authorization", "")
        ok = self.auth.cached(header)
        while ok is None and header in self._auth_checking:
            # None: that check was dropped (its client went away) before it ran: check it here
            ok = await asyncio.shield(self._auth_checking[header])
        if ok is None:
            ip = req.peer.rsplit(":", 1)[0]
            now = time.monotonic()
            backoff = self._auth_backoff.get(ip)
            if backoff is not None and now < backoff[1]:
                self.auth_rejected += 1
                return Response(429, b"too many wrong passwords from this address; retry later\n",
                                [("Retry-After", str(max(1, round(backoff[1] - now))))])
            if self._auth_waiting >= self.limits.auth_queue + self.limits.auth_workers:
                self.auth_rejected += 1
                return Response(429, b"too many password checks in progress; retry later\n",
                                [("Retry-After", "1")])
            self._auth_waiting += 1
            conn.busy = False  # an unauthenticated client waiting for its turn may be evicted
            shared = self._auth_checking[header] = asyncio.get_running_loop().create_future()
            try:
                waits = self._auth_slots.locked()
                async with self._auth_slots:
                    if waits and _gone(reader, writer):
                        self.auth_dropped += 1
                        raise ConnectionResetError("client gone before its password check")
                    loop = asyncio.get_running_loop()
                    try:
                        ok = await loop.run_in_executor(self._auth_pool, self.auth.verify, header)
                    except Exception:  # noqa: BLE001 - a checker bug denies; it must not drop the client
                        log.debug("password check failed", exc_info=True)
                        ok = False
            finally:
                self._auth_waiting -= 1
                conn.busy = True
                if self._auth_checking.get(header) is shared:
                    del self._auth_checking[header]
                shared.set_result(ok)
            self._note_auth(ip, ok)
        if ok:
            return None
        return Response(401, b"unauthorized\n", [("WWW-Authenticate", f'Basic realm="{self.auth.realm}"')])

    def _note_auth(self, ip: str, ok: bool) -> None:
        """After AUTH_FREE_FAILURES wrong passwords in a row, an address waits AUTH_BACKOFF_S
        (doubling with each further failure, up to AUTH_BACKOFF_MAX_S) before its next uncached
        check; a success clears it."""
        if ok:
            self._auth_backoff.pop(ip, None)
            return
        failures, _, wait = self._auth_backoff.pop(ip, (0, 0.0, 0.0))
        failures += 1
        if failures >= AUTH_FREE_FAILURES:
            wait = min(AUTH_BACKOFF_MAX_S, wait * 2) if wait else AUTH_BACKOFF_S
        if len(self._auth_backoff) >= AUTH_BACKOFF_ADDRESSES:  # bounded: forget the oldest
            del self._auth_backoff[next(iter(self._auth_backoff))]
        self._auth_backoff[ip] = (failures, time.monotonic() + wait, wait)

    async def _one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                           conn: _Conn, peer: str, cert: dict[str, Any] | None, timeout: float,
                           stalled: list[int]) -> bool:
        """Read, serve and answer one request; True when the connection may carry another.
        `stalled`: how many answers in a row the client has left waiting."""
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
        except asyncio.IncompleteReadError:
            return False  # closed between requests
        except asyncio.LimitOverrunError:
            await self._send(writer, "GET", Response(431, b"request head too large\n"), False)
            return False
        conn.busy = True
        req, problem = _parse_head(head, peer, cert)
        if req is None:
            await self._send(writer, "GET", Response(problem[0], problem[1].encode() + b"\n"), False)
            return False
        keep = _keep_alive(req)
        if "content-length" in req.headers and req.headers["content-length"].strip() != "0" \
                or "transfer-encoding" in req.headers:
            keep = False  # we read no request bodies: the rest of the stream is not a request
        if req.method not in ALLOWED_METHODS:
            refused = Response(405, b"method not allowed; use GET or HEAD\n",
                               [("Allow", ", ".join(ALLOWED_METHODS))])
            await self._send(writer, req.method, refused, False)
            return False
        resp: Response | None = self.quick(req) if self.quick is not None else None
        if resp is None and self.auth is not None:
            resp = await self._authorized(req, reader, writer, conn)
            if resp is not None and resp.status == 429:
                keep = False
        if resp is None:
            resp = await self._handle(req, reader, writer, conn)
        if stalled[0] >= MAX_STALLED_RESPONSES - 1:
            keep = False  # it has not read its last answers: this one is its last
        if await self._send(writer, req.method, resp, keep, http10=req.version == "HTTP/1.0", conn=conn):
            stalled[0] += 1
        else:
            stalled[0] = 0
        return keep

    async def _handle(self, req: Request, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter, conn: _Conn) -> Response:
        """Run the handler on the pool; a request that waited for a worker is dropped when its
        client has gone by its turn (ConnectionResetError), so a burst of clients that send and
        leave costs no handler work. While it waits, its connection is evictable (last)."""
        assert self._work_slots is not None
        waits = self._work_slots.locked()
        conn.queued = time.monotonic() if waits else None
        try:
            await self._work_slots.acquire()
        finally:
            conn.queued = None
        try:
            if waits and _gone(reader, writer):
                self.work_dropped += 1
                raise ConnectionResetError("client gone before its request was served")
            loop = asyncio.get_running_loop()
            try:
                return await loop.run_in_executor(self._pool, self.handler, req)
            except Exception:  # noqa: BLE001 - a handler bug answers 500, the server goes on
                log.exception("handling %s %s", req.method, req.path)
                return Response(500, b"internal error; see the exporter's log\n")
        finally:
            self._work_slots.release()

    async def _send(self, writer: asyncio.StreamWriter, method: str, resp: Response, keep: bool,
                    http10: bool = False, conn: _Conn | None = None) -> bool:
        """Write the response; True when the client left it unread for STALL_S or more."""
        names = {k.lower() for k, _ in resp.headers}
        headers = list(resp.headers) + self.extra_headers
        if "content-type" not in names:
            headers.append(("Content-Type", "text/plain; charset=utf-8"))
        headers.append(("Content-Length", str(len(resp.body))))
        if not keep:
            headers.append(("Connection", "close"))
        elif http10:
            headers.append(("Connection", "keep-alive"))
        lines = [f"HTTP/1.1 {resp.status} {_REASONS.get(resp.status, '')}"]
        lines += [f"{k}: {v}" for k, v in headers]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        # One write: head and body leave in the same segments (HEAD: the GET's headers,
        # Content-Length included, and no body).
        writer.write(head if method == "HEAD" else head + resp.body)
        pending = writer.transport.get_write_buffer_size()
        if not pending:
            return False
        t = time.monotonic()
        if conn is not None:
            conn.busy, conn.writing, conn.buffered = False, t, pending
            self.buffered += pending
            self._shed(conn)
        try:
            await asyncio.wait_for(writer.drain(), self.limits.write_timeout)
        finally:
            if conn is not None:
                self.buffered -= conn.buffered
                conn.busy, conn.writing, conn.buffered = True, None, 0
        return time.monotonic() - t >= STALL_S

    def _shed(self, current: _Conn) -> None:
        """Reset the connections that have waited longest for their clients to read, until the
        responses held for such clients fit MAX_BUFFERED_BYTES (`current` last)."""
        if self.buffered <= MAX_BUFFERED_BYTES:
            return
        waiting = sorted(((c.writing, cid) for cid, c in self._conns.items()
                          if c.writing is not None and c is not current))
        for _, cid in waiting:
            if self.buffered <= MAX_BUFFERED_BYTES:
                return
            conn = self._conns.pop(cid)
            self.buffered -= conn.buffered  # its task's finally would too: only once
            conn.buffered = 0
            conn.close()
            self.shed += 1


def _gone(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """The client closed (or half-closed) its side with nothing more to read, or reset."""
    return reader.at_eof() or writer.transport.is_closing()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Abort; with a reset when a response is still unsent (the client stopped reading), which
    would otherwise keep the socket and its data in the kernel, behind a zero window, long after
    we let it go. Idle and slow-header clients get a plain close."""
    sock = writer.get_extra_info("socket")
    if sock is not None and writer.transport.get_write_buffer_size():
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _parse_head(head: bytes, peer: str, cert: dict[str, Any] | None
                ) -> tuple[Request | None, tuple[int, str]]:
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
        return None, (400, "bad request")
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return None, (400, "bad request line")
    method, target, version = parts
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        return None, (505, "HTTP version not supported; use HTTP/1.1")
    if not method.isalpha() or not method.isupper():
        return None, (400, "bad method")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, val = line.partition(":")
        if not sep or not _TOKEN.fullmatch(name):
            return None, (400, "bad header line")
        key = name.lower()
        headers[key] = f"{headers[key]}, {val.strip()}" if key in headers else val.strip()
    path, _, query = target.partition("?")
    return Request(method, path, query, headers, peer, version, peer_cert=cert), (200, "")


def _keep_alive(req: Request) -> bool:
    tokens = {t.strip().lower() for t in req.headers.get("connection", "").split(",")}
    if req.version == "HTTP/1.0":
        return "keep-alive" in tokens
    return "close" not in tokens
