"""`check` and `ack` as an operator (or Slurm/Kubernetes) runs them: one-shot, no daemon."""

import json
import os

import pytest

from exporter.cli import main
from tests.helpers import FIXTURES, HANG_GUARD_S, START_HANG_GUARD_S

REAL = (FIXTURES / "kmsg" / "kmsg_nvidia.txt").read_text()
# A saved kernel log of a p5 node (GPU 2 at 0000:75:00, GPU 5 at 0000:a8:00) plus the real H200
# record (0000:00:06, a GPU this node's NVML does not list).
REPLAYED = REAL + "\n" + "".join([
    "4,400,40000000,-;NVRM: Xid (PCI:0000:75:00): 63, pid='<unknown>', name=<unknown>, Row Remapper: New row "
    "(0x00000000001f0a40) marked for remapping, reset gpu to activate.\n",
    "4,401,50000000,-;NVRM: Xid (PCI:0000:a8:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off "
    "the bus.\n",
    "3,402,50000100,-;NVRM: The NVIDIA GPU 0000:a8:00.0\n",
    "3,403,50000110,-;NVRM: (PCI ID: 10de:2330) installed in this system has\n",
    "3,404,50000120,-;NVRM: fallen off the bus and is not responding to commands.\n",
    "4,405,60000000,-;NVRM: Xid (PCI:0000:53:00): 13, pid=7, name=python3, Graphics SM Warp Exception on "
    "(GPC 0, TPC 0, SM 0): Out Of Range Address\n",
    "4,406,60000001,-;NVRM: Xid (PCI:0000:53:00): 13, pid=7, name=python3, Graphics SM Global Exception on "
    "(GPC 0, TPC 0, SM 0): Multiple Warp Errors\n",
])


def run_check(capsys, *args):
    code = main(["check", *args])
    out = capsys.readouterr().out
    return code, out


def test_check_json_on_a_simulated_node_with_a_replayed_log(tmp_path, capsys):
    log = tmp_path / "kmsg.txt"
    log.write_text(REPLAYED)
    code, out = run_check(capsys, "--simulate", "p5.48xlarge", "--kmsg-file", str(log), "--json")
    doc = json.loads(out)
    assert code == 2 and doc["node"]["exit_status"] == 2
    assert doc["node"]["verdict"] == "replace_required"
    assert doc["node"]["reasons"] == ["xid_replace", "xid_reboot"]
    assert (doc["node"]["gpu_count"], doc["node"]["expected_gpus"]) == (8, 8)
    by = {(g["gpu"], g["pci_bus_id"]): g for g in doc["gpus"]}
    g2 = by[(2, "00000000:75:00.0")]
    assert g2["verdict"] == "replace_required" and g2["reasons"] == ["xid_replace"]
    assert [(x["xid"], x["count"], x["tier"]) for x in g2["xids"]] == [(63, 1, "replace")]
    g5 = by[(5, "00000000:A8:00.0")]
    assert [(x["xid"], x["count"], x["tier"]) for x in g5["xids"]] == [(79, 1, "reboot")]
    assert g5["verdict"] == "reboot_required"
    g0 = by[(0, "00000000:53:00.0")]
    assert [(x["xid"], x["count"], x["tier"]) for x in g0["xids"]] == [(13, 1, "application")]
    assert g0["verdict"] == "healthy"
    stray = by[(None, "00000000:00:06.0")]  # not an NVML GPU: reported with its PCI address
    assert [(x["xid"], x["count"], x["tier"]) for x in stray["xids"]] == [(31, 1, "application")]
    assert stray["uuid"] == "GPU-5d849bfd-1fd8-d42f-aa96-a7c78683d9fe"
    assert doc["sources"]["kmsg"]["ok"] and doc["problems"] == []


