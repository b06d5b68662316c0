"""The command line as an operator runs it:
`python -m exporter ...` in a subprocess, on 127.0.0.1 only, IMDS off."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import pytest
import requests

from tests.helpers import (
    FIXTURES,
    HANG_GUARD_S,
    START_HANG_GUARD_S,
    answers_now,
    guarded_env,
    port_of,
    wait_for,
    wait_until_serving,
)

ENV = guarded_env()  # the checkout, with the suite's loopback guard
CAPTURE = FIXTURES / "nvml" / "h200" / "nvml_capture.json"  # one real H200
KMSG = FIXTURES / "kmsg" / "kmsg_nvidia.txt"


def cli(*args: str, timeout: float = 30, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, sys.executable, "-m", "exporter", *args], env=ENV, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


@contextmanager
def serving(*args: str, path: str = "/metrics", listen_flag: str = "--web.listen-address"):
    """The exporter on 127.0.0.1:0, its stderr into a log file; yields (process, base URL, log) once
    `path` answers. The port is read from the socket table: at --log.level warn nothing says it."""
    with tempfile.TemporaryDirectory(prefix="ghe-test-") as tmp:
        log = Path(tmp) / "exporter.log"
        with open(log, "a") as err:
            proc = subprocess.Popen([sys.executable, "-m", "exporter", *args, listen_flag, "127.0.0.1:0"],
                                    env=ENV, stdout=subprocess.DEVNULL, stderr=err, text=True)
        try:
            url = f"http://127.0.0.1:{port_of(proc)}"
            wait_until_serving(url + path, proc, 60, "exporter")
            yield proc, url, log
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def stop(proc: subprocess.Popen, log: Path) -> tuple[int, str]:
    proc.terminate()
    proc.wait(timeout=15)
    return proc.returncode, log.read_text()


def series(text: str) -> set[str]:
    return {ln.split("{")[0].split(" ")[0] for ln in text.splitlines() if ln and not ln.startswith("#")}


# --- node_exporter's flags --------------------------------------------------------------------------

@pytest.mark.slow
def test_must_show_json_logs_no_lustre_collect_filter_and_build_info():
    with serving("--simulate", "p5.48xlarge", "--no-collector.lustre", "--log.format",
                 "json") as (proc, url, log):
        full = requests.get(url + "/metrics", timeout=10).text
        assert not any(n.startswith("lustre_") for n in series(full))
        assert any(n.startswith("efa_") for n in series(full))
        gpu = requests.get(url + "/metrics", params={"collect[]": "gpu"}, timeout=10).text
        names = series(gpu)
        assert any(n.startswith("gpu_") for n in names)
        assert not any(n.startswith("efa_") for n in names), sorted(names)
        info = [ln for ln in full.splitlines() if ln.startswith("gpu_health_exporter_build_info{")]
        assert len(info) == 1
        for label in ("revision", "branch", "version", "python_version"):
            assert re.search(rf'\b{label}="[^"]+"', info[0]), info[0]
        rc, err = stop(proc, log)
    assert rc == 0, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines
    for ln in lines:
        rec = json.loads(ln)  # every stderr line is one JSON object
        assert isinstance(rec, dict) and {"level", "msg"} <= rec.keys(), ln
        assert rec["level"] in {"debug", "info", "warn", "error"}
        assert any(k in rec for k in ("ts", "time", "timestamp"))
    assert any(f"127.0.0.1:{url.rsplit(':', 1)[1]}" in json.loads(ln)["msg"] for ln in lines)


@pytest.mark.slow
def test_port_0_logs_the_port_it_serves(tmp_path):
    with serving("--simulate", "p5.48xlarge", "--log.format", "json") as (proc, url, log):
        assert re.fullmatch(r"http://127\.0\.0\.1:[1-9]\d*", url), url  # answered on that port
        rc, err = stop(proc, log)
    assert rc == 0, err


def _logfmt(line: str) -> dict[str, str]:
    """A strict logfmt parser: key=value pairs, value bare (no space, quote or =) or a quoted string."""
    out: dict[str, str] = {}
    pos = 0
    pat = re.compile(r'([A-Za-z_][A-Za-z0-9_.]*)=("(?:[^"\\]|\\.)*"|[^\s"=]*)(?: |$)')
    while pos < len(line):
        m = pat.match(line, pos)
        assert m, f"not logfmt at {pos}: {line!r}"
        v = m.group(2)
        out[m.group(1)] = json.loads(v) if v.startswith('"') else v
        pos = m.end()
    return out


@pytest.mark.slow
def test_telemetry_path_aliases_and_logfmt():
    """Old aliases (--collectors, --log-level), a moved telemetry path linked from the landing page,
    and logfmt lines a strict parser reads, with the address actually served."""
    with serving("--simulate", "p4d.24xlarge", "--collectors", "gpu,efa", "--log-level", "debug",
                 "--web.telemetry-path", "/m", path="/m", listen_flag="--listen") as (proc, url, log):
        names = series(requests.get(url + "/m", timeout=10).text)
        assert any(n.startswith("gpu_") for n in names) and any(n.startswith("efa_") for n in names)
        assert not any(n.startswith("lustre_") for n in names)
        assert 'href="/m"' in requests.get(url + "/", timeout=10).text
        assert requests.get(url + "/metrics", timeout=10).status_code == 404
        rc, err = stop(proc, log)
    assert rc == 0, err
    recs = [_logfmt(ln) for ln in err.splitlines() if ln.strip()]
    assert any(r["level"] == "debug" for r in recs)
    for r in recs:
        assert r["level"] in {"debug", "info", "warn", "error"}
        datetime.fromisoformat(r["ts"].replace("Z", "+00:00"))
    assert any(f"{url}/m" in r["msg"] for r in recs)


def test_logfmt_quotes_what_needs_it():
    code = ("import logging, sys; from exporter import logs; logs.setup('info', 'logfmt'); "
            "logging.getLogger('exporter').warning('a b \"c\" d=e\\nf\\\\g'); "
            "logging.getLogger('exporter').error('plain')")
    r = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True,
                       timeout=HANG_GUARD_S)
    lines = r.stderr.splitlines()
    assert len(lines) == 2, r.stderr
    rec = _logfmt(lines[0])
    assert rec["level"] == "warn" and rec["msg"] == 'a b "c" d=e\nf\\g'
    assert _logfmt(lines[1])["level"] == "error"
    datetime.fromisoformat(rec["ts"].replace("Z", "+00:00"))


@pytest.mark.parametrize("args, serves, absent", [
    (["--collector.disable-defaults", "--collector.gpu"], "gpu_", ("efa_", "lustre_")),
    (["--no-collector.efa", "--collector.efa", "--no-collector.gpu"], "efa_", ("gpu_temperature",)),
])
@pytest.mark.slow
def test_collector_flags(args, serves, absent):
    with serving("--simulate", "p5.48xlarge", "--log.level", "warn", *args) as (proc, url, log):
        names = series(requests.get(url + "/metrics", timeout=10).text)
        assert any(n.startswith(serves) for n in names)
        for a in absent:
            assert not any(n.startswith(a) for n in names), a
        rc, err = stop(proc, log)
    assert rc == 0 and not [ln for ln in err.splitlines() if "level=info" in ln], err


@pytest.mark.parametrize("level", ["debug", "info", "warn", "error"])
def test_log_levels_accepted(level):
    r = cli("--log.level", level, "--list-scenarios")
    assert r.returncode == 0, r.stderr


def test_unknown_collector_exits_2_naming_it():
    r = cli("--collector.foo", "--simulate", "p5.48xlarge")
    assert r.returncode == 2 and "collector.foo" in r.stderr
    r = cli("--collectors", "gpu,foo", "--simulate", "p5.48xlarge")
    assert r.returncode == 2 and "foo" in r.stderr


# --- config files ----------------------------------------------------------------------------------

THREE = "log_level: loud\nnode:\n  expected_gpus: many\nxid:\n  policy:\n    replace: [999999]\n"
SUBCOMMANDS = [[], ["check"], ["ack", "--gpu", "0"], ["capture", "--out", "OUT"]]


def config_error_status(sub: list[str]) -> int:
    """2 for the daemon and every command but `check`, which answers 3 (could not check: issue
    29), so a wrapper draining on 2 never drains a node for a typo in the config."""
    return 3 if sub[:1] == ["check"] else 2


@pytest.mark.parametrize("sub", SUBCOMMANDS, ids=["serve", "check", "ack", "capture"])
def test_three_mistakes_named_in_every_command(tmp_path, sub):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(THREE)
    sub = [str(tmp_path / "o.json") if a == "OUT" else a for a in sub]
    extra = ["--web.listen-address", "127.0.0.1:0"] if not sub else []
    r = cli(*sub, "--config", str(cfg), "--simulate", "p5.48xlarge", "--path.state-dir",
            str(tmp_path / "st"), *extra)
    assert r.returncode == config_error_status(sub), r.stderr
    for key, value in (("log_level", "loud"), ("node.expected_gpus", "many"), ("xid.policy", "999999")):
        assert key in r.stderr and value in r.stderr, (key, r.stderr)
    assert "3" in r.stderr and str(cfg) in r.stderr
    assert "expected" in r.stderr
    # the list item is named as the problem, not the list
    assert "out of range" in r.stderr or "item 0" in r.stderr


BOMB = "a0: &a0 [x,x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"a{i}: &a{i} [*a{i - 1},*a{i - 1},*a{i - 1},*a{i - 1},*a{i - 1},*a{i - 1},*a{i - 1},*a{i - 1},"
    f"*a{i - 1},*a{i - 1}]\n" for i in range(1, 10)) + "log_level: *a9\n"

BAD_DOCS = {
    "syntax": ("a: [1, 2\nb: 3\n", ("line 2", "column")),
    "unhashable": ("{{}}\n", ("line 1",)),
    "list": ("[]\n", ("mapping",)),
    "scalar": ("hello\n", ("mapping",)),
    "binary": (b"\x99\x00\xff\xfe" * 64, ("UTF-8",)),
    "bomb": (BOMB, ("alias",)),
}


@pytest.mark.parametrize("name", sorted(BAD_DOCS))
@pytest.mark.parametrize("sub", [[], ["check"]], ids=["serve", "check"])
def test_bad_documents_exit_2_in_bounded_memory(tmp_path, name, sub):
    text, words = BAD_DOCS[name]
    cfg = tmp_path / "c.yaml"
    (cfg.write_bytes if isinstance(text, bytes) else cfg.write_text)(text)
    assert len(BOMB) < 1500
    extra = ["--web.listen-address", "127.0.0.1:0"] if not sub else []
    # bounded memory (a bomb expanded would pass 1 GiB and die with a traceback); no wall-time
    # bound: a loaded host slows any start, and HANG_GUARD_S only catches a hang
    r = cli(*sub, "--config", str(cfg), "--simulate", "p5.48xlarge", "--path.state-dir", str(tmp_path / "st"),
            *extra, prefix=("prlimit", "--as=1073741824", "--"), timeout=HANG_GUARD_S)
    assert r.returncode == config_error_status(sub), r.stderr + r.stdout
    assert str(cfg) in r.stderr
    for w in words:
        assert w.lower() in r.stderr.lower(), (w, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr) < 2000


def test_empty_config_is_the_defaults(tmp_path):
    """Choice: an empty file is an empty mapping (every default), as for an empty web config."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("")
    r = cli("check", "--config", str(cfg), "--simulate", "p5.48xlarge", "--path.state-dir",
            str(tmp_path / "s"))
    assert r.returncode == 0, r.stderr


