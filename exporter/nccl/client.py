"""One RAS session, as NCCL's own `ncclras` runs it (docs/nccl.md, "The query"), every step
under one monotonic deadline and the reply under a byte cap:

    C: CLIENT PROTOCOL 2      S: SERVER PROTOCOL 2     (1 s at most; no answer: reconnect once,
                                                         a frozen SO_REUSEPORT listener)
    C: TIMEOUT <leg>          S: OK
    C: SET FORMAT json        S: OK | ERROR: Unknown command SET FORMAT json   (before 2.28.7)
    C: STATUS                 S: the report, then EOF

STATUS is sent once, last, and only when `allow(format)` says so (the collector refuses text from
a version it cannot tell is safe). Never `TIMEOUT 0`, `VERBOSE STATUS` or a second STATUS."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

MAX_LINE = 1024  # the server's own receive buffer
HANDSHAKE_S = 1.0
CONNECT_S = 2.0

# Results (nccl_ras_queries_total{result}): bounded.
OK = "ok"
NO_LISTENER = "no_listener"
UNTRUSTED = "untrusted"
TIMEOUT = "timeout"
PROTOCOL_ERROR = "protocol_error"
TOO_LARGE = "too_large"
UNSUPPORTED = "unsupported"
ERROR = "error"  # refused, reset: the listener went away
RESULTS = (OK, NO_LISTENER, UNTRUSTED, TIMEOUT, PROTOCOL_ERROR, TOO_LARGE, UNSUPPORTED, ERROR)


class QueryFailed(Exception):
    def __init__(self, result: str, why: str) -> None:
        super().__init__(why)
        self.result = result


@dataclass(frozen=True)
class Reply:
    format: str  # json or text
    data: bytes


class _Conn:
    def __init__(self, sock: socket.socket, end: float) -> None:
        self.sock, self.end, self.buf = sock, end, b""

    def _left(self, cap: float | None = None) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise QueryFailed(TIMEOUT, "no complete answer within the query's deadline")
        return min(left, cap) if cap is not None else left

    def send(self, line: str) -> None:
        self.sock.settimeout(self._left())
        self.sock.sendall(line.encode("ascii") + b"\n")

    def line(self, cap: float | None = None) -> str:
        while b"\n" not in self.buf:
            if len(self.buf) > MAX_LINE:
                raise QueryFailed(PROTOCOL_ERROR, "a reply line longer than 1024 bytes")
            self.sock.settimeout(self._left(cap))
            chunk = self.sock.recv(4096)
            if not chunk:
                raise QueryFailed(PROTOCOL_ERROR, "the server closed the connection mid-session")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.rstrip(b"\r").decode("ascii", "replace")[:200]

    def rest(self, max_bytes: int) -> bytes:
        parts, n = [self.buf], len(self.buf)
        while True:
            self.sock.settimeout(self._left())
            chunk = self.sock.recv(min(1 << 20, max_bytes + 1 - n))
            if not chunk:
                return b"".join(parts)
            parts.append(chunk)
            n += len(chunk)
            if n > max_bytes:
                raise QueryFailed(TOO_LARGE, f"the reply exceeds {max_bytes} bytes")


def status(
    connect: Callable[[float], socket.socket],
    *,
    timeout_s: float,
    max_bytes: int,
    leg_timeout_s: int = 5,
    allow: Callable[[str], bool] = lambda fmt: True,
) -> Reply:
    """Run one STATUS. `connect(timeout)` returns a connected socket. Raises QueryFailed."""
    end = time.monotonic() + timeout_s
    for attempt in (1, 2):
        try:
            sock = connect(max(0.001, min(CONNECT_S, end - time.monotonic())))
        except TimeoutError:
            raise QueryFailed(TIMEOUT, "connecting timed out") from None
        except OSError as e:
            raise QueryFailed(ERROR, f"connecting: {e}") from None
        conn = _Conn(sock, end)
        try:
            conn.send("CLIENT PROTOCOL 2")
            hello = conn.line(HANDSHAKE_S)
        except (TimeoutError, QueryFailed) as e:
            sock.close()
            if (
                attempt == 1
                and time.monotonic() < end
                and not (isinstance(e, QueryFailed) and e.result != TIMEOUT)
            ):
                continue  # another SO_REUSEPORT listener may answer a new connection
            if isinstance(e, QueryFailed):
                raise
            raise QueryFailed(TIMEOUT, "no SERVER PROTOCOL line within 1 s, twice") from None
        except OSError as e:
            sock.close()
            raise QueryFailed(ERROR, f"handshake: {e}") from None
        break
    try:
        if not hello.startswith("SERVER PROTOCOL "):
            raise QueryFailed(PROTOCOL_ERROR, f"not a RAS server: {hello[:60]!r}")
        conn.send(f"TIMEOUT {max(1, int(leg_timeout_s))}")
        if conn.line() != "OK":
            raise QueryFailed(PROTOCOL_ERROR, "TIMEOUT was not acknowledged")
        conn.send("SET FORMAT json")
        answer = conn.line()
        if answer == "OK":
            fmt = "json"
        elif answer.startswith("ERROR: Unknown command"):
            fmt = "text"
        else:
            raise QueryFailed(PROTOCOL_ERROR, f"unexpected answer to SET FORMAT: {answer[:60]!r}")
        if not allow(fmt):
            raise QueryFailed(
                UNSUPPORTED,
                "the server speaks only text and its NCCL version is not known to be safe to query",
            )
        conn.send("STATUS")
        return Reply(fmt, conn.rest(max_bytes))
    except TimeoutError:
        raise QueryFailed(TIMEOUT, "no complete answer within the query's deadline") from None
    except OSError as e:
        raise QueryFailed(ERROR, f"connection: {e}") from None
    finally:
        sock.close()
