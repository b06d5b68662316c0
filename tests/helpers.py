"""Shared test helpers: scraping a runner, reading samples, running the real promtool, and
starting the exporter as a subprocess on 127.0.0.1."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from exporter.deadline import Pool
from exporter.exposition import render
from exporter.runner import Runner

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
NO_IMDS = FIXTURES / "config" / "no-imds.yaml"  # `instance.imds: false`: this machine is no EC2 instance
NETGUARD = ROOT / "tests" / "netguard"  # the loopback guard, loaded by every exporter started here

# Hang guards: how long a test waits for what should end or come before it gives up as hung. They
# are not measures of speed (a timing assertion is never a test here): each is many times what the
# step takes on a loaded 2-core host, so that only a hang trips one. A promtool suite that takes
# 26 s on an idle core ran past a 120 s timeout under `stress-ng --cpu 2` beside the suite.
HANG_GUARD_S = 600.0  # a tool or child interpreter run to completion (promtool, amtool, kubectl, python -c)
START_HANG_GUARD_S = 120.0  # a program started here until it serves, or a condition polled for
# A test that shows a deadline bounds a hang makes its fake hang for HANG_GUARD_S (or until the test
# releases it) and asserts the call returns within DEADLINE_MARGIN_S: a guard, not a speed, many
# times any deadline under test (a second or so) yet far below the hang it bounds.
DEADLINE_MARGIN_S = 60.0


_POOLS: list[Pool] = []  # made by test_pool(); see close_test_pools


def test_pool() -> Pool:
    """A deadline pool for a Runner or NvmlSession a test builds (the pool is never defaulted).
    One made by a test or its function-scoped fixtures is closed when the test ends (the `pool`
    fixture is the same for a test function's own use); one made by a module- or
    session-scoped fixture lives as long as the process (its idle threads are daemons)."""
    pool = Pool()
    _POOLS.append(pool)
    return pool


test_pool.__test__ = False  # a helper, not a test pytest should collect


def close_test_pools(since: int) -> None:
    """Close the pools test_pool() made after the first `since` (by the test that just ended)."""
    while len(_POOLS) > since:
        _POOLS.pop().close()


def test_pools_made() -> int:
    return len(_POOLS)


test_pools_made.__test__ = False


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
                       timeout=HANG_GUARD_S)
    return (r.stdout + r.stderr).strip() if r.returncode != 0 or r.stdout.strip() or r.stderr.strip() else ""


def wait_for(cond: Callable[[], Any], timeout: float = START_HANG_GUARD_S, what: str = "condition",
             proc: subprocess.Popen | None = None, log: Path | None = None, interval: float = 0.02) -> Any:
    """Poll `cond()` until it returns something true, and return that. Fails naming `what` after
    `timeout` s, or at once when `proc` has exited; either failure quotes the end of `log`."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode} while waiting for {what}{_tail(log)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:g} s{_tail(log)}")
        time.sleep(interval)


def _tail(log: Path | None) -> str:
    return f":\n{log.read_text(errors='replace')[-3000:]}" if log is not None and log.exists() else ""


# Servers started by tests bind port 0 and say which port they got: a port picked here and bound
# later by another process can be handed to two servers at once (tests/test_suite_hygiene.py).
_SERVING = re.compile(r"serving (https?://(?:\[[^\]]+\]|[^\s:/\"]+):(\d+))")


def served_base(log: Path, proc: subprocess.Popen | None = None, timeout: float = START_HANG_GUARD_S,
                after: int = 0) -> str:
    """The base URL (scheme://host:port) of the last "serving ..." line the exporter logged into
    `log` after byte offset `after` (a reload with port 0 binds a new port: pass the log's size
    before the SIGHUP)."""
    def found() -> str | None:
        hits = _SERVING.findall(log.read_bytes()[after:].decode(errors="replace"))
        return hits[-1][0] if hits else None
    return wait_for(found, timeout, "a 'serving' line", proc, log)


def _listening(proc: subprocess.Popen) -> set[int]:
    """The TCP ports `proc` listens on, from the kernel's socket table."""
    try:
        return {c.laddr.port for c in psutil.Process(proc.pid).net_connections("tcp")
                if c.status == psutil.CONN_LISTEN}
    except psutil.NoSuchProcess:
        return set()


def port_of(proc: subprocess.Popen, timeout: float = START_HANG_GUARD_S) -> int:
    """The TCP port `proc` listens on, read from the kernel's socket table (for a server that does not
    log its address); waits until it listens on exactly one."""
    def found() -> int | None:
        ports = _listening(proc)
        return ports.pop() if len(ports) == 1 else None
    return wait_for(found, timeout, "a listening socket", proc)


def answers_now(log: Path, path: str = "/metrics") -> bool:
    """Whether `path` answers 200 on the port the exporter last logged it serves (a restart in place
    with --listen 127.0.0.1:0 binds a new port); for wait_for."""
    hits = _SERVING.findall(log.read_text(errors="replace"))
    try:
        return bool(hits) and requests.get(hits[-1][0] + path, timeout=5).ok
    except requests.ConnectionError:
        return False


def start_listening(cmd: list[str], log: Path,
                    timeout: float = START_HANG_GUARD_S) -> tuple[subprocess.Popen, int]:
    """Start a server whose `cmd` has it listen on 127.0.0.1:0 (Prometheus, Alertmanager,
    node_exporter: --web.listen-address=127.0.0.1:0), its output into `log`; returns the process
    and the port it bound."""
    with open(log, "a") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        return proc, port_of(proc, timeout)
    except BaseException:
        proc.kill()
        proc.wait()
        raise


