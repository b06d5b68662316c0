"""A tool error never looks like a node fault: `check` answers 3 (could not check) for
a configuration error, an input it cannot parse or an error of its own; `ack` refuses a GPU the
node does not have; relative paths in the config file mean the same from any working directory;
a fully configured identity asks instance metadata nothing."""

from __future__ import annotations

import json
import os

import bcrypt
import pytest

from exporter import collectors, imds
from exporter.cli import main
from exporter.collectors.lustre import LustreSection
from exporter.compose import compose
from exporter.config import load
from exporter.runner import Runner
from exporter.tools.simulate.imds import FakeImdsServer
from tests.helpers import FIXTURES, HANG_GUARD_S, refused_address, scrape, test_pool

REAL = (FIXTURES / "kmsg" / "kmsg_nvidia.txt").read_text()
# What `dmesg -T` prints for the same kind of node: human timestamps, no /dev/kmsg record prefix.
DMESG_T = (
    "[Fri Nov 27 10:01:02 2026] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07\n"
    "[Fri Nov 27 10:14:09 2026] NVRM: Xid (PCI:0000:53:00): 94, pid=4121, name=python3, Contained: "
    "CE User Channel (0x9). RST: No, D-RST: No\n"
    "[Fri Nov 27 10:14:10 2026] NVRM: Xid (PCI:0000:53:00): 94, pid=4121, name=python3, Contained: "
    "CE User Channel (0x9). RST: No, D-RST: No\n"
)


def check(capsys, tmp_path, *args: str) -> tuple[int, dict]:
    code = main(["check", "--simulate", "p5.48xlarge", "--path.state-dir", str(tmp_path / "st"), *args,
                 "--json"])
    return code, json.loads(capsys.readouterr().out)


# A kernel log that names an XID `check` cannot read: the line is cut off inside the report.
UNREADABLE_XID = "[Fri Nov 27 10:14:09 2026] NVRM: Xid (PCI:0000:53:0\n"


def test_dmesg_output_as_the_kernel_log_is_read_and_its_xids_counted(tmp_path, capsys):
    """`dmesg -T` output is a kernel log like any other (it answered 3 before)."""
    log = tmp_path / "dmesg.txt"
    log.write_text(DMESG_T)
    code, doc = check(capsys, tmp_path, "--kmsg-file", str(log))
    assert code == 2 and doc["node"]["verdict"] == "replace_required" and doc["problems"] == []
    g0 = next(g for g in doc["gpus"] if g["gpu"] == 0)
    assert [(x["xid"], x["count"]) for x in g0["xids"]] == [(94, 1)]  # two lines 1 s apart: one event
    # lines in no form we read, and nothing else: could not check
    log.write_text("hello\nworld\n")
    code, doc = check(capsys, tmp_path, "--kmsg-file", str(log))
    assert code == 3 and doc["node"]["verdict"] == "unknown" and doc["node"]["exit_status"] == 3
    assert any("none of its 2 line(s) is a kernel-log line" in p and str(log) in p for p in doc["problems"])
    # one record among unreadable lines is a kernel log with noise: a verdict, not exit 3
    log.write_text("hello\n" + REAL)
    code, doc = check(capsys, tmp_path, "--kmsg-file", str(log))
    assert code == 0 and doc["problems"] == []


def test_an_unparseable_log_still_fails_a_node_nvml_says_needs_action(tmp_path, capsys):
    """What NVML read is evidence on its own: a pending row remap is exit 2 whatever the log is."""
    log = tmp_path / "dmesg.txt"
    log.write_text(UNREADABLE_XID)
    code, doc = check(capsys, tmp_path, "--kmsg-file", str(log), "--scenario", "gpu-row-remap-pending")
    assert code == 2 and doc["problems"]


@pytest.mark.parametrize("config", ["log_level: [\n", "node:\n  expected_gpus: many\n", "bogus_key: 1\n"])
def test_config_errors_are_exit_3_with_the_reason(tmp_path, capsys, config):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(config)
    code, doc = check(capsys, tmp_path, "--config", str(cfg))
    assert code == 3 and doc["node"]["verdict"] == "unknown" and str(cfg) in doc["problems"][0]


def test_ack_refuses_a_gpu_the_node_does_not_have_unless_forced(tmp_path, capsys):
    sim = ["--simulate", "p5.48xlarge", "--path.state-dir", str(tmp_path / "st")]
    assert main(["ack", *sim, "--gpu", "00000000:E1:00.0"]) == 2
    err = capsys.readouterr().err
    assert "no GPU at 00000000:E1:00.0" in err and "--force" in err
    assert not (tmp_path / "st" / "xid-state.json").exists()  # nothing written
    assert main(["ack", *sim, "--gpu", "00000000:E1:00.0", "--force"]) == 0
    assert main(["ack", *sim, "--gpu", "00000000:53:00.0"]) == 0  # GPU 0 of the simulated p5
    assert "acknowledged all XIDs on GPU 0" in capsys.readouterr().out


