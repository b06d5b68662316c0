"""The HTTP endpoint: the telemetry path (/metrics), the landing page, /healthz and /readyz, on
exporter.web.httpd.

- /metrics: the runner's collection (shared with concurrent scrapes) plus the process_* metrics,
  rendered directly (exporter.exposition) in the format and encoding the client asks for (406
  when it accepts no encoding we have). Scrapes that share a collection share its rendered body
  too. `?collect[]=gpu&collect[]=efa` keeps only those collectors' parts of the collection (with
  the exporter's own: build_info, scrapes, process_*; collector_success and duration for those
  collectors only), as node_exporter's filter does; `exclude[]` keeps all but those. The filter
  applies to the shared collection: it selects what is sent, not what is run (docs/design.md,
  "collect[]").
- /: the node verdict (the health collector's last reading), GPUs needing action and each
  source's problems; a reading older than LANDING_MAX_AGE_S is refreshed first.
- /healthz: 200 while the process serves. /readyz: 200 once the first collection is done; the
  server runs one in the background at start, so a pod becomes Ready without waiting for
  Prometheus. Both are answered on the server's event loop (never behind its workers or a
  password check) and without credentials (they carry no data), so probes need no secret.
- Basic auth (when the web config has users) guards everything else; exporter.web.httpd runs it.
  TLS is the transport's.
"""

from __future__ import annotations

import logging
import threading
import time
from urllib.parse import parse_qs

from exporter.collection import Collection
from exporter.config import Config
from exporter.exposition import choose_encoding, encode, negotiate
from exporter.metric import Metric
from exporter.process import process_metrics
from exporter.runner import Runner
from exporter.web.httpd import HttpServer, Limits, Request, Response
from exporter.web.landing import render_page
from exporter.web.webconfig import BasicAuth, WebConfig

log = logging.getLogger("exporter.web.server")

LANDING_MAX_AGE_S = 5.0  # `/` collects again when its reading is older than this
RUNBOOKS_PATH = "/runbooks.html"  # the runbooks, which the landing page links to
_RESERVED = ("/", "/index.html", "/healthz", "/readyz", RUNBOOKS_PATH)  # not a telemetry path


class App:
    """Routes a request; remembers the last collection for the landing page."""

    def __init__(self, runner: Runner, web: WebConfig | None = None,
                 telemetry_path: str = "/metrics") -> None:
        self.runner = runner
        self.auth = BasicAuth(web.users) if web and web.users else None
        self.telemetry_path = telemetry_path
        self.last: list[Metric] | None = None
        self.last_at: float | None = None  # wall time of self.last
        self._runbooks: bytes | None = None  # /runbooks.html, rendered once
        # Scrapes that share a collection share its rendered body, per format, coding and filter
        # (process_* as of the first of them): a burst of scrapes, or clients that pipeline
        # requests, cost one render and one gzip per collection, not one per request.
        self._body_lock = threading.Lock()
        self._bodies_of: Collection | None = None
        self._bodies: dict[tuple[bool, str, frozenset[str] | None], tuple[bytes, list[tuple[str, str]]]] = {}

    def collect(self, scrape: bool = True, arrived: float | None = None) -> Collection:
        metrics = self.runner.collect(scrape, arrived)
        self.last, self.last_at = metrics, time.time()
        return metrics

    def quick(self, req: Request) -> Response | None:
        """The probes, answered on the event loop; None for everything else."""
        if req.path == "/healthz":
            return Response(200, b"ok\n")
        if req.path == "/readyz":
            if self.runner.ready.is_set():
                return Response(200, b"ready\n")
            return Response(503, b"first collection not done yet\n")
        return None

    def __call__(self, req: Request) -> Response:
        """Everything but the probes; the server has checked the credentials."""
        if req.path == self.telemetry_path:
            return self.metrics(req)
        if req.path in ("/", "/index.html"):
            return self.landing()
        if req.path == RUNBOOKS_PATH:
            return self.runbooks()
        quick = self.quick(req)
        if quick is not None:
            return quick
        return Response(404, f"not found; see {self.telemetry_path}\n".encode())

    def metrics(self, req: Request) -> Response:
        coding = choose_encoding(req.headers.get("accept-encoding", ""))
        if coding is None:
            return Response(406, b"no acceptable content coding; gzip and identity are offered\n")
        enabled = [c.name for c in self.runner.collectors]
        wanted, problem = collectors_wanted(req.query, enabled)
        if problem:
            return Response(400, problem.encode() + b"\n")
        metrics = self.collect(arrived=req.received)
        accept = req.headers.get("accept", "")
        key = (negotiate(accept), coding, frozenset(wanted) if wanted is not None else None)
        with self._body_lock:
            if self._bodies_of is not metrics:  # a new collection: the old bodies are stale
                self._bodies_of, self._bodies = metrics, {}
            got = self._bodies.get(key)
            if got is None:
                got = self._bodies[key] = encode(families(metrics, wanted), accept, coding)
        return Response(200, *got)

    def runbooks(self) -> Response:
        """The runbooks, rendered (the landing page links each reason to its section): the node
        always has them, from the checkout or the wheel's copy (exporter.share)."""
        if self._runbooks is None:
            from exporter import runbooks, share

            root = share.root()
            built = root / share.RUNBOOKS_HTML
            self._runbooks = built.read_bytes() if built.is_file() else \
                runbooks.render((root / "docs" / "runbooks.md").read_text()).encode()
        return Response(200, self._runbooks, [("Content-Type", "text/html; charset=utf-8")])

    def landing(self) -> Response:
        if self.last_at is None or time.time() - self.last_at > LANDING_MAX_AGE_S:
            self.collect(scrape=False)  # a fault injected a moment ago shows without a scrape
        verdict = self.runner.readings.get("health")
        page = render_page(self.last, self.runner.status, self.last_at, verdict, self.telemetry_path)
        return Response(200, page.encode(), [("Content-Type", "text/html; charset=utf-8")])


