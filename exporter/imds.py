"""EC2 instance identity (instance type, instance id, availability zone) from config, the DMI
product name (the type only; exporter/dmi.py) and IMDSv2.

IMDSv2: PUT /latest/api/token, then GETs with the token, over one kept-alive http.client
connection with connect and read timeouts and bounded retries (ImdsClient). The daemon's lookup
runs on a background thread started once per process: the first try at start-up, then retries
with capped exponential back-off (and jitter, so a fleet restarted together does not retry in
step) until it succeeds.
The composition root starts it (IdentitySource.start); start-up and scrapes never wait for it,
and a scrape only reads what is known: until it succeeds the identity comes from config and DMI
alone. `check` asks once instead (IdentitySource.lookup_now). `IdentitySource` (Context.identity,
one per process) holds all three; exporter.node reads the instance type.

IMDS is not asked when `instance.imds` is false (a simulated node and a replayed capture set it
so: not a real node; tests on this machine give it in their config); a simulated node with
scenario ec2-scheduled-reboot asks only its own fake IMDS on 127.0.0.1
(exporter/tools/simulate/imds.py), whose URL the composition root hands over (compose's `imds_url`).
In a container, IMDSv2 needs the instance's metadata hop limit at 2 or more: with 1 the token's
answer is dropped, each request times out (after its retries) and the lookup keeps backing off.

Off EC2 (issue 37): IMDS is not asked when the DMI identity says the host is not an EC2 instance
(exporter.dmi.on_ec2; logged once at start). Where it is asked and fails, the lookups back off
exponentially (5 s, doubling, to instance.imds_retry_max_seconds) and log once per change of
state (the first failure at WARNING, the answer after failures at INFO; every failed attempt at
DEBUG).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar
from urllib.parse import urlsplit

from exporter.config import CollectorSection, positive, setting
from exporter.without_ssl import import_without_ssl

if TYPE_CHECKING:
    from http.client import HTTPConnection, HTTPException

    from exporter.config import Config

log = logging.getLogger("exporter.imds")

SECTION = "instance"
TOKEN_TTL_S = 21600
EVENTS_PATH = "events/maintenance/scheduled"
T = TypeVar("T")


def http_url(v: Any) -> str | None:
    """IMDS is plain HTTP: an http:// URL with a host (and a valid port, if any)."""
    try:
        url = urlsplit(v)
        ok = url.scheme == "http" and bool(url.hostname) and (url.port or 80) > 0
    except ValueError:
        ok = False
    return None if ok else "an http:// URL (IMDS is plain HTTP), like http://169.254.169.254"


@dataclass
class InstanceSection(CollectorSection):
    """Instance identity: EC2 instance id and availability zone (the instance type is node.instance_type),
    from config or the instance metadata service (IMDSv2)."""

    name: ClassVar[str] = SECTION
    enabled: bool = setting(
        True, "Export gpu_health_exporter_instance_info.")
    imds: bool = setting(
        True, "Ask IMDSv2 (the identity, scheduled events) in the background; false on a host that is not "
        "an EC2 instance (never asked under --simulate or --nvml-capture).")
    imds_endpoint: str = setting(
        "http://169.254.169.254", "IMDS base URL (IPv6-only: http://[fd00:ec2::254]).", check=http_url)
    imds_timeout_seconds: float = setting(
        1.0, "Timeout of each IMDS request.", check=positive)
    imds_retry_max_seconds: float = setting(
        600.0, "Longest wait between IMDS retries (back-off starts at 5 s and doubles).", check=positive)
    scheduled_events: bool = setting(
        True, "Poll IMDSv2 events/maintenance/scheduled in the background and export each active EC2 "
        "scheduled event (same conditions as `imds`).")
    scheduled_events_interval_seconds: float = setting(
        300.0, "How often scheduled events are polled once a poll worked (failures back off as the identity "
        "lookup does).", check=positive)
    instance_id: str | None = setting(
        None, "EC2 instance id; from IMDS when unset.")
    availability_zone: str | None = setting(
        None, "Availability zone; from IMDS when unset.")


