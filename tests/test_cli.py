"""node_exporter's command-line conventions: --web.listen-address, --web.telemetry-path,
--collector.NAME / --no-collector.NAME, --collector.disable-defaults, --log.level, --log.format
(logfmt correctly quoted, json), today's flags kept as aliases; build_info's revision and branch;
the served address in the start-up line."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
import requests

from exporter import buildinfo, logs
from exporter.arguments import build_parser, cli_overrides
from exporter.serve import served_url
from tests.helpers import HANG_GUARD_S, ROOT, names, start_exporter, value


def overrides(*argv: str) -> dict:
    return cli_overrides(build_parser().parse_args(list(argv)))


def test_node_exporter_flags_and_their_aliases():
    assert overrides("--web.listen-address", "127.0.0.1:1")["listen"] == "127.0.0.1:1"
    assert overrides("--listen", "127.0.0.1:2")["listen"] == "127.0.0.1:2"
    assert overrides("--web.telemetry-path", "/m")["web.telemetry_path"] == "/m"
    assert overrides("--log.level", "warn")["log_level"] == "warn"
    assert overrides("--log-level", "debug")["log_level"] == "debug"
    assert overrides("--log.format", "json")["log_format"] == "json"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--log.format", "xml"])


def enabled(*argv: str) -> dict[str, bool]:
    return {k.removesuffix(".enabled"): v for k, v in overrides(*argv).items() if k.endswith(".enabled")}


def test_collector_flags():
    assert enabled("--no-collector.lustre") == {"lustre": False}
    on = enabled("--collector.disable-defaults", "--collector.gpu", "--collector.health")
    assert {k for k, v in on.items() if v} == {"gpu", "health"} and on["efa"] is False and on["xid"] is False
    # --collectors LIST is disable-defaults plus --collector.NAME for each; --no-collector.NAME still wins
    assert {k for k, v in enabled("--collectors", "gpu,efa", "--no-collector.efa").items() if v} == {"gpu"}
    help_text = build_parser().format_help()
    for name in ("gpu", "efa", "lustre", "xid", "nvswitch", "health", "instance"):
        assert f"--collector.{name}, --no-collector.{name}" in help_text


def record(msg, *args, exc=None):
    r = logging.LogRecord("exporter.x", logging.WARNING, __file__, 1, msg, args, exc)
    r.created = 1795692161.873  # 2026-11-26T11:22:41.873Z
    return r


@pytest.mark.parametrize("msg, expected", [
    ("plain", "msg=plain"),
    ("serving http://0.0.0.0:9858/metrics", 'msg="serving http://0.0.0.0:9858/metrics"'),
    ('say "hi"', r'msg="say \"hi\""'),
    ("a=b", 'msg="a=b"'),
    ("back\\slash", r'msg="back\\slash"'),
    ("two\nlines\ttab", r'msg="two\nlines\ttab"'),
    ("", 'msg=""'),
    ("bell\x07", r'msg="bell\u0007"'),
])
def test_logfmt_quotes_what_needs_it(msg, expected):
    line = logs.LogfmtFormatter().format(record(msg))
    assert line == f"ts=2026-11-26T11:22:41.873Z level=warn logger=exporter.x {expected}"


def test_logfmt_round_trips_through_a_logfmt_reader():
    """Go's logfmt decoder unquotes with strconv.Unquote; json.loads reads the same escapes."""
    msg = 'a "quoted" path=/x y\\z\nnext'
    line = logs.LogfmtFormatter().format(record(msg))
    quoted = line.split(" msg=", 1)[1]
    assert json.loads(quoted) == msg


def test_json_lines():
    try:
        raise ValueError("boom")
    except ValueError:
        rec = record("failed %s", "here", exc=sys.exc_info())
    line = logs.JsonFormatter().format(rec)
    assert "\n" not in line
    doc = json.loads(line)
    assert doc["ts"] == "2026-11-26T11:22:41.873Z" and doc["level"] == "warn" and doc["msg"] == "failed here"
    assert doc["logger"] == "exporter.x" and "ValueError: boom" in doc["exc"]


def test_served_url_names_the_bound_port_and_a_local_url_for_a_wildcard():
    assert served_url(False, "127.0.0.1", 9999, "/metrics") == "http://127.0.0.1:9999/metrics"
    assert served_url(True, "0.0.0.0", 9858, "/m") == \
        "https://0.0.0.0:9858/m (every address; from this host: https://localhost:9858/m)"


def test_quickstart_prints_no_fixed_port():
    text = (ROOT / "deploy" / "quickstart.sh").read_text()
    assert not [line for line in text.splitlines() if line.startswith("echo") and "9858" in line]


