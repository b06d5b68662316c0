"""One unary gRPC call over a unix socket, on the `h2` HTTP/2 state machine (python-hyper, pure
Python), in the calling thread: no thread, no event loop, no C core (grpcio cost the served exporter
16.5 MiB and 6 threads; docs/performance.md).

The call (gRPC over HTTP/2, grpc/grpc doc/PROTOCOL-HTTP2.md): one POST stream with
`content-type: application/grpc`, `te: trailers` and `grpc-timeout`, the request as one
length-prefixed message (a 0 compression byte and a 4-byte big-endian length), then the response's
headers, its one length-prefixed message and the trailers `grpc-status` / `grpc-message` (or a
"Trailers-Only" answer: the status in the headers).

A `Channel` keeps its connection between calls (a new stream each; about a third of the CPU of a
new connection) and makes a new one when the socket file is replaced (a kubelet restart creates a
new socket: its inode changes), after any failure, and every RECONNECT_AFTER calls. A reused
connection that the server has closed since (EOF or GOAWAY before our stream was answered) is
retried once on a new connection, within the same deadline.

Bounds: the whole call is under one deadline (every connect, send and receive gets what is left of
it); a response message whose length prefix is over `max_bytes` is refused as soon as its 5 bytes
arrive, before the rest is read; the bytes read from the socket in one call (frames and headers
included) stop at `max_bytes` plus 1 MiB; the header list is limited to 64 KiB
(SETTINGS_MAX_HEADER_LIST_SIZE)."""

from __future__ import annotations

import errno
import os
import socket
import time
from dataclasses import dataclass
from urllib.parse import unquote

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

# grpc/grpc doc/statuscodes.md
CODES = ("OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
         "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
         "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED")
# an HTTP status other than 200 as gRPC maps it (doc/http-grpc-status-mapping.md)
_HTTP_CODES = {400: "INTERNAL", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "UNIMPLEMENTED",
               429: "UNAVAILABLE", 502: "UNAVAILABLE", 503: "UNAVAILABLE", 504: "UNAVAILABLE"}
MAX_HEADER_LIST = 64 << 10
WINDOW = 1 << 20  # flow-control window: the server may send 1 MiB before we acknowledge
SLACK = 1 << 20  # bytes of frames and headers read beyond the message's max_bytes


@dataclass
class GrpcError(Exception):
    code: str  # a name of CODES
    message: str

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class TooLarge(GrpcError):
    pass


class Retry(Exception):
    """A reused connection was closed before our stream was answered: try a new one."""


class Channel:
    """Unary calls on one unix socket; not for use from two threads at once."""

    RECONNECT_AFTER = 10000  # calls on one connection: bounds what h2 keeps of closed streams

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self._sock: socket.socket | None = None
        self._conn: h2.connection.H2Connection | None = None
        self._inode: tuple[int, int] | None = None
        self._calls = 0

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock = self._conn = self._inode = None

    def unary(self, method: str, request: bytes, timeout_s: float, max_bytes: int) -> memoryview:
        """The response message of `method` (`/package.Service/Method`) called with the serialized
        `request`; raises GrpcError (TooLarge for an answer over max_bytes) or OSError (stat of the
        socket file)."""
        deadline = time.monotonic() + timeout_s
        st = os.stat(self.socket_path)
        if (st.st_dev, st.st_ino) != self._inode or self._calls >= self.RECONNECT_AFTER:
            self.close()  # a new socket file: the kubelet restarted, the old connection is dead
        for attempt in (0, 1):
            reused = self._sock is not None
            try:
                if not reused:
                    self._connect(deadline, (st.st_dev, st.st_ino))
                self._calls += 1
                assert self._sock is not None and self._conn is not None
                call = _Call(self._sock, self._conn, deadline, max_bytes, reused)
                return call.run(method, request, timeout_s)
            except Retry:
                self.close()
                if attempt:
                    raise GrpcError("UNAVAILABLE", "the server closed the connection") from None
            except BaseException:
                self.close()
                raise
        raise AssertionError("unreachable")

    def _connect(self, deadline: float, inode: tuple[int, int]) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            sock.connect(self.socket_path)
        except TimeoutError:
            sock.close()
            raise GrpcError("DEADLINE_EXCEEDED", "connect timed out") from None
        except OSError as e:
            sock.close()
            why = f" ({errno.errorcode.get(e.errno, '')})" if e.errno else ""
            raise GrpcError("UNAVAILABLE", f"connect: {e.strerror or e}{why}") from None
        # Our own request headers are constants, valid and lower-case: not checked again each call.
        config = h2.config.H2Configuration(client_side=True, header_encoding="utf-8",
                                           validate_outbound_headers=False, normalize_outbound_headers=False)
        conn = h2.connection.H2Connection(config)
        conn.local_settings = h2.settings.Settings(client=True, initial_values={
            h2.settings.SettingCodes.ENABLE_PUSH: 0,
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: WINDOW,
            h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST})
        conn.initiate_connection()
        conn.increment_flow_control_window(WINDOW)
        self._sock, self._conn, self._inode, self._calls = sock, conn, inode, 0


