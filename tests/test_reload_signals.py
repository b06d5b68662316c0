"""SIGHUP is safe at any moment: a reload restarts the process in place with execve,
and a SIGHUP that arrives while it does (two `systemctl reload`s in a row) must never kill the
exporter. Real processes; every wait is for a condition, with a deadline."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.helpers import START_HANG_GUARD_S, answers_now, start_exporter, stop_within, wait_for

pytestmark = pytest.mark.slow

RELOADED = "SIGHUP: the configuration is valid; restarting in place"


def start(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("log_level: info\ninstance:\n  imds: false  # this machine is no EC2 instance\n")
    return start_exporter(tmp_path, "--collectors", "lustre", "--config", str(cfg),
                          "--path.state-dir", str(tmp_path / "state"))


def settled(log, reloads: int) -> bool:
    """`reloads` reloads done and the process that followed the last one is serving."""
    t = log.read_text()
    return t.count(RELOADED) >= reloads and t.count("msg=\"serving http") == t.count(RELOADED) + 1


def test_a_sighup_during_the_reload_exec_is_a_second_reload_not_a_kill(tmp_path):
    proc, _, log = start(tmp_path)
    try:
        for n in (1, 2):
            before = log.read_text().count("shut down cleanly")
            proc.send_signal(signal.SIGHUP)
            # The old process has flushed and is about to exec: the new one has no handler yet.
            wait_for(lambda b=before: log.read_text().count("shut down cleanly") > b, START_HANG_GUARD_S,
                     f"reload {n}", proc, log)
            proc.send_signal(signal.SIGHUP)
            # The SIGHUP held across the exec is taken by the restarted process: one more reload.
            wait_for(lambda b=before: settled(log, b + 2), START_HANG_GUARD_S,
                     f"the reload asked during reload {n}", proc, log)
        wait_for(lambda: answers_now(log), START_HANG_GUARD_S, "serving", proc, log)
        assert log.read_text().count(RELOADED) == 4
        assert stop_within(proc, 30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_back_to_back_sighups_never_kill_the_exporter(tmp_path):
    proc, _, log = start(tmp_path)
    try:
        for _ in range(3):
            before = log.read_text().count(RELOADED)
            os.kill(proc.pid, signal.SIGHUP)
            os.kill(proc.pid, signal.SIGHUP)
            wait_for(lambda before=before: log.read_text().count(RELOADED) > before, START_HANG_GUARD_S,
                     "a reload", proc, log)
            wait_for(lambda: answers_now(log), START_HANG_GUARD_S, "serving after the reloads", proc, log)
        assert answers_now(log) and proc.poll() is None
        assert stop_within(proc, 30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_sighup_with_an_alias_bomb_in_the_config_keeps_serving(tmp_path):
    from tests.test_config import bomb

    proc, _, log = start(tmp_path)
    try:
        (tmp_path / "config.yaml").write_text(bomb())
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "SIGHUP: not reloading" in log.read_text(), START_HANG_GUARD_S,
                 "the refused reload", proc, log)
        assert "aliases are expanded" in log.read_text() and answers_now(log)
        assert stop_within(proc, 30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_stop_and_continue_is_not_a_reload(tmp_path):
    """SIGSTOP then SIGCONT (a debugger, a cgroup freezer, a benchmark taking turns) interrupts the
    wait for SIGHUP; CPython then hands back an empty siginfo instead of None once the wait's
    timeout has passed, which the exporter took for a SIGHUP and reloaded (a restart, a dropped
    connection). Fails on the old code."""
    proc, _, log = start(tmp_path)
    try:
        for _ in range(3):
            proc.send_signal(signal.SIGSTOP)
            time.sleep(0.6)  # longer than the SIGHUP wait's poll: the interrupted wait times out
            proc.send_signal(signal.SIGCONT)
            wait_for(lambda: answers_now(log), START_HANG_GUARD_S, "serving after SIGCONT", proc, log)
        assert RELOADED not in log.read_text()
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(timeout=30)
