import os
import subprocess
import sys
import threading

import pytest

from exporter.config import ConfigError, load, validate
from tests.helpers import HANG_GUARD_S, ROOT, START_HANG_GUARD_S


def write(tmp_path, text):
    p = tmp_path / "config.yaml"
    p.write_text(text)
    return p


def test_defaults_without_file():
    cfg = load(None)
    assert cfg.listen == "0.0.0.0:9858"
    assert cfg.paths.sysfs == "/sys"
    assert cfg.collector_timeout_seconds == 5.0


def test_file_values_and_cli_overrides(tmp_path):
    p = write(tmp_path, "listen: 127.0.0.1:9999\npaths:\n  sysfs: /tmp/sys\n")
    cfg = load(p, {"paths.sysfs": "/other/sys"})
    assert cfg.listen == "127.0.0.1:9999"
    assert cfg.paths.sysfs == "/other/sys"


@pytest.mark.parametrize("text, key, expected", [
    ("bogus: 1\n", "'bogus'", "expected one of"),
    ("paths:\n  sysfss: /x\n", "'paths.sysfss'", "paths.sysfs"),
    ("collector_timeout_seconds: fast\n", "'collector_timeout_seconds'", "a number"),
    ("collector_timeout_seconds: -1\n", "'collector_timeout_seconds'", "greater than 0"),
    ("listen: nowhere\n", "'listen'", "HOST:PORT"),
    ("log_level: loud\n", "'log_level'", "one of debug"),
    ("paths: 3\n", "'paths'", "a mapping"),
    ("node:\n  expected_gpus: true\n", "'node.expected_gpus'", "an integer"),
])
def test_bad_values_name_file_key_and_expectation(tmp_path, text, key, expected):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load(p)
    msg = str(e.value)
    assert str(p) in msg and key in msg and expected in msg


