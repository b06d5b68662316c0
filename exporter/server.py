"""The HTTP endpoint: /metrics, the landing page, /healthz and /readyz, on exporter.httpd.

- /metrics: one collection (shared with concurrent scrapes) plus the process_* metrics, in the
  format and encoding the client asks for (406 when it accepts no encoding we have).
- /: the node verdict, GPUs needing action and each source's problems, from the last collection.
- /healthz: 200 while the process serves. /readyz: 200 once the first collection is done; the
  server runs one in the background at start, so a pod becomes Ready without waiting for
  Prometheus. Both answer without credentials (they carry no data) so probes need no secret.
- Basic auth (when the web config has users) guards everything else; TLS is the transport's.
"""

from __future__ import annotations

import logging
import threading
import time

from exporter.config import Config
from exporter.exposition import choose_encoding, encode
from exporter.httpd import HttpServer, Limits, Request, Response
from exporter.landing import render_page
from exporter.metric import Metric
from exporter.process import process_metrics
from exporter.runner import Runner
from exporter.webconfig import BasicAuth, WebConfig

log = logging.getLogger("exporter.server")

_OPEN_PATHS = ("/healthz", "/readyz")


class App:
    """Routes a request; remembers the last collection for the landing page."""

    def __init__(self, runner: Runner, web: WebConfig | None = None) -> None:
        self.runner = runner
        self.auth = BasicAuth(web.users) if web and web.users else None
        self.last: list[Metric] | None = None
        self.last_at: float | None = None

    def collect(self, scrape: bool = True, arrived: float | None = None) -> list[Metric]:
        metrics = self.runner.collect(scrape, arrived)
        self.last, self.last_at = metrics, time.time()
        return metrics

    def __call__(self, req: Request) -> Response:
        if self.auth is not None and req.path not in _OPEN_PATHS \
                and not self.auth.check(req.headers.get("authorization", "")):
            return Response(401, b"unauthorized\n",
                            [("WWW-Authenticate", 'Basic realm="gpu-health-exporter"')])
        if req.path == "/metrics":
            coding = choose_encoding(req.headers.get("accept-encoding", ""))
            if coding is None:
                return Response(406, b"no acceptable content coding; gzip and identity are offered\n")
            metrics = self.collect(arrived=req.received) + process_metrics()
            body, headers = encode(metrics, req.headers.get("accept", ""), coding)
            return Response(200, body, [h for h in headers if h[0] != "Content-Length"])
        if req.path == "/healthz":
            return Response(200, b"ok\n")
        if req.path == "/readyz":
            if self.runner.ready.is_set():
                return Response(200, b"ready\n")
            return Response(503, b"first collection not done yet\n")
        if req.path in ("/", "/index.html"):
            page = render_page(self.last, self.runner.status, self.last_at)
            return Response(200, page.encode(), [("Content-Type", "text/html; charset=utf-8")])
        return Response(404, b"not found; see /metrics\n")


def limits_from_config(cfg: Config) -> Limits:
    w = cfg.web
    return Limits(max_connections=w.max_connections, read_header_timeout=w.read_header_timeout_seconds,
                  idle_timeout=w.idle_timeout_seconds, write_timeout=w.write_timeout_seconds,
                  workers=w.workers)


class Server:
    """The endpoint on a background thread; `start` also runs the first collection in the
    background, `shutdown` stops serving within about two seconds."""

    def __init__(self, runner: Runner, host: str, port: int, web: WebConfig | None = None,
                 limits: Limits | None = None) -> None:
        self.app = App(runner, web)
        web = web or WebConfig()
        self.httpd = HttpServer(self.app, host, port, limits or Limits(), web.ssl_context, web.headers)
        self.port = self.httpd.port
        self.tls = web.ssl_context is not None

    def start(self) -> None:
        self.httpd.start()
        threading.Thread(target=self._first_collection, name="first-collection", daemon=True).start()

    def _first_collection(self) -> None:
        try:
            self.app.collect(scrape=False)
        except Exception:  # noqa: BLE001 - the runner isolates collectors; this is a last resort
            log.exception("first collection failed")

    def shutdown(self) -> None:
        self.httpd.shutdown()
