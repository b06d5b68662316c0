"""The `active` command and its suite with fake binaries on PATH standing in for dcgmi,
all_reduce_perf, fi_info and fi_pingpong (each passes, fails, hangs past its deadline or prints
garbage), the NVML checks on the fake backend, the budget, and the result files."""

import json
import os
import stat
import time
from pathlib import Path

import pytest
import requests

from exporter.activecheck import result
from exporter.activecheck.settings import ActiveSection
from exporter.activecheck.suite import Node, Suite
from exporter.cli import main
from exporter.config import load
from exporter.nvml.backend import NVML_ERROR_NOT_SUPPORTED
from exporter.nvml.fake import FakeBackend, load_capture
from exporter.nvml.session import NvmlSession
from exporter.profiles import PROFILES
from exporter.tools.simulate.nvml_synth import node_capture
from tests.helpers import FIXTURES, samples, start_exporter, stop_within, test_pool, value, wait_for

DIAG = FIXTURES / "diag"
GiB = 1 << 30


def fake_tool(bin_dir: Path, name: str, body: str) -> Path:
    """A shell script named `name` in bin_dir (first on PATH in these tests)."""
    bin_dir.mkdir(exist_ok=True)
    p = bin_dir / name
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(p.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return p


def prints(fixture: str, code: int = 0, marker: Path | None = None) -> str:
    touch = f'echo "$@" >> "{marker}"\n' if marker else ""
    return f'{touch}cat "{DIAG / fixture}"\nexit {code}'


def hangs(pid_file: Path) -> str:
    """Starts a child that would outlive the tool unless its process group is killed."""
    return f'sleep 300 &\necho $! > "{pid_file}"\nwait'


@pytest.fixture
def node(tmp_path, monkeypatch):
    """A p5 on the fake NVML backend, an empty bin dir first on PATH (and nothing else of ours)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    fake = FakeBackend(node_capture(PROFILES["p5.48xlarge"], load_capture()))
    session = NvmlSession(fake, pool=test_pool())
    return bin_dir, fake, session


def suite(tmp_path, session, budget=60.0, instance_type="p5.48xlarge", efa=32, **cfg):
    overrides = {"paths.state_dir": str(tmp_path / "state"), **{f"active.{k}": v for k, v in cfg.items()}}
    config = load(None, overrides)
    n = Node(instance_type, 8, efa, session, test_pool())
    return Suite(config.section(ActiveSection), n, str(tmp_path / "state"), budget)


def by_check(results):
    return {r.check: r for r in results}


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie not yet reaped by init is gone for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def test_missing_tools_are_skipped_never_failed(tmp_path, node):
    _, _, session = node
    rs = by_check(suite(tmp_path, session).run(list(result.CHECKS)))
    assert rs["nvml"].result == "pass"
    for c in ("efa", "dcgm", "nccl"):
        assert rs[c].result == "skip" and "not found" in rs[c].reason
    on_disk = result.read(tmp_path / "state", "dcgm")
    assert on_disk is not None and on_disk.result == "skip"


@pytest.mark.parametrize(("fixture", "code", "want"), [
    ("dcgm4-diag-r3-pass-h100x8-assembled.json", 0, "pass"),
    ("dcgm4-diag-r1-fail-config-gb10.json", 226, "fail"),
    ("dcgm4-diag-r2-fail-isolate-constructed.json", 205, "fail"),
    ("dcgm4-diag-r3-pass-h100x8-assembled.json", 205, "pass"),
    ("dcgm4-diag-r1-warn-constructed.json", 0, "warn"),
    ("dcgm3-diag-r1-fail-warn.json", 226, "fail"),
    ("fi_info-no-efa.txt", 235, "skip"),  # no host engine, whatever it printed
    ("fi_info-no-efa.txt", 203, "error"),
    ("nccl-tests-mpirun-failure-not-enough-slots.txt", 0, "error"),  # garbage
])
def test_dcgmi_outputs_and_exit_codes(tmp_path, node, fixture, code, want):
    bin_dir, _, session = node
    args = tmp_path / "args"
    fake_tool(bin_dir, "dcgmi", prints(fixture, code, args))
    [r] = suite(tmp_path, session, dcgm_level=3).run(["dcgm"])
    assert (r.result, r.exit_code) == (want, code)
    assert args.read_text().split() == ["diag", "-r", "3", "-j"]
    assert result.read(tmp_path / "state", "dcgm").result == want


def test_a_hung_tool_is_killed_with_its_process_group_at_its_deadline(tmp_path, node):
    bin_dir, _, session = node
    pid_file = tmp_path / "child.pid"
    fake_tool(bin_dir, "dcgmi", hangs(pid_file))
    [r] = suite(tmp_path, session, dcgm_deadline_seconds=1.0).run(["dcgm"])
    assert r.result == "timeout" and "its deadline" in r.reason
    child = int(pid_file.read_text())
    wait_for(lambda: gone(child), what=f"the hung tool's child {child} to be gone")


def test_the_budget_cuts_a_running_check_and_skips_the_rest(tmp_path, node):
    bin_dir, _, session = node
    fake_tool(bin_dir, "dcgmi", hangs(tmp_path / "child.pid"))
    marker = tmp_path / "nccl-ran"
    fake_tool(bin_dir, "all_reduce_perf", prints("nccl-tests-allreduce-p5-awsbatch-aws.txt", 0, marker))
    s = suite(tmp_path, session, budget=1.5)  # the dcgm deadline (1,200 s) is far past the budget
    rs = by_check(s.run(["dcgm", "nccl"]))
    assert rs["dcgm"].result == "timeout" and "the rest of the budget" in rs["dcgm"].reason
    assert rs["nccl"].result == "skip" and "budget" in rs["nccl"].reason
    assert not marker.exists()
    assert result.read(tmp_path / "state", "nccl") is None  # not recorded: a cached pass must not count it


@pytest.mark.parametrize(("fixture", "code", "expected", "want"), [
    ("nccl-tests-allreduce-p5-awsbatch-aws.txt", 0, None, "pass"),  # 483 GB/s >= 0.9 x 460
    ("nccl-tests-allreduce-p5-awsbatch-aws.txt", 0, {"p5": {"single_node": 600}}, "fail"),
    ("nccl-tests-mpirun-failure-not-enough-slots.txt", 1, None, "error"),
    ("nccl-tests-nccl-failure-constructed.txt", 3, None, "fail"),
    ("dcgm3-diag-r1-pass.json", 0, None, "error"),  # garbage
])
def test_all_reduce_perf_judged_at_16_gib(tmp_path, node, fixture, code, expected, want):
    bin_dir, _, session = node
    args = tmp_path / "args"
    fake_tool(bin_dir, "all_reduce_perf", prints(fixture, code, args))
    [r] = suite(tmp_path, session, nccl_expected=expected or {}).run(["nccl"])
    assert r.result == want, r.reason
    assert args.read_text().split() == ["-b", str(16 * GiB), "-e", str(16 * GiB), "-f", "2", "-g", "8"]


def test_all_reduce_perf_hung_is_a_timeout(tmp_path, node):
    bin_dir, _, session = node
    fake_tool(bin_dir, "all_reduce_perf", hangs(tmp_path / "pid"))
    [r] = suite(tmp_path, session, nccl_deadline_seconds=0.5).run(["nccl"])
    assert r.result == "timeout"


def test_nccl_command_under_a_launcher(tmp_path, node):
    bin_dir, _, session = node
    args = tmp_path / "args"
    fake_tool(bin_dir, "srun", prints("nccl-tests-allreduce-p5-2node-aws.txt", 0, args))
    [r] = suite(tmp_path, session, nccl_scope="multi_node",
                nccl_command=["srun", "-N", "2", "--label", "all_reduce_perf", "-b", "{size}", "-e", "{size}"]
                ).run(["nccl"])
    assert r.result == "pass" and "expected 487.09" in r.reason  # the 2 x p5 figure, at 16 GiB
    assert args.read_text().split()[-4:] == ["-b", str(16 * GiB), "-e", str(16 * GiB)]


@pytest.mark.parametrize(("fixture", "code", "efa", "want"), [
    ("fi_info-efa-p4d-4dev.txt", 0, 4, "pass"),
    ("fi_info-efa-p4d-4dev.txt", 0, 32, "fail"),  # a p5 that opens only 4
    ("fi_info-no-efa.txt", 1, 32, "fail"),
    ("fi_info-no-efa.txt", 1, None, "skip"),  # no EFA, none expected
    ("dcgm3-diag-r1-pass.json", 0, 4, "error"),  # garbage
])
def test_fi_info_device_count(tmp_path, node, fixture, code, efa, want):
    bin_dir, _, session = node
    fake_tool(bin_dir, "fi_info", prints(fixture, code))
    [r] = suite(tmp_path, session, efa=efa).run(["efa"])
    assert r.result == want, r.reason


@pytest.mark.parametrize(("client_code", "want"), [(0, "pass"), (1, "fail")])
def test_efa_loopback_with_fi_pingpong(tmp_path, node, client_code, want):
    bin_dir, _, session = node
    fake_tool(bin_dir, "fi_info", prints("fi_info-efa-p4d-4dev.txt"))
    # the server (no host argument) waits for a client; the client names localhost
    fake_tool(bin_dir, "fi_pingpong", f'case "$*" in *localhost*) exit {client_code};; esac\nexec sleep 300')
    [r] = suite(tmp_path, session, efa=4).run(["efa"])
    assert r.result == want, r.reason


def test_fi_info_hung_is_a_timeout(tmp_path, node):
    bin_dir, _, session = node
    fake_tool(bin_dir, "fi_info", hangs(tmp_path / "pid"))
    [r] = suite(tmp_path, session, efa_deadline_seconds=0.5).run(["efa"])
    assert r.result == "timeout"


def test_nvml_checks_nvlink_pcie_count_and_a_hung_gpu(tmp_path, node):
    _, fake, session = node
    fake.set_value(2, "nvmlDeviceGetNvLinkState/7", 0)
    fake.set_value(4, "nvmlDeviceGetCurrPcieLinkWidth", 8)
    fake.set_value(5, "nvmlDeviceGetCurrPcieLinkGeneration", 1)
    fake.set_value(6, "nvmlDeviceGetEccMode", [0, 0])
    fake.hang(3, "nvmlDeviceGetEccMode")
    [r] = suite(tmp_path, session, nvml_call_timeout_seconds=0.5).run(["nvml"])
    assert r.result == "fail"
    bad = {(f.gpu, f.test): f for f in r.findings if f.status != "pass"}
    assert set(bad) == {("2", "nvlink"), ("4", "pcie"), ("5", "pcie"), ("6", "ecc"), ("3", "answers")}
    assert "NVLink 7 down of 18" in bad[("2", "nvlink")].message
    assert bad[("4", "pcie")].status == "fail" and bad[("5", "pcie")].status == "warn"
    assert "did not answer" in bad[("3", "answers")].message
    fake.release()


def test_nvml_checks_assume_no_nvlink_and_count_expected_gpus(tmp_path, node):
    _, fake, session = node
    for link in range(18):  # a PCIe part: NVML says Not Supported for every link
        fake.set_error(0, f"nvmlDeviceGetNvLinkState/{link}", NVML_ERROR_NOT_SUPPORTED)
    s = suite(tmp_path, session, nvml_persistence=True, nvml_power_limit_watts=800.0)
    s.node.expected_gpus = 9
    [r] = s.run(["nvml"])
    tests = {(f.gpu, f.test): f.status for f in r.findings}
    assert ("0", "nvlink") not in tests and tests[("1", "nvlink")] == "pass"
    assert tests[("", "gpu_count")] == "fail"
    assert tests[("0", "power_limit")] == "fail"  # 700 W enforced


def test_a_skip_never_replaces_a_valid_result(tmp_path, node):
    bin_dir, _, session = node
    tool = fake_tool(bin_dir, "dcgmi", prints("dcgm4-diag-r1-fail-config-gb10.json", 226))
    assert suite(tmp_path, session).run(["dcgm"])[0].result == "fail"
    tool.unlink()
    assert suite(tmp_path, session).run(["dcgm"])[0].result == "skip"
    assert result.read(tmp_path / "state", "dcgm").result == "fail"  # still on record


def test_last_pass_is_carried_over(tmp_path, node):
    bin_dir, _, session = node
    tool = fake_tool(bin_dir, "dcgmi", prints("dcgm4-diag-r3-pass-h100x8-assembled.json"))
    passed = suite(tmp_path, session).run(["dcgm"])[0]
    tool.write_text("#!/bin/sh\n" + prints("dcgm4-diag-r1-fail-config-gb10.json", 226))
    failed = suite(tmp_path, session).run(["dcgm"])[0]
    assert failed.result == "fail" and failed.last_pass_at == passed.finished_at


# --- the command ---------------------------------------------------------------------------------

def active(tmp_path, capsys, *args):
    code = main(["active", "--simulate", "p5.48xlarge", "--path.state-dir", str(tmp_path / "state"), *args])
    return code, capsys.readouterr().out


@pytest.mark.parametrize(("fixture", "code", "exit_status"), [
    ("dcgm4-diag-r3-pass-h100x8-assembled.json", 0, 0),
    ("dcgm4-diag-r1-warn-constructed.json", 0, 0),  # a warning is not a verdict reason
    ("dcgm4-diag-r1-fail-config-gb10.json", 226, 1),  # Deployment: degraded
    ("dcgm4-diag-r2-fail-pcie-constructed.json", 226, 2),  # Integration: reboot
    ("dcgm4-diag-r2-fail-isolate-constructed.json", 205, 2),  # Hardware, ISOLATE: replace
    ("fi_info-no-efa.txt", 235, 0),  # no host engine: skipped
    ("fi_info-no-efa.txt", 203, 3),  # could not check
])
def test_command_exit_status_follows_the_verdict_level(tmp_path, node, capsys, fixture, code, exit_status):
    bin_dir, _, _ = node
    fake_tool(bin_dir, "dcgmi", prints(fixture, code))
    got, out = active(tmp_path, capsys, "--checks", "dcgm", "--json")
    assert got == exit_status, out
    assert json.loads(out)[0]["check"] == "dcgm"


def test_command_reuses_a_recent_pass_running_nothing(tmp_path, node, capsys):
    bin_dir, _, _ = node
    marker = tmp_path / "ran"
    fake_tool(bin_dir, "dcgmi", prints("dcgm4-diag-r3-pass-h100x8-assembled.json", 0, marker))
    assert active(tmp_path, capsys, "--checks", "nvml,dcgm", "--reuse-pass", "3600")[0] == 0
    assert marker.read_text().count("diag") == 1
    code, out = active(tmp_path, capsys, "--checks", "nvml,dcgm", "--reuse-pass", "3600")
    assert code == 0 and "nothing run" in out
    assert marker.read_text().count("diag") == 1  # not run again
    assert active(tmp_path, capsys, "--checks", "nvml,dcgm", "--reuse-pass", "0")[0] == 0
    assert marker.read_text().count("diag") == 2


def test_command_rejects_an_unknown_check(tmp_path, node, capsys):
    assert main(["active", "--simulate", "p5.48xlarge", "--path.state-dir", str(tmp_path), "--checks",
                 "nvml,stress"]) == 3


def test_check_never_runs_a_tool(tmp_path, node, capsys):
    """`check` (Slurm's HealthCheckProgram) stays passive: a dcgmi that hangs is never started."""
    bin_dir, _, _ = node
    pid_file = tmp_path / "pid"
    fake_tool(bin_dir, "dcgmi", hangs(pid_file))
    fake_tool(bin_dir, "all_reduce_perf", hangs(pid_file))
    code = main(["check", "--simulate", "p5.48xlarge", "--path.state-dir", str(tmp_path / "state")])
    assert code == 0 and not pid_file.exists()


def test_results_are_written_atomically_and_read_back(tmp_path):
    r = result.CheckResult("nccl", "pass", "ok", started_at=10.0, finished_at=20.0,
                           measurements={"bus_bandwidth_bytes_per_second": 4.8e11})
    assert result.write(tmp_path, r)
    back = result.read(tmp_path, "nccl")
    assert back == r and back.last_pass_at == 20.0
    assert [p.name for p in (tmp_path / "active").iterdir()] == ["nccl.json"]  # no temporary left
    (tmp_path / "active" / "dcgm.json").write_text('{"version": 1, "check": "dcgm", "result": "maybe"}')
    with pytest.raises(ValueError, match=r"dcgm\.json: result: expected one of"):
        result.read(tmp_path, "dcgm")
    assert result.read(tmp_path, "efa") is None


def test_validity(tmp_path):
    now = time.time()
    r = result.CheckResult("dcgm", "fail", finished_at=now - 100, valid_for_s=60)
    assert not r.valid(now) and r.age_s(now) == pytest.approx(100)
    assert result.CheckResult("dcgm", "fail", finished_at=now - 10, valid_for_s=60).valid(now)
    assert not result.CheckResult("dcgm", "fail", finished_at=now + 3600, valid_for_s=60).valid(now)


def test_check_reads_the_recorded_results_as_the_daemon_does(tmp_path, capsys):
    """`check` runs no tool but its verdict counts a valid failure on record, and not an expired one."""
    state = tmp_path / "state"
    now = time.time()
    failed = result.CheckResult("dcgm", "fail", "failed", started_at=now - 20, finished_at=now - 10,
                                findings=[result.Finding("2", "memory", "fail", "Hardware", [11])])
    result.write(state, failed)
    args = ["check", "--simulate", "p5.48xlarge", "--path.state-dir", str(state), "--json"]
    assert main(args) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["node"]["verdict"] == "replace_required" and "active_dcgm_hardware" in doc["node"]["reasons"]
    failed.finished_at, failed.valid_for_s = now - 7200, 3600.0
    result.write(state, failed)
    assert main(args) == 0
    capsys.readouterr()


def test_the_daemon_exports_what_active_recorded_and_never_runs_a_tool(tmp_path, node, capsys):
    """`active` records a DCGM failure; the daemon, with a dcgmi that would hang first on its PATH,
    serves the results and the verdict they give, and never starts a tool itself."""
    bin_dir, _, _ = node
    pid_file = tmp_path / "pid"
    fake_tool(bin_dir, "dcgmi", prints("dcgm4-diag-r2-fail-isolate-constructed.json", 205))
    state = tmp_path / "state"
    assert active(tmp_path, capsys, "--checks", "nvml,dcgm")[0] == 2
    fake_tool(bin_dir, "dcgmi", hangs(pid_file))  # the daemon must never start it
    pid_file.unlink(missing_ok=True)
    proc, url, _ = start_exporter(tmp_path, "--simulate", "p5.48xlarge", "--path.state-dir", str(state))
    try:
        s = samples(requests.get(url, timeout=30).text)
        assert value(s, "gpu_health_active_check_result", check="dcgm", result="fail") == 1
        assert value(s, "gpu_health_active_check_result", check="nvml", result="pass") == 1
        assert value(s, "gpu_health_active_check_gpu_result", check="dcgm", gpu="3", result="fail") == 1
        assert value(s, "gpu_health_reason", gpu="3", reason="active_dcgm_hardware") == 1
        assert value(s, "gpu_node_health_verdict", verdict="replace_required") == 1
        assert value(s, "gpu_health_active_check_valid", check="dcgm") == 1
        assert not pid_file.exists()
    finally:
        stop_within(proc)
