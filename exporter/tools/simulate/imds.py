"""The simulated node's instance metadata service: an IMDSv2 on 127.0.0.1 (never the real address)
serving the profile's identity and, with scenario `ec2-scheduled-reboot`, scheduled maintenance
events in the documented JSON shape. It runs only while that scenario is active; otherwise a
simulated node asks no IMDS at all."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from exporter.profiles import Profile
from exporter.tools.simulate.source import SimSource

if TYPE_CHECKING:
    # Imported when the scenario runs: http.server loads http.client, ssl and email (~5 MiB RSS,
    # counted by bench_memory.py), which a simulated node without the scenario does not use.
    from http.server import BaseHTTPRequestHandler

TOKEN = "AQAEAsimulatedToken=="
REBOOT_IN_S = 20 * 3600.0  # inside the 24-hour page
MAINTENANCE_IN_S = 5 * 86400.0  # inside the 7-day ticket only


def imds_date(t: float) -> str:
    """`21 Jan 2019 09:00:43 GMT`, IMDS's form (day not zero-padded)."""
    from email.utils import formatdate

    s = formatdate(t, usegmt=True)  # 'Mon, 21 Jan 2019 09:00:43 GMT'
    return s.split(", ", 1)[1].lstrip("0")


def scheduled_events(now: float) -> list[dict]:
    return [
        {"Code": "system-reboot", "Description": "scheduled reboot",
         "EventId": "instance-event-0d59937288b749b32", "NotBefore": imds_date(now + REBOOT_IN_S),
         "NotAfter": imds_date(now + REBOOT_IN_S + 1800), "State": "active"},
        {"Code": "system-maintenance", "Description": "scheduled network maintenance",
         "EventId": "instance-event-0a1b2c3d4e5f60718", "NotBefore": imds_date(now + MAINTENANCE_IN_S),
         "NotAfter": imds_date(now + MAINTENANCE_IN_S + 3600), "State": "active"},
        {"Code": "system-reboot", "Description": "[Completed] scheduled reboot",
         "EventId": "instance-event-00000000000000001", "NotBefore": imds_date(now - 86400 * 20),
         "State": "completed"},
    ]


class FakeImdsServer:
    """IMDSv2 on 127.0.0.1: PUT /latest/api/token (the TTL header required), then GET
    /latest/meta-data/<key> with the token, answered from `meta` (which may change while it
    serves). For tests: `delay_s` delays every answer (until `released` is set), `token_status`
    refuses the token (IMDS disabled), `fail_next` answers the next requests with these statuses
    (throttling: 429), changing `token` expires the tokens handed out, `requests` records (method, path)."""

    def __init__(self, meta: dict[str, str]) -> None:
        from http.server import ThreadingHTTPServer

        self.meta = meta
        self.delay_s = 0.0
        self.released = threading.Event()  # set: delayed answers go out now (a test's hang ends)
        self.token_status = 200
        self.token = TOKEN
        self.fail_next: list[int] = []
        self.requests: list[tuple[str, str]] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        from http.server import BaseHTTPRequestHandler

        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: object) -> None:
                pass

            def _send(self, status: int, body: str = "") -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (its timeout)

            def _answer(self, method: str) -> bool:
                """Record the request; True when it was answered with one of `fail_next`."""
                fake.requests.append((method, self.path))
                fake.released.wait(fake.delay_s)
                if fake.fail_next:
                    self._send(fake.fail_next.pop(0))
                    return True
                return False

            def do_PUT(self) -> None:  # noqa: N802
                if self._answer("PUT"):
                    return None
                if self.path != "/latest/api/token" or not self.headers.get(
                        "X-aws-ec2-metadata-token-ttl-seconds"):
                    return self._send(400)
                return self._send(fake.token_status, fake.token if fake.token_status == 200 else "")

            def do_GET(self) -> None:  # noqa: N802
                if self._answer("GET"):
                    return None
                if self.headers.get("X-aws-ec2-metadata-token") != fake.token:
                    return self._send(401)
                body = fake.meta.get(self.path.removeprefix("/latest/meta-data/"))
                return self._send(404) if body is None else self._send(200, body)

        return Handler

    def start(self, poll_interval_s: float = 0.2) -> None:
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": poll_interval_s},
                         name="fake-imds", daemon=True).start()

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


class ImdsSimSource(SimSource):
    name = "imds"
    scenarios = {
        "ec2-scheduled-reboot": "a fake IMDSv2 on 127.0.0.1 announces a system-reboot starting 20 h after "
                                "start (pages) and a system-maintenance in 5 days (tickets)",
    }

    def __init__(self, root: Path, profile: Profile, scenarios: set[str]) -> None:
        super().__init__(root, profile, scenarios)
        self.server: FakeImdsServer | None = None
        self.url: str | None = None
        if self.active:  # bound now: the config needs the address before the node is built
            self.server = FakeImdsServer({
                "instance-type": profile.instance_type, "instance-id": "i-0simulated0000000",
                "placement/availability-zone": "us-east-2b",
                "events/maintenance/scheduled": json.dumps(scheduled_events(time.time()), indent=1)})
            self.url = self.server.url

    def build(self) -> None:
        if self.server is not None:
            self.server.start()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


SOURCE = ImdsSimSource
