"""Debian's headless Chromium driven over the DevTools protocol on a pipe (no WebSocket, no port):
open a page with JavaScript off (Emulation.setScriptExecutionDisabled, which the browser enforces;
command-line switches such as --disable-javascript are not honoured by headless Chromium), and read
back its DOM as the browser built it and a PNG screenshot. For tests/test_landing_page.py."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Rendered:
    html: str  # the DOM as the browser built it (outerHTML of the document)
    png: bytes  # a screenshot of the viewport


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "chromium is missing: .ci/run installs Debian's chromium package"
    return path


class _Pipe:
    def __init__(self, proc: subprocess.Popen, to_browser: int, from_browser: int) -> None:
        self.proc, self.w, self.r = proc, to_browser, from_browser
        self.buf = b""
        self.next_id = 0
        self.events: list[dict] = []

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self.buf:
            assert time.monotonic() < deadline, "Chromium did not answer in time"
            chunk = os.read(self.r, 1 << 16)
            assert chunk, "Chromium closed the DevTools pipe"
            self.buf += chunk
        raw, _, self.buf = self.buf.partition(b"\0")
        return json.loads(raw)

    def call(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 60) -> dict:
        self.next_id += 1
        msg: dict = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            got = self._read_message(deadline)
            if got.get("id") == self.next_id:
                assert "error" not in got, f"{method}: {got['error']}"
                return got.get("result", {})
            self.events.append(got)

    def wait_event(self, method: str, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            for i, ev in enumerate(self.events):
                if ev.get("method") == method:
                    return self.events.pop(i)
            self.events.append(self._read_message(deadline))


def render(url: str, profile: Path, width: int = 1400, height: int = 1800) -> Rendered:
    """Load `url` in headless Chromium with scripts disabled; its DOM and a screenshot."""
    to_r, to_w = os.pipe()  # browser reads commands on fd 3
    from_r, from_w = os.pipe()  # and writes answers on fd 4

    def fds() -> None:
        os.dup2(to_r, 3)
        os.dup2(from_w, 4)

    proc = subprocess.Popen([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                             "--disable-dev-shm-usage", "--no-proxy-server", f"--user-data-dir={profile}",
                             "--remote-debugging-pipe", f"--window-size={width},{height}", "about:blank"],
                            pass_fds=(3, 4, to_r, from_w), preexec_fn=fds, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    os.close(to_r)
    os.close(from_w)
    pipe = _Pipe(proc, to_w, from_r)
    try:
        target = pipe.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = pipe.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        pipe.call("Emulation.setScriptExecutionDisabled", {"value": True}, session)
        pipe.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session)
        pipe.call("Page.enable", {}, session)
        pipe.call("Page.navigate", {"url": url}, session)
        pipe.wait_event("Page.loadEventFired")
        root = pipe.call("DOM.getDocument", {"depth": -1}, session)["root"]["nodeId"]
        html = pipe.call("DOM.getOuterHTML", {"nodeId": root}, session)["outerHTML"]
        png = base64.b64decode(pipe.call("Page.captureScreenshot", {"format": "png"}, session)["data"])
        return Rendered(html, png)
    finally:
        try:
            pipe.call("Browser.close", timeout=10)
        except (AssertionError, OSError):
            pass
        os.close(to_w)
        os.close(from_r)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(20)
