"""The acks file `ack` writes (xid-acks.json) is XID state like the state file: when it cannot be
read (unreadable, corrupt, a newer version's), the daemon says so in the state file's metrics
(gpu_health_exporter_state_file_ok, _errors_total) and `check` among its problems and under
sources.acks_file, and the log says what happens to the acknowledgements (acks are not counts:
nothing is rebuilt from the kernel log)."""

from __future__ import annotations

import json
import logging

from exporter.collectors.xid import XidCollector
from exporter.runner import Runner
from exporter.state import versions
from exporter.xid.service import one_shot
from tests.helpers import scrape, value
from tests.test_xid_service import _xid_record, make_ctx

OK = "gpu_health_exporter_state_file_ok"
ERRORS = "gpu_health_exporter_state_file_errors_total"


def _metrics(ctx) -> str:
    return scrape(Runner([XidCollector(ctx)], deadline_s=5, pool=ctx.pool))


def test_a_corrupt_acks_file_is_a_metric_and_its_log_line_is_about_acks(tmp_path, caplog):
    state = tmp_path / "state"
    state.mkdir()
    (state / "xid-acks.json").write_text("{not json")
    ctx = make_ctx(tmp_path, _xid_record(0, 1_000_000))
    with caplog.at_level(logging.ERROR, "exporter"):
        svc = one_shot(ctx)  # not read-only (the daemon's way): set aside
    assert list(state.glob("xid-acks.json.corrupt-*")) and not (state / "xid-acks.json").exists()
    line = next(r.getMessage() for r in caplog.records if "xid-acks.json" in r.getMessage())
    assert "counts are rebuilt" not in line
    assert "acknowledgements the daemon already took stay" in line and "gpu-health-exporter ack" in line
    text = _metrics(ctx)
    assert value(text, OK) == 0 and value(text, ERRORS, operation="read") == 1
    assert value(text, "gpu_xid_errors_total", xid="31") == 1  # the counts are not the acks'
    assert svc.flush_state(force=True)  # the XID state file is fine; the acks' trouble stays ...
    assert value(_metrics(ctx), OK) == 0
    good = {"version": versions.ACKS.version, "boot_id": "boot-1", "acks": []}
    (state / "xid-acks.json").write_text(json.dumps(good))  # ... until `ack` writes a good one
    svc.refresh_acks()
    assert value(_metrics(ctx), OK) == 1


def test_an_unreadable_acks_file_is_a_metric(tmp_path):
    state = tmp_path / "state"
    (state / "xid-acks.json").mkdir(parents=True)  # no regular file: never read, never replaced
    ctx = make_ctx(tmp_path, _xid_record(0, 1_000_000))
    svc = one_shot(ctx)
    assert svc.snapshot().state.acks_problem == "unreadable"
    text = _metrics(ctx)
    assert value(text, OK) == 0 and value(text, ERRORS, operation="read") >= 1
    assert (state / "xid-acks.json").is_dir()


def _check(tmp_path, capsys, acks_text: str) -> tuple[int, dict]:
    from exporter.cli import main

    log = tmp_path / "kmsg.txt"
    log.write_text(_xid_record(0, 1_000_000))
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    (state / "xid-acks.json").write_text(acks_text)
    code = main(["check", "--simulate", "p5.48xlarge", "--kmsg-file", str(log), "--path.state-dir",
                 str(state), "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_check_reports_a_corrupt_acks_file_and_leaves_it_for_the_daemon(tmp_path, capsys):
    code, doc = _check(tmp_path, capsys, "{not json")
    assert doc["sources"]["acks_file"]["problem"] == "corrupt"
    assert doc["sources"]["acks_file"]["path"].endswith("xid-acks.json")
    assert any(p.startswith("acks file ") and "corrupt" in p for p in doc["problems"]), doc["problems"]
    assert code == 3  # acknowledgements it may hold are unknown: the verdict is not to be trusted
    assert (tmp_path / "state" / "xid-acks.json").read_text() == "{not json"  # read only


def test_check_reports_an_acks_file_of_a_newer_version(tmp_path, capsys):
    newer = json.dumps({"version": versions.ACKS.version + 1, "acks": []})
    code, doc = _check(tmp_path, capsys, newer)
    assert doc["sources"]["acks_file"]["problem"] == "newer_version"
    assert any(p.startswith("acks file ") and "newer_version" in p for p in doc["problems"])
    assert (tmp_path / "state" / "xid-acks.json").read_text() == newer


def test_check_without_acks_file_trouble_names_none(tmp_path, capsys):
    good = json.dumps({"version": versions.ACKS.version, "acks": []})  # another boot's: not a problem
    _code, doc = _check(tmp_path, capsys, good)
    assert doc["sources"]["acks_file"]["problem"] == ""
    assert not any(p.startswith("acks file ") for p in doc["problems"])