def test_fifo_config_errors_without_hanging(tmp_path):
    fifo = tmp_path / "c.yaml"
    os.mkfifo(fifo)
    for sub in ([], ["check"]):
        extra = ["--web.listen-address", "127.0.0.1:0"] if not sub else []
        r = cli(*sub, "--config", str(fifo), "--simulate", "p5.48xlarge", *extra, timeout=20)
        assert r.returncode == config_error_status(sub) and str(fifo) in r.stderr, r.stderr


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:"))


@pytest.mark.slow
def test_sighup_storms_and_a_bomb_on_reload(tmp_path):
    """SIGHUPs 0-1.5 s apart (the second of a pair lands during the reload's exec), and a reload
    onto an alias bomb while a reload is pending: the exporter keeps serving under the same pid,
    memory stays bounded, SIGTERM still stops it."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("log_level: info\n")
    log = tmp_path / "exporter.log"
    with open(log, "a") as err:
        proc = subprocess.Popen([sys.executable, "-m", "exporter", "--simulate", "p5.48xlarge", "--config",
                                 str(cfg), "--path.state-dir", str(tmp_path / "st"), "--web.listen-address",
                                 "127.0.0.1:0"], env=ENV, stdout=subprocess.DEVNULL, stderr=err, text=True)
    try:
        # (a SIGHUP before the interpreter runs kills any program: its default action; not tested)
        wait_for(lambda: answers_now(log), START_HANG_GUARD_S, "the exporter serving", proc, log)
        for gap in (0.0, 0.3, 1.5):
            proc.send_signal(signal.SIGHUP)
            time.sleep(gap)  # the gap between signals is the subject here, not a wait for a condition
            proc.send_signal(signal.SIGHUP)
            assert proc.poll() is None
        wait_for(lambda: answers_now(log), START_HANG_GUARD_S,
                 "the exporter serving after SIGHUPs", proc, log)
        for _ in range(3):
            proc.send_signal(signal.SIGHUP)
        wait_for(lambda: answers_now(log), START_HANG_GUARD_S,
                 "the exporter serving after a burst", proc, log)
        cfg.write_text(BOMB)
        proc.send_signal(signal.SIGHUP)
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "alias" in log.read_text(), START_HANG_GUARD_S,
                 "the bomb refused", proc, log)
        wait_for(lambda: answers_now(log), START_HANG_GUARD_S,
                 "the exporter serving after a bad reload", proc, log)
        assert _rss_kib(proc.pid) < 400 * 1024
    finally:
        rc, tail = stop(proc, log) if proc.poll() is None else (proc.returncode, log.read_text())
    assert rc == 0, tail[-3000:]


# --- check's expected GPU count --------------------------------------------------------------------

def _sysfs(tmp_path, product: str | None):
    d = tmp_path / "sys" / "devices" / "virtual" / "dmi" / "id"
    d.mkdir(parents=True)
    if product is not None:
        (d / "product_name").write_text(product)
    return tmp_path / "sys"


def _check(tmp_path, product, *args):
    return cli("check", "--nvml-capture", str(CAPTURE), "--kmsg-file", str(KMSG), "--path.sysfs",
               str(_sysfs(tmp_path, product)), "--path.state-dir", str(tmp_path / "st"), *args)


@pytest.mark.parametrize("product", ["p5.48xlarge", "p5.48xlarge\n", "  p5.48xlarge  \n", "p4d.24xlarge\n"])
def test_check_by_dmi_one_gpu_of_eight(tmp_path, product):
    r = _check(tmp_path, product)
    assert r.returncode == 2, r.stdout + r.stderr
    assert re.search(r"\b1\b", r.stdout) and re.search(r"\b8 expected\b", r.stdout), r.stdout
    r = _check(tmp_path / "j", product, "--json")
    node = json.loads(r.stdout)["node"]
    assert r.returncode == 2 and (node["gpu_count"], node["expected_gpus"]) == (1, 8)
    assert node["instance_type"] == product.strip()


def test_check_config_instance_type_overrides_dmi(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("node:\n  instance_type: p4d.24xlarge\n")
    r = _check(tmp_path, "c7i.large\n", "--config", str(cfg), "--json")
    node = json.loads(r.stdout)["node"]
    assert r.returncode == 2 and node["instance_type"] == "p4d.24xlarge" and node["expected_gpus"] == 8
    cfg.write_text("node:\n  instance_type: g6e.xlarge\n")  # no 8-GPU profile: not a count failure
    r = _check(tmp_path / "b", "p5.48xlarge\n", "--config", str(cfg))
    assert r.returncode != 2, r.stdout


def test_check_without_dmi_or_imds_is_no_count_failure(tmp_path):
    r = _check(tmp_path, None)
    assert r.returncode != 2, r.stdout + r.stderr


def test_check_without_nvml_is_one_unknown(tmp_path):
    args = ["check", "--nvml-capture", str(tmp_path / "nope.json"), "--kmsg-file", str(KMSG),
            "--path.sysfs", str(_sysfs(tmp_path, None)), "--path.state-dir", str(tmp_path / "st")]
    r = cli(*args)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "UNKNOWN" in r.stdout.upper()
    for other in ("DEGRADED", "HEALTHY", "REBOOT", "DRAIN"):
        assert other not in r.stdout.upper(), r.stdout
    r = cli(*args, "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 3 and doc["node"]["verdict"] == "unknown" and doc["node"]["exit_status"] == 3
    assert {g["verdict"] for g in doc["gpus"]} <= {"unknown"}, doc["gpus"]  # kernel log only: not checked