def unary(socket_path: str, method: str, request: bytes, timeout_s: float, max_bytes: int) -> memoryview:
    """One call on a new connection, closed after it."""
    ch = Channel(socket_path)
    try:
        return ch.unary(method, request, timeout_s, max_bytes)
    finally:
        ch.close()


class _Call:
    def __init__(self, sock: socket.socket, conn: h2.connection.H2Connection, deadline: float, max_bytes: int,
                 reused: bool) -> None:
        self.sock, self.conn, self.deadline = sock, conn, deadline
        self.max_bytes, self.reused = max_bytes, reused
        self.sid = 0
        self.headers: dict[str, str] = {}
        self.trailers: dict[str, str] = {}
        self.body = bytearray()
        self.length: int | None = None  # the response message's length prefix, once read
        self.read = 0
        self.events = 0  # h2 events the bytes read made: none from bytes that are not HTTP/2
        self.ended = False

    def _flush(self) -> None:
        out = self.conn.data_to_send()
        if out:
            self._timeout()
            try:
                self.sock.sendall(out)
            except TimeoutError:
                raise GrpcError("DEADLINE_EXCEEDED", "send timed out") from None
            except OSError as e:
                if self.reused and not self.headers:
                    raise Retry() from None
                raise GrpcError("UNAVAILABLE", f"send: {e.strerror or e}") from None

    def _timeout(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise GrpcError("DEADLINE_EXCEEDED", "deadline exceeded")
        self.sock.settimeout(left)

    def run(self, method: str, request: bytes, timeout_s: float) -> memoryview:
        conn = self.conn
        try:
            sid = self.sid = conn.get_next_available_stream_id()
            conn.send_headers(sid, [
                (b":method", b"POST"), (b":scheme", b"http"), (b":path", method.encode()),
                (b":authority", b"localhost"), (b"content-type", b"application/grpc"), (b"te", b"trailers"),
                (b"grpc-timeout", b"%dm" % max(1, int(timeout_s * 1000))),
                (b"user-agent", b"gpu-health-exporter")])
            conn.send_data(sid, b"\x00" + len(request).to_bytes(4, "big") + request, end_stream=True)
        except h2.exceptions.ProtocolError:
            raise Retry() from None  # the connection is closing (a GOAWAY read in the last call)
        self._flush()
        while not self.ended:
            self._timeout()
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                raise GrpcError("DEADLINE_EXCEEDED", "deadline exceeded") from None
            except OSError as e:
                if self.reused and not self.headers:
                    raise Retry() from None
                raise GrpcError("UNAVAILABLE", f"receive: {e.strerror or e}") from None
            if not data:
                if self.reused and not self.headers:
                    raise Retry()
                if self.read and not self.events:
                    raise GrpcError("UNAVAILABLE", "the server's answer is not HTTP/2 (is this the kubelet's "
                                                   "socket?)")
                raise GrpcError("UNAVAILABLE", "the server closed the connection before the call ended")
            self.read += len(data)
            if self.read > self.max_bytes + SLACK:
                raise TooLarge("RESOURCE_EXHAUSTED", f"more than {self.max_bytes + SLACK:,} bytes received")
            try:
                events = conn.receive_data(data)
            except h2.exceptions.ProtocolError as e:
                raise GrpcError("INTERNAL", f"HTTP/2 protocol error: {e}") from None
            self.events += len(events)
            for ev in events:
                self._event(ev, sid)
            self._flush()
        return self._result()

    def _event(self, ev: h2.events.Event, sid: int) -> None:
        if getattr(ev, "stream_id", sid) not in (sid, 0):
            return  # an earlier stream's late frame
        if isinstance(ev, h2.events.ResponseReceived):
            self.headers = {str(k): str(v) for k, v in ev.headers}
        elif isinstance(ev, h2.events.TrailersReceived):
            self.trailers = {str(k): str(v) for k, v in ev.headers}
        elif isinstance(ev, h2.events.DataReceived):
            self._data(ev.data)
            self.conn.acknowledge_received_data(ev.flow_controlled_length, sid)
        elif isinstance(ev, h2.events.StreamEnded):
            self.ended = True
        elif isinstance(ev, h2.events.StreamReset):
            code = "UNAVAILABLE" if ev.error_code == 7 else "INTERNAL"  # 7: REFUSED_STREAM
            raise GrpcError(code, f"stream reset by the server (HTTP/2 error {int(ev.error_code or 0)})")
        elif isinstance(ev, h2.events.ConnectionTerminated):
            if self.reused and not self.headers and (ev.last_stream_id or 0) < sid:
                raise Retry()  # a GOAWAY for a connection idle since the last call: our stream was not seen
            raise GrpcError("UNAVAILABLE", f"the server ended the connection (GOAWAY, HTTP/2 error "
                                           f"{int(ev.error_code or 0)})")
    def _data(self, data: bytes) -> None:
        self.body += data
        if self.length is None and len(self.body) >= 5:
            if self.body[0] != 0:
                raise GrpcError("INTERNAL", "a compressed response, which was not asked for")
            self.length = int.from_bytes(self.body[1:5], "big")
            if self.length > self.max_bytes:
                raise TooLarge("RESOURCE_EXHAUSTED", f"the answer is {self.length:,} bytes, over the limit "
                                                     f"of {self.max_bytes:,}")
        if self.length is not None and len(self.body) > 5 + self.length:
            raise GrpcError("INTERNAL", "more than one response message in a unary call")

    def _result(self) -> memoryview:
        status = self.headers.get(":status", "")
        if status != "200":
            code = _HTTP_CODES.get(int(status) if status.isdigit() else 0, "UNKNOWN")
            raise GrpcError(code, f"HTTP status {status or 'missing'}")
        got = self.trailers or self.headers  # a Trailers-Only answer has its status in the headers
        if "grpc-status" not in got:
            raise GrpcError("INTERNAL", "the response has no grpc-status")
        raw = got["grpc-status"]
        code = CODES[int(raw)] if raw.isdigit() and int(raw) < len(CODES) else "UNKNOWN"
        if code != "OK":
            raise GrpcError(code, unquote(got.get("grpc-message", ""))[:200])
        if not self.headers.get("content-type", "").startswith("application/grpc"):
            raise GrpcError("UNKNOWN", f"content-type {self.headers.get('content-type', '')!r}")
        if self.length is None or len(self.body) != 5 + self.length:
            raise GrpcError("INTERNAL", "the response message is incomplete")
        return memoryview(self.body)[5:]  # no copy: an answer near max_bytes is held once