@dataclass(frozen=True)
class InstanceIdentity:
    instance_type: str | None = None
    instance_id: str | None = None
    availability_zone: str | None = None


@dataclass(frozen=True)
class ScheduledEvent:
    """One EC2 scheduled maintenance event (IMDS events/maintenance/scheduled)."""

    code: str  # instance-reboot, system-reboot, system-maintenance, instance-retirement, instance-stop
    event_id: str
    state: str  # active (completed and canceled ones are not this path's business)
    not_before: float  # unix time the event may start
    not_after: float | None = None  # latest end; absent for instance-stop
    description: str = ""


EVENT_CODES = ("instance-reboot", "system-reboot", "system-maintenance", "instance-retirement",
               "instance-stop")


def _imds_time(v: object, where: str) -> float:
    """`21 Jan 2019 09:00:43 GMT` (day not zero-padded either) as unix time."""
    if not isinstance(v, str):
        raise ValueError(f"{where} is {v!r}; expected a date like '21 Jan 2019 09:00:43 GMT'")
    # Imported here: the email package is loaded only on nodes that read IMDS (http.client loads
    # it there anyway).
    from email.utils import parsedate_to_datetime

    try:
        return parsedate_to_datetime(v).timestamp()
    except (TypeError, ValueError, IndexError) as e:
        raise ValueError(f"{where} is {v!r}; expected a date like '21 Jan 2019 09:00:43 GMT'") from e


def parse_scheduled_events(text: str) -> list[ScheduledEvent]:
    """The active events of an events/maintenance/scheduled answer (a JSON array, `[]` when none).
    Completed or canceled entries are left out. Raises ValueError naming the entry and key for an
    answer out of shape (the poller logs it and retries; the last good answer is kept)."""
    import json

    try:
        data = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{EVENTS_PATH}: not JSON ({e})") from e
    if not isinstance(data, list):
        raise ValueError(f"{EVENTS_PATH}: expected a JSON array, got {type(data).__name__}")
    out = []
    for i, ev in enumerate(data):
        where = f"{EVENTS_PATH}[{i}]"
        if not isinstance(ev, dict):
            raise ValueError(f"{where} is not an object")
        state = str(ev.get("State", "")).lower()
        desc = str(ev.get("Description", ""))
        if state != "active" or desc.startswith(("[Completed]", "[Canceled]")):
            continue
        code, event_id = ev.get("Code"), ev.get("EventId")
        if not isinstance(code, str) or not code:
            raise ValueError(f"{where}: Code is {code!r}; expected one of {', '.join(EVENT_CODES)}")
        if not isinstance(event_id, str) or not event_id:
            raise ValueError(f"{where}: EventId is {event_id!r}; expected instance-event-<id>")
        not_before = _imds_time(ev.get("NotBefore"), f"{where}: NotBefore")
        not_after = _imds_time(ev["NotAfter"], f"{where}: NotAfter") if ev.get("NotAfter") else None
        # an unknown code is kept (EC2 may add codes): the few events a node has bound the labels
        out.append(ScheduledEvent(code, event_id[:64], state, not_before, not_after, desc[:200]))
    return out


class ImdsError(Exception):
    """IMDS did not give an answer (unreachable, timed out, refused the token, bad status)."""


# Bounded retries of one request (on top of the poller's back-off between lookups): connection
# errors and read timeouts twice and once, and IMDS's throttling or server errors twice. Refusals
# (401/403/404) are answers, never retried: a 403 token is IMDS disabled or IMDSv2 off.
CONNECT_RETRIES, READ_RETRIES, STATUS_RETRIES = 2, 1, 2
RETRY_STATUSES = (429, 500, 502, 503, 504)
RETRY_BACKOFF_S = 0.1  # no wait before a request's first retry, then 0.2 s, 0.4 s, ...
TOKEN_RENEW_S = 60.0  # get a new token this long before the old one's TTL runs out


def prepare_http_client() -> None:
    """Import http.client for the IMDS client, without ssl (exporter/without_ssl.py): IMDS is
    plain HTTP. Called by the composition root (IdentitySource), in the main thread at start-up."""
    import_without_ssl("http.client")