def test_relative_paths_in_the_config_are_relative_to_its_directory(tmp_path, monkeypatch):
    conf = tmp_path / "etc"
    conf.mkdir()
    cfg = conf / "config.yaml"
    cfg.write_text("paths:\n  state_dir: state\n  kmsg: ../logs/kmsg.txt\n  sysfs: /sys\n"
                   "web:\n  config_file: web.yml\nlustre:\n  rootfs: host\n")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # systemd runs the unit in /
    for path in (cfg, os.path.relpath(cfg)):
        c = load(path)
        assert c.paths.state_dir == str(conf / "state")
        assert c.paths.kmsg == str(tmp_path / "logs" / "kmsg.txt")
        assert c.paths.sysfs == "/sys" and c.web.config_file == str(conf / "web.yml")
        assert c.section(LustreSection).rootfs == str(conf / "host")
    # the command line's paths are the working directory's, as for any command
    c = load(cfg, {"paths.state_dir": "here", "web.config_file": "w.yml"})
    assert (c.paths.state_dir, c.web.config_file) == ("here", "w.yml")


def test_a_relative_web_config_file_is_found_from_any_working_directory(tmp_path, monkeypatch):
    from exporter.web.webconfig import load_web_config

    conf = tmp_path / "etc"
    conf.mkdir()
    digest = bcrypt.hashpw(b"secret", bcrypt.gensalt(4)).decode()
    (conf / "web.yml").write_text(f"basic_auth_users:\n  prometheus: '{digest}'\n")
    (conf / "config.yaml").write_text("web:\n  config_file: web.yml\n")
    monkeypatch.chdir("/")
    web = load_web_config(load(conf / "config.yaml").web.config_file)
    assert list(web.users) == ["prometheus"]


def test_no_instance_metadata_call_when_config_gives_everything():
    fake = FakeImdsServer({"instance-type": "p5.48xlarge", "instance-id": "i-1",
                           "placement/availability-zone": "us-east-2a"})
    fake.start(poll_interval_s=0.05)
    try:
        cfg = load(None, {"instance.imds_endpoint": fake.url, "node.instance_type": "p5.48xlarge",
                          "instance.instance_id": "i-0123", "instance.availability_zone": "us-east-2b",
                          "instance.scheduled_events": False})
        ctx = compose(cfg)
        runner = Runner.from_config(collectors.build(ctx, only=["instance", "health"]), cfg, pool=test_pool())
        assert ctx.identity.start() is None  # the daemon's start-up: nothing to ask
        runner.start()
        try:
            text = scrape(runner)
            assert 'instance_id="i-0123"' in text and 'instance_type="p5.48xlarge"' in text
            assert ctx.identity.lookup_now() == "p5.48xlarge"  # check's path too
        finally:
            runner.close()
        assert fake.requests == []
        # scheduled events are not configuration: with them on (the default), IMDS is asked for them
        cfg = load(None, {"instance.imds_endpoint": fake.url, "node.instance_type": "p5.48xlarge",
                          "instance.instance_id": "i-0123", "instance.availability_zone": "us-east-2b"})
        ctx = compose(cfg)
        assert ctx.identity.start() is None
        poller = imds.events_poller(ctx.identity, lambda _events: None)
        assert poller is not None
        poller.close()
    finally:
        fake.close()


def test_the_same_imds_failure_reads_the_same_so_it_is_logged_once():
    """The poller logs a failure when its text changes: IMDS failing the same way on each new
    connection (refused, or never answering) must read the same each time, naming no connection
    object, or every retry would be logged."""
    fake = FakeImdsServer({})
    fake.start(poll_interval_s=0.05)
    fake.delay_s = HANG_GUARD_S  # never answers: only the timeout ends each try
    try:
        with refused_address() as addr:
            for url, timeout_s in ((f"http://{addr}", 1.0), (fake.url, 0.2)):
                texts = []
                for _ in range(2):
                    with pytest.raises(imds.ImdsError) as failed:
                        imds.ImdsClient(url, timeout_s=timeout_s).fetch()
                    texts.append(str(failed.value))
                assert texts[0] == texts[1] and " at 0x" not in texts[0], texts
        assert texts[0].startswith("Timeout: ")
    finally:
        fake.close()