def test_build_info_revision_and_branch_from_the_checkout(monkeypatch):
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                         text=True).stdout.strip()
    branch = subprocess.run(["git", "rev-parse", "--abbrev-ref", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    monkeypatch.delenv(buildinfo.ENV_REVISION, raising=False)
    monkeypatch.delenv(buildinfo.ENV_BRANCH, raising=False)
    assert buildinfo.build_info() == (sha, branch)
    monkeypatch.setenv(buildinfo.ENV_REVISION, "abc")
    monkeypatch.setenv(buildinfo.ENV_BRANCH, "release-1")
    assert buildinfo.build_info() == ("abc", "release-1")


def test_build_info_reads_packed_refs_detached_heads_and_no_checkout(tmp_path):
    sha = "0123456789abcdef0123456789abcdef01234567"
    git = tmp_path / "repo" / ".git"
    git.mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    (git / "packed-refs").write_text(f"# pack-refs with: peeled\n{sha} refs/heads/main\n")
    assert buildinfo.from_git(tmp_path / "repo") == (sha, "main")
    (git / "HEAD").write_text(sha + "\n")
    assert buildinfo.from_git(tmp_path / "repo") == (sha, "HEAD")
    assert buildinfo.from_git(tmp_path) is None  # an installed package: no .git


@pytest.mark.slow
def test_node_exporter_style_invocation_serves_json_logs_without_lustre(tmp_path):
    """`--web.listen-address 127.0.0.1:PORT --simulate p5.48xlarge --no-collector.lustre
    --log.format json` serves with no Lustre series and logs JSON lines; build_info has revision."""
    proc, url, log = start_exporter(tmp_path, "--simulate", "p5.48xlarge", "--no-collector.lustre",
                                    "--log.format", "json", "--path.state-dir", str(tmp_path / "state"),
                                    listen_flag="--web.listen-address")
    try:
        text = requests.get(url, timeout=30).text
    finally:
        proc.terminate()
        rc = proc.wait(30)
    assert rc == 0
    assert not [n for n in names(text) if n.startswith("lustre_")]
    assert "gpu_temperature_celsius" in names(text) and "efa_devices" in names(text)
    assert value(text, "gpu_health_exporter_build_info", revision=buildinfo.build_info()[0]) == 1
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert lines and all({"ts", "level", "logger", "msg"} <= set(d) for d in lines)
    assert any(d["msg"].startswith(f"serving {url}") for d in lines)


@pytest.mark.slow
def test_web_telemetry_path_moves_the_metrics(tmp_path):
    proc, url, _ = start_exporter(tmp_path, "--web.telemetry-path", "/gpu-metrics", "--collectors", "lustre",
                                  "--path.state-dir", str(tmp_path / "state"), path="/gpu-metrics")
    base = url.removesuffix("/gpu-metrics")
    try:
        assert "gpu_health_exporter_build_info" in requests.get(url, timeout=30).text
        assert requests.get(base + "/metrics", timeout=30).status_code == 404
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
    with pytest.raises(Exception, match="web.telemetry_path"):
        from exporter.config import load

        load(None, {"web.telemetry_path": "/healthz"})


def test_log_setup_replaces_only_its_own_handler():
    root = logging.getLogger()
    other = logging.NullHandler()
    root.addHandler(other)
    saved = root.level
    try:
        logs.setup("info", "json")
        logs.setup("warn", "logfmt")
        ours = [h for h in root.handlers if h.get_name() == "gpu-health-exporter"]
        assert len(ours) == 1 and isinstance(ours[0].formatter, logs.LogfmtFormatter)
        assert other in root.handlers and root.level == logging.WARNING
    finally:
        root.removeHandler(other)
        for h in [h for h in root.handlers if h.get_name() == "gpu-health-exporter"]:
            root.removeHandler(h)
        root.setLevel(saved)


@pytest.mark.parametrize("fmt", ["json", "logfmt"])
def test_start_up_errors_follow_log_format_given_on_the_command_line(tmp_path, fmt):
    """A config the daemon cannot start with is reported in the --log.format asked for (one
    record, every error in it), exit 2; without the flag it stays plain text for a terminal."""
    bad = tmp_path / "config.yaml"
    bad.write_text("listen: 12\ngpu:\n  timeout_seconds: soon\n")
    cmd = [sys.executable, "-m", "exporter", "--config", str(bad), "--web.listen-address", "127.0.0.1:0"]
    r = subprocess.run(cmd + ["--log.format", fmt], cwd=ROOT, capture_output=True, text=True,
                       timeout=HANG_GUARD_S)
    assert r.returncode == 2
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    if fmt == "json":
        rec = json.loads(lines[0])
        assert rec["level"] == "error" and str(bad) in rec["msg"] and "gpu.timeout_seconds" in rec["msg"]
    else:
        assert lines[0].startswith("ts=") and " level=error " in lines[0]
        assert "gpu.timeout_seconds" in lines[0]
    plain = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert plain.returncode == 2 and plain.stderr.startswith("gpu-health-exporter: ")
