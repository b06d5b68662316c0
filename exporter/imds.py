"""EC2 instance identity (instance type, instance id, availability zone) from IMDSv2 or config.

IMDSv2: PUT /latest/api/token, then GETs with the token, each with a short timeout. The lookup
runs on a background thread started once per process: the first try at start-up, then retries
with capped exponential back-off (and jitter, so a fleet restarted together does not retry in
step) until it succeeds. Start-up and scrapes never wait for it; until it succeeds the identity
comes from config alone. The result is published as ctx.shared["instance_identity"]
(exporter.node reads `instance_type` from it).

IMDS is never consulted under --simulate or --nvml-capture (not a real node), when
`instance.imds` is false, or when the environment sets GPU_HEALTH_EXPORTER_IMDS=off (tests).
In a container, IMDSv2 needs the instance's metadata hop limit at 2 or more.
"""

from __future__ import annotations

import logging
import os
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass

from exporter.collector import Context
from exporter.config import Key, declare_section, positive

log = logging.getLogger("exporter.imds")

SECTION = "instance"
ENV_SWITCH = "GPU_HEALTH_EXPORTER_IMDS"
SHARED_KEY = "instance_identity"
LOOKUP_KEY = "instance_identity_lookup"
TOKEN_TTL_S = 21600

declare_section(SECTION, "Instance identity: EC2 instance id and availability zone (the instance type is "
                "node.instance_type), from config or the instance metadata service (IMDSv2).", {
    "enabled": Key(bool, True, "Export gpu_health_exporter_instance_info."),
    "imds": Key(bool, True, "Look the identity up from IMDSv2 in the background (never under --simulate "
                "or --nvml-capture, or when the environment sets GPU_HEALTH_EXPORTER_IMDS=off)."),
    "imds_endpoint": Key(str, "http://169.254.169.254", "IMDS base URL (IPv6-only: http://[fd00:ec2::254])."),
    "imds_timeout_seconds": Key((int, float), 1.0, "Timeout of each IMDS request.", check=positive),
    "imds_retry_max_seconds": Key((int, float), 600.0,
                                  "Longest wait between IMDS retries (back-off starts at 5 s and doubles).",
                                  check=positive),
    "instance_id": Key(str, None, "EC2 instance id; from IMDS when unset.", nullable=True),
    "availability_zone": Key(str, None, "Availability zone; from IMDS when unset.", nullable=True),
})


@dataclass(frozen=True)
class InstanceIdentity:
    instance_type: str | None = None
    instance_id: str | None = None
    availability_zone: str | None = None


class ImdsError(Exception):
    """IMDS did not give an answer (unreachable, timed out, refused the token, bad status)."""


class ImdsClient:
    def __init__(self, endpoint: str = "http://169.254.169.254", timeout_s: float = 1.0) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.timeout_s = timeout_s

    def fetch(self) -> InstanceIdentity:
        import requests  # here, not at module level: ~13 MiB RSS that nodes without IMDS never need

        with requests.Session() as s:
            s.trust_env = False  # never send metadata requests through an HTTP(S)_PROXY
            try:
                r = s.put(f"{self.endpoint}/latest/api/token", timeout=self.timeout_s,
                          headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)})
                if r.status_code != 200 or not r.text:
                    raise ImdsError(f"token request answered HTTP {r.status_code}")
                headers = {"X-aws-ec2-metadata-token": r.text}
                values = {}
                for key, path in (("instance_type", "instance-type"), ("instance_id", "instance-id"),
                                  ("availability_zone", "placement/availability-zone")):
                    g = s.get(f"{self.endpoint}/latest/meta-data/{path}", headers=headers,
                              timeout=self.timeout_s)
                    if g.status_code != 200:
                        raise ImdsError(f"meta-data/{path} answered HTTP {g.status_code}")
                    values[key] = g.text.strip()
            except requests.RequestException as e:
                raise ImdsError(f"{type(e).__name__}: {e}") from e
        return InstanceIdentity(**values)


class IdentityLookup:
    """Background IMDS lookup with back-off; `publish` receives the identity once it succeeds."""

    def __init__(self, client: ImdsClient, publish: Callable[[InstanceIdentity], None],
                 first_retry_s: float = 5.0, max_retry_s: float = 600.0) -> None:
        self.client = client
        self.publish = publish
        self.first_retry_s = first_retry_s
        self.max_retry_s = max_retry_s
        self.attempts = 0
        self.last_error = ""
        self.succeeded = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="imds", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        wait = self.first_retry_s
        while not self._stop.is_set():
            self.attempts += 1
            try:
                ident = self.client.fetch()
            except ImdsError as e:
                if self.attempts == 1 or str(e) != self.last_error:
                    log.warning("instance metadata lookup failed (retrying in %.0f s): %s", wait, e)
                self.last_error = str(e)
            else:
                self.last_error = ""
                self.publish(ident)
                self.succeeded.set()
                log.info("instance identity from IMDS: %s %s %s", ident.instance_type, ident.instance_id,
                         ident.availability_zone)
                return
            if self._stop.wait(wait * random.uniform(0.8, 1.2)):
                return
            wait = min(wait * 2, self.max_retry_s)


def imds_allowed(ctx: Context) -> bool:
    if ctx.simulation is not None or ctx.nvml_capture:
        return False
    if os.environ.get(ENV_SWITCH, "").lower() in ("off", "0", "false", "no"):
        return False
    return bool(getattr(ctx.config, SECTION).imds)


def configured_identity(ctx: Context) -> InstanceIdentity:
    sec = getattr(ctx.config, SECTION)
    return InstanceIdentity(ctx.config.node.instance_type, sec.instance_id, sec.availability_zone)


def identity(ctx: Context) -> InstanceIdentity:
    """Config values first, then what IMDS found (fields config leaves unset)."""
    conf = configured_identity(ctx)
    found = ctx.shared.get(SHARED_KEY)
    if found is None:
        return conf
    return InstanceIdentity(conf.instance_type or found.instance_type, conf.instance_id or found.instance_id,
                            conf.availability_zone or found.availability_zone)


def ensure_lookup(ctx: Context) -> IdentityLookup | None:
    """Start the process-wide IMDS lookup once (any collector that needs the identity calls this
    from its start()). None when IMDS is off or config already gives every field."""
    if not imds_allowed(ctx):
        return None
    conf = configured_identity(ctx)
    if conf.instance_type and conf.instance_id and conf.availability_zone:
        return None
    sec = getattr(ctx.config, SECTION)

    def make() -> IdentityLookup:
        def publish(ident: InstanceIdentity) -> None:
            ctx.shared[SHARED_KEY] = ident

        return IdentityLookup(ImdsClient(sec.imds_endpoint, sec.imds_timeout_seconds), publish,
                              max_retry_s=sec.imds_retry_max_seconds)

    lookup = ctx.get_shared(LOOKUP_KEY, make)
    lookup.start()
    return lookup