def test_not_yaml(tmp_path):
    p = write(tmp_path, "listen: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load(p)


def test_top_level_must_be_mapping():
    with pytest.raises(ConfigError, match="expected a mapping"):
        validate(["a"], "x.yaml")


def test_unknown_key_exits_2_naming_the_key(tmp_path):
    p = write(tmp_path, "gpu_frobnicate: yes\n")
    r = subprocess.run([sys.executable, "-m", "exporter", "--config", str(p)], cwd=ROOT,
                       capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert r.returncode == 2
    assert "gpu_frobnicate" in r.stderr and str(p) in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_duplicate_keys_are_refused_naming_the_file_and_key(tmp_path):
    import exporter.collectors.gpu  # noqa: F401 - declares the gpu section

    p = write(tmp_path, "gpu:\n  parallel: true\n  nvlink: false\n  parallel: false\n")
    with pytest.raises(ConfigError, match=r"config.yaml: not valid YAML: [\s\S]*duplicate key 'parallel' "
                                          r"\(first at line 2\)"):
        load(p)
    p = write(tmp_path, "log_level: debug\nlog_level: info\n")
    with pytest.raises(ConfigError, match="duplicate key 'log_level'"):
        load(p)


def test_a_non_utf8_config_file_names_the_file(tmp_path):
    p = tmp_path / "config.yaml"
    p.write_bytes(b"log_level: info\n# caf\xe9\n")
    with pytest.raises(ConfigError, match=r"config.yaml: not UTF-8 text \(byte 21"):
        load(p)


def test_gpu_read_timeout_above_its_share_of_the_timeout_is_an_error(tmp_path):
    import exporter.collectors.gpu  # noqa: F401 - declares the gpu section

    p = write(tmp_path, "gpu:\n  timeout_seconds: 2\n  read_timeout_seconds: 3\n")
    with pytest.raises(ConfigError, match=r"config.yaml: key 'gpu.read_timeout_seconds' is 3; expected at "
                                          r"most 0.8 x gpu.timeout_seconds \(1.6\)"):
        load(p)
    assert load(write(tmp_path, "gpu:\n  timeout_seconds: 2\n  read_timeout_seconds: 1.6\n")) is not None


# --- hostile files, the config path's kind ---

def bomb(levels: int = 9) -> str:
    """About 1 KB of YAML that expands to 9**levels strings, used as a known key's (wrong) value."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + f"\nlisten: *a{levels - 1}\n"


def run_limited(args, timeout=60):
    """Run the exporter's CLI with its address space capped at 1 GiB: a value expanded or formatted
    whole dies there (the old code grew to 1.3 GB in 15 s) instead of eating the machine."""
    import resource

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    return subprocess.run([sys.executable, "-m", "exporter", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, preexec_fn=cap)


def test_an_alias_bomb_is_refused_before_it_is_expanded(tmp_path):
    text = bomb()
    assert len(text) < 1200
    p = write(tmp_path, text)
    with pytest.raises(ConfigError, match=r"config.yaml: not valid YAML: .*more than 100000 values once its "
                                          r"aliases are expanded"):
        load(p)
    for args in (["check", "--config", str(p)], ["--config", str(p)]):
        r = run_limited(args)
        assert r.returncode == (3 if args[0] == "check" else 2), r.stderr[-2000:]  # check: could not check
        assert "alias" in r.stderr and str(p) in r.stderr and len(r.stderr) < 500


def test_a_long_value_is_cut_in_the_message(tmp_path):
    p = write(tmp_path, "listen: [&a [" + ", ".join(["xxxxxxxxxx"] * 500) + "], *a, *a]\n")
    with pytest.raises(ConfigError) as e:
        load(p)
    msg = str(e.value)
    assert "key 'listen' is list [['xxxxxxxxxx', 'xxxxxxxxxx'" in msg and "..." in msg and len(msg) < 300
    p = write(tmp_path, "log_level: " + "y" * 100_000 + "\n")
    with pytest.raises(ConfigError, match=r"key 'log_level' is 'yyyy.*\.\.\.; expected one of") as e:
        load(p)
    assert len(str(e.value)) < 300


def test_a_recursive_alias_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="recursive alias"):
        load(write(tmp_path, "listen: &a [*a]\n"))


@pytest.mark.parametrize("text", ["{{}}", "{[1]: 2}\n", "paths:\n  ? [a]\n  : 1\n"])
def test_an_unhashable_key_is_a_config_error(tmp_path, text):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError, match=r"config.yaml: not valid YAML: line \d+, column \d+: .*as a key"):
        load(p)
    r = subprocess.run([sys.executable, "-m", "exporter", "--config", str(p)], cwd=ROOT,
                       capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert r.returncode == 2 and "Traceback" not in r.stderr and str(p) in r.stderr


def test_a_fifo_or_a_directory_as_the_config_file_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    errors = []

    def try_load():
        try:
            load(fifo)
        except ConfigError as e:
            errors.append(str(e))

    t = threading.Thread(target=try_load, daemon=True)  # a regression blocks in open(): fail, not hang
    t.start()
    t.join(START_HANG_GUARD_S)
    assert not t.is_alive(), "load() blocked on a FIFO"
    assert errors and "config.yaml: the config file: not a regular file (a FIFO)" in errors[0]
    r = subprocess.run([sys.executable, "-m", "exporter", "check", "--config", str(fifo)], cwd=ROOT,
                       capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert r.returncode == 3 and "not a regular file (a FIFO)" in r.stderr  # check: could not check
    with pytest.raises(ConfigError, match=r"not a regular file \(a directory\)"):
        load(tmp_path)


def test_a_huge_integer_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="config.yaml: not valid YAML"):
        load(write(tmp_path, "web:\n  workers: " + "1" * 5000 + "\n"))


def test_yaml_syntax_errors_name_the_file_line_and_column(tmp_path):
    p = write(tmp_path, "log_level: info\nlisten: [unclosed\n")
    with pytest.raises(ConfigError) as e:
        load(p)
    assert str(e.value).startswith(f"{p}: not valid YAML: line 3, column 1: ")
    assert "<unicode string>" not in str(e.value)


# --- every error at once, typed sections ------------------------------

def test_every_error_is_reported_at_once_with_its_key_expectation_and_value(tmp_path):
    p = write(tmp_path, "listen: nowhere\nbogus: 1\ngpu:\n  timeout_seconds: -1\n  parallel: maybe\n"
                        "xid:\n  policy: {replace: [999999]}\n")
    with pytest.raises(ConfigError) as e:
        load(p, {"log_level": "loud"})
    msg = str(e.value)
    assert msg.startswith("6 configuration errors:\n")
    for part in (f"{p}: key 'listen' is 'nowhere'; expected HOST:PORT",
                 f"{p}: unknown key 'bogus'; expected one of listen,",
                 f"{p}: key 'gpu.timeout_seconds' is -1; expected a number greater than 0",
                 f"{p}: key 'gpu.parallel' is str 'maybe'; expected a boolean",
                 f"{p}: key 'xid.policy' is {{'replace': [999999]}}; expected XID numbers from 1 to 99999 "
                 "under 'replace' (item 0, 999999, is out of range)",
                 "command line: key 'log_level' is 'loud'; expected one of debug"):
        assert part in msg, part
    assert len(e.value.errors) == 6


def test_three_mistakes_exit_2_naming_all_three(tmp_path):
    p = write(tmp_path, "listen: nowhere\nlog_level: loud\nefa:\n  read_workers: 0\n")
    for args in (["--config", str(p)], ["check", "--config", str(p)],
                 ["ack", "--config", str(p), "--gpu", "0"],
                 ["capture", "--config", str(p), "--out", str(tmp_path / "c.json")]):
        r = subprocess.run([sys.executable, "-m", "exporter", *args], cwd=ROOT, capture_output=True,
                           text=True, timeout=HANG_GUARD_S)
        assert r.returncode == (3 if args[0] == "check" else 2), (args, r.stderr)  # check: could not check
        for key in ("'listen'", "'log_level'", "'efa.read_workers'"):
            assert key in r.stderr, (args, key, r.stderr)


def test_the_config_is_typed():
    from exporter.collectors.efa import EfaSection
    from exporter.collectors.gpu import GpuSection
    from exporter.config import Config, Paths, Web

    cfg = load(None)
    assert isinstance(cfg, Config) and isinstance(cfg.paths, Paths) and isinstance(cfg.web, Web)
    assert isinstance(cfg.section(GpuSection), GpuSection) and not hasattr(cfg, "gpu")  # typed reads only
    assert cfg.section(EfaSection).counters == "default" and cfg.web.telemetry_path == "/metrics"
    assert cfg.log_format == "logfmt"