def collectors_wanted(query: str, enabled: list[str]) -> tuple[set[str] | None, str]:
    """The collectors a query's `collect[]` / `exclude[]` select (None: no filter), or the
    problem with it: a name that is not an enabled collector, or both parameters at once."""
    if "[]" not in query and "%5B" not in query.upper():
        return None, ""
    params = parse_qs(query)
    collect, exclude = params.get("collect[]", []), params.get("exclude[]", [])
    if collect and exclude:
        return None, "collect[] and exclude[] cannot be used together"
    for name in collect + exclude:
        if name not in enabled:
            shown = name if len(name) <= 64 else name[:64] + "..."
            return None, (f"collect[]/exclude[]: unknown or disabled collector {shown!r}; enabled: "
                          + ", ".join(enabled))
    if collect:
        return set(collect), ""
    if exclude:
        return set(enabled) - set(exclude), ""
    return None, ""


def families(collection: Collection, wanted: set[str] | None = None) -> list[Metric]:
    """What /metrics renders: the collection's families (those of the `wanted` collectors and
    the runner's own; None: all), then process_* as of now."""
    return [*collection.select(wanted), *process_metrics()]


def limits_from_config(cfg: Config) -> Limits:
    w = cfg.web
    return Limits(max_connections=w.max_connections, read_header_timeout=w.read_header_timeout_seconds,
                  idle_timeout=w.idle_timeout_seconds, write_timeout=w.write_timeout_seconds,
                  workers=w.workers)


class Server:
    """The endpoint on a background thread; `start` also runs the first collection in the
    background, `shutdown` stops serving within about two seconds."""

    def __init__(self, runner: Runner, host: str, port: int, web: WebConfig | None = None,
                 limits: Limits | None = None, telemetry_path: str = "/metrics") -> None:
        if not telemetry_path.startswith("/") or telemetry_path in _RESERVED:
            raise ValueError(f"telemetry path {telemetry_path!r} must start with / and not be /, /healthz "
                             "or /readyz")
        self.app = App(runner, web, telemetry_path)
        web = web or WebConfig()
        self.httpd = HttpServer(self.app, host, port, limits or Limits(), web.ssl_context, web.headers,
                                quick=self.app.quick, auth=self.app.auth)
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