def test_exit_statuses(tmp_path, capsys):
    log = tmp_path / "kmsg.txt"
    log.write_text(REAL)
    assert run_check(capsys, "--simulate", "p5.48xlarge", "--kmsg-file", str(log))[0] == 0
    log.write_text("4,1,1000,-;NVRM: Xid (PCI:0000:53:00): 242, a new XID\n")
    code, out = run_check(capsys, "--simulate", "p5.48xlarge", "--kmsg-file", str(log))
    assert code == 1 and "DEGRADED" in out and "242 x1 unknown" in out
    code, out = run_check(capsys, "--simulate", "p5.48xlarge", "--scenario", "gpu-row-remap-pending",
                          "--kmsg-file", str(log))
    assert code == 2 and "row_remap_pending" in out
    # no kernel log and no NVML: could not check
    missing = str(tmp_path / "missing")
    code, out = run_check(capsys, "--kmsg-file", missing, "--nvml-capture", missing,
                          "--path.state-dir", str(tmp_path / "st"))
    assert code == 3 and "could not check" in out
    # NVML unusable, but the kernel log alone shows action is needed: 2, not 3
    log.write_text(REPLAYED)
    code, out = run_check(capsys, "--kmsg-file", str(log), "--nvml-capture", missing, "--json",
                          "--path.state-dir", str(tmp_path / "st"))
    assert code == 2 and json.loads(out)["problems"]


def test_ack_clears_the_sticky_verdict_and_keeps_the_counts(tmp_path, capsys):
    state = str(tmp_path / "state")
    sim = ["--simulate", "p5.48xlarge", "--scenario", "xid-63", "--path.state-dir", state]
    code, out = run_check(capsys, *sim, "--json")
    assert code == 2 and json.loads(out)["gpus"][2]["reasons"] == ["xid_replace"]
    assert main(["ack", *sim, "--gpu", "2", "--xid", "63"]) == 0
    assert "acknowledged XID 63 on GPU 2" in capsys.readouterr().out
    code, out = run_check(capsys, *sim, "--json")
    g2 = json.loads(out)["gpus"][2]
    assert code == 0 and g2["verdict"] == "healthy"
    assert g2["xids"] == [{**g2["xids"][0], "xid": 63, "count": 1, "tier": "replace", "acknowledged": True}]
    assert main(["ack", *sim, "--gpu", "17"]) == 2  # no such GPU


def test_unreadable_kernel_log_with_this_boots_state_file_is_still_a_check(tmp_path, capsys):
    state = str(tmp_path / "state")
    log = tmp_path / "kmsg.txt"
    log.write_text(REPLAYED)
    args = ["--simulate", "p5.48xlarge", "--kmsg-file", str(log), "--path.state-dir", state]
    assert main(["ack", *args, "--gpu", "2"]) == 0  # its acks file names this boot and GPU 2's XID 63
    capsys.readouterr()
    acks = json.loads((tmp_path / "state" / "xid-acks.json").read_text())
    a = acks["acks"][0]
    daemons = {a["pci"]: {k: [n, 1.0, a["time"]] for k, n in a["baseline"].items()}}
    assert daemons[a["pci"]] == {"63": [1, 1.0, a["time"]]}
    (tmp_path / "state" / "xid-state.json").write_text(  # the daemon's state file of this boot ...
        json.dumps({"version": 1, "boot_id": acks["boot_id"], "counts": daemons}))
    (tmp_path / "state" / "xid-acks.json").unlink()  # ... without the ack
    log.unlink()  # e.g. no CAP_SYSLOG for the check: the daemon's state still has the counts
    code, out = run_check(capsys, *args, "--json")
    doc = json.loads(out)
    assert not doc["sources"]["kmsg"]["ok"] and doc["sources"]["state_file"]["found"]
    assert doc["problems"] == [] and code == 2 and doc["node"]["verdict"] == "replace_required", doc
    # neither the kernel log nor a state file for this boot: could not check
    code, out = run_check(capsys, *args[:-2], "--path.state-dir", str(tmp_path / "empty"), "--json")
    assert code == 3 and json.loads(out)["problems"]


def test_a_non_utf8_state_file_is_exit_3_and_left_for_the_daemon(tmp_path, capsys):
    state = tmp_path / "state"
    state.mkdir()
    (state / "xid-state.json").write_bytes(b'{"version": 1, "boot_id": "\xff\xfe"}')
    log = tmp_path / "kmsg.txt"
    log.write_text(REAL)
    code, out = run_check(capsys, "--simulate", "p5.48xlarge", "--kmsg-file", str(log),
                          "--path.state-dir", str(state), "--json")
    doc = json.loads(out)
    assert code == 3 and doc["sources"]["state_file"]["problem"] == "corrupt"
    assert any("state file" in p for p in doc["problems"])
    assert (state / "xid-state.json").exists()  # the daemon sets it aside and counts the recovery


