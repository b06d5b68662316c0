"""Fake tools that misbehave as real ones do, against the runner (exporter.activecheck.tool) and
the suite: a tool that ignores SIGTERM, one whose child leaves its process group and keeps the
output pipe open (after the tool exited, or while it hangs), one that floods its output, one that
writes only to stderr. The budget holds, the memory stays bounded, nothing is left waiting on a
pipe, and a tool that exited is judged by its exit status and output even when a child of it
still holds the pipe (written independently of test_active_checks)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from exporter.activecheck import result, tool
from exporter.activecheck.settings import ActiveSection
from exporter.activecheck.suite import Node, Suite
from exporter.config import load
from exporter.nvml.fake import FakeBackend, load_capture
from exporter.nvml.session import NvmlSession
from exporter.profiles import PROFILES
from exporter.tools.simulate.nvml_synth import node_capture
from tests.helpers import DEADLINE_MARGIN_S, FIXTURES, HANG_GUARD_S, START_HANG_GUARD_S, test_pool, wait_for

DIAG = FIXTURES / "diag"
PASS_JSON = DIAG / "dcgm4-diag-r3-pass-h100x8-assembled.json"
# The tools faked here hang for minutes or for ever, so a bounded call is asserted to return within
# DEADLINE_MARGIN_S. SLACK_S is left only where the defect is the command's own start-up (seconds).
SLACK_S = 4.0


def script(bin_dir: Path, name: str, body: str) -> Path:
    bin_dir.mkdir(exist_ok=True)
    p = bin_dir / name
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(0o755)
    return p


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def escapees():
    """Pids of children that left the tool's process group (setsid): the runner cannot kill them,
    the test does."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def setsid_child(pid_file: Path) -> str:
    """A grandchild in its own session holding the inherited stdout for 300 s."""
    return f'setsid sh -c \'echo $$ > "{pid_file}"; exec sleep 300\' &\n' \
           f'while [ ! -s "{pid_file}" ]; do sleep 0.05; done\n'


def test_a_tool_ignoring_sigterm_is_killed_within_its_limit_and_grace(tmp_path):
    t = script(tmp_path, "t", "trap '' TERM\necho started\nwhile :; do sleep 1; done")
    start = time.monotonic()
    r = tool.run([str(t)], 1.0, grace_s=1.0)
    assert r.timed_out and r.exit_code is None
    assert "started" in r.output
    assert time.monotonic() - start < DEADLINE_MARGIN_S  # its 1 s limit and grace, not the hang


def test_a_child_holding_the_pipe_after_the_tool_exited_keeps_its_exit_status(tmp_path, escapees):
    pid_file = tmp_path / "child.pid"
    t = script(tmp_path, "dcgmi", setsid_child(pid_file) + f'cat "{PASS_JSON}"\nexit 226')
    start = time.monotonic()
    r = tool.run([str(t)], HANG_GUARD_S, grace_s=1.0)
    escapees.append(int(pid_file.read_text()))
    assert (r.timed_out, r.exit_code) == (False, 226)
    assert '"DCGM Diagnostic"' in r.output
    # not held by the child's open pipe (300 s) nor to the deadline
    assert time.monotonic() - start < DEADLINE_MARGIN_S


def test_a_hung_tool_whose_child_left_its_group_returns_at_its_limit(tmp_path, escapees):
    pid_file = tmp_path / "child.pid"
    t = script(tmp_path, "t", setsid_child(pid_file) + "echo partial\nexec sleep 300")
    start = time.monotonic()
    r = tool.run([str(t)], 1.0, grace_s=1.0)
    escapees.append(int(pid_file.read_text()))
    assert r.timed_out and "partial" in r.output  # what it printed before it hung is kept
    assert time.monotonic() - start < DEADLINE_MARGIN_S  # its 1 s limit and grace, not the hang


def test_children_left_in_the_group_after_the_tool_exited_are_ended(tmp_path):
    pid_file = tmp_path / "child.pid"
    t = script(tmp_path, "t", f'sleep 300 &\necho $! > "{pid_file}"\necho done\nexit 0')
    r = tool.run([str(t)], 30.0, grace_s=1.0)
    assert (r.timed_out, r.exit_code) == (False, 0) and "done" in r.output
    child = int(pid_file.read_text())
    wait_for(lambda: not alive(child), what=f"the tool's leftover child {child} to be ended")


