"""A reload runs with exactly what it validated, whatever its size, the web config
(and the TLS files it names) included. An edit that lands between the SIGHUP's validation and
the re-exec'd process's start must neither stop the exporter (exit 2, which systemd does not
restart) nor run unvalidated. Real processes for the races; the hand-over in-process for TLS."""

from __future__ import annotations

import signal
import subprocess

import pytest

from exporter import reload_snapshot
from exporter.web.webconfig import load_web_config
from tests.helpers import HANG_GUARD_S, START_HANG_GUARD_S, answers_now, start_exporter, stop_within, wait_for
from tests.test_reload_signals import RELOADED, settled

pytestmark = pytest.mark.slow

REFUSED = "SIGHUP: not reloading"
NO_IMDS = "instance:\n  imds: false\n"  # this machine is no EC2 instance


def reload_racing_an_edit(tmp_path, edited, edit: str, *args: str) -> None:
    """SIGHUP, and as soon as the old process has validated, break `edited` with `edit`. The
    restarted process must serve (with what was validated); the next SIGHUP reads the files again
    and is refused."""
    proc, _, log = start_exporter(tmp_path, "--collectors", "lustre", "--path.state-dir",
                                    str(tmp_path / "state"), *args)
    try:
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: RELOADED in log.read_text(), START_HANG_GUARD_S, "the reload validated", proc, log)
        with open(edited, "a") as f:  # lands before the exec'd process starts reading
            f.write(edit)
        wait_for(lambda: settled(log, 1), START_HANG_GUARD_S, "the restarted process serving", proc, log)
        assert answers_now(log) and proc.poll() is None
        proc.send_signal(signal.SIGHUP)  # the files now on disk are invalid: refused, still serving
        wait_for(lambda: REFUSED in log.read_text(), START_HANG_GUARD_S, "the refused reload", proc, log)
        assert answers_now(log) and log.read_text().count(RELOADED) == 1
        assert stop_within(proc, 30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_web_config_edit_during_the_reload_does_not_stop_the_exporter(tmp_path):
    """The issue's reproduction. Fails on the old code: the exec'd process read the web config
    again, found `bogus_key` and exited 2."""
    web = tmp_path / "web.yml"
    web.write_text("http_server_config:\n  http2: false\n")
    cfg = tmp_path / "config.yaml"
    cfg.write_text("log_level: info\n" + NO_IMDS)
    reload_racing_an_edit(tmp_path, web, "bogus_key: 1\n", "--config", str(cfg),
                          "--web.config.file", str(web))


def test_a_large_config_edit_during_the_reload_does_not_stop_the_exporter(tmp_path):
    """Fails on the old code: a config of 100,000 bytes or more was read again by the exec'd
    process, which found `log_level: [` and exited 2."""
    cfg = tmp_path / "config.yaml"
    cfg.write_text("log_level: info\n" + NO_IMDS + "# padding to make a large config file\n" * 3000)
    assert cfg.stat().st_size > 110_000
    reload_racing_an_edit(tmp_path, cfg, "log_level: [\n", "--config", str(cfg))


def test_the_new_process_loads_the_validated_certificate_not_the_file_swapped_since(tmp_path):
    """The TLS files a reload validated are handed over with the web config: a certificate and
    key replaced (or broken) after the check are not what the new process loads."""
    exe = ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
           "-nodes", "-days", "2"]
    subprocess.run([*exe, "-keyout", "server.key", "-out", "server.crt", "-subj", "/CN=validated"],
                   cwd=tmp_path, check=True, capture_output=True, timeout=HANG_GUARD_S)
    web = tmp_path / "web.yml"
    web.write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n")
    with reload_snapshot.recording() as validated:
        assert load_web_config(web).ssl_context is not None
    assert set(validated) == {str(tmp_path / n) for n in ("web.yml", "server.crt", "server.key")}
    (tmp_path / "server.crt").write_text("not a certificate\n")  # swapped after the check
    web.write_text("bogus_key: 1\n")
    reload_snapshot.hand_over(validated)  # what the exec'd process inherits ...
    try:
        reload_snapshot.take_over()  # ... and takes first thing
        assert load_web_config(web).ssl_context is not None  # the broken files would not load
    finally:
        reload_snapshot.release()
    with pytest.raises(Exception, match="bogus_key"):  # released: the files on disk again
        load_web_config(web)