@pytest.mark.slow
def test_check_gives_the_daemons_reasons_in_simulation(tmp_path):
    """`check --simulate` plays the scenario's onset on the fake NVML too, so it sees what the
    daemon sees a few seconds in (it used to read NVML before the fault happened)."""
    import subprocess
    import sys

    import requests

    from tests.helpers import ROOT, samples, start_exporter, wait_for

    scenarios = ["gpu-ecc-dbe", "gpu-lost", "gpu-nvml-hang"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    daemons = {}
    try:
        for s in scenarios:
            daemons[s] = start_exporter(tmp_path, "--simulate", "p5.48xlarge", "--scenario", s,
                                        "--path.state-dir", str(tmp_path / f"d-{s}"))
        for s in scenarios:
            r = subprocess.run([sys.executable, "-m", "exporter", "check", "--simulate", "p5.48xlarge",
                                "--scenario", s, "--json", "--path.state-dir", str(tmp_path / f"c-{s}")],
                               env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
            checked = sorted(json.loads(r.stdout)["node"]["reasons"])
            assert checked  # a hung GPU is gpu_not_answering, never a clean bill of health
            proc, url, log = daemons[s]

            def daemon_reasons(url=url) -> list[str]:
                got = samples(requests.get(url, timeout=30).text)
                return sorted(dict(ls)["reason"] for (n, ls), v in got.items()
                              if n == "gpu_node_health_reason" and v)
            # the daemon gets there once its scenario's onset (3 s) has passed
            wait_for(lambda d=daemon_reasons, c=checked: d() == c, START_HANG_GUARD_S,
                     f"{s}: the daemon's reasons {checked}", proc, log)
    finally:
        for proc, _, _ in daemons.values():
            proc.terminate()
            proc.wait(30)


def test_command_line_and_config_errors_of_check_and_ack(tmp_path, capsys):
    assert main(["check", "--collectors", "nope"]) == 3  # could not check: never 2, which drains
    assert "unknown collector 'nope'" in capsys.readouterr().err
    assert main(["check", "--no-such-flag"]) == 3
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err
    bad = tmp_path / "config.yaml"
    bad.write_bytes(b"gpu:\n  parallel: yes please\n\xff\n")
    code, out = run_check(capsys, "--config", str(bad), "--json")
    doc = json.loads(out)  # a config error is still a JSON document under --json
    # exit 3 (could not check), never 2: a wrapper drains on 2 alone
    assert code == 3 and doc["node"]["exit_status"] == 3 and str(bad) in doc["problems"][0]
    assert doc["node"]["verdict"] == "unknown"
    state = str(tmp_path / "state")
    sim = ["--simulate", "p5.48xlarge", "--scenario", "xid-63", "--path.state-dir", state]
    assert main(["ack", *sim, "--gpu", "2", "--xid", "999"]) == 2  # not in the catalog, never counted
    assert "XID 999 is not in the XID catalog" in capsys.readouterr().err
    assert main(["ack", *sim, "--gpu", "2", "--xid", "99999999999"]) == 2


def test_an_ack_in_simulation_holds_whatever_the_scenario_flags(tmp_path, capsys):
    state = str(tmp_path / "state")
    base = ["--simulate", "p5.48xlarge", "--path.state-dir", state]
    assert main(["ack", *base, "--scenario", "xid-63", "--gpu", "2", "--xid", "63"]) == 0
    capsys.readouterr()
    for flags in (["--scenario", "xid-63", "--scenario", "gpu-thermal-slowdown"], ["--scenario", "xid-63"]):
        code, out = run_check(capsys, *base, *flags, "--json")
        g2 = json.loads(out)["gpus"][2]
        assert g2["xids"][0]["xid"] == 63 and g2["xids"][0]["acknowledged"], flags
        assert "xid_replace" not in g2["reasons"]


def test_check_fatal_sxid_exits_2_with_the_node_reboot(tmp_path, capsys):
    """A fatal SXid makes the node reboot_required (exit 2) whatever the GPUs say; non-fatal ones
    are listed and leave it healthy; a policy can make it replace."""
    from tests.test_sxid import RECORDS, kmsg

    log = tmp_path / "kmsg.txt"
    log.write_text(REAL + kmsg(RECORDS[9:10] + RECORDS[3:6], start_seq=500))  # 20009 non-fatal, 20034 fatal
    code, out = run_check(capsys, "--simulate", "p5.48xlarge", "--kmsg-file", str(log), "--json")
    doc = json.loads(out)
    assert code == 2 and doc["node"]["verdict"] == "reboot_required"
    assert doc["node"]["reasons"] == ["sxid_reboot"]
    assert all(g["verdict"] == "healthy" for g in doc["gpus"] if g["gpu"] is not None)
    got = {(x["switch"], x["sxid"], x["severity"], x["tier"], x["count"]) for x in doc["nvswitch_sxids"]}
    assert got == {
        (1, 20009, "non_fatal", "ignore", 1), (1, 20034, "fatal", "reboot", 1)}  # one switch at 06:00.0
    assert all(g["fabric_state"] == "completed" for g in doc["gpus"] if g["gpu"] is not None)
    code, out = run_check(capsys, "--simulate", "p5.48xlarge", "--kmsg-file", str(log))
    assert code == 2 and "NVSwitch SXids since boot" in out and "20034 x1 fatal reboot" in out
    cfg = tmp_path / "c.yaml"
    cfg.write_text("nvswitch:\n  fatal_tier: replace\n")
    code, out = run_check(capsys, "--simulate", "p5.48xlarge", "--kmsg-file", str(log), "--config", str(cfg),
                          "--json")
    assert code == 2 and json.loads(out)["node"]["reasons"] == ["sxid_replace"]
    log.write_text(REAL + kmsg(RECORDS[9:10], start_seq=500))
    assert run_check(capsys, "--simulate", "p5.48xlarge", "--kmsg-file", str(log))[0] == 0


def test_check_fabric_manager_down_and_status_error(tmp_path, capsys):
    log = tmp_path / "kmsg.txt"
    log.write_text(REAL)
    code, out = run_check(capsys, "--simulate", "p5.48xlarge", "--scenario", "gpu-fabric-manager-down",
                          "--kmsg-file", str(log), "--json")
    doc = json.loads(out)
    assert code == 2 and doc["node"]["reasons"] == ["fabric_not_completed"]
    assert {g["fabric_state"] for g in doc["gpus"] if g["gpu"] is not None} == {"in_progress"}
    code, out = run_check(capsys, "--simulate", "p5.48xlarge", "--scenario", "gpu-fabric-status-error",
                          "--kmsg-file", str(log), "--json")
    doc = json.loads(out)
    assert code == 2 and doc["node"]["reasons"] == ["fabric_status_error"]
    assert [g["gpu"] for g in doc["gpus"] if g["reasons"]] == [3]
    # A100 (p4d): no fabric registration; Not Supported is not a fault
    code, out = run_check(capsys, "--simulate", "p4d.24xlarge", "--scenario", "gpu-fabric-manager-down",
                          "--kmsg-file", str(log), "--json")
    doc = json.loads(out)
    assert code == 0 and {g["fabric_state"] for g in doc["gpus"]} == {None}


CAPTURE = FIXTURES / "nvml" / "h200" / "nvml_capture.json"  # a real one-GPU H200 node


def dmi_sysfs(root, product_name: str | None):
    """A generated sysfs tree whose DMI product name is `product_name` (None: no DMI at all)."""
    sysfs = root / "sys"
    dmi = sysfs / "devices" / "virtual" / "dmi" / "id"
    dmi.mkdir(parents=True)
    if product_name is not None:
        (dmi / "product_name").write_text(product_name + "\n")
    return sysfs


def one_gpu_check(capsys, tmp_path, product_name, *args):
    sysfs = dmi_sysfs(tmp_path, product_name)
    log = tmp_path / "kmsg.txt"
    log.write_text(REAL)
    code, out = run_check(capsys, "--nvml-capture", str(CAPTURE), "--path.sysfs", str(sysfs),
                          "--kmsg-file", str(log), "--path.state-dir", str(tmp_path / "st"), *args)
    return code, out


def test_a_p5_by_dmi_with_one_gpu_fails_the_check_without_config(tmp_path, capsys):
    code, out = one_gpu_check(capsys, tmp_path, "p5.48xlarge")
    assert code == 2
    assert "node p5.48xlarge: REBOOT_REQUIRED (exit 2); GPUs 1/8" in out
    assert ("NVML shows 1 GPU(s), 8 expected: a p5.48xlarge has 8 (instance type from the DMI product name)"
            in out)
    code, out = run_check(capsys, "--nvml-capture", str(CAPTURE), "--path.sysfs", str(tmp_path / "sys"),
                          "--kmsg-file", str(tmp_path / "kmsg.txt"), "--path.state-dir", str(tmp_path / "st"),
                          "--json")
    node = json.loads(out)["node"]
    assert code == 2 and node["verdict"] == "reboot_required"
    assert (node["instance_type"], node["instance_type_source"]) == ("p5.48xlarge", "dmi")
    assert (node["gpu_count"], node["expected_gpus"]) == (1, 8)
    assert "1 GPU(s), 8 expected" in node["details"]["gpu_count_below_expected"]


@pytest.mark.parametrize("product_name", [None, "Standard PC (Q35 + ICH9, 2009)", "HVM domU", "",
                                          "c7i.2xlarge"])
def test_a_dmi_that_names_no_known_gpu_type_expects_nothing(tmp_path, capsys, product_name):
    code, out = one_gpu_check(capsys, tmp_path, product_name)
    assert code == 0, out
    assert "GPUs 1/?" in out


def test_config_overrides_the_dmi_product_name(tmp_path, capsys):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("node:\n  instance_type: g6e.xlarge\n")  # a one-GPU type this exporter has no profile of
    assert one_gpu_check(capsys, tmp_path, "p5.48xlarge", "--config", str(cfg))[0] == 0
    cfg.write_text("node:\n  expected_gpus: 2\n")
    code, out = run_check(capsys, "--nvml-capture", str(CAPTURE), "--path.sysfs", str(tmp_path / "sys"),
                          "--kmsg-file", str(tmp_path / "kmsg.txt"), "--path.state-dir", str(tmp_path / "st"),
                          "--config", str(cfg))
    assert code == 2 and "node.expected_gpus in the config says 2" in out


def test_nothing_to_check_is_one_verdict_unknown_exit_3(tmp_path, capsys):
    """No GPU (NVML unusable) and nothing else wrong: exit 3 and verdict `unknown`, in the text and
    the JSON, never `degraded` (which is exit 1's)."""
    log = tmp_path / "kmsg.txt"
    log.write_text(REAL)
    args = ["--nvml-capture", str(tmp_path / "missing.json"), "--kmsg-file", str(log),
            "--path.state-dir", str(tmp_path / "st"), "--path.sysfs", str(dmi_sysfs(tmp_path, None))]
    code, out = run_check(capsys, *args)
    assert code == 3 and ": UNKNOWN (exit 3)" in out
    assert "DEGRADED" not in out.upper().replace("UNKNOWN", "")
    code, out = run_check(capsys, *args, "--json")
    doc = json.loads(out)
    assert code == 3 and doc["node"]["verdict"] == "unknown" and doc["node"]["exit_status"] == 3
    assert "degraded" not in json.dumps(doc["node"])
    assert any("NVML" in p for p in doc["problems"])


@pytest.mark.parametrize(("scenario", "code", "gpu3"), [
    ("gpu-nvml-hang", 3, "unknown"),  # hangs for good: one read cannot tell more than "unknown"
    ("gpu-nvml-hang-recover", 3, "unknown"),  # still hanging a minute in
    ("gpu-nvml-hang-once", 0, "healthy"),  # over by then: it answers
])
def test_check_on_a_gpu_that_does_not_answer_is_never_healthy(tmp_path, capsys, scenario, code, gpu3):
    args = ["--simulate", "p5.48xlarge", "--scenario", scenario, "--path.state-dir", str(tmp_path / "s")]
    got, out = run_check(capsys, *args, "--json")
    doc = json.loads(out)
    assert got == code and doc["node"]["exit_status"] == code
    by = {g["gpu"]: g for g in doc["gpus"]}
    assert by[3]["verdict"] == gpu3
    assert {by[i]["verdict"] for i in range(8) if i != 3} == {"healthy"}  # they answered
    if code:
        assert doc["node"]["verdict"] == "unknown" and doc["node"]["reasons"] == ["gpu_not_answering"]
        assert by[3]["reasons"] == ["gpu_not_answering"]
        assert any("GPU 3" in p and "did not answer" in p for p in doc["problems"])
    else:
        assert doc["problems"] == [] and doc["node"]["verdict"] == "healthy"
    got, out = run_check(capsys, *args)
    assert got == code
    assert ("UNKNOWN (exit 3)" in out) == bool(code)
