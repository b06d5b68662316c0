"""A TLS proxy in front of the test's kube-apiserver that can misbehave on demand.

Run inside the API server's network namespace with a listening socket made in the test's own
namespace (inherited as file descriptor LISTEN_FD): the exporter under test connects to it on the
test's 127.0.0.1, the proxy forwards to the real API server on the namespace's 127.0.0.1.

Before each request it reads the control file (JSON, written by the test):
- {"mode": "pass"}: forward;
- {"mode": "drop"}: close the connection without an answer (an API server that went away);
- {"mode": "status", "status": 403}: answer that status with a Kubernetes Status object;
- "delay_s": wait that long before answering (a slow server), with any mode;
- "revoked": [tokens]: a bearer token in this list gets 401 (a rotated-out token).
Every request is appended to the log file: `METHOD PATH STATUS TOKEN`.

usage: faultproxy.py LISTEN_FD CONTROL LOG UPSTREAM_PORT CERT KEY
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    fd, control, logfile, upstream, cert, key = sys.argv[1:7]
    lock = threading.Lock()
    upctx = ssl.create_default_context(cafile=cert)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a: object) -> None:
            pass

        def _do(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                with open(control) as f:
                    ctl = json.load(f)
            except (OSError, ValueError):
                ctl = {}
            token = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
            time.sleep(float(ctl.get("delay_s", 0)))
            mode = ctl.get("mode", "pass")
            if mode == "drop":
                self._log("-", token)
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if token in ctl.get("revoked", []):
                return self._status(401, "Unauthorized", token)
            if mode == "status":
                return self._status(int(ctl["status"]), "injected by the test's fault proxy", token)
            conn = http.client.HTTPSConnection("127.0.0.1", int(upstream), context=upctx, timeout=30)
            headers = {k: v for k, v in self.headers.items()
                       if k.lower() in ("authorization", "content-type", "accept")}
            conn.request(self.command, self.path, body=body or None, headers=headers)
            r = conn.getresponse()
            data = r.read()
            conn.close()
            self._answer(r.status, data, r.getheader("Content-Type") or "application/json", token)

        do_GET = do_PATCH = do_POST = do_PUT = do_DELETE = _do

        def _status(self, code: int, message: str, token: str) -> None:
            reason = {401: "Unauthorized", 403: "Forbidden", 409: "Conflict"}.get(code, "InternalError")
            body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                               "reason": reason, "code": code}).encode()
            self._answer(code, body, "application/json", token)

        def _answer(self, code: int, body: bytes, ctype: str, token: str) -> None:
            self._log(str(code), token)
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _log(self, status: str, token: str) -> None:
            with lock, open(logfile, "a") as f:
                f.write(f"{self.command} {self.path} {status} {token or '-'}\n")

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler, bind_and_activate=False)
    srv.daemon_threads = True
    srv.socket.close()
    srv.socket = ctx.wrap_socket(socket.socket(fileno=int(fd)), server_side=True,
                                 do_handshake_on_connect=False)
    print("up", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