@contextmanager
def refused_address() -> Iterator[str]:
    """A 127.0.0.1:PORT that refuses connections for as long as the block runs: the port is held
    bound (no listen), so no other server can be handed it meanwhile."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{s.getsockname()[1]}"


def wait_until_serving(url: str, proc: subprocess.Popen | None = None, timeout: float = START_HANG_GUARD_S,
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


def start_exporter(log_dir: Path, *args: str, timeout: float = START_HANG_GUARD_S, path: str = "/metrics",
                   listen_flag: str = "--listen", **get_kw) -> tuple[subprocess.Popen, str, Path]:
    """Start `python -m exporter ARGS --listen 127.0.0.1:0` (with IMDS off, `no_imds`, and the
    loopback guard, `guarded_env`), its stdout and stderr appended to a new log in log_dir, and
    wait until `path` answers on the port it bound (`get_kw` goes to requests.get: verify= for
    HTTPS). Returns the process, the URL of `path` and the log's path:
    read it with Path.read_text (O_APPEND, and no descriptor of ours shares the exporter's offset,
    so a read never moves where it writes)."""
    fd, name = tempfile.mkstemp(prefix="exporter-", suffix=".log", dir=log_dir)
    os.close(fd)
    log = Path(name)
    with open(log, "a") as out:
        proc = subprocess.Popen([sys.executable, "-m", "exporter", *no_imds(args), listen_flag,
                                 "127.0.0.1:0"], env=guarded_env(), stdout=out, stderr=subprocess.STDOUT,
                                text=True)
    scheme = "https" if "verify" in get_kw else "http"

    def answering() -> str | None:
        """The URL of `path` on whichever of the process's listening ports answers it (the socket
        table: at --log.level warning no "serving" line says the port; a simulated node may also
        listen for its fake IMDS)."""
        for port in _listening(proc):
            url = f"{scheme}://127.0.0.1:{port}{path}"
            try:
                if requests.get(url, timeout=5, **get_kw).ok:
                    return url
            except requests.RequestException:
                pass
        return None
    try:
        url = wait_for(answering, timeout, f"the exporter answering {path}", proc, log, interval=0.1)
    except BaseException as e:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"{e}\n{log.read_text()[-3000:]}") from e
    return proc, url, log


def no_imds(args: tuple[str, ...] | list[str]) -> list[str]:
    """The exporter's arguments with IMDS off, through its configuration as on any host that is
    not an EC2 instance: a simulated or replayed node needs nothing (the simulation and
    --nvml-capture turn it off); otherwise the run gets tests/fixtures/config/no-imds.yaml, or,
    when the test gives a config of its own, that config must say `instance: {imds: false}` or
    name a fake IMDS on 127.0.0.1 (`instance.imds_endpoint`)."""
    args = list(args)
    if "--simulate" in args or "--nvml-capture" in args:
        return args
    if "--config" not in args:
        return [*args, "--config", str(NO_IMDS)]
    import yaml

    path = Path(args[args.index("--config") + 1])
    try:
        instance = (yaml.safe_load(path.read_text()) or {}).get("instance", {})
        imds, endpoint = instance.get("imds", True), str(instance.get("imds_endpoint", ""))
    except (OSError, ValueError, AttributeError, yaml.YAMLError):  # a test of a bad config: never starts
        return args
    assert imds is False or endpoint.startswith("http://127.0.0.1:"), (
        f"{path}: an exporter on this machine needs `instance: {{imds: false}}` or a fake IMDS on 127.0.0.1")
    return args


def guarded_env(**extra: str) -> dict[str, str]:
    """The environment of an exporter a test starts: this checkout on its path, after the
    loopback guard (tests/netguard: tests/conftest.py fails the test it tripped in)."""
    return {**os.environ, "PYTHONPATH": f"{NETGUARD}{os.pathsep}{ROOT}", **extra}


def stop_all(procs: list[subprocess.Popen]) -> None:
    """Clean-up of a test's helper processes (Prometheus, Alertmanager, exporters), any of which may
    be dead already: SIGTERM all, then kill whichever is still there after 10 s. No assertion: a
    test that checks how a process stops uses stop_within."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


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
def running_exporter(*args: str, timeout: float = START_HANG_GUARD_S):
    """Start `python -m exporter ARGS --listen 127.0.0.1:0`; yields the base URL once /metrics
    answers. Stops it with SIGTERM and checks it exits cleanly."""
    with tempfile.TemporaryDirectory(prefix="ghe-test-") as tmp:
        proc, url, log = start_exporter(Path(tmp), *args, timeout=timeout)
        try:
            yield url.removesuffix("/metrics")
        finally:
            proc.terminate()
            try:
                rc = proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise
        # SIGTERM shuts the exporter down cleanly (checked only when the body did not fail first).
        assert rc == 0, f"exporter exited {rc} on SIGTERM: {log.read_text()[-2000:]}"


@contextmanager
def network_namespace() -> Iterator[list[str]]:
    """A network namespace with only its loopback up, held by a sleeping process; yields the command
    prefix that runs a program in it (tests/test_slurm.py, tests/kube_apiserver.py: servers whose
    ports are fixed flags cannot collide there). Slurm resolves 127.0.0.1 with AF_INET and
    AI_ADDRCONFIG, which glibc answers only where an IPv4 address other than 127.0.0.1 exists:
    127.0.0.2 on lo is one."""
    holder = subprocess.Popen(["unshare", "--net", "sh", "-c", "ip link set lo up && ip addr add "
                               "127.0.0.2/32 dev lo && echo up && exec sleep infinity"],
                              stdout=subprocess.PIPE, text=True)
    try:
        up = holder.stdout.readline().strip() == "up"
        assert up, f"no network namespace: unshare exited {holder.wait()}"
        yield ["nsenter", f"--net=/proc/{holder.pid}/ns/net", "--"]
    finally:
        holder.kill()
        holder.wait()
