"""The HTTP endpoint: /metrics, a landing page, /healthz and /readyz."""

from __future__ import annotations

import html
import logging
import threading
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from exporter import __version__
from exporter.exposition import encode
from exporter.runner import Runner

log = logging.getLogger("exporter.server")


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    # socketserver's default listen backlog of 5 drops the rest of a burst of connections, whose
    # clients then retry a second later: 20 concurrent scrapes arrived in two waves.
    request_queue_size = 128


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s %s", self.address_string(), format % args)


def build_app(runner: Runner):  # noqa: ANN201 - a WSGI callable
    def app(environ, start_response):  # noqa: ANN001, ANN202
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            body, headers = encode(runner.collect(), environ.get("HTTP_ACCEPT", ""),
                                   environ.get("HTTP_ACCEPT_ENCODING", ""))
            start_response("200 OK", headers)
            return [body]
        if path == "/healthz":
            return _text(start_response, "200 OK", "ok\n")
        if path == "/readyz":
            if runner.ready.is_set():
                return _text(start_response, "200 OK", "ready\n")
            return _text(start_response, "503 Service Unavailable", "first collection not done yet\n")
        if path in ("/", "/index.html"):
            body = _landing(runner).encode()
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8"),
                                      ("Content-Length", str(len(body)))])
            return [body]
        return _text(start_response, "404 Not Found", "not found; see /metrics\n")

    return app


def _text(start_response, status: str, body: str) -> list[bytes]:  # noqa: ANN001
    data = body.encode()
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"),
                            ("Content-Length", str(len(data)))])
    return [data]


def _landing(runner: Runner) -> str:
    rows = []
    for name, st in runner.status.items():
        state = "not collected yet" if st.ok is None else ("ok" if st.ok else "failed: " + st.error)
        rows.append(f"<tr><td>{html.escape(name)}</td><td>{html.escape(state)}</td>"
                    f"<td>{st.duration * 1000:.1f} ms</td></tr>")
    return (
        "<!doctype html><html><head><title>gpu-health-exporter</title></head><body>"
        f"<h1>gpu-health-exporter {html.escape(__version__)}</h1>"
        '<p><a href="/metrics">Metrics</a> &middot; <a href="/healthz">healthz</a> &middot; '
        '<a href="/readyz">readyz</a></p>'
        "<table border=1 cellpadding=4><tr><th>collector</th><th>last status</th><th>duration</th></tr>"
        + "".join(rows) + "</table></body></html>\n"
    )


class Server:
    """A threaded HTTP server on a background thread; `shutdown` stops it cleanly."""

    def __init__(self, runner: Runner, host: str, port: int) -> None:
        self.httpd = make_server(host, port, build_app(runner), _ThreadingWSGIServer, _QuietHandler)
        self.port = self.httpd.server_port
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def shutdown(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