class _Failed(Exception):
    """One attempt failed before an answer: `kind` is connect or read (which retries it uses)."""

    def __init__(self, kind: str, error: OSError | HTTPException) -> None:
        super().__init__(_describe(error))
        self.kind = kind


class ImdsClient:
    """IMDSv2 over one kept-alive HTTP connection: connect and read timeouts of `timeout_s` each,
    bounded retries of each request (above), and the token reused until shortly before its TTL
    ends (a 401 gets a new one). No proxy and no .netrc (http.client reads neither): IMDS is
    link-local, never proxied.

    http.client rather than requests: IMDS is plain HTTP, asked on every EC2 node (the identity,
    the scheduled events), and a lookup over requests, with urllib3 and ssl, cost a serving
    exporter 8.4 MiB, over http.client without ssl 0.8 (`bench/bench_memory.py --variants imds`).
    The composition root imports it without ssl (`prepare_http_client`)."""

    def __init__(self, endpoint: str = "http://169.254.169.254", timeout_s: float = 1.0) -> None:
        url = urlsplit(endpoint)
        self.host, self.port, self.base = url.hostname or "", url.port or 80, url.path.rstrip("/")
        self.timeout_s = timeout_s
        self._conn: HTTPConnection | None = None
        self._token = ""
        self._token_expires = 0.0
        self._lock = threading.Lock()  # one request at a time on the connection

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _once(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, str]:
        """One attempt on the kept connection (a new one when there is none)."""
        import http.client

        reused = self._conn is not None
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
            try:
                self._conn.connect()
            except OSError as e:
                self._drop()
                raise _Failed("connect", e) from e
        try:
            self._conn.request(method, path, headers=headers)
            resp = self._conn.getresponse()
            body = resp.read()
        except (OSError, http.client.HTTPException) as e:
            self._drop()
            closed = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)
            if reused and isinstance(e, closed):  # IMDS closed the idle connection: once on a new one
                return self._once(method, path, headers)
            raise _Failed("read", e) from e
        if resp.will_close:
            self._drop()
        return resp.status, body.decode("utf-8", "replace")  # no charset guessing

    def _call(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, str]:
        """The request, retried within the bounds above: the last answer's status and body."""
        left = {"connect": CONNECT_RETRIES, "read": READ_RETRIES, "status": STATUS_RETRIES}
        retried = 0
        while True:
            try:
                status, body = self._once(method, f"{self.base}/latest/{path}", headers)
                if status not in RETRY_STATUSES or not left["status"]:
                    return status, body
                kind = "status"
            except _Failed as e:
                if not left[e.kind]:
                    raise ImdsError(str(e)) from e
                kind = e.kind
            left[kind] -= 1
            retried += 1
            if retried > 1:
                time.sleep(RETRY_BACKOFF_S * 2 ** (retried - 1))

    def _get_token(self) -> str:
        now = time.monotonic()
        if self._token and now < self._token_expires:
            return self._token
        status, body = self._call("PUT", "api/token",
                                  {"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)})
        if status != 200 or not body:
            raise ImdsError(f"api/token answered HTTP {status}")
        self._token, self._token_expires = body, now + TOKEN_TTL_S - TOKEN_RENEW_S
        return body

    def get(self, *paths: str) -> list[str]:
        """A token (reused while valid), then meta-data/<path> for each path: their bodies."""
        with self._lock:
            out = []
            for p in paths:
                path = f"meta-data/{p}"
                status, body = self._call("GET", path, {"X-aws-ec2-metadata-token": self._get_token()})
                if status == 401:  # the token expired early (IMDS restarted): once more with a new one
                    self._token = ""
                    status, body = self._call("GET", path, {"X-aws-ec2-metadata-token": self._get_token()})
                if status != 200 or not body:
                    raise ImdsError(f"{path} answered HTTP {status}")
                out.append(body)
            return out

    def close(self) -> None:
        with self._lock:
            self._drop()

    def fetch(self) -> InstanceIdentity:
        values = self.get("instance-type", "instance-id", "placement/availability-zone")
        return InstanceIdentity(*(v.strip() for v in values))

    def fetch_events(self) -> list[ScheduledEvent]:
        """The active scheduled maintenance events (meta-data/events/maintenance/scheduled)."""
        return parse_scheduled_events(self.get(EVENTS_PATH)[0])


def _describe(e: OSError | HTTPException) -> str:
    """One line for a failed attempt: `Timeout: ...` for a connect or read timeout, else the
    error's type and message."""
    return f"{'Timeout' if isinstance(e, TimeoutError) else type(e).__name__}: {e}"


class ImdsPoller(Generic[T]):
    """A background IMDS lookup with back-off: `fetch` until it succeeds (capped exponential
    back-off with jitter, so a fleet restarted together does not retry in step), `publish` each
    result; then stop, or (`refresh_s`) look again every refresh_s seconds, backing off again
    while it fails. `ok` is whether the last attempt succeeded."""

    def __init__(self, fetch: Callable[[], T], publish: Callable[[T], None], what: str,
                 first_retry_s: float = 5.0, max_retry_s: float = 600.0,
                 refresh_s: float | None = None, client: ImdsClient | None = None) -> None:
        self.fetch = fetch
        self.client = client  # closed when the poller's thread ends
        self.publish = publish
        self.what = what
        self.first_retry_s = first_retry_s
        self.max_retry_s = max_retry_s
        self.refresh_s = refresh_s
        self.attempts = 0
        self.last_error = ""
        self.ok = False
        self.succeeded = threading.Event()
        self.waits: list[float] = []  # per attempt, the back-off that follows it if it fails (tests)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"imds-{self.what}", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        try:
            self._poll()
        finally:
            if self.client is not None:
                self.client.close()

    def _poll(self) -> None:
        wait = self.first_retry_s
        while not self._stop.is_set():
            self.attempts += 1
            self.waits.append(wait)
            try:
                found = self.fetch()
            except (ImdsError, ValueError) as e:
                if self.ok or self.attempts == 1:  # a change of state: answering (or new) -> failing
                    log.warning("%s lookup from IMDS failed (retrying with back-off from %.0f s up to "
                                "%.0f s; logged again when it answers): %s", self.what, wait,
                                self.max_retry_s, e)
                else:
                    log.debug("%s lookup from IMDS failed again (next try in %.0f s): %s", self.what, wait, e)
                self.last_error, self.ok = str(e), False
            else:
                if self.last_error or not self.succeeded.is_set():
                    after = f" after {self.attempts - 1} failed attempt(s)" if self.last_error else ""
                    log.info("%s from IMDS%s: %s", self.what, after, found)
                self.last_error, self.ok = "", True
                self.publish(found)
                self.succeeded.set()
                if self.refresh_s is None:
                    return
                wait = self.first_retry_s
                if self._stop.wait(self.refresh_s * random.uniform(0.9, 1.1)):
                    return
                continue
            if self._stop.wait(wait * random.uniform(0.8, 1.2)):
                return
            wait = min(wait * 2, self.max_retry_s)


class IdentityLookup(ImdsPoller[InstanceIdentity]):
    """The instance identity, looked up once (retried until it succeeds)."""

    def __init__(self, client: ImdsClient, publish: Callable[[InstanceIdentity], None],
                 first_retry_s: float = 5.0, max_retry_s: float = 600.0) -> None:
        super().__init__(client.fetch, publish, "instance identity", first_retry_s, max_retry_s,
                         client=client)


def imds_allowed(config: Config) -> bool:
    """IMDS is asked only when config allows it (`instance.imds`)."""
    sec = config.find(InstanceSection)  # None: loaded before this module declared the section
    return sec is not None and sec.imds


class IdentitySource:
    """The process's instance identity. The instance type comes from config, else the DMI product
    name (read once, at start), else IMDS; the instance id and zone from config, else IMDS.

    `imds_url` is the IMDS base URL the composition root gives (a simulated node's fake on
    127.0.0.1); None: config's `instance.imds_endpoint`."""

    def __init__(self, config: Config, imds_url: str | None = None,
                 dmi_instance_type: str | None = None, on_ec2: bool | None = None) -> None:
        # the defaults where the config was loaded before this module declared the section
        # (IMDS is then never asked: imds_allowed)
        sec = self.section = config.find(InstanceSection) or InstanceSection()
        self.config = config
        self.endpoint = imds_url or sec.imds_endpoint
        self.on_ec2 = on_ec2  # the DMI identity's answer (exporter.dmi.on_ec2); None: not known
        self.imds_allowed = imds_allowed(config) and on_ec2 is not False
        if self.imds_allowed:
            prepare_http_client()  # here: the main thread, before the daemon's threads start
        if imds_allowed(config) and on_ec2 is False:
            log.info("not asking IMDS: the DMI identity says this host is not an EC2 instance (set "
                     "node.instance_type, instance.instance_id and instance.availability_zone to name it)")
        self.configured = InstanceIdentity(config.node.instance_type, sec.instance_id, sec.availability_zone)
        self.dmi_instance_type = dmi_instance_type
        self.found: InstanceIdentity | None = None  # set once by the lookup (thread or lookup_now)
        self.lookup: IdentityLookup | None = None
        self.last_error = ""  # of lookup_now
        self._one_shot = False
        self._lock = threading.Lock()

    def current(self) -> InstanceIdentity:
        conf, found = self.configured, self.found or InstanceIdentity()
        return InstanceIdentity(conf.instance_type or self.dmi_instance_type or found.instance_type,
                                conf.instance_id or found.instance_id,
                                conf.availability_zone or found.availability_zone)

    def instance_type_source(self) -> str | None:
        """Where the instance type comes from: config, dmi, imds, or None while unknown."""
        if self.configured.instance_type:
            return "config"
        if self.dmi_instance_type:
            return "dmi"
        return "imds" if self.found is not None and self.found.instance_type else None

    def publish(self, ident: InstanceIdentity) -> None:
        self.found = ident

    def start(self) -> IdentityLookup | None:
        """Start the background IMDS lookup once: the daemon's composition root calls this at
        start-up, never a scrape. None when IMDS is off, config (and DMI) already give every
        field, or a one-shot command looked the type up already (lookup_now)."""
        conf = self.configured
        known = (conf.instance_type or self.dmi_instance_type) and conf.instance_id and conf.availability_zone
        if not self.imds_allowed or self._one_shot or known:
            return None
        with self._lock:
            if self.lookup is None:
                sec = self.section
                client = ImdsClient(self.endpoint, sec.imds_timeout_seconds)
                self.lookup = IdentityLookup(client, self.publish, max_retry_s=sec.imds_retry_max_seconds)
                self.lookup.start()
        return self.lookup

    def close(self) -> None:
        """Stop the background lookup (at shutdown)."""
        if self.lookup is not None:
            self.lookup.close()

    def lookup_now(self) -> str | None:
        """For a one-shot command (`check`): when neither config nor DMI gives the instance type,
        ask IMDS once, now, with the configured (short) timeout, and start no background lookup
        afterwards. Returns the instance type."""
        self._one_shot = True
        if self.current().instance_type or not self.imds_allowed:
            return self.current().instance_type
        sec = self.section
        client = ImdsClient(self.endpoint, sec.imds_timeout_seconds)
        try:
            self.publish(client.fetch())
        except ImdsError as e:
            self.last_error = str(e)
            log.warning("instance type lookup from IMDS failed: %s", e)
        finally:
            client.close()
        return self.current().instance_type


def events_poller(identity: IdentitySource,
                  publish: Callable[[list[ScheduledEvent]], None]) -> ImdsPoller[list[ScheduledEvent]] | None:
    """A started poller of the scheduled events, or None when IMDS or the events are off."""
    sec = identity.section
    if not identity.imds_allowed or not sec.scheduled_events:
        return None
    client = ImdsClient(identity.endpoint, sec.imds_timeout_seconds)
    poller = ImdsPoller(client.fetch_events, publish, "scheduled events",
                        max_retry_s=sec.imds_retry_max_seconds,
                        refresh_s=sec.scheduled_events_interval_seconds, client=client)
    poller.start()
    return poller
