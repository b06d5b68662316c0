"""Shared test helpers: scraping a runner, reading samples, running the real promtool, and
starting the exporter as a subprocess on 127.0.0.1."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from exporter.exposition import render
from exporter.runner import Runner

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


def scrape(runner: Runner) -> str:
    """One collection rendered as /metrics serves it (text format)."""
    return render(runner.collect()).decode()


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """{(sample name, frozenset of label items): value} for a text exposition."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(text_or_samples, name: str, **labels: str) -> float:
    """The one sample named `name` whose labels include `labels`; fails if none or several."""
    ss = samples(text_or_samples) if isinstance(text_or_samples, str) else text_or_samples
    want = {(k, str(v)) for k, v in labels.items()}
    hits = [v for (n, ls), v in ss.items() if n == name and want <= ls]
    assert len(hits) == 1, f"{name}{labels}: {len(hits)} samples match"
    return hits[0]


def names(text: str) -> set[str]:
    return {n for n, _ in samples(text)}


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is missing: install Debian's 'prometheus' package (.ci/run does)"
    return path


def promtool_check_metrics(text: str) -> str:
    """Run `promtool check metrics` on an exposition; returns its complaints ('' when clean)."""
    r = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True,
                       timeout=60)
    return (r.stdout + r.stderr).strip() if r.returncode != 0 or r.stdout.strip() or r.stderr.strip() else ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_serving(url: str, proc: subprocess.Popen | None = None, timeout: float = 30.0,
                       what: str = "server", **get_kw) -> None:
    """Poll `url` until it answers 200; fail at once if `proc` exits, or after `timeout` s.
    `get_kw` goes to requests.get (verify= for HTTPS)."""
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            out = proc.stderr or proc.stdout
            raise RuntimeError(f"{what} exited {proc.returncode}: {out.read() if out else ''}")
        try:
            if requests.get(url, timeout=5, **get_kw).ok:
                return
        except requests.ConnectionError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not answer {url} within {timeout:g} s")
        time.sleep(0.1)


def start_exporter(log_dir: Path, *args: str, timeout: float = 60.0) -> tuple[subprocess.Popen, str, Path]:
    """Start `python -m exporter ARGS --listen 127.0.0.1:PORT`, its stdout and stderr appended to
    log_dir/exporter-PORT.log, and wait until /metrics answers. Returns the process, the metrics
    URL and the log's path: read it with Path.read_text (O_APPEND, and no descriptor of ours
    shares the exporter's offset, so a read never moves where it writes)."""
    port = free_port()
    log = log_dir / f"exporter-{port}.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(log, "a") as out:
        proc = subprocess.Popen([sys.executable, "-m", "exporter", *args, "--listen", f"127.0.0.1:{port}"],
                                env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        wait_until_serving(url, proc, timeout, "exporter")
    except BaseException as e:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"{e}\n{log.read_text()[-3000:]}") from e
    return proc, url, log


def stop_within(proc: subprocess.Popen, bound_s: float = 9.0) -> int:
    """SIGTERM `proc`; fails the test unless it exits within `bound_s`. Returns its exit status."""
    t = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=bound_s + 20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"no exit {bound_s + 20:g} s after SIGTERM")
    took = time.monotonic() - t
    assert took <= bound_s, f"exit took {took:.1f} s after SIGTERM"
    return rc


@contextmanager
def running_exporter(*args: str, timeout: float = 30.0):
    """Start `python -m exporter ARGS --listen 127.0.0.1:PORT`; yields the base URL once /readyz
    answers after a first scrape. Stops it with SIGTERM and checks it exits cleanly."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "exporter", *args, "--listen", f"127.0.0.1:{port}"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(url + "/metrics", proc, timeout, "exporter")
        yield url
    finally:
        proc.terminate()
        try:
            rc = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    # SIGTERM shuts the exporter down cleanly (checked only when the body did not fail first).
    assert rc == 0, f"exporter exited {rc} on SIGTERM: {proc.stderr.read()[-2000:]}"