def test_a_flood_of_output_is_kept_bounded(tmp_path):
    """`yes` writes gigabytes a minute: only the start and the end are kept, and the runner's
    memory does not grow with it (checked in a child process, by its peak RSS)."""
    import subprocess
    import sys

    code = ("import resource, sys; from exporter.activecheck import tool\n"
            "r = tool.run(['yes', 'x' * 200], 3.0, grace_s=0.5)\n"
            "assert r.timed_out, r\n"
            "print(len(r.output), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).parent.parent)
    assert out.returncode == 0, out.stderr
    kept, rss_kib = map(int, out.stdout.split())
    assert kept <= tool.MAX_OUTPUT_BYTES + 100
    assert rss_kib < 200 * 1024, f"peak RSS {rss_kib} KiB"


def test_stderr_is_read_with_stdout(tmp_path):
    t = script(tmp_path, "dcgmi", "echo 'Error: unable to establish a connection to the specified host: "
               "localhost' >&2\nexit 235")
    r = tool.run([str(t)], 10.0)
    assert r.exit_code == 235 and "unable to establish" in r.output


@pytest.fixture
def session():
    return NvmlSession(FakeBackend(node_capture(PROFILES["p5.48xlarge"], load_capture())), pool=test_pool())


def suite(tmp_path, session, budget, efa=32, **cfg):
    overrides = {"paths.state_dir": str(tmp_path / "state"), **{f"active.{k}": v for k, v in cfg.items()}}
    node = Node("p5.48xlarge", 8, efa, session, test_pool())
    return Suite(load(None, overrides).section(ActiveSection), node, str(tmp_path / "state"), budget)


@pytest.mark.parametrize("check", ["dcgm", "nccl", "efa"])
def test_the_budget_holds_against_a_tool_that_ignores_sigterm(tmp_path, session, monkeypatch, check,
                                                               escapees):
    """Budget 3 s, the tools' deadlines far past it, each tool ignoring SIGTERM and leaving a
    grandchild outside its group holding the pipe: the suite ends within the budget (the kill's
    grace is taken from it), reports `timeout`, and starts nothing after."""
    bin_dir = tmp_path / "bin"
    pid_file = tmp_path / "child.pid"
    body = "trap '' TERM\n" + setsid_child(pid_file) + "while :; do sleep 1; done"
    for name in ("dcgmi", "all_reduce_perf", "fi_info"):
        script(bin_dir, name, body)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    start = time.monotonic()
    rs = suite(tmp_path, session, 3.0).run([check, "nvml"])
    took = time.monotonic() - start
    if pid_file.exists():
        escapees.append(int(pid_file.read_text()))
    assert [r.result for r in rs] == ["timeout", "skip"], [r.reason for r in rs]
    assert took < DEADLINE_MARGIN_S  # the 3 s budget; the tools never end
    assert result.read(tmp_path / "state", check).result == "timeout"


def test_a_loopback_cut_by_the_budget_is_a_timeout_never_an_efa_failure(tmp_path, session, monkeypatch):
    bin_dir = tmp_path / "bin"
    script(bin_dir, "fi_info", f'cat "{DIAG / "fi_info-efa-p4d-4dev.txt"}"')
    script(bin_dir, "fi_pingpong", "exec sleep 300")  # server and client both wait forever
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    start = time.monotonic()
    [r] = suite(tmp_path, session, 3.0, efa=4).run(["efa"])
    assert r.result == "timeout" and "budget" in r.reason, r.reason
    assert time.monotonic() - start < DEADLINE_MARGIN_S  # the 3 s budget; fi_pingpong never ends


@pytest.mark.parametrize(("code", "output"), [
    (226, "Error: the diagnostic failed; see the log\n"),  # a failed test, the JSON lost (no -j output)
    (205, ""),  # an error of ISOLATE priority, nothing printed
])
def test_dcgmi_failure_exit_without_json_is_a_failure_that_names_no_gpu(tmp_path, session, monkeypatch,
                                                                        code, output):
    """dcgmi's own exit status says a test failed (226) or a GPU is to be isolated (205): a
    failure, kept at `degraded` (no category, no GPU to replace), never `error` nor `pass`."""
    from exporter.activecheck import findings

    bin_dir = tmp_path / "bin"
    script(bin_dir, "dcgmi", f"printf '{output}'\nexit {code}")
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    [r] = suite(tmp_path, session, 60.0).run(["dcgm"])
    assert (r.result, r.exit_code) == ("fail", code), r.reason
    assert str(code) in r.reason
    assert findings.level(findings.reasons([r], time.time())) == "degraded"


def test_nccl_exit_7_under_nccl_tests_min_bw_is_a_bandwidth_failure(tmp_path, session, monkeypatch):
    """nccl-tests exits 7 and prints FAILED on the average line when NCCL_TESTS_MIN_BW is set and
    not reached (src/common.cu): bandwidth, degraded, never `error`."""
    src = (DIAG / "nccl-tests-allreduce-p5-awsbatch-aws.txt").read_text()
    failed = tmp_path / "failed.txt"
    failed.write_text(src.replace("Avg bus bandwidth    : 156.742", "Avg bus bandwidth    : 156.742 FAILED"))
    assert "FAILED" in failed.read_text()
    bin_dir = tmp_path / "bin"
    script(bin_dir, "all_reduce_perf", f'cat "{failed}"\nexit 7')
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    [r] = suite(tmp_path, session, 60.0).run(["nccl"])
    assert r.result == "fail" and [f.test for f in r.findings] == ["bus_bandwidth"], r.reason


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_active_ends_the_running_tool_with_it(tmp_path, sig):
    """The prolog's `timeout`, Slurm's PrologTimeout or a Job's activeDeadlineSeconds SIGTERM the
    command: the diagnostic it started (its own session) must not go on running on the GPUs."""
    import subprocess
    import sys

    bin_dir = tmp_path / "bin"
    pid_file = tmp_path / "dcgmi.pid"
    script(bin_dir, "dcgmi", f'echo $$ > "{pid_file}"\nexec sleep 300')
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    argv = [sys.executable, "-m", "exporter", "active", "--simulate", "p5.48xlarge",
            "--path.state-dir", str(tmp_path / "state"), "--checks", "dcgm", "--budget", "600"]
    proc = subprocess.Popen(argv, env=env, cwd=Path(__file__).parent.parent, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=120,
                 what="dcgmi to start", proc=proc)
        tool_pid = int(pid_file.read_text())
        proc.send_signal(sig)
        proc.wait(60)
        assert proc.returncode != 0
        wait_for(lambda: not alive(tool_pid), what=f"dcgmi {tool_pid} to end with the command")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if pid_file.exists() and alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_a_signal_that_lands_while_a_tool_starts_still_ends_the_tool(monkeypatch):
    """The signal lands inside Popen, after the fork and before the pid is returned (a loaded host
    widens that window: one stressed run of the test above left dcgmi running). What the handler
    does there (`tool.interrupt`) is held until the tool's process group is known, then raised,
    and the tool is killed with it."""
    import subprocess

    class Stop(BaseException):
        pass

    def raise_stop() -> None:
        raise Stop

    real_popen = subprocess.Popen
    started: list[subprocess.Popen[bytes]] = []

    def popen_then_signal(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        started.append(proc)
        tool.interrupt(raise_stop)  # the handler, run by a signal landing before Popen returns
        return proc

    monkeypatch.setattr(subprocess, "Popen", popen_then_signal)
    try:
        with pytest.raises(Stop):
            tool.run(["sleep", str(int(HANG_GUARD_S))], timeout_s=HANG_GUARD_S)
        assert len(started) == 1
        wait_for(lambda: started[0].poll() is not None, what="the tool to end with the signal")
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_the_nvml_check_holds_the_budget_when_every_gpu_hangs(tmp_path):
    """A wedged driver: every NVML call on all 8 GPUs blocks. The check ends with the budget, as
    `timeout` (a GPU cut short by the budget is not a GPU that does not answer), not after 8 x the
    per-call deadline."""
    fake = FakeBackend(node_capture(PROFILES["p5.48xlarge"], load_capture()))
    sess = NvmlSession(fake, pool=test_pool())
    assert sess.ensure()
    for i in range(8):
        fake.hang(i)
    try:
        start = time.monotonic()
        # per-call deadlines of a hang guard: 8 of them in turn would take 16 minutes
        [r] = suite(tmp_path, sess, 3.0, nvml_call_timeout_seconds=START_HANG_GUARD_S).run(["nvml"])
        took = time.monotonic() - start
    finally:
        fake.release()
    assert r.result == "timeout", r.reason
    assert took < DEADLINE_MARGIN_S  # the 3 s budget


@pytest.mark.parametrize("later", ["timeout", "error", "skip"])
def test_a_run_that_could_not_check_never_hides_a_valid_failure(tmp_path, later):
    """A GPU failed DCGM; the next run's dcgmi hangs (perhaps because of that GPU) or prints
    garbage: the failure stays on record, and with it the verdict, until a run that checks."""
    from exporter.activecheck import findings

    state = tmp_path / "state"
    now = time.time()
    failed = result.CheckResult("dcgm", "fail", "failed", started_at=now - 60, finished_at=now - 50,
                                findings=[result.Finding("3", "memory", "fail", "Hardware", [11])])
    assert result.write(state, failed)
    result.write(state, result.CheckResult("dcgm", later, "could not check", started_at=now - 5,
                                           finished_at=now))
    on_record = result.read(state, "dcgm")
    assert on_record is not None and on_record.result == "fail"
    assert findings.level(findings.reasons([on_record], now)) == "replace_required"
    # a run that checked replaces it
    result.write(state, result.CheckResult("dcgm", "pass", "ok", started_at=now, finished_at=now + 1))
    assert result.read(state, "dcgm").result == "pass"


def test_an_expired_pass_is_no_cached_pass(tmp_path):
    """--reuse-pass longer than the result's validity: the expired pass counts as absent."""
    from exporter.commands.active import recent_pass

    state = tmp_path / "state"
    now = time.time()
    result.write(state, result.CheckResult("dcgm", "pass", "ok", started_at=now - 130, finished_at=now - 120,
                                           valid_for_s=60.0))
    assert not recent_pass(str(state), ["dcgm"], 3600.0, now)
    result.write(state, result.CheckResult("dcgm", "pass", "ok", started_at=now - 30, finished_at=now - 20,
                                           valid_for_s=60.0))
    assert recent_pass(str(state), ["dcgm"], 3600.0, now)


@pytest.mark.parametrize("doc", [
    '{"DCGM Diagnostic": {"test_categories": true}}',
    '{"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": 1}]}}',
    '{"DCGM GPU Diagnostic": {"test_categories": [{"tests": [{"name": "memory", "results": 1.5}]}]}}',
])
def test_garbage_with_the_right_top_key_is_an_error_and_the_next_check_runs(tmp_path, session, monkeypatch,
                                                                           doc):
    bin_dir = tmp_path / "bin"
    script(bin_dir, "dcgmi", f"echo '{doc}'\nexit 0")
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    rs = suite(tmp_path, session, 60.0).run(["dcgm", "nvml"])
    assert [r.result for r in rs] == ["error", "pass"], [r.reason for r in rs]


def test_a_check_that_raises_is_an_error_and_the_next_check_runs(tmp_path, session, monkeypatch):
    """Whatever a parser meets, one check never takes the others down."""
    from exporter.activecheck import dcgm

    def broken(output, exit_code):
        raise RuntimeError("a parser bug")

    bin_dir = tmp_path / "bin"
    script(bin_dir, "dcgmi", f'cat "{PASS_JSON}"')
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setattr(dcgm, "result", broken)
    rs = suite(tmp_path, session, 60.0).run(["dcgm", "nvml"])
    assert [r.result for r in rs] == ["error", "pass"]
    assert "a parser bug" in rs[0].reason


def test_the_budget_bounds_the_whole_command_from_its_start(tmp_path):
    """`active --budget N` is what a prolog or a Job sizes its own timeout by: the command's
    start-up (imports, NVML, the instance type) is part of it."""
    import subprocess
    import sys

    bin_dir = tmp_path / "bin"
    script(bin_dir, "dcgmi", "trap '' TERM\nwhile :; do sleep 1; done")
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    argv = [sys.executable, "-m", "exporter", "active", "--simulate", "p5.48xlarge",
            "--path.state-dir", str(tmp_path / "state"), "--checks", "dcgm", "--budget", "10"]
    start = time.monotonic()
    out = subprocess.run(argv, env=env, cwd=Path(__file__).parent.parent, capture_output=True, text=True,
                         timeout=120)
    took = time.monotonic() - start
    assert out.returncode == 3, out.stdout + out.stderr  # could not check: timed out
    # the interpreter's own start (before the command is invoked) is outside the budget: twice the slack
    assert took < 10 + 2 * SLACK_S, f"{took:.1f}s\n{out.stdout}"


def test_a_check_with_no_time_left_past_the_kills_reserve_is_not_started(tmp_path, session, monkeypatch):
    """Just over min_start_seconds left, but less than the reserve a kill needs: starting the tool
    would only record a `timeout` (replacing a valid pass) for a run that never had time."""
    bin_dir = tmp_path / "bin"
    marker = tmp_path / "ran"
    script(bin_dir, "dcgmi", f'touch "{marker}"\nexec sleep 300')
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    [r] = suite(tmp_path, session, 1.02, min_start_seconds=0.0).run(["dcgm"])
    assert r.result == "skip" and "budget" in r.reason
    assert not marker.exists() and result.read(tmp_path / "state", "dcgm") is None
